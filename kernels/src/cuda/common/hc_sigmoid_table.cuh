// g = RoundToT(Sigmoid(x)) for a bfloat16 x by table lookup: the gate epilogue's sigmoids, where x is the
// rounded up projection, so one of 2^16 bit patterns. The table holds Sigmoid's own rounded results, filled
// by each block into shared memory with Sigmoid itself (hc_common.cuh), so a lookup gives the same bits as
// computing it; only the magnitudes where the rounded result changes are stored:
//   |x| < 2^-9 (magnitude bits below kLo): g = 0.5 for either sign (0.5 -/+ |x| / 4 is within half a bf16
//     ulp of 0.5; the true threshold is 2^-8), stored once per sign as the magnitude kLo - 1;
//   |x| >= 128 (kHi, infinities included): g = 1 for x > 0, +0 for x < 0 (expf(128) is inf in fp32),
//     stored once per sign as the magnitude kHi.
// So the lookup clamps the magnitude to [kLo - 1, kHi]; two patterns at once, as the two 16-bit halves of a
// 32-bit word (__vmaxu2 / __vminu2: one instruction each on sm_90, emulated before). Entries are the rounded g
// in fp32, ready for the multiply-add. NaN inputs are not looked up (the caller computes Sigmoid for them).
// Checked against RoundToT(Sigmoid(x)) for every non-NaN bfloat16 x (tests/cuda/sigmoid_in_range_check.cu).
// Cost: 4100 entries (16.4 KB) and 4100 sigmoids a block.
#pragma once

#include <cuda_bf16.h>

#include "cuda/common/hc_common.cuh"

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
__device__ __forceinline__ void FillBf16SigmoidTable(float* table) {
  using Table = Bf16SigmoidTable;
  for (int i = threadIdx.x; i < Table::kEntries; i += blockDim.x) {
    const unsigned negative = i >= Table::kPerSign;
    const unsigned magnitude = Table::kLo - 1 + (i - negative * Table::kPerSign);
    const float x = __uint_as_float((negative << 31) | (magnitude << 16));
    table[i] = RoundToT<__nv_bfloat16>(Sigmoid(x));
  }
}

// The largest magnitude of the two bfloat16 in each word, per half (above kMaxNotNaN: a NaN among them).
__device__ __forceinline__ unsigned Bf16MagnitudesMax(unsigned max_so_far, unsigned word) {
  return __vmaxu2(word & 0x7FFF7FFFu, max_so_far);
}

// RoundToT<bf16>(Sigmoid(x)) in fp32 for the two bfloat16 x of a word (low half first; neither NaN).
__device__ __forceinline__ void Bf16SigmoidPairFromTable(const float* table, unsigned word, float& lo, float& hi) {
  using Table = Bf16SigmoidTable;
  constexpr unsigned kLo2 = (Table::kLo - 1) * 0x10001u, kHi2 = Table::kHi * 0x10001u;
  const unsigned m = __vminu2(__vmaxu2(word & 0x7FFF7FFFu, kLo2), kHi2);  // both magnitudes clamped to [kLo - 1, kHi]
  const unsigned index = m + ((word >> 15) & 0x10001u) * Table::kPerSign;  // per half: < 2^16, no carry
  const float* base = table - (Table::kLo - 1);
  lo = base[index & 0xFFFFu];
  hi = base[index >> 16];
}

// g[j] = RoundToT(Sigmoid(up[j])) for a vector of bfloat16 up: from the table, two at a time, or computed where
// one of them is NaN.
template <int VEC>
__device__ __forceinline__ void GFromTable(const float* table, const Vec<__nv_bfloat16, VEC>& up, float (&g)[VEC]) {
  constexpr int kWords = (VEC + 1) / 2;
  unsigned words[kWords] = {};
  memcpy(words, &up, sizeof(up));
  unsigned largest = 0;  // per half
#pragma unroll
  for (int k = 0; k < kWords; ++k) largest = Bf16MagnitudesMax(largest, words[k]);
  if (max(largest & 0xFFFFu, largest >> 16) > Bf16SigmoidTable::kMaxNotNaN) {
#pragma unroll
    for (int j = 0; j < VEC; ++j) g[j] = RoundToT<__nv_bfloat16>(Sigmoid(ToFloat(up.v[j])));
    return;
  }
  float pairs[2 * kWords];
#pragma unroll
  for (int k = 0; k < kWords; ++k) Bf16SigmoidPairFromTable(table, words[k], pairs[2 * k], pairs[2 * k + 1]);
#pragma unroll
  for (int j = 0; j < VEC; ++j) g[j] = pairs[j];
}

}  // namespace cuda
}  // namespace hcfuse
