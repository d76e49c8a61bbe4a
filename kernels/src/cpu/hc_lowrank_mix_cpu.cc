// CPU kernel of HyperConnectionLowRankMix; the order of operations is hcfuse/reference.py's (see the
// header). Three phases per pass of up to kHcCpuRowsPerPass rows, each a set of independent tasks
// over output elements handed to the task runner (ORT's thread pool):
//   1. S, streams_out and hn per (row, branch);
//   2. down -> Z -> SG -> hidden and inject -> post_gate per (row tile, block of output columns);
//   3. up -> g and pre_output per (row tile, block of features h, all C branches).
// The products run in hc_lowrank_mix_cpu_gemm.inc, compiled for AVX-512, AVX2 and plain x86-64 (or
// the target's default) and picked at run time; every variant gives the same bits.
#include "cpu/hc_lowrank_mix_cpu.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HCFUSE_X86_DISPATCH 1
#endif

namespace hcfuse {
namespace {

// One column block of a product: out[r * ldo + (n - n0)] = sum_k x[r * ldx + k] * w[k * ldw + n]
// for rows r < rows (<= kHcCpuRowTile) and n in [n0, n1).
template <typename T>
struct GemmArgs {
  const float* x;
  int64_t ldx;
  int64_t rows;
  const T* w;
  int64_t ldw;
  int64_t K;
  int64_t n0, n1;
  float* out;
  int64_t ldo;
};

inline void WidenHalfPortable(const Half* src, int64_t n, float* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = ToFloat(src[i]);
}

namespace generic {
constexpr int MaxVectors(int rows) { return rows == 1 ? 2 : 1; }
inline void WidenHalf(const Half* src, int64_t n, float* dst) { WidenHalfPortable(src, n, dst); }
#include "cpu/hc_lowrank_mix_cpu_gemm.inc"
}  // namespace generic

#ifdef HCFUSE_X86_DISPATCH
#pragma GCC push_options
#pragma GCC target("avx2,f16c")
namespace avx2 {
constexpr int MaxVectors(int rows) { return rows == 1 ? 4 : rows == 2 ? 2 : 1; }
// F16C widening is exact, as ToFloat is (a NaN's payload is kept; only its quiet bit may differ,
// and no NaN reaches a 16-bit output with its payload: FromFloat<Half> makes every NaN 0x7e00).
inline void WidenHalf(const Half* src, int64_t n, float* dst) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  }
  WidenHalfPortable(src + i, n - i, dst + i);
}
#include "cpu/hc_lowrank_mix_cpu_gemm.inc"
}  // namespace avx2
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,f16c")
namespace avx512 {
constexpr int MaxVectors(int rows) { return rows <= 2 ? 8 : 4; }
inline void WidenHalf(const Half* src, int64_t n, float* dst) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i))));
  }
  WidenHalfPortable(src + i, n - i, dst + i);
}
#include "cpu/hc_lowrank_mix_cpu_gemm.inc"
}  // namespace avx512
#pragma GCC pop_options
#endif

template <typename T>
using GemmFn = void (*)(const GemmArgs<T>&);

// The widest variant this CPU (and OS) runs; all give the same bits.
template <typename T>
GemmFn<T> PickGemm() {
#ifdef HCFUSE_X86_DISPATCH
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("f16c")) {
    return &avx512::GemmBlock<T>;
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c")) return &avx2::GemmBlock<T>;
#endif
  return &generic::GemmBlock<T>;
}

// sigmoid(x) = 1 / (1 + e), e = exp(-x) correctly rounded to fp32 (computed in double, rounded once).
inline float Sigmoid(float x) {
  const float e = static_cast<float>(std::exp(-static_cast<double>(x)));
  return 1.0f / (1.0f + e);
}

constexpr int64_t kColumnBlock = 32;    // down / inject output columns per task (one cache line of fp16)
constexpr int64_t kFeatureBlock = 128;  // features h per up/mix task (C * 128 output columns)

inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

template <typename T>
class Pass {
 public:
  // Rows [row0, row0 + rows) of the call, rows <= kHcCpuRowsPerPass.
  Pass(const HcLowRankMixParams& p, const HcLowRankMixCpuArgs<T>& a, GemmFn<T> gemm, float* scratch, int64_t row0,
       int64_t rows)
      : p_(p), a_(a), gemm_(gemm), row0_(row0), rows_(rows), tiles_(CeilDiv(rows, kHcCpuRowTile)) {
    hn_ = scratch;
    g_ = hn_ + rows * p.width();
    hidden_ = g_ + rows * p.width();
  }

  void Run(const HcTaskRunner& run) {
    const int64_t C = p_.C;
    run(rows_ * C, [this, C](int64_t task) { Norm(task / C, task % C); });
    const int64_t column_blocks = CeilDiv(p_.R, kColumnBlock) + CeilDiv(C, kColumnBlock);
    run(column_blocks * tiles_, [this](int64_t task) { DownInject(task / tiles_, task % tiles_); });
    run(CeilDiv(p_.H, kFeatureBlock) * tiles_, [this](int64_t task) { UpMix(task / tiles_, task % tiles_); });
  }

