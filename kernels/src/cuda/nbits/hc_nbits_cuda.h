// CUDA kernels of ai.hcfuse::HyperConnectionLowRankMixNBits (hc_nbits.cu): launcher declarations, no device
// code and no ORT type (the glue, hc_lowrank_mix_nbits_op_cuda.cc, is plain C++).
//
// Per chunk of at most kHcNBitsChunkRows rows, three kernels on one stream (docs/QUANTIZED.md, "CUDA kernel"):
//   HcNBitsNormKernel     S (prologue), streams_out, per-branch rms, hn (scratch, T)
//   HcNBitsProductKernel  down_inject's fp32 partial sums over fixed K slices of kHcNBitsSliceK; the block that
//                         stores a column group's last slice adds the slices in order -> down -> Z, SG, hidden
//                         (scratch, T), or inject -> post_gate
//   HcNBitsUpMixKernel    up over all of K = R -> g -> pre_output (branches in order)
// (C > 128: HcNBitsProductKernel's partials of up over slices of K = R, then HcNBitsUpGateKernel.)
// The slices depend on K only, the chunk on nothing a row computes, so a row's bits are the same at every
// row count. No host synchronization and no allocation: CUDA-graph capturable. On sm_90 the kernels launch with
// programmatic dependent launch (HcNBitsLaunchOptions).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cpu/hc_nbits_cpu.h"  // HcNBitsParams, HcNBitsProjection: plain structs over raw pointers
#include "cuda/common/hc_lowrank_mix_cuda.h"  // HcLaunchStatus

namespace hcfuse {
namespace cuda {

// k per slice of every product's sum (a slice's bytes of one column of B: 64 at 4 bits, 128 at 8).
constexpr int64_t kHcNBitsSliceK = 128;
// Rows per chunk: bounds the fp32 partials (slices x rows x N floats) whatever the row count.
constexpr int64_t kHcNBitsChunkRows = 256;

// pdl: every kernel launches with programmatic dependent launch (sm_90 code only, HcRunsSm90Code) and waits
// for the kernel before it before reading what it may write; a product reads its quantized weight (B, scales,
// zero points) before that wait only where the projection's flag says they are constant initializers.
struct HcNBitsLaunchOptions {
  bool pdl = false;
  bool down_inject_constant = false;
  bool up_constant = false;
};

// Bytes of device scratch LaunchHcNBits needs (256-byte aligned parts: hn and hidden of one chunk in T, the
// fp32 partials of one chunk's larger product).
template <typename T>
size_t HcNBitsScratchBytes(const HcNBitsParams& params);

// Runs the op for params.mix.rows > 0 rows on `stream`; scratch holds HcNBitsScratchBytes bytes. Shapes are
// the caller's to have checked (ResolveHcNBitsForm). B must be 8-byte aligned (ORT's allocations are).
// Never throws and never synchronizes.
template <typename T>
HcLaunchStatus LaunchHcNBits(const HcNBitsParams& params, const HcNBitsTensors<T>& tensors, void* scratch,
                             const HcNBitsLaunchOptions& options, cudaStream_t stream);

}  // namespace cuda
}  // namespace hcfuse
