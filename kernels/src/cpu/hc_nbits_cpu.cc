// CPU kernel of HyperConnectionLowRankMixNBits (see the header for its order of operations). Phases
// per pass of up to kHcCpuRowsPerPass rows, each a set of independent tasks over output elements
// handed to the task runner (ORT's thread pool):
//   1. S, streams_out and hn per (rows, branch);
//   2. the down/inject product per block of its R + C columns, then down -> Z -> SG -> hidden or
//      inject -> post_gate on those columns;
//   3. the up product per block of features h (all C branches), then g and pre_output on them.
// The products (hc_nbits_cpu_product.inc) and the elementwise spans (hc_lowrank_mix_cpu_gemm.inc, the
// dense kernel's, so both ops round and take sigmoids alike) are compiled for AVX-512, AVX2 and plain
// x86-64 (or the target's default) and picked at run time. No variant fuses a multiply-add, so all
// give the same bits.
#include "cpu/hc_nbits_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
#define HCFUSE_X86_DISPATCH 1
#endif

namespace hcfuse {
namespace {

// The dense kernel's products in hc_lowrank_mix_cpu_gemm.inc take these; this kernel uses only its
// vector loads and elementwise spans, so they stay undefined here.
template <typename T>
struct GemmArgs;
template <typename T>
struct CpuOps;

// Columns [n0, n1) of x (rows x K, row stride ldx) times one projection [K, N], into out (row stride ldo).
template <typename T>
struct ProductArgs {
  HcNBitsProjection<T> w;
  int64_t K, N, bits, block_size;
  const float* x;
  int64_t ldx, rows;  // rows <= kHcCpuRowTile
  int64_t n0, n1;
  float* out;
  int64_t ldo;
};

// One instruction set's product and elementwise spans.
template <typename T>
struct NBitsOps {
  void (*product)(const ProductArgs<T>&);
  void (*widen)(const T* src, int64_t n, float* dst);  // dst[i] = ToFloat(src[i])
  void (*narrow)(const float* x, int64_t n, T* out);   // out[i] = FromFloat<T>(x[i])
  void (*round)(float* x, int64_t n);                  // x[i] = RoundToT<T>(x[i])
  void (*sigmoid)(float* x, int64_t n);                // x[i] = Sigmoid(x[i])
};

// sigmoid(x) = 1 / (1 + e), e = exp(-x) correctly rounded to fp32 (computed in double, rounded once).
inline float Sigmoid(float x) {
  const float e = static_cast<float>(std::exp(-static_cast<double>(x)));
  return 1.0f / (1.0f + e);
}

inline void WidenHalfPortable(const Half* src, int64_t n, float* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = ToFloat(src[i]);
}
inline void NarrowHalfPortable(const float* x, int64_t n, Half* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = FromFloat<Half>(x[i]);
}
inline void RoundHalfPortable(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = RoundToT<Half>(x[i]);
}

// Each namespace below defines what hc_lowrank_mix_cpu_gemm.inc asks of an instruction set (as
// hc_lowrank_mix_cpu.cc does; MulAdd only for its unused products) and GatherDwords.

namespace generic {
constexpr int kLanes = 16 / sizeof(float);
constexpr int MaxVectors(int rows) { return rows == 1 ? 8 : rows == 2 ? 4 : 2; }
inline void WidenHalf(const Half* src, int64_t n, float* dst) { WidenHalfPortable(src, n, dst); }
inline void NarrowHalf(const float* x, int64_t n, Half* out) { NarrowHalfPortable(x, n, out); }
inline void RoundHalf(float* x, int64_t n) { RoundHalfPortable(x, n); }
typedef float LaneVector __attribute__((vector_size(kLanes * sizeof(float))));
inline LaneVector MulAdd(LaneVector acc, float x, LaneVector w) { return acc + x * w; }
inline LaneVector LoadHalf(const Half* src) {
  LaneVector v;
  for (int i = 0; i < kLanes; ++i) v[i] = ToFloat(src[i]);
  return v;
}
typedef int32_t VI __attribute__((vector_size(kLanes * sizeof(int32_t))));
inline VI GatherDwords(const uint8_t* base, VI offsets) {
  VI g;
  for (int l = 0; l < kLanes; ++l) {
    int32_t v;
    std::memcpy(&v, base + offsets[l], sizeof v);
    g[l] = v;
  }
  return g;
}
// out[0] and out[1]: the dwords at base + offsets[l] and 4 bytes further, per lane l.
inline void GatherDwordPairs(const uint8_t* base, VI offsets, const int32_t* /*scalar_offsets*/, VI* out) {
  out[0] = GatherDwords(base, offsets);
  out[1] = GatherDwords(base + 4, offsets);
}
#include "cpu/hc_lowrank_mix_cpu_gemm.inc"
#include "cpu/hc_nbits_cpu_product.inc"
}  // namespace generic

#ifdef HCFUSE_X86_DISPATCH
#pragma GCC push_options
#pragma GCC target("avx2,f16c,fma")
namespace avx2 {
constexpr int kLanes = 8;
constexpr int MaxVectors(int rows) { return rows == 1 ? 8 : rows == 2 ? 4 : 2; }
inline __m256 MulAdd(__m256 acc, float x, __m256 w) { return _mm256_fmadd_ps(_mm256_set1_ps(x), w, acc); }
inline __m256 LoadHalf(const Half* src) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src)));
}
inline void WidenHalf(const Half* src, int64_t n, float* dst) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  }
  WidenHalfPortable(src + i, n - i, dst + i);
}
// NaN lanes made FromFloat<Half>'s NaN (0x7e00 | sign) before the hardware narrowing, which otherwise
// rounds as FromFloat<Half> does.
inline __m256 CanonicalNaN(__m256 v) {
  const __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
  const __m256 sign = _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(INT32_MIN)));
  const __m256 canonical = _mm256_or_ps(sign, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000)));
  return _mm256_blendv_ps(v, canonical, nan);
}
inline __m128i NarrowHalf8(const float* x) {
  return _mm256_cvtps_ph(CanonicalNaN(_mm256_loadu_ps(x)), _MM_FROUND_TO_NEAREST_INT);
}
inline void NarrowHalf(const float* x, int64_t n, Half* out) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), NarrowHalf8(x + i));
  NarrowHalfPortable(x + i, n - i, out + i);
}
inline void RoundHalf(float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_cvtph_ps(NarrowHalf8(x + i)));
  RoundHalfPortable(x + i, n - i);
}
typedef int32_t VI __attribute__((vector_size(kLanes * sizeof(int32_t))));
inline VI GatherDwords(const uint8_t* base, VI offsets) {
  return (VI)_mm256_i32gather_epi32(reinterpret_cast<const int*>(base), (__m256i)offsets, 1);
}
inline void GatherDwordPairs(const uint8_t* base, VI offsets, const int32_t* /*scalar_offsets*/, VI* out) {
  out[0] = GatherDwords(base, offsets);
  out[1] = GatherDwords(base + 4, offsets);
}
#include "cpu/hc_lowrank_mix_cpu_gemm.inc"
#include "cpu/hc_nbits_cpu_product.inc"
}  // namespace avx2
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,f16c")
#pragma GCC diagnostic push
// GCC 12's own _mm512_cvtps_ph / _mm512_cvtph_ps start from an "undefined" vector that it then
// reports as maybe uninitialized (GCC bug 105593, fixed in GCC 13).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
namespace avx512 {
constexpr int kLanes = 16;
constexpr int MaxVectors(int rows) { return rows <= 2 ? 8 : 4; }
inline __m512 MulAdd(__m512 acc, float x, __m512 w) { return _mm512_fmadd_ps(_mm512_set1_ps(x), w, acc); }
inline __m512 LoadHalf(const Half* src) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src)));
}
inline void WidenHalf(const Half* src, int64_t n, float* dst) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i))));
  }
  WidenHalfPortable(src + i, n - i, dst + i);
}
inline __m512 CanonicalNaN(__m512 v) {
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  const __m512i sign = _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(INT32_MIN));
  const __m512 canonical = _mm512_castsi512_ps(_mm512_or_si512(sign, _mm512_set1_epi32(0x7fc00000)));
  return _mm512_mask_blend_ps(nan, v, canonical);
}
inline __m256i NarrowHalf16(const float* x) {
  return _mm512_cvtps_ph(CanonicalNaN(_mm512_loadu_ps(x)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
inline void NarrowHalf(const float* x, int64_t n, Half* out) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), NarrowHalf16(x + i));
  NarrowHalfPortable(x + i, n - i, out + i);
}
inline void RoundHalf(float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(x + i, _mm512_cvtph_ps(NarrowHalf16(x + i)));
  RoundHalfPortable(x + i, n - i);
}
typedef int32_t VI __attribute__((vector_size(kLanes * sizeof(int32_t))));
inline VI GatherDwords(const uint8_t* base, VI offsets) {
  return (VI)_mm512_i32gather_epi32((__m512i)offsets, base, 1);
}
// The same pairs from 16 plain 8-byte loads and two dword permutes: a zmm gather waits on all its 16
// loads, and on AMD's Zen 4 the gathers alone took about half of a 1-row product (perf, 2-core VM).
inline void GatherDwordPairs(const uint8_t* base, VI /*offsets*/, const int32_t* offsets, VI* out) {
  int64_t q[16];
  for (int l = 0; l < 16; ++l) std::memcpy(&q[l], base + offsets[l], sizeof q[l]);
  const __m512i lo = _mm512_set_epi64(q[7], q[6], q[5], q[4], q[3], q[2], q[1], q[0]);
  const __m512i hi = _mm512_set_epi64(q[15], q[14], q[13], q[12], q[11], q[10], q[9], q[8]);
  const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  const __m512i odd = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
  out[0] = (VI)_mm512_permutex2var_epi32(lo, even, hi);
  out[1] = (VI)_mm512_permutex2var_epi32(lo, odd, hi);
}
#include "cpu/hc_lowrank_mix_cpu_gemm.inc"
#include "cpu/hc_nbits_cpu_product.inc"
}  // namespace avx512
#pragma GCC diagnostic pop
#pragma GCC pop_options
#endif

