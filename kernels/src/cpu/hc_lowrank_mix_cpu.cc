// CPU kernel of HyperConnectionLowRankMix; the order of operations is hcfuse/reference.py's (see the
// header; float32 sums down in fixed slices of k). Phases per pass of up to kHcCpuRowsPerPass rows,
// each a set of independent tasks over output elements handed to the task runner (ORT's thread pool):
//   1. S, streams_out and hn per (row, branch);
//   2. down -> Z -> SG -> hidden and inject -> post_gate per (row tile, block of output columns);
//      float32: the down slices per (row tile, group of 4 slices), then one phase adding them in
//      order and computing Z, SG and hidden;
//   3. up -> g and pre_output per (row tile, block of features h, all C branches); at 1-4 rows up in
//      two parts of its rows (runs of 10-20 KB), then g and pre_output per block of features.
// The products run in hc_lowrank_mix_cpu_gemm.inc, compiled for AVX-512, AVX2 and plain x86-64 (or
// the target's default) and picked at run time; the variants differ only in FMA (see the header).
// At 1-4 rows they are bound by reading the weights from memory, which goes fastest as several long
// sequential streams: up in halves of its rows (any T), float32's down slices two or four at once;
// 16-bit down goes through tiles that prefetch the next tile as they consume this one.
#include "cpu/hc_lowrank_mix_cpu.h"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <utility>

// Per-instruction-set variants through `#pragma GCC target` (GCC; elsewhere only the plain one).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
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
  // The block computed after this one by the same task (nullptr: none): the weight at its first
  // column and its column count, whose first rows this block prefetches at its end; and whether the
  // block before did so for this one.
  const T* next = nullptr;
  int64_t next_cols = 0;
  bool first_prefetched = false;
  // K's rows of k in slices of slice_k (0: one slice), slice j summed on its own into out + j * slice_out.
  int64_t slice_k = 0;
  int64_t slice_out = 0;
};

// One instruction set's products and elementwise spans (hc_lowrank_mix_cpu_gemm.inc).
template <typename T>
struct CpuOps {
  void (*gemm)(const GemmArgs<T>&);
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

namespace generic {
constexpr int kLanes = 16 / sizeof(float);  // SSE2 (x86-64's baseline), 16 registers
constexpr int MaxVectors(int rows) { return rows == 1 ? 8 : rows == 2 ? 4 : 2; }
inline void WidenHalf(const Half* src, int64_t n, float* dst) { WidenHalfPortable(src, n, dst); }
inline void NarrowHalf(const float* x, int64_t n, Half* out) { NarrowHalfPortable(x, n, out); }
inline void RoundHalf(float* x, int64_t n) { RoundHalfPortable(x, n); }
typedef float LaneVector __attribute__((vector_size(kLanes * sizeof(float))));
inline LaneVector MulAdd(LaneVector acc, float x, LaneVector w) { return acc + x * w; }  // no FMA in SSE2
inline LaneVector LoadHalf(const Half* src) {
  LaneVector v;
  for (int i = 0; i < kLanes; ++i) v[i] = ToFloat(src[i]);
  return v;
}
#include "cpu/hc_lowrank_mix_cpu_gemm.inc"
}  // namespace generic

#ifdef HCFUSE_X86_DISPATCH
#pragma GCC push_options
#pragma GCC target("avx2,f16c,fma")
namespace avx2 {
constexpr int kLanes = 8;  // 16 registers: 8 accumulators, the rest for weights, x and products
constexpr int MaxVectors(int rows) { return rows == 1 ? 8 : rows == 2 ? 4 : 2; }
// F16C widening is exact, as ToFloat is (a NaN's payload is kept; only its quiet bit may differ,
// and no NaN reaches a 16-bit output with its payload: FromFloat<Half> makes every NaN 0x7e00).
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
// The hardware narrowing rounds to nearest even as FromFloat<Half> does (subnormals and overflow
// to infinity included); NaN lanes are first made the NaN FromFloat<Half> gives (0x7e00 | sign),
// whose fp32 form sign | 0x7fc00000 the hardware narrows to exactly that.
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
#include "cpu/hc_lowrank_mix_cpu_gemm.inc"
}  // namespace avx2
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,f16c")
#pragma GCC diagnostic push
// GCC 12's own _mm512_cvtps_ph / _mm512_cvtph_ps start from an "undefined" vector that it then
// reports as maybe uninitialized (GCC bug 105593, fixed in GCC 13).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
namespace avx512 {
constexpr int kLanes = 16;  // 32 registers
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
// As in avx2:: (NaN lanes made FromFloat<Half>'s NaN first).
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
#include "cpu/hc_lowrank_mix_cpu_gemm.inc"
}  // namespace avx512
#pragma GCC diagnostic pop
#pragma GCC pop_options
#endif

// The widest instruction set this CPU (and OS) runs (float32 bits differ between FMA and SSE2).
template <typename T>
CpuOps<T> PickOps() {
#ifdef HCFUSE_X86_DISPATCH
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("f16c")) {
    return avx512::Ops<T>();
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c") && __builtin_cpu_supports("fma")) {
    return avx2::Ops<T>();
  }
#endif
  return generic::Ops<T>();
}

