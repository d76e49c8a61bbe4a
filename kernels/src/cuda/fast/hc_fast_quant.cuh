// The quantized op's weights on the fast path's tensor cores (hc_fast_path.cu, QUANT kernels): 4-bit
// MatMulNBits bytes read from global memory into registers and turned into mma fragments there.
//
// k runs in groups of 32 (16 bytes of a column, within one quantization block: block_size >= 32). In a
// group, lane t of a quad (t = lane % 4) holds the column's bytes 4t .. 4t + 3 (k = 8t .. 8t + 7, even k in
// the low nibbles). Its mma k pairs of step s (s = 0, 1), 2t, 2t + 1 and 2t + 8, 2t + 9, stand for k
// 8t + 4s + {0, 1} and 8t + 4s + {2, 3}: the activations are read with the same map (one 8-byte load of a
// row at 8t + 4s), so every product pairs an activation with its own weight and only the order of the
// group's sum differs from mma's k order.
//
// A weight enters as q - z, exact in T (|q - z| <= 15), so each product is exact in fp32; a group's two
// steps accumulate from 0 on the tensor cores and the group's sum then goes into the column's fp32
// accumulator times its block's scale in one fmaf (sum_k x (q - z) s = s sum_k x (q - z)).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>
#include <utility>

#include "cuda/common/hc_ptx.cuh"
#include "cuda/fast/hc_fast_path.h"

namespace hcfuse {
namespace fast {

inline constexpr int kQuantGroupK = 32;  // k per group: 16 bytes of a column
// stage 2: a warp's groups of up's K = R (two warps share a column tile, each half of its groups)
inline constexpr int kQuantUpGroups = static_cast<int>(kHcFastQuantMaxR / kQuantGroupK + 1) / 2;

// The exponent bits of 2^10 (float16) or 2^7 (bfloat16): with a nibble v in the mantissa's low bits the
// value is exactly that power + v.
template <typename T>
__device__ __forceinline__ constexpr unsigned QuantMagic() {
  return std::is_same_v<T, __half> ? 0x6400u : 0x4300u;
}

// (power + z) twice, the bias subtracted from both nibbles of a byte.
template <typename T>
__device__ __forceinline__ unsigned QuantZeroBias(unsigned z) {
  return (QuantMagic<T>() | z) * 0x00010001u;
}

// q - z of the two nibbles of byte B of a word as a T pair (low nibble in the low half). lo and hi are
// the word's low and high nibbles (word & 0x0f0f0f0f, (word >> 4) & 0x0f0f0f0f).
template <typename T, int B>
__device__ __forceinline__ unsigned QuantPair(unsigned lo, unsigned hi, unsigned zero_bias) {
  constexpr unsigned kSelect = B | (B << 4) | ((B + 4) << 8) | ((B + 4) << 12);
  const unsigned v = (__byte_perm(lo, hi, kSelect) & 0x00ff00ffu) | (QuantMagic<T>() * 0x00010001u);
  unsigned r;
  if constexpr (std::is_same_v<T, __half>) {
    const __half2 d = __hsub2(*reinterpret_cast<const __half2*>(&v), *reinterpret_cast<const __half2*>(&zero_bias));
    r = *reinterpret_cast<const unsigned*>(&d);
  } else {
    const __nv_bfloat162 d = __hsub2(*reinterpret_cast<const __nv_bfloat162*>(&v),
                                     *reinterpret_cast<const __nv_bfloat162*>(&zero_bias));
    r = *reinterpret_cast<const unsigned*>(&d);
  }
  return r;
}

// One column's view of a quantized projection [K, N]: B [N][k_blocks][block_size / 2] bytes, scales and
// packed zero points [N][k_blocks].
template <typename T>
struct QuantColumn {
  const HcFastQuantWeights<T>& w;
  int k_blocks, row_bytes, block_size;

  __device__ __forceinline__ QuantColumn(const HcFastQuantWeights<T>& weights, int K, int bs)
      : w(weights), k_blocks((K + bs - 1) / bs), row_bytes(k_blocks * bs / 2), block_size(bs) {}