template <typename T>
NBitsOps<T> PickOps() {
#ifdef HCFUSE_X86_DISPATCH
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("f16c")) {
    return avx512::NBitsOpsFor<T>();
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c") && __builtin_cpu_supports("fma")) {
    return avx2::NBitsOpsFor<T>();
  }
#endif
  return generic::NBitsOpsFor<T>();
}

constexpr int64_t kColumnBlock = 64;   // down/inject columns per task: R + C = 324 in 6 tasks
constexpr int64_t kFeatureBlock = 64;  // features h per up/mix task (C x 64 columns of up)
constexpr int64_t kSpan = 256;         // elementwise work in stack spans of this many floats
constexpr int64_t kNormRows = 4;       // rows per norm task (their sums of squares interleaved)

inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

template <typename T>
class Pass {
 public:
  // Rows [row0, row0 + rows) of the call, rows <= kHcCpuRowsPerPass.
  Pass(const HcNBitsParams& p, const HcNBitsCpuArgs<T>& a, const NBitsOps<T>& ops, float* scratch, int64_t row0,
       int64_t rows)
      : p_(p), m_(p.mix), a_(a), ops_(ops), row0_(row0), rows_(rows) {
    hn_ = scratch;
    g_ = hn_ + rows * m_.width();
    di_ = g_ + rows * m_.width();
    hidden_ = di_ + rows * (m_.R + m_.C);
  }

