// What both CUDA paths need to know of the device: read once per kernel instance (QueryHcDeviceCaps),
// then passed to the fast path's planner and the general path's launchers. The struct is plain C++ so
// that the planner builds and is tested on a host without CUDA.
#pragma once

#include <cstdint>

#if defined(HCFUSE_WITH_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace hcfuse {

struct HcDeviceCaps {
  int sm_major = 0;
  int sm_minor = 0;
  int64_t max_shared_memory_per_block = 0;  // cudaDevAttrMaxSharedMemoryPerBlockOptin
  // cudaDevAttrMaxSharedMemoryPerMultiprocessor and cudaDevAttrReservedSharedMemoryPerBlock (0: not
  // known, then HcFastTuning::kernels_ahead sets no limit)
  int64_t shared_memory_per_sm = 0;
  int64_t reserved_shared_memory_per_block = 0;
  int sm_count = 0;  // cudaDevAttrMultiProcessorCount (the general path's persistent grids)
};

// Thread-block clusters and programmatic dependent launch need the kernels' sm_90 code. The build
// carries sm_80 and sm_90a code plus compute_80 PTX, so any other compute capability runs sm_80 code
// (sm_100 and later JIT-compile the compute_80 PTX, where the cluster step traps and the PDL wait is
// compiled out) and must take the sm_80 configuration: no clusters, no PDL. Both CUDA paths decide by it.
inline bool HcRunsSm90Code(int sm_major) { return sm_major == 9; }

#if defined(HCFUSE_WITH_CUDA)
namespace cuda {
// The capabilities of `device`, read from the CUDA runtime (not for the hot path).
cudaError_t QueryHcDeviceCaps(int device, HcDeviceCaps* caps);
}  // namespace cuda
#endif

}  // namespace hcfuse
