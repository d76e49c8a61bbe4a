// g = RoundToT(Sigmoid(x)) for a bfloat16 x by table lookup: the gate epilogue's sigmoids, where x is the
// rounded up projection, so one of 2^16 bit patterns. The table holds Sigmoid's own rounded results, filled
// by each block into shared memory with Sigmoid itself (hc_common.cuh), so a lookup gives the same bits as
// computing it; only the magnitudes where the rounded result changes are stored:
//   |x| < 2^-9 (magnitude bits below kLo): g = 0.5 for either sign (0.5 -/+ |x| / 4 is within half a bf16
//     ulp of 0.5; the true threshold is 2^-8), stored once per sign as the magnitude kLo - 1;
//   |x| >= 128 (kHi, infinities included): g = 1 for x > 0, +0 for x < 0 (expf(128) is inf in fp32),
//     stored once per sign as the magnitude kHi.
// So the lookup clamps the magnitude to [kLo - 1, kHi]. NaN inputs are not looked up (the caller computes
// Sigmoid for them). Checked against RoundToT(Sigmoid(x)) for every non-NaN bfloat16 x
// (tests/cuda/sigmoid_in_range_check.cu). Cost: 4100 entries (8.2 KB) and 4100 sigmoids a block, against
// ~15 instructions an element saved (measured in bench/README.md, issue 14).
#pragma once

#include <cuda_bf16.h>

#include "cuda/hc_common.cuh"

namespace hcfuse {
namespace cuda {

struct Bf16SigmoidTable {
  static constexpr unsigned kLo = 0x3B00;                // bits of 2^-9
  static constexpr unsigned kHi = 0x4300;                // bits of 128
  static constexpr int kPerSign = kHi - (kLo - 1) + 1;   // magnitudes kLo - 1 ... kHi
  static constexpr int kEntries = 2 * kPerSign;          // positive x, then negative x
  static constexpr unsigned kMaxNotNaN = 0x7F80;         // magnitude bits of inf; above: NaN
};

// Fills table[Bf16SigmoidTable::kEntries] (shared memory) with every thread of the block; the caller
// synchronizes the block before the first lookup.
__device__ __forceinline__ void FillBf16SigmoidTable(unsigned short* table) {
  using Table = Bf16SigmoidTable;
  for (int i = threadIdx.x; i < Table::kEntries; i += blockDim.x) {
    const unsigned negative = i >= Table::kPerSign;
    const unsigned magnitude = Table::kLo - 1 + (i - negative * Table::kPerSign);
    const float x = __uint_as_float((negative << 31) | (magnitude << 16));
    table[i] = __bfloat16_as_ushort(__float2bfloat16_rn(Sigmoid(x)));
  }
}

// RoundToT<bf16>(Sigmoid(x)) in fp32 for the bfloat16 x with these bits (not NaN).
__device__ __forceinline__ float Bf16SigmoidFromTable(const unsigned short* table, unsigned bits) {
  using Table = Bf16SigmoidTable;
  const unsigned magnitude = min(max(bits & 0x7FFFu, Table::kLo - 1), Table::kHi);
  const unsigned index = (bits >> 15) * Table::kPerSign + magnitude - (Table::kLo - 1);
  return __uint_as_float(static_cast<unsigned>(table[index]) << 16);
}

}  // namespace cuda
}  // namespace hcfuse
