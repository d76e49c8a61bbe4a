// CUDAExecutionProvider kernels of ai.hcfuse::HyperConnectionLowRankMixNBits (float, float16, bfloat16).
// Compiled only when the library is built with CUDA (HCFUSE_WITH_CUDA).
#pragma once

#include <onnxruntime_cxx_api.h>

namespace hcfuse {

// Adds the three typed CUDA kernels to domain (ai.hcfuse; called by RegisterCustomOps).
void RegisterNBitsCudaOps(Ort::CustomOpDomain& domain);

}  // namespace hcfuse
