// The fast path's plain design (hc_fast_plain.cu), launched by cuda::LaunchHcFast (hc_fast_path.cu)
// when the plan's design is kPlain. No ORT type here.
#pragma once

#include <string>

#include <cuda_runtime.h>

#include "cuda/hc_fast_plan.h"
#include "cuda/hc_lowrank_mix_cuda.h"

namespace hcfuse {
namespace cuda {

// Grids, shared memory and how many CTAs of each kernel fit per SM (HCFUSE_DEBUG).
std::string HcFastPlainSummary(const HcFastPlan& plan);

// Enqueues the two kernels of a kPlain plan (LaunchHcFast checked the plan, pointers and scratch).
template <typename T>
HcLaunchStatus LaunchHcFastPlain(const HcDeviceTensors<T>& tensors, void* scratch, const HcFastPlan& plan,
                                 cudaStream_t stream, bool weights_are_constant);

}  // namespace cuda
}  // namespace hcfuse
