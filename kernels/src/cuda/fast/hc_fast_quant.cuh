// The quantized op's weights on the fast path's tensor cores (hc_fast_path.cu, QUANT kernels): 4-bit
// MatMulNBits bytes copied into shared memory with cp.async before the kernel's wait (as the dense kernels
// copy their weight tiles), read from there into registers after it and turned into mma fragments. Register
// loads issued before the wait would hold a scoreboard that the loads after it (the streams, the partials)
// are given by ptxas, so those would wait for every weight byte.
//
// k runs in groups of 32 (16 bytes of a column, within one quantization block: block_size >= 32). In a
// group, lane t of a quad (t = lane % 4) holds the column's bytes 4t .. 4t + 3: nibble j of that word (bits
// 4j .. 4j + 3) is k = 8t + j. One lop3 against a magic exponent turns nibbles j and j + 4 into a T pair
// (QuantNibblePair), so mma step s takes the pairs of j = 2s (k 8t + 2s, 8t + 2s + 4; mma's k 2t, 2t + 1) and
// j = 2s + 1 (mma's k 2t + 8, 2t + 9). The activations are stored in shared memory in that order (within each
// 8 k, positions 0 .. 7 hold k 0, 4, 1, 5, 2, 6, 3, 7: QuantPosition), so one 8-byte load of a row at 8t + 4s
// gives both pairs and every product pairs an activation with its own weight; only the order of the group's
// sum differs from the k order.
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

// Where k offset m (0 .. 7) of an 8-k run is stored in the products' activation tiles: 0, 4, 1, 5, 2, 6, 3, 7
// at positions 0 .. 7.
__device__ __forceinline__ constexpr int QuantPosition(int m) { return m < 4 ? 2 * m : 2 * (m - 4) + 1; }