  // lane t's word of the group of column n that starts at k
  __device__ __forceinline__ unsigned Word(int n, int k, int t) const {
    return __ldg(reinterpret_cast<const unsigned*>(w.q + static_cast<size_t>(n) * row_bytes + k / 2 + 4 * t));
  }
  __device__ __forceinline__ unsigned ScaleBits(int n, int k) const {
    return __ldg(reinterpret_cast<const unsigned short*>(w.scales) + static_cast<size_t>(n) * k_blocks + k / block_size);
  }
  template <bool ZP>
  __device__ __forceinline__ unsigned ZeroPoint(int n, int k) const {
    if (!ZP || w.zero_points == nullptr) return 8u;
    const int b = k / block_size;
    const unsigned byte = __ldg(w.zero_points + static_cast<size_t>(n) * ((k_blocks + 1) / 2) + b / 2);
    return (byte >> (4 * (b % 2))) & 15u;
  }
};

// The scale in the low (H = 0) or high (H = 1) half of a T pair, as fp32.
template <typename T, int H>
__device__ __forceinline__ float ScaleOf(unsigned pair) {
  const unsigned short bits = static_cast<unsigned short>(H == 0 ? pair : pair >> 16);
  return cuda::ToFloat<T>(*reinterpret_cast<const T*>(&bits));
}

// Nibble i of packed zero points as QuantZeroBias.
template <typename T>
__device__ __forceinline__ unsigned ZeroBiasAt(unsigned packed, int i) {
  return QuantZeroBias<T>((packed >> (4 * i)) & 15u);
}

// One group's two mma steps from 0: part (+)= A @ B with A given by a(s), B by b(s) for s = 0, 1.
template <typename T, typename AFn, typename BFn>
__device__ __forceinline__ void GroupSteps(float (&part)[4], AFn&& a_of, BFn&& b_of) {
  part[0] = part[1] = part[2] = part[3] = 0.0f;
  {
    unsigned a[4], b[2];
    a_of(std::integral_constant<int, 0>{}, a);
    b_of(std::integral_constant<int, 0>{}, b);
    Mma<T>(part, a, b);
  }
  {
    unsigned a[4], b[2];
    a_of(std::integral_constant<int, 1>{}, a);
    b_of(std::integral_constant<int, 1>{}, b);
    Mma<T>(part, a, b);
  }
}

// Stage 1's [down | inject] slice in registers: TILES 8-column tiles of a warp (tile u: columns n0[u] ..
// n0[u] + 7, n0 < 0: none), GROUPS groups of the CTA's K slice from k0. Lane (g, t) holds word t of column
// n0[u] + g of each group (mma's B operand: column g), that column's scale and its zero point (a nibble each;
// ZP: the projection may have zero points, else every one is 8). Columns past N load as zeros.
template <typename T, int TILES, int GROUPS, bool ZP>
struct QuantSliceRegs {
  static_assert(TILES * GROUPS <= 8, "the zero points of a lane's words fit one register");
  unsigned w[TILES][GROUPS], scale[TILES][GROUPS];
  unsigned zero_points = 0;

  __device__ __forceinline__ void Load(const HcFastQuantWeights<T>& weights, int K, int N, int block_size, int k0,
                                       const int (&n0)[TILES], int lane) {
    const QuantColumn<T> col(weights, K, block_size);
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int u = 0; u < TILES; ++u) {
#pragma unroll
      for (int G = 0; G < GROUPS; ++G) {
        const int k = k0 + G * kQuantGroupK, n = n0[u] + g;
        const bool real = n0[u] >= 0 && n < N;
        w[u][G] = real ? col.Word(n, k, t) : 0u;
        scale[u][G] = real ? col.ScaleBits(n, k) : 0u;
        if constexpr (ZP) zero_points |= (real ? col.template ZeroPoint<ZP>(n, k) : 0u) << (4 * (u * GROUPS + G));
      }
    }
  }

  // acc = A[16 x 32 GROUPS] @ tile u, A in shared memory: a_rows rows then a zero row (stride lda, k from the
  // slice's start). mma's accumulator layout: lane (g, t) rows g and g + 8, columns 2t, 2t + 1 (their scales
  // come from the lanes that hold those columns' words).
  template <int U>
  __device__ __forceinline__ void MultiplyTile(const T* A, int a_rows, int lda, float (&acc)[4]) const {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const T* row_lo = A + min(g, a_rows) * lda + 8 * t;
    const T* row_hi = A + min(g + 8, a_rows) * lda + 8 * t;
    acc[0] = acc[1] = acc[2] = acc[3] = 0.0f;
#pragma unroll
    for (int G = 0; G < GROUPS; ++G) {
      const unsigned lo = w[U][G] & 0x0f0f0f0fu, hi = (w[U][G] >> 4) & 0x0f0f0f0fu;
      const unsigned zb = ZP ? ZeroBiasAt<T>(zero_points, U * GROUPS + G) : QuantZeroBias<T>(8);
      float part[4];
      GroupSteps<T>(
          part,
          [&](auto s, unsigned (&a)[4]) {
            const uint2 x0 = *reinterpret_cast<const uint2*>(row_lo + G * kQuantGroupK + 4 * s);
            const uint2 x1 = *reinterpret_cast<const uint2*>(row_hi + G * kQuantGroupK + 4 * s);
            a[0] = x0.x, a[1] = x1.x, a[2] = x0.y, a[3] = x1.y;
          },
          [&](auto s, unsigned (&b)[2]) {
            b[0] = QuantPair<T, 2 * decltype(s)::value>(lo, hi, zb);
            b[1] = QuantPair<T, 2 * decltype(s)::value + 1>(lo, hi, zb);
          });
      const float s0 = ScaleOf<T, 0>(__shfl_sync(0xffffffffu, scale[U][G], 8 * t));  // column 2t: lane (2t, 0)
      const float s1 = ScaleOf<T, 0>(__shfl_sync(0xffffffffu, scale[U][G], 8 * t + 4));
      acc[0] = fmaf(part[0], s0, acc[0]);
      acc[1] = fmaf(part[1], s1, acc[1]);
      acc[2] = fmaf(part[2], s0, acc[2]);
      acc[3] = fmaf(part[3], s1, acc[3]);
    }
  }
};

// Stage 2's up weights of one 16-column tile in registers (mma's A operand, the rows on the N side):
// lane (g, t) holds word t of columns n[0] and n[1] (the tile's columns g and g + 8, mapped to up's columns
// by the caller) of `count` (at most kQuantUpGroups) groups from group `first` of up's K = R, their zero
// points (nibbles, ZP only) and scales (T pairs: column g low, g + 8 high).
template <typename T, bool ZP>
struct QuantUpRegs {
  unsigned w[2][kQuantUpGroups], scale[kQuantUpGroups];
  unsigned zero_points[2] = {};
  int first = 0, count = 0;

