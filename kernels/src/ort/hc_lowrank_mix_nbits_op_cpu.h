// CPUExecutionProvider kernels of ai.hcfuse::HyperConnectionLowRankMixNBits (float, float16, bfloat16).
#pragma once

#include <onnxruntime_cxx_api.h>

namespace hcfuse {

// Adds the three typed CPU kernels to domain (ai.hcfuse; called by RegisterCustomOps).
void RegisterNBitsCpuOps(Ort::CustomOpDomain& domain);

}  // namespace hcfuse
