// cp.async (sm_80+) helpers of the general path's kernels: 16-byte global -> shared copies that land
// while the issuing thread computes; cp.async.wait_group makes them visible to that thread.
#pragma once

#include <cuda_runtime.h>

namespace hcfuse {
namespace cuda {

// 16 bytes global -> shared; zeros when !valid (src-size 0 reads nothing; gmem must still be a
// mapped address).
__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem, bool valid = true) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(bytes) : "memory");
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

}  // namespace cuda
}  // namespace hcfuse
