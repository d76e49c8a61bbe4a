// Fused fast decode path of HyperConnectionLowRankMix (fp16 / bf16, sm_80+, PDL on sm_90).
// Two kernels: stage 1 splits K = C*H over ~128 CTAs (prologue, per-branch RMS norm, down and inject
// products on tensor cores, fp32 partials reduced inside a thread-block cluster); stage 2 splits the
// H features over ~128 CTAs (fixed-order partial reduction, ScaledSiLU, up product on tensor cores,
// sigmoid, pre-mix, post_gate). Rows go through in tiles of 16 (the mma's M). A second design without
// clusters (hc_fast_plain.cu, same bits) runs when HcFastTuning::design asks for it.
// Shapes it supports: hc_fast_path_eligibility.h. Launcher declarations only; no ORT type here.
#pragma once

#include <cstddef>
#include <string>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "cuda/hc_fast_path_eligibility.h"
#include "cuda/hc_lowrank_mix_cuda.h"
#include "hcfuse/hc_params.h"

namespace hcfuse {

// Device pointers of one call: the struct the general path takes too (optional ones nullptr when absent).
template <typename T>
using HcFastArgs = cuda::HcDeviceTensors<T>;

// Bytes of device scratch one call needs (fp32 partials and the normalized rows); 0 for zero rows.
// The glue allocates it through ORT's allocator and passes it to LaunchHcFast.
size_t HcFastScratchBytes(const HcLowRankMixParams& params);

// Bytes of dynamic shared memory per block the larger of the two kernels takes for this call on a
// device of compute capability sm_major (it grows with the rows of one pass, up to 16); 0 for a call
// the fast path does not support. The glue compares it with the device's cudaDevAttrMaxSharedMemoryPerBlockOptin.
size_t HcFastSharedMemoryBytes(const HcLowRankMixParams& params, int sm_major, const HcFastTuning& tuning);

// One line for HCFUSE_DEBUG: grids, shared memory, how many clusters fit on the device at once
// (queries the CUDA runtime; not for the hot path).
template <typename T>
std::string HcFastLaunchSummary(const HcLowRankMixParams& params, int sm_major, const HcFastTuning& tuning);

// Enqueues the two kernels on `stream` (no host synchronization; CUDA-graph capturable).
// weights_are_constant: norm_scale / down / up / inject are constant initializers, so the kernels may
//   read them before waiting on the producer of the activations (only meaningful with use_pdl).
// use_pdl: launch with programmatic stream serialization (ignored unless HcFastUsesSm90Features).
// sm_major: the compute capability of the current device (the caller reads it once, at kernel creation).
// tuning: how the work is spread (hc_fast_path_eligibility.h); never changes a result.
// Requires IsHcFastPathSupported(params, ...) and 16-byte aligned pointers (HcFastPointersAligned);
// returns cudaErrorInvalidValue otherwise, or the first CUDA error of the launches.
template <typename T>
cudaError_t LaunchHcFast(const HcFastArgs<T>& args, const HcLowRankMixParams& params, void* scratch,
                         size_t scratch_bytes, cudaStream_t stream, bool weights_are_constant, bool use_pdl,
                         int sm_major, const HcFastTuning& tuning);

extern template cudaError_t LaunchHcFast<__half>(const HcFastArgs<__half>&, const HcLowRankMixParams&, void*,
                                                 size_t, cudaStream_t, bool, bool, int, const HcFastTuning&);
extern template cudaError_t LaunchHcFast<__nv_bfloat16>(const HcFastArgs<__nv_bfloat16>&,
                                                        const HcLowRankMixParams&, void*, size_t, cudaStream_t,
                                                        bool, bool, int, const HcFastTuning&);

}  // namespace hcfuse
