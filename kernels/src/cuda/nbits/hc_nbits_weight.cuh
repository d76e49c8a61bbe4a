// A quantized weight as every CUDA kernel of the quantized op makes it: MatMulNBits' (q - zero point) * scale,
// with the CPU kernel's arithmetic (q and the zero point widened to fp32, a zero point of T exactly, one
// __fsub_rn and one __fmul_rn, never contracted).
#pragma once

#include <cstdint>

#include "cpu/hc_nbits_cpu.h"  // HcNBitsProjection
#include "cuda/common/hc_common.cuh"

namespace hcfuse {
namespace cuda {

// The zero point of column n's quantization block b as fp32: of T, packed (BITS a value), or 2^(BITS-1).
template <typename T, int BITS>
__device__ __forceinline__ float ZeroPoint(const HcNBitsProjection<T>& w, int64_t n, int64_t b, int64_t k_blocks) {
  if (w.zero_points_t != nullptr) return ToFloat(w.zero_points_t[n * k_blocks + b]);
  if (w.zero_points != nullptr) {
    const int64_t row_bytes = (k_blocks * BITS + 7) / 8;
    if constexpr (BITS == 8) {
      return static_cast<float>(w.zero_points[n * row_bytes + b]);
    } else {
      return static_cast<float>((w.zero_points[n * row_bytes + b / 2] >> (4 * (b % 2))) & 15);
    }
  }
  return static_cast<float>(1 << (BITS - 1));
}

// (q - zero) * scale in fp32.
__device__ __forceinline__ float QuantizedWeight(uint32_t q, float zero, float scale) {
  return __fmul_rn(__fsub_rn(static_cast<float>(q), zero), scale);
}

}  // namespace cuda
}  // namespace hcfuse
