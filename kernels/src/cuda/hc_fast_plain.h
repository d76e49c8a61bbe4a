// The fast path's plain design (hc_fast_plain.cu), called by LaunchHcFast (hc_fast_path.cu) when
// HcFastRunsPlain (hc_fast_path_eligibility.h) says so. No ORT type here.
#pragma once

#include <cstddef>
#include <string>

#include <cuda_runtime.h>

#include "cuda/hc_fast_path_eligibility.h"
#include "cuda/hc_lowrank_mix_cuda.h"
#include "hcfuse/hc_params.h"

namespace hcfuse {

// Scratch bytes of the plain design (fp32 partials of down and inject, hn); 0 for zero rows.
size_t HcFastPlainScratchBytes(const HcLowRankMixParams& params);

// Dynamic shared memory of the larger of its two kernels.
size_t HcFastPlainSharedMemoryBytes(const HcLowRankMixParams& params);

// Grids, shared memory and how many CTAs of each kernel fit per SM (HCFUSE_DEBUG).
std::string HcFastPlainSummary(const HcLowRankMixParams& params);

// Enqueues the two kernels (requires IsHcFastPlainSupported; the caller checked pointers and scratch).
template <typename T>
cudaError_t LaunchHcFastPlain(const cuda::HcDeviceTensors<T>& args, const HcLowRankMixParams& params, void* scratch,
                              cudaStream_t stream, bool weights_are_constant, bool use_pdl,
                              const HcFastTuning& tuning);

}  // namespace hcfuse
