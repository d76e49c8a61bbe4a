// CPU kernel of HyperConnectionLowRankMixNBits over raw pointers (no ONNX Runtime types).
//
// The dense op's computation (hc_lowrank_mix_cpu.h, docs/NUMERICS.md) with each projection either dense
// (T, row-major [K, N]) or as MatMulNBits stores it: B [N, k_blocks, blob] of 4- or 8-bit integers,
// scales T [N, k_blocks] and optional zero points (packed uint8 [N, ceil(k_blocks * bits / 8)] or T
// [N, k_blocks]; absent: 2^(bits-1)). A quantized weight is w[k, n] = (q - zero_point) * scale in fp32:
// q and the zero point widened to fp32, one fp32 subtraction and one fp32 multiplication (both exact
// unless the scales or zero points are float32 values that need more bits). It is dequantized 32 k of one
// column at a time (one chunk), in registers, straight from B (never into a dequantized copy of the
// matrix), and enters the products as fp32.
//
// Order and rounding points are hcfuse/reference_nbits.py's, operation for operation: every product step
// is a separately rounded multiply and add (no FMA: the product of a T activation and an fp32 weight is
// not exact in fp32, so FMA would change bits); a dense projection's dot products accumulate sequentially
// over k from 0, a quantized one's in lane order (32 lanes of k mod 32, each sequential, then a fixed
// tree); the norm's sum of squares runs sequentially over h, branches are summed in order, sigmoid comes
// from a correctly rounded exp, each step is rounded to T where the contract says. The outputs are
// therefore bitwise equal to hcfuse.reference_nbits for every T, every instruction set, row count and
// thread count (tests/kernels/test_nbits_cpu.py against the reference, test_nbits_isa.py across instruction
// sets).
//
// Work is split over output elements only: the norm per (rows, branch), the down/inject product and
// its epilogue per block of its R + C columns, the up product and pre_output per block of features h
// (all C branches of them). Rows go in passes of kHcCpuRowsPerPass that share each dequantized chunk.
#pragma once

#include <cstdint>

#include "cpu/hc_lowrank_mix_cpu.h"

namespace hcfuse {

// One projection [K, N]: dense (dense != nullptr) or quantized (q != nullptr), never both.
template <typename T>
struct HcNBitsProjection {
  const T* dense = nullptr;              // row-major [K, N]
  const uint8_t* q = nullptr;            // [N, k_blocks, blob_bytes]
  const T* scales = nullptr;             // [N, k_blocks]
  const uint8_t* zero_points = nullptr;  // packed [N, zero_point_bytes], or
  const T* zero_points_t = nullptr;      // T [N, k_blocks]; neither: 2^(bits-1)
};

// The lanes of a quantized projection's dot products (hcfuse.reference_nbits.LANES): lane j sums the k = j
// (mod 32) in ascending k, then a fixed tree adds the lanes.
inline constexpr int64_t kHcNBitsLanes = 32;
inline int64_t HcNBitsLanePadded(int64_t K) { return (K + kHcNBitsLanes - 1) / kHcNBitsLanes * kHcNBitsLanes; }

struct HcNBitsParams {
  HcLowRankMixParams mix;  // rows, C, H, R, attributes, prologue, streams_out
  int64_t bits = 4;        // 4 or 8
  int64_t block_size = 32;  // a power of two >= 16

  int64_t KBlocks(int64_t K) const { return (K + block_size - 1) / block_size; }
  int64_t BlobBytes() const { return block_size * bits / 8; }
  int64_t ZeroPointBytes(int64_t K) const { return (KBlocks(K) * bits + 7) / 8; }
};

// The pointers of one call, host (CPU kernel) or device (CUDA kernel) alike.
template <typename T>
struct HcNBitsTensors {
  const T* streams = nullptr;     // (rows, C*H)
  const T* norm_scale = nullptr;  // (C*H)
  HcNBitsProjection<T> down_inject;  // K = C*H, N = R + C: down's R columns, then inject's C
  HcNBitsProjection<T> up;           // K = R, N = C*H
  const T* prev_block_output = nullptr;  // (rows, H), with mix.has_prologue
  const T* prev_post_gate = nullptr;     // (rows, C)
  T* pre_output = nullptr;               // (rows, H)
  T* post_gate = nullptr;                // (rows, C)
  T* streams_out = nullptr;              // (rows, C*H), with mix.has_streams_out
};

// fp32 scratch for one pass: hn and g (rows x C*H), the down/inject sums (rows x (R + C)), hidden (rows x R),
// and hn and hidden arranged for the quantized products (rows x C*H and rows x R, padded to whole chunks of lanes).
inline int64_t HcNBitsCpuScratchFloats(const HcNBitsParams& p) {
  const HcLowRankMixParams& m = p.mix;
  const int64_t rows = m.rows < kHcCpuRowsPerPass ? m.rows : kHcCpuRowsPerPass;
  return rows * (2 * m.width() + 2 * m.R + m.C + HcNBitsLanePadded(m.width()) + HcNBitsLanePadded(m.R));
}

// Computes the op for all p.mix.rows rows. The shapes behind every pointer are the caller's to have
// checked (B's and the scales' against K, N, bits and block_size); scratch holds
// HcNBitsCpuScratchFloats(p) floats. Nothing is read or written when rows == 0.
template <typename T>
void HcNBitsCpu(const HcNBitsParams& p, const HcNBitsTensors<T>& args, const HcTaskRunner& run, float* scratch);

extern template void HcNBitsCpu<float>(const HcNBitsParams&, const HcNBitsTensors<float>&, const HcTaskRunner&,
                                       float*);
extern template void HcNBitsCpu<Half>(const HcNBitsParams&, const HcNBitsTensors<Half>&, const HcTaskRunner&, float*);
extern template void HcNBitsCpu<BFloat16>(const HcNBitsParams&, const HcNBitsTensors<BFloat16>&, const HcTaskRunner&,
                                          float*);

}  // namespace hcfuse
