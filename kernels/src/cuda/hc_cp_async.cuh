// cp.async (sm_80+) helpers of the general path's kernels: 16-byte global -> shared copies that land
// while the issuing thread computes; cp.async.wait_group makes them visible to that thread.
#pragma once

#include <cuda_runtime.h>

namespace hcfuse {
namespace cuda {

// 16 bytes global -> shared (both 16-byte aligned), bypassing L1.
__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

}  // namespace cuda
}  // namespace hcfuse
