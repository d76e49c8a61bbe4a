// CPU kernel of HyperConnectionLowRankMix over raw pointers (no ONNX Runtime types).
//
// Follows hcfuse/reference.py operation for operation: fp32 arithmetic, rounding to T at each of the
// contract's rounding points (docs/NUMERICS.md), sequential accumulation over k for every dot product
// and the norm's sum of squares, branches summed in order c = 0..C-1 for pre_output, and
// sigmoid(x) = 1 / (1 + e) with e = exp(-x) correctly rounded to fp32. The products' multiply-adds are
// fused (FMA) under AVX2+FMA and AVX-512 (separate under plain SSE2); everything else is built with
// -ffp-contract=off. For float16 and
// bfloat16 the product of two rounded 16-bit values is exact in fp32, so FMA gives the reference's
// bits (bfloat16: unless a product falls outside fp32's normal range). For float32 FMA skips the
// product's rounding, and the down product (K = C*H) is summed in kHcCpuDownSlices fixed slices of k
// (ceil(K / 8) rows each; each slice sequential from 0, the slices added in order), which lets 1-4
// rows read down_weight as several sequential streams; pre_output and post_gate are then within a
// few tens of scaled ulps of the reference (tests/test_kernels_cpu.py asserts 32; the Qwen size
// measures <= 16). The slices are the same at every row count, thread count and path.
//
// Work is split over OUTPUT elements only, never over a sum (float32's down slices are fixed parts of
// the sum, not a split of work): the norm per (row, branch), the down/inject products per block of
// output columns (float32: per group of down slices), the up product, g and pre_output per block of
// features h (all C branches of it). Rows go in tiles of kHcCpuRowTile that share each weight read.
// How a product walks its weight (tiles of k, or k outer for 1-4 rows over long weight rows) and how
// many features a task takes (128 or 256) vary with the row count; no column's arithmetic does.
// Every output's sequence of operations is fixed, whatever the tiling, blocking or thread (on one
// instruction set), so a row gives the same bits at any batch size and with any number of threads.
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>

#include "hcfuse/hc_params.h"

namespace hcfuse {

// 16-bit storage types, bit-compatible with Ort::Float16_t / Ort::BFloat16_t.
struct Half {
  uint16_t bits;
};
struct BFloat16 {
  uint16_t bits;
};

inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Exact widening (subnormals, infinities and NaN payloads kept).
inline float ToFloat(float x) { return x; }
inline float ToFloat(BFloat16 x) { return BitsFloat(static_cast<uint32_t>(x.bits) << 16); }
inline float ToFloat(Half x) {
  const uint32_t shifted_exp = 0x7c00u << 13;
  uint32_t u = (static_cast<uint32_t>(x.bits) & 0x7fffu) << 13;
  const uint32_t exp = u & shifted_exp;
  u += (127u - 15u) << 23;
  if (exp == shifted_exp) {
    u += (128u - 16u) << 23;  // Inf / NaN
  } else if (exp == 0) {      // zero / subnormal: renormalise through an fp32 subtraction (exact)
    u += 1u << 23;
    u = FloatBits(BitsFloat(u) - BitsFloat(113u << 23));
  }
  return BitsFloat(u | (static_cast<uint32_t>(x.bits) & 0x8000u) << 16);
}

// Narrowing with round to nearest even; NaN stays a (quiet) NaN, overflow gives infinity.
template <typename T>
T FromFloat(float f);

template <>
inline float FromFloat<float>(float f) {
  return f;
}

template <>
inline BFloat16 FromFloat<BFloat16>(float f) {
  const uint32_t u = FloatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return BFloat16{static_cast<uint16_t>((u >> 16) | 0x40u)};
  return BFloat16{static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16)};
}

template <>
inline Half FromFloat<Half>(float f) {
  uint32_t u = FloatBits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  u &= 0x7fffffffu;
  uint32_t o;
  if (u >= (127u + 16u) << 23) {  // >= 65536, Inf or NaN
    o = u > 0x7f800000u ? 0x7e00u : 0x7c00u;
  } else if (u < 113u << 23) {  // below the smallest normal half: the fp32 add rounds to even
    const float magic = BitsFloat(126u << 23);
    o = FloatBits(BitsFloat(u) + magic) - (126u << 23);
  } else {
    const uint32_t mant_odd = (u >> 13) & 1u;
    u += ((15u - 127u) << 23) + 0xfffu + mant_odd;  // 65520 and up carry into Inf
    o = u >> 13;
  }
  return Half{static_cast<uint16_t>(o | sign)};
}

// One of the contract's rounding points: fp32 -> T -> fp32.
template <typename T>
inline float RoundToT(float f) {
  return ToFloat(FromFloat<T>(f));
}

template <typename T>
struct HcLowRankMixCpuArgs {
  const T* streams = nullptr;  // (rows, C*H)
  const T* norm_scale = nullptr;
  const T* down_weight = nullptr;
  const T* up_weight = nullptr;
  const T* inject_weight = nullptr;
  const T* prev_block_output = nullptr;  // (rows, H), with params.has_prologue
  const T* prev_post_gate = nullptr;     // (rows, C)
  T* pre_output = nullptr;               // (rows, H)
  T* post_gate = nullptr;                // (rows, C)
  T* streams_out = nullptr;              // (rows, C*H), with params.has_streams_out
};

// run(num_tasks, fn) must call fn(task) once for every task in [0, num_tasks), in any order and on
// any threads; the serial loop is a valid runner.
using HcTaskRunner = std::function<void(int64_t num_tasks, const std::function<void(int64_t task)>& fn)>;

// Rows processed together (sharing each widened weight tile); results do not depend on it.
inline constexpr int64_t kHcCpuRowTile = 64;
// Rows per pass of the three phases: bounds the scratch (about 5 MB at the Qwen shape).
inline constexpr int64_t kHcCpuRowsPerPass = 64;

// Slices of k the float32 down product is summed in (each sequentially over its k, then added in order).
inline constexpr int64_t kHcCpuDownSlices = 8;

// fp32 scratch HcLowRankMixCpu needs for one pass: hn and g (rows x C*H), hidden (rows x R), and for
// float32 the down product's slices (kHcCpuDownSlices x rows x R).
inline int64_t HcLowRankMixCpuScratchFloats(const HcLowRankMixParams& p) {
  const int64_t rows = p.rows < kHcCpuRowsPerPass ? p.rows : kHcCpuRowsPerPass;
  return rows * (2 * p.width() + (1 + kHcCpuDownSlices) * p.R);
}

// Computes the op for all params.rows rows. params comes from ResolveHcLowRankMixParams; scratch
// holds HcLowRankMixCpuScratchFloats(params) floats. Nothing is read or written when rows == 0.
template <typename T>
void HcLowRankMixCpu(const HcLowRankMixParams& params, const HcLowRankMixCpuArgs<T>& args, const HcTaskRunner& run,
                     float* scratch);

extern template void HcLowRankMixCpu<float>(const HcLowRankMixParams&, const HcLowRankMixCpuArgs<float>&,
                                            const HcTaskRunner&, float*);
extern template void HcLowRankMixCpu<Half>(const HcLowRankMixParams&, const HcLowRankMixCpuArgs<Half>&,
                                           const HcTaskRunner&, float*);
extern template void HcLowRankMixCpu<BFloat16>(const HcLowRankMixParams&, const HcLowRankMixCpuArgs<BFloat16>&,
                                               const HcTaskRunner&, float*);

}  // namespace hcfuse