constexpr int64_t kColumnBlock = 160;   // down / inject output columns per task: R = 320 in two halves
// Features h per up/mix task (C * that many output columns) from 5 rows: 128; 1-4 rows stream up in
// kUpParts parts and compute g and pre_output in tasks of 256 features.
constexpr int64_t kFeatureBlock = 128;
constexpr int64_t kFeatureBlockMax = 256;
constexpr int64_t kSpan = 256;          // elementwise work in stack spans of this many floats
// 1-4 rows: up in this many parts of its rows, a task each (runs of 20 KB at the Qwen shape, 10 KB
// for 16-bit; float32: up in 4 parts measured 9-13% slower on 2 threads, bench/cpu_stream_micro.cc)
constexpr int64_t kUpParts = 2;
constexpr int64_t kNormRows = 4;        // rows per norm task (their sums of squares interleaved)

inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

template <typename T>
class Pass {
 public:
  // Rows [row0, row0 + rows) of the call, rows <= kHcCpuRowsPerPass.
  Pass(const HcLowRankMixParams& p, const HcLowRankMixCpuArgs<T>& a, const CpuOps<T>& ops, float* scratch,
       int64_t row0, int64_t rows)
      : p_(p), a_(a), ops_(ops), row0_(row0), rows_(rows), tiles_(CeilDiv(rows, kHcCpuRowTile)) {
    hn_ = scratch;
    g_ = hn_ + rows * p.width();
    hidden_ = g_ + rows * p.width();
    down_part_ = hidden_ + rows * p.R;
  }

  void Run(const HcTaskRunner& run) {
    const int64_t C = p_.C;
    run(CeilDiv(rows_, kNormRows) * C, [this, C](int64_t task) { Norm(task / C, task % C); });
    const int64_t inject_blocks = CeilDiv(C, kColumnBlock);
    if constexpr (kSplitK) {  // float32: down's k in slices, 2 or 4 to a task, added in order afterwards
      const int64_t down_tasks = CeilDiv(down_.count, down_.per_task) * down_blocks_;
      run((down_tasks + inject_blocks) * tiles_, [this, down_tasks](int64_t task) {
        const int64_t block = task / tiles_, tile = task % tiles_;
        if (block < down_tasks) {
          DownSlices(block / down_blocks_, block % down_blocks_, tile);
        } else {
          DownInject(CeilDiv(p_.R, kColumnBlock) + block - down_tasks, tile);
        }
      });
      run(tiles_, [this](int64_t tile) { DownEpilogue(tile); });
    } else {
      const int64_t column_blocks = CeilDiv(p_.R, kColumnBlock) + inject_blocks;
      run(column_blocks * tiles_, [this](int64_t task) { DownInject(task / tiles_, task % tiles_); });
    }
    const int64_t feature_blocks = CeilDiv(p_.H, feature_block_);
    if (stream_up_) {  // 1-4 rows: up in kUpParts parts of its rows, then g and pre_output
      run(kUpParts, [this](int64_t part) { UpPart(part); });
      run(feature_blocks, [this](int64_t block) {
        const int64_t h0 = block * feature_block_;
        MixRows(0, rows_, h0, std::min(feature_block_, p_.H - h0));
      });
    } else {
      run(feature_blocks * tiles_, [this](int64_t task) { UpMix(task / tiles_, task % tiles_); });
    }
  }