  void Run(const HcTaskRunner& run) {
    const int64_t C = m_.C;
    run(CeilDiv(rows_, kNormRows) * C, [this, C](int64_t task) { Norm(task / C, task % C); });
    run(CeilDiv(m_.R + C, kColumnBlock), [this](int64_t block) { DownInject(block); });
    run(CeilDiv(m_.H, kFeatureBlock), [this](int64_t block) { UpMix(block); });
  }

 private:
  ProductArgs<T> Args(const HcNBitsProjection<T>& w, int64_t K, int64_t N, const float* x, int64_t n0, int64_t n1,
                      float* out, int64_t ldo) const {
    return {w, K, N, p_.bits, p_.block_size, x, K, rows_, n0, n1, out, ldo};
  }

  // S (prologue), streams_out and hn of branch c for the rows of group `group` (kNormRows rows).
  void Norm(int64_t group, int64_t c) {
    const int64_t C = m_.C, H = m_.H, W = m_.width();
    const int64_t r0 = group * kNormRows, nr = std::min(kNormRows, rows_ - r0);
    float* x[kNormRows];
    for (int64_t r = 0; r < nr; ++r) {
      const int64_t row = row0_ + r0 + r;
      x[r] = hn_ + (r0 + r) * W + c * H;
      ops_.widen(a_.streams + row * W + c * H, H, x[r]);
      if (m_.has_prologue) {
        const float gate = ToFloat(a_.prev_post_gate[row * C + c]);
        float pbo[kSpan];
        for (int64_t h0 = 0; h0 < H; h0 += kSpan) {
          const int64_t n = std::min(kSpan, H - h0);
          ops_.widen(a_.prev_block_output + row * H + h0, n, pbo);
          float* xs = x[r] + h0;
          for (int64_t h = 0; h < n; ++h) xs[h] = xs[h] + gate * pbo[h];
        }
        ops_.round(x[r], H);  // rounding point: S
      }
      if (m_.has_streams_out) ops_.narrow(x[r], H, a_.streams_out + row * W + c * H);
    }
    for (int64_t r = nr; r < kNormRows; ++r) x[r] = x[0];  // padding rows, results unused
    float ss[kNormRows] = {};
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t r = 0; r < kNormRows; ++r) ss[r] += x[r][h] * x[r][h];
    }
    float scale[kSpan];
    for (int64_t h0 = 0; h0 < H; h0 += kSpan) {
      const int64_t n = std::min(kSpan, H - h0);
      ops_.widen(a_.norm_scale + c * H + h0, n, scale);
      for (int64_t r = 0; r < nr; ++r) {
        const float inv_rms = 1.0f / std::sqrt(ss[r] / static_cast<float>(H) + m_.epsilon);
        float* xs = x[r] + h0;
        for (int64_t h = 0; h < n; ++h) xs[h] = xs[h] * inv_rms * scale[h];
        ops_.round(xs, n);  // rounding point: hn
      }
    }
  }

  // Columns [n0, n1) of hn @ down_inject and their epilogue: hidden for down's columns (< R),
  // post_gate for inject's.
  void DownInject(int64_t block) {
    const int64_t R = m_.R, C = m_.C, N = R + C, W = m_.width();
    const int64_t n0 = block * kColumnBlock, n1 = std::min(N, n0 + kColumnBlock);
    ops_.product(Args(a_.down_inject, W, N, hn_, n0, n1, di_ + n0, N));
    for (int64_t r = 0; r < rows_; ++r) {
      float* v = di_ + r * N;
      if (n0 < R) {
        const int64_t e = std::min(n1, R);
        DownToHidden(v + n0, e - n0, hidden_ + r * R + n0);
      }
      if (n1 > R) {
        const int64_t s = std::max(n0, R);
        PostGate(v + s, n1 - s, a_.post_gate + (row0_ + r) * C + (s - R));
      }
    }
  }

  // down (n sums in v, overwritten) -> Z -> SG -> hidden (n values); n <= kColumnBlock.
  void DownToHidden(float* v, int64_t n, float* hidden) const {
    ops_.round(v, n);  // rounding point: down
    for (int64_t j = 0; j < n; ++j) v[j] = m_.silu_alpha * v[j];
    ops_.round(v, n);  // rounding point: Z
    float sg[kColumnBlock];
    std::memcpy(sg, v, n * sizeof(float));
    ops_.sigmoid(sg, n);
    ops_.round(sg, n);  // rounding point: SG
    for (int64_t j = 0; j < n; ++j) hidden[j] = v[j] * sg[j];
    ops_.round(hidden, n);  // rounding point: hidden
  }

  // inject (n sums in v, overwritten) -> post_gate = T(T(sigmoid(T(inject / gate_div))) * gate_mul).
  void PostGate(float* v, int64_t n, T* post_gate) const {
    ops_.round(v, n);  // rounding point: inject
    for (int64_t j = 0; j < n; ++j) v[j] = v[j] / m_.gate_div;
    ops_.round(v, n);  // rounding point: gate logit
    ops_.sigmoid(v, n);
    ops_.round(v, n);  // rounding point: its sigmoid
    for (int64_t j = 0; j < n; ++j) v[j] = v[j] * m_.gate_mul;
    ops_.narrow(v, n, post_gate);  // rounding point: post_gate
  }

  // up = hidden @ up for features [h0, h1) of every branch, then g and pre_output on them.
  void UpMix(int64_t block) {
    const int64_t R = m_.R, C = m_.C, H = m_.H, W = m_.width();
    const int64_t h0 = block * kFeatureBlock, h1 = std::min(H, h0 + kFeatureBlock), n = h1 - h0;
    for (int64_t c = 0; c < C; ++c) {
      ops_.product(Args(a_.up, R, W, hidden_, c * H + h0, c * H + h1, g_ + c * H + h0, W));
    }
    for (int64_t r = 0; r < rows_; ++r) {
      float* gr = g_ + r * W + h0;
      const float* hn = hn_ + r * W + h0;
      float mix[kFeatureBlock] = {};
      for (int64_t c = 0; c < C; ++c) {
        float* v = gr + c * H;
        ops_.round(v, n);  // rounding point: up
        ops_.sigmoid(v, n);
        ops_.round(v, n);  // rounding point: g
        const float* hc = hn + c * H;
        for (int64_t h = 0; h < n; ++h) mix[h] += hc[h] * v[h];  // branches in order c = 0..C-1
      }
      for (int64_t h = 0; h < n; ++h) mix[h] = m_.reduction_scale * mix[h];
      ops_.narrow(mix, n, a_.pre_output + (row0_ + r) * H + h0);  // rounding point: pre_output
    }
  }

  const HcNBitsParams& p_;
  const HcLowRankMixParams& m_;
  const HcNBitsCpuArgs<T>& a_;
  const NBitsOps<T> ops_;
  const int64_t row0_, rows_;
  float* hn_;      // rows x W: S, then hn
  float* g_;       // rows x W: up's sums, then g
  float* di_;      // rows x (R + C): the down/inject sums
  float* hidden_;  // rows x R
};

}  // namespace

template <typename T>
void HcNBitsCpu(const HcNBitsParams& p, const HcNBitsCpuArgs<T>& args, const HcTaskRunner& run, float* scratch) {
  const NBitsOps<T> ops = PickOps<T>();
  for (int64_t row0 = 0; row0 < p.mix.rows; row0 += kHcCpuRowsPerPass) {
    Pass<T>(p, args, ops, scratch, row0, std::min(kHcCpuRowsPerPass, p.mix.rows - row0)).Run(run);
  }
}

template void HcNBitsCpu<float>(const HcNBitsParams&, const HcNBitsCpuArgs<float>&, const HcTaskRunner&, float*);
template void HcNBitsCpu<Half>(const HcNBitsParams&, const HcNBitsCpuArgs<Half>&, const HcTaskRunner&, float*);
template void HcNBitsCpu<BFloat16>(const HcNBitsParams&, const HcNBitsCpuArgs<BFloat16>&, const HcTaskRunner&,
                                   float*);

}  // namespace hcfuse