  __device__ __forceinline__ void Load(const HcFastQuantWeights<T>& weights, int K, int block_size, int first_group,
                                       int groups, const int (&n)[2], int lane) {
    const QuantColumn<T> col(weights, K, block_size);
    const int t = lane & 3;
    first = first_group;
    count = groups;
#pragma unroll
    for (int G = 0; G < kQuantUpGroups; ++G) {
      if (G >= count) break;
      const int k = (first + G) * kQuantGroupK;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        w[h][G] = col.Word(n[h], k, t);
        if constexpr (ZP) zero_points[h] |= col.template ZeroPoint<ZP>(n[h], k) << (4 * G);
      }
      scale[G] = col.ScaleBits(n[0], k) | (col.ScaleBits(n[1], k) << 16);
    }
  }

  // acc = (X[xr .. xr + 8) @ W[this warp's groups of k, tile columns])^T in mma's layout with the rows on N:
  // lane (g, t) holds columns g (e = 0, 1) and g + 8 (e = 2, 3) of rows xr + 2t + (e & 1). X [rows][k] in
  // shared memory (stride ldx), x_rows real rows (the others multiply as zeros).
  __device__ __forceinline__ void Multiply(const T* X, int x_rows, int ldx, int xr, float (&acc)[4]) const {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const bool x_real = xr + g < x_rows;
    const T* x_row = X + min(xr + g, x_rows - 1) * ldx + first * kQuantGroupK + 8 * t;
    acc[0] = acc[1] = acc[2] = acc[3] = 0.0f;
#pragma unroll
    for (int G = 0; G < kQuantUpGroups; ++G) {
      if (G >= count) break;
      const unsigned lo0 = w[0][G] & 0x0f0f0f0fu, hi0 = (w[0][G] >> 4) & 0x0f0f0f0fu;
      const unsigned lo1 = w[1][G] & 0x0f0f0f0fu, hi1 = (w[1][G] >> 4) & 0x0f0f0f0fu;
      const unsigned zb0 = ZP ? ZeroBiasAt<T>(zero_points[0], G) : QuantZeroBias<T>(8);
      const unsigned zb1 = ZP ? ZeroBiasAt<T>(zero_points[1], G) : QuantZeroBias<T>(8);
      float part[4];
      GroupSteps<T>(
          part,
          [&](auto s, unsigned (&a)[4]) {
            constexpr int B = 2 * decltype(s)::value;
            a[0] = QuantPair<T, B>(lo0, hi0, zb0);
            a[1] = QuantPair<T, B>(lo1, hi1, zb1);
            a[2] = QuantPair<T, B + 1>(lo0, hi0, zb0);
            a[3] = QuantPair<T, B + 1>(lo1, hi1, zb1);
          },
          [&](auto s, unsigned (&b)[2]) {
            const uint2 x = x_real ? *reinterpret_cast<const uint2*>(x_row + G * kQuantGroupK + 4 * s)
                                   : make_uint2(0u, 0u);
            b[0] = x.x, b[1] = x.y;
          });
      const float s0 = ScaleOf<T, 0>(scale[G]), s1 = ScaleOf<T, 1>(scale[G]);
      acc[0] = fmaf(part[0], s0, acc[0]);
      acc[1] = fmaf(part[1], s0, acc[1]);
      acc[2] = fmaf(part[2], s1, acc[2]);
      acc[3] = fmaf(part[3], s1, acc[3]);
    }
  }
};

}  // namespace fast
}  // namespace hcfuse
