// Fused fast decode path of HyperConnectionLowRankMix (fp16 / bf16, sm_80+, PDL on sm_90).
// Two kernels: stage 1 splits K = C*H over ~128 CTAs (prologue, per-branch RMS norm, down and inject
// products on tensor cores, fp32 partials reduced inside a thread-block cluster); stage 2 splits the
// H features over ~128 CTAs (fixed-order partial reduction, ScaledSiLU, up product on tensor cores,
// sigmoid, pre-mix, post_gate). Rows go through in tiles of 16 (the mma's M).
// Which calls it runs, and how: HcFastPlanFor (hc_fast_plan.h). Launcher declarations only; no ORT type here.
#pragma once

#include <cstdint>
#include <string>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "cuda/common/hc_lowrank_mix_cuda.h"
#include "cuda/fast/hc_fast_plan.h"
#include "hcfuse/hc_params.h"

namespace hcfuse {

// Device pointers of one call: the struct the general path takes too (optional ones nullptr when absent).
template <typename T>
using HcFastArgs = cuda::HcDeviceTensors<T>;

// One projection of the quantized op as MatMulNBits holds it (4 bits): B [N][k_blocks][block_size / 2] bytes,
// scales [N][k_blocks], packed zero points [N][(k_blocks + 1) / 2] or null (8).
template <typename T>
struct HcFastQuantWeights {
  const uint8_t* q = nullptr;
  const T* scales = nullptr;
  const uint8_t* zero_points = nullptr;
};

// The quantized op's weights (the dense tensors' weight pointers are then null): down_inject K = C*H,
// N = R + C (down's columns, then inject's); up K = R, N = C*H.
template <typename T>
struct HcFastQuant {
  HcFastQuantWeights<T> down_inject, up;
};

namespace cuda {

// Every tensor of the call is 16-byte aligned (what HcFastRequest::pointers_aligned says).
template <typename T>
bool HcFastTensorsAligned(const HcDeviceTensors<T>& t) {
  return HcFastPointersAligned({t.streams, t.norm_scale, t.down_weight, t.up_weight, t.inject_weight,
                                t.prev_block_output, t.prev_post_gate, t.pre_output, t.post_gate, t.streams_out});
}

// The fast path, in the general path's convention (LaunchHcGeneral: params, tensors, scratch, the
// path's own state, stream, flag): enqueues the plan's two kernels on `stream` (no host
// synchronization; CUDA-graph capturable). Never throws.
// plan: HcFastPlanFor(params, ...) and ok(); scratch: plan.scratch.total bytes, 16-byte aligned.
// weights_are_constant: norm_scale / down / up / inject are constant initializers, so the kernels may
//   read them before waiting on the producer of the activations (only meaningful with plan.use_pdl).
// A plan that is not ok, made for other params, or a misaligned scratch: cudaErrorInvalidValue at step
// "fast path plan"; else the first CUDA error of the launches.
template <typename T>
HcLaunchStatus LaunchHcFast(const HcLowRankMixParams& params, const HcDeviceTensors<T>& tensors, void* scratch,
                            const HcFastPlan& plan, cudaStream_t stream, bool weights_are_constant);

// The fast path for the quantized op (a plan made with HcFastRequest::quant_block_size): as LaunchHcFast,
// the weights from `quant`; weights_are_constant covers norm_scale and every quantized weight input.
template <typename T>
HcLaunchStatus LaunchHcFastQuant(const HcLowRankMixParams& params, const HcDeviceTensors<T>& tensors,
                                 const HcFastQuant<T>& quant, void* scratch, const HcFastPlan& plan,
                                 cudaStream_t stream, bool weights_are_constant);

// One line for HCFUSE_DEBUG: grids, shared memory, how many clusters fit on the device at once
// (queries the CUDA runtime; not for the hot path).
template <typename T>
std::string HcFastLaunchSummary(const HcFastPlan& plan);

extern template HcLaunchStatus LaunchHcFast<__half>(const HcLowRankMixParams&, const HcDeviceTensors<__half>&, void*,
                                                    const HcFastPlan&, cudaStream_t, bool);
extern template HcLaunchStatus LaunchHcFast<__nv_bfloat16>(const HcLowRankMixParams&,
                                                           const HcDeviceTensors<__nv_bfloat16>&, void*,
                                                           const HcFastPlan&, cudaStream_t, bool);
extern template HcLaunchStatus LaunchHcFastQuant<__half>(const HcLowRankMixParams&, const HcDeviceTensors<__half>&,
                                                         const HcFastQuant<__half>&, void*, const HcFastPlan&,
                                                         cudaStream_t, bool);
extern template HcLaunchStatus LaunchHcFastQuant<__nv_bfloat16>(const HcLowRankMixParams&,
                                                                const HcDeviceTensors<__nv_bfloat16>&,
                                                                const HcFastQuant<__nv_bfloat16>&, void*,
                                                                const HcFastPlan&, cudaStream_t, bool);
extern template std::string HcFastLaunchSummary<__half>(const HcFastPlan&);
extern template std::string HcFastLaunchSummary<__nv_bfloat16>(const HcFastPlan&);

}  // namespace cuda
}  // namespace hcfuse
