// The general path's up product and gate epilogue in one sm_90 kernel (hc_up_gate_sm90.cu): up = hidden @
// up_weight on wgmma, g = sigmoid(up) and pre_output = reduction_scale * sum_c hn * g from the accumulators,
// so up (rows x C*H in T) is never written and read back. Same rounding points and per-element arithmetic as
// cuBLASLt's product + HcGateEpilogueKernel; up's fp32 sums run in the kernel's own fixed order (K in
// 16-wide steps, ascending), the same for every row count.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "cuda/common/hc_device_caps.h"

namespace hcfuse {
namespace cuda {

template <typename T>
struct HcUpGateArgs {
  const T* hidden;     // (rows, R): ScaledSiLU(down) in T
  const T* up_weight;  // (R, C*H)
  const T* hn;         // (rows, C*H)
  T* pre_output;       // (rows, H)
  int64_t rows = 0, C = 0, H = 0, R = 0;
  float reduction_scale = 1.0f;
};

// Why the fused kernel cannot run these arguments on this device (16-bit T, sm_90, C = 4, H a multiple of
// 64, R a multiple of 8, 16-byte aligned pointers, a build with CUTLASS); empty when it can.
template <typename T>
std::string HcUpGateRefusal(const HcUpGateArgs<T>& args, const HcDeviceCaps& caps);

// Launches the kernel on `stream` (use_pdl: with programmatic stream serialization; it waits before its
// first read). Only after an empty HcUpGateRefusal. Never synchronizes.
template <typename T>
cudaError_t LaunchHcUpGate(const HcUpGateArgs<T>& args, const HcDeviceCaps& caps, bool use_pdl, cudaStream_t stream);

}  // namespace cuda
}  // namespace hcfuse