 private:
  // S (prologue), streams_out and hn of branch c of pass row r.
  void Norm(int64_t r, int64_t c) {
    const int64_t C = p_.C, H = p_.H, W = p_.width(), row = row0_ + r;
    const T* s = a_.streams + row * W + c * H;
    float* x = hn_ + r * W + c * H;
    for (int64_t h = 0; h < H; ++h) x[h] = ToFloat(s[h]);
    if (p_.has_prologue) {
      const T* pbo = a_.prev_block_output + row * H;
      const float gate = ToFloat(a_.prev_post_gate[row * C + c]);
      for (int64_t h = 0; h < H; ++h) x[h] = RoundToT<T>(x[h] + gate * ToFloat(pbo[h]));  // rounding point: S
    }
    if (p_.has_streams_out) {
      T* out = a_.streams_out + row * W + c * H;
      for (int64_t h = 0; h < H; ++h) out[h] = FromFloat<T>(x[h]);
    }
    float ss = 0.0f;
    for (int64_t h = 0; h < H; ++h) ss += x[h] * x[h];
    const float inv_rms = 1.0f / std::sqrt(ss / static_cast<float>(H) + p_.epsilon);
    const T* scale = a_.norm_scale + c * H;
    for (int64_t h = 0; h < H; ++h) x[h] = RoundToT<T>(x[h] * inv_rms * ToFloat(scale[h]));  // rounding point: hn
  }

  // Column block `block` of [hn @ down_weight | hn @ inject_weight] for row tile `tile`, and its
  // epilogue: hidden (into scratch) for down columns, post_gate for inject columns.
  void DownInject(int64_t block, int64_t tile) {
    const int64_t R = p_.R, C = p_.C, W = p_.width();
    const int64_t r0 = tile * kHcCpuRowTile, nr = std::min(kHcCpuRowTile, rows_ - r0);
    const int64_t down_blocks = CeilDiv(R, kColumnBlock);
    const bool down = block < down_blocks;
    const int64_t N = down ? R : C;
    const int64_t n0 = (down ? block : block - down_blocks) * kColumnBlock, n1 = std::min(N, n0 + kColumnBlock);
    float acc[kHcCpuRowTile * kColumnBlock];
    gemm_({hn_ + r0 * W, W, nr, down ? a_.down_weight : a_.inject_weight, N, W, n0, n1, acc, kColumnBlock});
    for (int64_t r = 0; r < nr; ++r) {
      const float* ar = acc + r * kColumnBlock;
      if (down) {
        float* hidden = hidden_ + (r0 + r) * R;
        for (int64_t n = n0; n < n1; ++n) {
          const float d = RoundToT<T>(ar[n - n0]);             // rounding point: down
          const float z = RoundToT<T>(p_.silu_alpha * d);     // rounding point: Z
          const float sg = RoundToT<T>(Sigmoid(z));           // rounding point: SG
          hidden[n] = RoundToT<T>(z * sg);                    // rounding point: hidden
        }
      } else {
        T* gate = a_.post_gate + (row0_ + r0 + r) * C;
        for (int64_t n = n0; n < n1; ++n) {
          const float inject = RoundToT<T>(ar[n - n0]);                        // rounding point: inject
          gate[n] = FromFloat<T>(Sigmoid(inject / p_.gate_div) * p_.gate_mul);  // rounding point: post_gate
        }
      }
    }
  }

  // up = hidden @ up_weight, g and pre_output for features [h0, h1) of every branch, row tile `tile`.
  void UpMix(int64_t block, int64_t tile) {
    const int64_t R = p_.R, C = p_.C, H = p_.H, W = p_.width();
    const int64_t r0 = tile * kHcCpuRowTile, nr = std::min(kHcCpuRowTile, rows_ - r0);
    const int64_t h0 = block * kFeatureBlock, h1 = std::min(H, h0 + kFeatureBlock);
    float* g = g_ + r0 * W;
    for (int64_t c = 0; c < C; ++c) gemm_({hidden_ + r0 * R, R, nr, a_.up_weight, W, R, c * H + h0, c * H + h1,
                                           g + c * H + h0, W});
    for (int64_t r = 0; r < nr; ++r) {
      float* gr = g + r * W;
      for (int64_t c = 0; c < C; ++c) {
        for (int64_t h = h0; h < h1; ++h) {
          float& v = gr[c * H + h];
          v = RoundToT<T>(Sigmoid(RoundToT<T>(v)));  // rounding points: up, g
        }
      }
      const float* hn = hn_ + (r0 + r) * W;
      T* pre = a_.pre_output + (row0_ + r0 + r) * H;
      for (int64_t h = h0; h < h1; ++h) {
        float mix = 0.0f;
        for (int64_t c = 0; c < C; ++c) mix += hn[c * H + h] * gr[c * H + h];
        pre[h] = FromFloat<T>(p_.reduction_scale * mix);  // rounding point: pre_output
      }
    }
  }

  const HcLowRankMixParams& p_;
  const HcLowRankMixCpuArgs<T>& a_;
  const GemmFn<T> gemm_;
  const int64_t row0_, rows_, tiles_;
  float* hn_;      // rows x W: S, then hn
  float* g_;       // rows x W: up accumulators, then g
  float* hidden_;  // rows x R
};

}  // namespace

template <typename T>
void HcLowRankMixCpu(const HcLowRankMixParams& params, const HcLowRankMixCpuArgs<T>& args, const HcTaskRunner& run,
                     float* scratch) {
  const GemmFn<T> gemm = PickGemm<T>();
  for (int64_t row0 = 0; row0 < params.rows; row0 += kHcCpuRowsPerPass) {
    Pass<T>(params, args, gemm, scratch, row0, std::min(kHcCpuRowsPerPass, params.rows - row0)).Run(run);
  }
}

template void HcLowRankMixCpu<float>(const HcLowRankMixParams&, const HcLowRankMixCpuArgs<float>&,
                                     const HcTaskRunner&, float*);
template void HcLowRankMixCpu<Half>(const HcLowRankMixParams&, const HcLowRankMixCpuArgs<Half>&, const HcTaskRunner&,
                                    float*);
template void HcLowRankMixCpu<BFloat16>(const HcLowRankMixParams&, const HcLowRankMixCpuArgs<BFloat16>&,
                                        const HcTaskRunner&, float*);

}  // namespace hcfuse