// q - z of nibbles J and J + 4 of a word (k 8t + J and 8t + J + 4) as a T pair, low half first: the nibbles
// put in the mantissa of the magic power by one lop3, then (power + z) subtracted.
template <typename T, int J>
__device__ __forceinline__ unsigned QuantNibblePair(unsigned word, unsigned zero_bias) {
  unsigned v;
  asm("lop3.b32 %0, %1, %2, %3, 0xea;"  // (a & b) | c
      : "=r"(v)
      : "r"(word >> (4 * J)), "r"(0x000f000fu), "r"(QuantMagic<T>() * 0x00010001u));
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

// cp.async of the 4-byte aligned word of `base` that holds byte `byte` into `dst`. Stage 1 reads scales and
// packed zero points of N = R + C columns, a multiple of 4 (the planner's R % 32 == 0, C % 4 == 0), so
// both tensors' sizes are multiples of 4 bytes and the word lies within the tensor.
__device__ __forceinline__ void CopyWordHolding(unsigned* dst, const uint8_t* base, size_t byte) {
  CpAsync<4>(dst, base + (byte & ~size_t{3}));
}

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

// Stage 1's [down | inject] slice in shared memory (HcFastStage1Layout's quantized tile): each of the R + 8
// columns' 32 bytes of the K slice [k0, k0 + 64) (two groups) at HcFastQuantStride(32), its word of scales
// holding the slice's (two blocks at block_size 32, else one) and its word of packed zero points (ZP only).
// Columns past N hold zeros (a zero scale: their products are 0).
template <typename T, bool ZP>
struct QuantSlice {
  static constexpr int kStride = static_cast<int>(HcFastQuantStride(kHcFastQuantKs / 2));
  static constexpr int kGroups = static_cast<int>(kHcFastQuantKs) / kQuantGroupK;
  uint8_t* bytes;
  unsigned *scale_words, *zero_point_words;
  int k_blocks, block_size, k0, zero_row;
  // Per group, computed before the wait (no division after it): its k-block, and where its scale sits in the
  // scale word of an even and of an odd column (element n * k_blocks + block of the word holding the slice's
  // first: the same word, as block_size 32 starts a slice at an even block and k_blocks is then even).
  int block[kGroups];
  unsigned even_shift[kGroups], odd_shift[kGroups];

  __device__ __forceinline__ QuantSlice(unsigned char* smem, const HcFastStage1Layout& layout, int K, int bs, int k)
      : bytes(smem + layout.tile),
        scale_words(reinterpret_cast<unsigned*>(smem + layout.q_scales)),
        zero_point_words(reinterpret_cast<unsigned*>(smem + layout.q_zero_points)),
        k_blocks((K + bs - 1) / bs),
        block_size(bs),
        k0(k),
        zero_row((k_blocks + 1) / 2) {
#pragma unroll
    for (int G = 0; G < kGroups; ++G) {
      block[G] = (k0 + G * kQuantGroupK) / block_size;
      even_shift[G] = 16u * (block[G] & 1);
      odd_shift[G] = 16u * ((block[G] ^ k_blocks) & 1);
    }
  }

  // The copies of `cols` columns (N real), by the CTA's threads; committed by the caller.
  __device__ __forceinline__ void Copy(const HcFastQuantWeights<T>& w, int N, int cols, int tid, int threads) const {
    const size_t row_bytes = static_cast<size_t>(k_blocks) * block_size / 2;
    for (int idx = tid; idx < 2 * cols; idx += threads) {  // 16 bytes each
      const int n = idx / 2, half = idx % 2;
      uint8_t* dst = bytes + n * kStride + 16 * half;
      if (n < N) {
        CpAsync<16>(dst, w.q + n * row_bytes + k0 / 2 + 16 * half);
      } else {
        *reinterpret_cast<uint4*>(dst) = make_uint4(0u, 0u, 0u, 0u);
      }
    }
    const int b = block[0];
    for (int n = tid; n < cols; n += threads) {
      if (n >= N) {
        scale_words[n] = 0u;
        if constexpr (ZP) zero_point_words[n] = 0u;
        continue;
      }
      const size_t idx = static_cast<size_t>(n) * k_blocks + b;
      CopyWordHolding(scale_words + n, reinterpret_cast<const uint8_t*>(w.scales), 2 * idx);
      if (ZP && w.zero_points != nullptr) {
        CopyWordHolding(zero_point_words + n, w.zero_points, static_cast<size_t>(n) * zero_row + b / 2);
      }
    }
  }

  // acc = A[16 x 64] @ the 8-column tile from n0 (a multiple of 8), A in shared memory in QuantPosition order:
  // a_rows rows then a zero row (stride lda, k from the slice's start). mma's accumulator layout: lane (g, t)
  // rows g and g + 8, columns 2t, 2t + 1.
  __device__ __forceinline__ void MultiplyTile(const T* A, int a_rows, int lda, int n0, bool has_zero_points,
                                               float (&acc)[4]) const {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const T* row_lo = A + min(g, a_rows) * lda + 8 * t;
    const T* row_hi = A + min(g + 8, a_rows) * lda + 8 * t;
    const uint8_t* column = bytes + (n0 + g) * kStride + 4 * t;  // mma's B operand: column g
    const uint2 scales = *reinterpret_cast<const uint2*>(scale_words + n0 + 2 * t);  // columns 2t (even), 2t + 1
    const unsigned zero_word = ZP && has_zero_points ? zero_point_words[n0 + g] : 0u;
    const unsigned zero_byte = ZP && has_zero_points ? static_cast<unsigned>(n0 + g) * zero_row : 0u;
    acc[0] = acc[1] = acc[2] = acc[3] = 0.0f;
#pragma unroll
    for (int G = 0; G < kGroups; ++G) {
      const unsigned word = *reinterpret_cast<const unsigned*>(column + 16 * G);
      unsigned z = 8u;
      if (ZP && has_zero_points) {
        const unsigned byte = zero_byte + block[G] / 2;
        z = (zero_word >> (8 * (byte & 3) + 4 * (block[G] & 1))) & 15u;
      }
      const unsigned zb = QuantZeroBias<T>(z);
      float part[4];
      GroupSteps<T>(
          part,
          [&](auto s, unsigned (&a)[4]) {
            const uint2 x0 = *reinterpret_cast<const uint2*>(row_lo + G * kQuantGroupK + 4 * s);
            const uint2 x1 = *reinterpret_cast<const uint2*>(row_hi + G * kQuantGroupK + 4 * s);
            a[0] = x0.x, a[1] = x1.x, a[2] = x0.y, a[3] = x1.y;
          },
          [&](auto s, unsigned (&b)[2]) {
            b[0] = QuantNibblePair<T, 2 * decltype(s)::value>(word, zb);
            b[1] = QuantNibblePair<T, 2 * decltype(s)::value + 1>(word, zb);
          });
      const float s0 = ScaleOf<T, 0>(scales.x >> even_shift[G]);
      const float s1 = ScaleOf<T, 0>(scales.y >> odd_shift[G]);
      acc[0] = fmaf(part[0], s0, acc[0]);
      acc[1] = fmaf(part[1], s1, acc[1]);
      acc[2] = fmaf(part[2], s0, acc[2]);
      acc[3] = fmaf(part[3], s1, acc[3]);
    }
  }
};

// Stage 2's up weights in shared memory (HcFastStage2Layout's quantized tile): the first R / 2 bytes of each
// of the CTA's n2 columns (column c * hs + j: up's column c * H + h0 + j) at HcFastQuantStride(R / 2), their
// scales [n2][k_blocks] and packed zero points [n2][(k_blocks + 1) / 2] as up holds them (ZP only).
template <typename T, bool ZP>
struct QuantUpSlice {
  uint8_t* bytes;
  unsigned short* scales;
  uint8_t* zero_points;
  int stride, k_blocks, block_size;

  __device__ __forceinline__ QuantUpSlice(unsigned char* smem, const HcFastStage2Layout& layout, int R, int bs)
      : bytes(smem + layout.tile),
        scales(reinterpret_cast<unsigned short*>(smem + layout.q_scales)),
        zero_points(smem + layout.q_zero_points),
        stride(static_cast<int>(HcFastQuantStride(R / 2))),
        k_blocks((R + bs - 1) / bs),
        block_size(bs) {}

  // The copies of the CTA's columns (hs of each of C branches from feature h0; up's N = C * H), by the CTA's
  // threads; committed by the caller. A branch's scales and zero points are contiguous in up's (hs and h0
  // are multiples of 4: 8-byte and 4-byte aligned pieces).
  __device__ __forceinline__ void Copy(const HcFastQuantWeights<T>& w, int R, int C, int H, int h0, int hs, int tid,
                                       int threads) const {
    const int pieces = R / 32;  // 16-byte pieces of a column
    const size_t row_bytes = static_cast<size_t>(k_blocks) * block_size / 2;
    for (int idx = tid; idx < C * hs * pieces; idx += threads) {
      const int col = idx / pieces, p = idx % pieces;
      const size_t n = static_cast<size_t>(col / hs) * H + h0 + col % hs;
      CpAsync<16>(bytes + col * stride + 16 * p, w.q + n * row_bytes + 16 * p);
    }
    const int scale_pieces = hs * k_blocks / 4;  // 8 bytes each, per branch
    for (int idx = tid; idx < C * scale_pieces; idx += threads) {
      const int c = idx / scale_pieces, p = idx % scale_pieces;
      CpAsync<8>(scales + (c * hs * k_blocks + 4 * p),
                 w.scales + (static_cast<size_t>(c) * H + h0) * k_blocks + 4 * p);
    }
    if (!ZP || w.zero_points == nullptr) return;
    const int zero_row = (k_blocks + 1) / 2, zero_pieces = hs * zero_row / 4;  // 4 bytes each, per branch
    for (int idx = tid; idx < C * zero_pieces; idx += threads) {
      const int c = idx / zero_pieces, p = idx % zero_pieces;
      CpAsync<4>(zero_points + (c * hs * zero_row + 4 * p),
                 w.zero_points + (static_cast<size_t>(c) * H + h0) * zero_row + 4 * p);
    }
  }
};

// Stage 2's up weights of one 16-column tile in registers (mma's A operand, the rows on the N side):
// lane (g, t) holds word t of columns col[0] and col[1] (the tile's columns g and g + 8, as QuantUpSlice's
// columns) of `count` (at most kQuantUpGroups) groups from group `first` of up's K = R, their zero points
// (nibbles, ZP only) and scales (T pairs: column g low, g + 8 high). Read from shared memory once the copies
// have landed.
template <typename T, bool ZP>
struct QuantUpRegs {
  unsigned w[2][kQuantUpGroups], scale[kQuantUpGroups];
  unsigned zero_points[2] = {};
  int first = 0, count = 0;

  __device__ __forceinline__ void Load(const QuantUpSlice<T, ZP>& slice, bool has_zero_points, int first_group,
                                       int groups, const int (&col)[2], int lane) {
    const int t = lane & 3, zero_row = (slice.k_blocks + 1) / 2;
    first = first_group;
    count = groups;
#pragma unroll
    for (int G = 0; G < kQuantUpGroups; ++G) {
      if (G >= count) break;
      const int k = (first + G) * kQuantGroupK, b = k / slice.block_size;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        w[h][G] = *reinterpret_cast<const unsigned*>(slice.bytes + col[h] * slice.stride + k / 2 + 4 * t);
        if (ZP && has_zero_points) {
          zero_points[h] |= ((slice.zero_points[col[h] * zero_row + b / 2] >> (4 * (b % 2))) & 15u) << (4 * G);
        }
      }
      scale[G] = slice.scales[col[0] * slice.k_blocks + b] |
                 (static_cast<unsigned>(slice.scales[col[1] * slice.k_blocks + b]) << 16);
    }
    if (!(ZP && has_zero_points)) zero_points[0] = zero_points[1] = 0x88888888u;
  }

  // acc = (X[xr .. xr + 8) @ W[this warp's groups of k, tile columns])^T in mma's layout with the rows on N:
  // lane (g, t) holds columns g (e = 0, 1) and g + 8 (e = 2, 3) of rows xr + 2t + (e & 1). X [rows][k] in
  // shared memory in QuantPosition order (stride ldx), x_rows real rows (the others multiply as zeros).
  __device__ __forceinline__ void Multiply(const T* X, int x_rows, int ldx, int xr, float (&acc)[4]) const {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const bool x_real = xr + g < x_rows;
    const T* x_row = X + min(xr + g, x_rows - 1) * ldx + first * kQuantGroupK + 8 * t;
    acc[0] = acc[1] = acc[2] = acc[3] = 0.0f;
#pragma unroll
    for (int G = 0; G < kQuantUpGroups; ++G) {
      if (G >= count) break;
      const unsigned zb0 = ZP ? ZeroBiasAt<T>(zero_points[0], G) : QuantZeroBias<T>(8);
      const unsigned zb1 = ZP ? ZeroBiasAt<T>(zero_points[1], G) : QuantZeroBias<T>(8);
      float part[4];
      GroupSteps<T>(
          part,
          [&](auto s, unsigned (&a)[4]) {
            constexpr int J = 2 * decltype(s)::value;
            a[0] = QuantNibblePair<T, J>(w[0][G], zb0);
            a[1] = QuantNibblePair<T, J>(w[1][G], zb1);
            a[2] = QuantNibblePair<T, J + 1>(w[0][G], zb0);
            a[3] = QuantNibblePair<T, J + 1>(w[1][G], zb1);
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
