// Launcher declarations of the CUDA general path (hc_general.cu) and the types shared with the fast
// path and the ORT glue. No ORT type here; no device code either (the glue is plain C++).
#pragma once

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <string>

#include "cuda/common/hc_device_caps.h"
#include "hcfuse/hc_params.h"

namespace hcfuse {
namespace cuda {

class HcLtGemm;

// Device pointers of one call. prev_block_output/prev_post_gate are null without the prologue,
// streams_out is null when the output is not requested.
template <typename T>
struct HcDeviceTensors {
  const T* streams = nullptr;
  const T* norm_scale = nullptr;
  const T* down_weight = nullptr;
  const T* up_weight = nullptr;
  const T* inject_weight = nullptr;
  const T* prev_block_output = nullptr;
  const T* prev_post_gate = nullptr;
  T* pre_output = nullptr;
  T* post_gate = nullptr;
  T* streams_out = nullptr;
};

// Outcome of a multi-step launcher: the step that failed with its CUDA or cuBLAS status.
struct HcLaunchStatus {
  const char* step = nullptr;  // null on success
  cudaError_t cuda = cudaSuccess;
  cublasStatus_t cublas = CUBLAS_STATUS_SUCCESS;

  bool ok() const { return step == nullptr; }
  // "<step>: <CUDA or cuBLAS error name>: <description>"
  std::string Message() const;
};

// How the general path runs its up product: kFused, the product and the gate epilogue in one kernel
// (hc_up_gate.h) wherever it can run the call; kUnfused, cuBLASLt's product and HcGateEpilogueKernel; kAuto
// (what the library runs; HCFUSE_UP_GATE pins another route in HCFUSE_DEV_KNOBS builds), fused where it is
// faster: bfloat16 in every row range, float16 from the mid range (256 rows), so a row range keeps one route.
// Both keep the contract's rounding points; up's fp32 sums run in another order, so pre_output's last bits
// may differ between the routes.
enum class HcUpGateRoute { kAuto, kFused, kUnfused };
struct HcGeneralOptions {
  HcUpGateRoute up_gate = HcUpGateRoute::kAuto;
};

// Bytes of device scratch LaunchHcGeneral needs for this call, 256-byte aligned parts: hn (rows * C*H),
// up (rows * C*H, only where the fused up/gate kernel does not run it) and hidden (rows * R) in T, plus
// the fp32 partials of one row chunk of the split down product: splits * HcPartialStride(m, R) floats,
// with the split and chunk rows m of the row range (hc_gemm.h, hc_general.cu).
template <typename T>
size_t HcGeneralScratchBytes(const HcLowRankMixParams& params, const HcDeviceTensors<T>& tensors,
                             const HcDeviceCaps& caps, const HcGeneralOptions& options);

// The general path: norm + inject kernel (post_gate), split-K cuBLASLt GEMM for down with its
// fixed-order reduction (+ ScaledSiLU), the up product and the gate epilogue (fused or not: options), all on
// `stream`; the K split and pinned algorithms depend on the row range (few rows / prefill, hc_gemm.h).
// Any shape and row count (params.rows > 0); `scratch` holds HcGeneralScratchBytes bytes; `caps` are the
// device's (QueryHcDeviceCaps).
// T is float, __half or __nv_bfloat16. Never throws and never synchronizes.
template <typename T>
HcLaunchStatus LaunchHcGeneral(const HcLowRankMixParams& params, const HcDeviceTensors<T>& tensors,
                               const HcDeviceCaps& caps, const HcGeneralOptions& options, void* scratch,
                               HcLtGemm& gemm, cudaStream_t stream, bool debug);

}  // namespace cuda
}  // namespace hcfuse
