// QueryHcDeviceCaps (hc_device_caps.h): host code only.
#include "cuda/common/hc_device_caps.h"

#include <cuda_runtime_api.h>

#include <utility>

namespace hcfuse {
namespace cuda {

cudaError_t QueryHcDeviceCaps(int device, HcDeviceCaps* caps) {
  int major = 0, minor = 0, per_block = 0, per_sm = 0, reserved = 0, sms = 0;
  for (auto [attr, value] : {std::pair{cudaDevAttrComputeCapabilityMajor, &major},
                             std::pair{cudaDevAttrComputeCapabilityMinor, &minor},
                             std::pair{cudaDevAttrMaxSharedMemoryPerBlockOptin, &per_block},
                             std::pair{cudaDevAttrMaxSharedMemoryPerMultiprocessor, &per_sm},
                             std::pair{cudaDevAttrReservedSharedMemoryPerBlock, &reserved},
                             std::pair{cudaDevAttrMultiProcessorCount, &sms}}) {
    if (const cudaError_t e = cudaDeviceGetAttribute(value, attr, device); e != cudaSuccess) return e;
  }
  caps->sm_major = major;
  caps->sm_minor = minor;
  caps->max_shared_memory_per_block = per_block;
  caps->shared_memory_per_sm = per_sm;
  caps->reserved_shared_memory_per_block = reserved;
  caps->sm_count = sms;
  return cudaSuccess;
}

}  // namespace cuda
}  // namespace hcfuse
