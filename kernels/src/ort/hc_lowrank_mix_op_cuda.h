// CUDAExecutionProvider kernels of HyperConnectionLowRankMix (float, float16, bfloat16).
// Compiled only when the library is built with CUDA (HCFUSE_WITH_CUDA).
#pragma once

#include <onnxruntime_cxx_api.h>

namespace hcfuse {

// Adds the three typed CUDA kernels to domain (called by RegisterCustomOps).
void RegisterCudaOps(Ort::CustomOpDomain& domain);

}  // namespace hcfuse