 private:
  // S (prologue), streams_out and hn of branch c for the rows of group `group`
  // (kNormRows rows).
  void Norm(int64_t group, int64_t c) {
    const int64_t C = p_.C, H = p_.H, W = p_.width();
    const int64_t r0 = group * kNormRows, nr = std::min(kNormRows, rows_ - r0);
    float* x[kNormRows];
    for (int64_t r = 0; r < nr; ++r) {
      const int64_t row = row0_ + r0 + r;
      x[r] = hn_ + (r0 + r) * W + c * H;
      ops_.widen(a_.streams + row * W + c * H, H, x[r]);
      if (p_.has_prologue) {
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
      if (p_.has_streams_out) ops_.narrow(x[r], H, a_.streams_out + row * W + c * H);
    }
    // sum of squares, sequential over h per row; the tile's rows interleaved (independent chains)
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
        const float inv_rms = 1.0f / std::sqrt(ss[r] / static_cast<float>(H) + p_.epsilon);
        float* xs = x[r] + h0;
        for (int64_t h = 0; h < n; ++h) xs[h] = xs[h] * inv_rms * scale[h];
        ops_.round(xs, n);  // rounding point: hn
      }
    }
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
    const int64_t n = n1 - n0;
    float acc[kHcCpuRowTile * kColumnBlock];
    ops_.gemm({hn_ + r0 * W, W, nr, down ? a_.down_weight : a_.inject_weight, N, W, n0, n1, acc, kColumnBlock});
    for (int64_t r = 0; r < nr; ++r) {
      float* v = acc + r * kColumnBlock;
      if (down) {
        float sg[kColumnBlock];
        DownToHidden(v, sg, n, hidden_ + (r0 + r) * R + n0);
        continue;
      }
      ops_.round(v, n);  // rounding point: inject
      InjectToPostGate(v, n, a_.post_gate + (row0_ + r0 + r) * C + n0);
    }
  }

  // inject (n rounded values in v, overwritten) -> post_gate, rounded where the stock Div, Sigmoid and
  // Mul round.
  void InjectToPostGate(float* v, int64_t n, T* post_gate) const {
    for (int64_t j = 0; j < n; ++j) v[j] = v[j] / p_.gate_div;
    ops_.round(v, n);  // rounding point: gate logit
    ops_.sigmoid(v, n);
    ops_.round(v, n);  // rounding point: sigmoid of the gate logit
    for (int64_t j = 0; j < n; ++j) v[j] = v[j] * p_.gate_mul;
    ops_.narrow(v, n, post_gate);  // rounding point: post_gate
  }

  // down (n sums in v, overwritten) -> Z -> SG (in sg) -> hidden (n values).
  void DownToHidden(float* v, float* sg, int64_t n, float* hidden) const {
    ops_.round(v, n);  // rounding point: down
    for (int64_t j = 0; j < n; ++j) v[j] = p_.silu_alpha * v[j];
    ops_.round(v, n);  // rounding point: Z
    std::memcpy(sg, v, n * sizeof(float));
    ops_.sigmoid(sg, n);
    ops_.round(sg, n);  // rounding point: SG
    for (int64_t j = 0; j < n; ++j) hidden[j] = v[j] * sg[j];
    ops_.round(hidden, n);  // rounding point: hidden
  }

  // up = hidden @ up_weight, g and pre_output for features [h0, h1) of every branch, row tile `tile`.
  void UpMix(int64_t block, int64_t tile) {
    const int64_t R = p_.R, C = p_.C, H = p_.H, W = p_.width();
    const int64_t r0 = tile * kHcCpuRowTile, nr = std::min(kHcCpuRowTile, rows_ - r0);
    const int64_t h0 = block * feature_block_, h1 = std::min(H, h0 + feature_block_), n = h1 - h0;
    float* g = g_ + r0 * W;
    for (int64_t c = 0; c < C; ++c) {
      const T* next = c + 1 < C ? a_.up_weight + (c + 1) * H + h0 : nullptr;
      ops_.gemm({hidden_ + r0 * R, R, nr, a_.up_weight, W, R, c * H + h0, c * H + h1, g + c * H + h0, W, next, n,
                 c > 0});
    }
    MixRows(r0, nr, h0, n);
  }

  // g and pre_output for features [h0, h0 + n) of rows [r0, r0 + nr) of the pass, from up's sums in g_.
  void MixRows(int64_t r0, int64_t nr, int64_t h0, int64_t n) {
    const int64_t C = p_.C, H = p_.H, W = p_.width();
    for (int64_t r = 0; r < nr; ++r) {
      float* gr = g_ + (r0 + r) * W + h0;
      const float* hn = hn_ + (r0 + r) * W + h0;
      float mix[kFeatureBlockMax] = {};
      for (int64_t c = 0; c < C; ++c) {
        float* v = gr + c * H;
        ops_.round(v, n);  // rounding point: up
        ops_.sigmoid(v, n);
        ops_.round(v, n);  // rounding point: g
        const float* hc = hn + c * H;
        for (int64_t h = 0; h < n; ++h) mix[h] += hc[h] * v[h];  // branches in order c = 0..C-1
      }
      for (int64_t h = 0; h < n; ++h) mix[h] = p_.reduction_scale * mix[h];
      ops_.narrow(mix, n, a_.pre_output + (row0_ + r0 + r) * H + h0);  // rounding point: pre_output
    }
  }

  // --- float32 (kSplitK): the down product in slices of k; 1-4 rows of any type: up in parts. ---

  // A product's K in `count` slices of `len` rows of k (the last one shorter), `per_task` to a task.
  struct Slices {
    int64_t len, count, per_task;
    Slices(int64_t K, int64_t max_count, int64_t per_task_)
        : len(CeilDiv(K, max_count)), count(CeilDiv(K, len)), per_task(per_task_) {}
  };

  // Slices [group * per_task, ...) of hn @ down_weight, columns of block `block`, each into its
  // down_part_ slot.
  void DownSlices(int64_t group, int64_t block, int64_t tile) {
    const int64_t R = p_.R, W = p_.width();
    const int64_t r0 = tile * kHcCpuRowTile, nr = std::min(kHcCpuRowTile, rows_ - r0);
    const int64_t s0 = group * down_.per_task, s1 = std::min(down_.count, s0 + down_.per_task);
    const int64_t k0 = s0 * down_.len, k1 = std::min(W, s1 * down_.len);
    const int64_t n0 = block * down_block_, n1 = std::min(R, n0 + down_block_);
    GemmArgs<T> g{hn_ + r0 * W + k0, W, nr, a_.down_weight + k0 * R, R, k1 - k0, n0, n1,
                  down_part_ + (s0 * rows_ + r0) * R + n0, R};
    g.slice_k = down_.len;
    g.slice_out = rows_ * R;
    ops_.gemm(g);
  }

  // down = the slices' sums added in order, then Z, SG and hidden, for row tile `tile`.
  void DownEpilogue(int64_t tile) {
    const int64_t R = p_.R;
    const int64_t r0 = tile * kHcCpuRowTile, nr = std::min(kHcCpuRowTile, rows_ - r0);
    for (int64_t r = r0; r < r0 + nr; ++r) {
      float* hidden = hidden_ + r * R;
      for (int64_t n0 = 0; n0 < R; n0 += kSpan) {
        const int64_t n = std::min(kSpan, R - n0);
        float z[kSpan], sg[kSpan];
        for (int64_t j = 0; j < n; ++j) z[j] = down_part_[r * R + n0 + j];
        for (int64_t s = 1; s < down_.count; ++s)
          for (int64_t j = 0; j < n; ++j) z[j] += down_part_[(s * rows_ + r) * R + n0 + j];
        DownToHidden(z, sg, n, hidden + n0);
      }
    }
  }

  // Part `part` of kUpParts of up = hidden @ up_weight's columns (1-4 rows, one tile) into g_: a run of
  // 20 KB (16-bit: 10 KB) of each weight row at the Qwen shape, streamed four rows of k at a time
  // (GemmBlock); each column's sum still sequential over k, as everywhere.
  void UpPart(int64_t part) {
    const int64_t W = p_.width();
    const int64_t len = CeilDiv(CeilDiv(W, kUpParts), 16) * 16;  // whole vectors of any width
    const int64_t n0 = std::min(W, part * len), n1 = std::min(W, n0 + len);
    if (n0 < n1) ops_.gemm({hidden_, p_.R, rows_, a_.up_weight, W, p_.R, n0, n1, g_ + n0, W});
  }

  static constexpr bool kSplitK = std::is_same_v<T, float>;

  const HcLowRankMixParams& p_;
  const HcLowRankMixCpuArgs<T>& a_;
  const CpuOps<T> ops_;
  const int64_t row0_, rows_, tiles_;
  const int64_t feature_block_ = rows_ <= 4 ? kFeatureBlockMax : kFeatureBlock;
  // 1-4 rows: up in kUpParts parts of its rows (any T: each column's sum stays sequential over k)
  const bool stream_up_ = rows_ <= 4;
  const int64_t down_block_ = kSplitK && rows_ <= 4 ? p_.R : kColumnBlock;
  const int64_t down_blocks_ = CeilDiv(p_.R, down_block_);
  // down: up to 8 slices of W (1280 rows each at the Qwen shape), read 4 slices to a task (4 streams)
  // at 1-2 rows, 2 at 3-4 rows (down/inject at 4 rows 1.8 ms against 2.3 with 4 slices; at 1 row 1.1
  // against 0.96, at 2 rows 1.34 against 1.19; bench/cpu_stream_micro.cc)
  const Slices down_{p_.width(), kHcCpuDownSlices, rows_ <= 2 ? 4 : 2};
  float* hn_;         // rows x W: S, then hn
  float* g_;          // rows x W: up accumulators, then g
  float* hidden_;     // rows x R
  float* down_part_;  // float32: kHcCpuDownSlices x rows x R, the down product's slices
};

}  // namespace

template <typename T>
void HcLowRankMixCpu(const HcLowRankMixParams& params, const HcLowRankMixCpuArgs<T>& args, const HcTaskRunner& run,
                     float* scratch) {
  const CpuOps<T> ops = PickOps<T>();
  for (int64_t row0 = 0; row0 < params.rows; row0 += kHcCpuRowsPerPass) {
    Pass<T>(params, args, ops, scratch, row0, std::min(kHcCpuRowsPerPass, params.rows - row0)).Run(run);
  }
}

template void HcLowRankMixCpu<float>(const HcLowRankMixParams&, const HcLowRankMixCpuArgs<float>&,
                                     const HcTaskRunner&, float*);
template void HcLowRankMixCpu<Half>(const HcLowRankMixParams&, const HcLowRankMixCpuArgs<Half>&, const HcTaskRunner&,
                                    float*);
template void HcLowRankMixCpu<BFloat16>(const HcLowRankMixParams&, const HcLowRankMixCpuArgs<BFloat16>&,
                                        const HcTaskRunner&, float*);

}  // namespace hcfuse
