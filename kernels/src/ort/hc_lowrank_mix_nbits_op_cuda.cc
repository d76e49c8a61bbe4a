// CUDAExecutionProvider kernel of ai.hcfuse::HyperConnectionLowRankMixNBits (float, float16, bfloat16): the
// call checked and its outputs allocated as on the CPU (PrepareHcNBitsCall, hc_lowrank_mix_nbits_op.h),
// scratch from ORT's CUDA allocator, the kernels launched on ORT's compute stream: the fast path's quantized
// kernels (cuda/fast/hc_fast_path.h: float16 and bfloat16, 4 bits, both projections quantized, no zero points
// of T, block_size >= 32, decode-sized row counts, the shapes HcFastPlanFor takes) or else the general path: the
// GEMM route from 64 rows where it can run the call (cuda/nbits/hc_nbits_gemm.h), else the CUDA-core quantized
// kernels (cuda/nbits/hc_nbits_cuda.h). HCFUSE_FORCE_PATH=general|fast pins the path. It never synchronizes the
// host during a call (float16 scales are read once, when the kernel is created) and keeps no process-wide state:
// the node's attributes, device and the GEMM route's cuBLASLt plans live in the kernel instance, so the op is
// CUDA-graph capturable. On sm_90 the kernels launch with programmatic dependent launch; a product reads its
// quantized weight before the kernel before it has ended only where B, scales and zero points are constant
// initializers (never written), everything else after.
#include "ort/hc_lowrank_mix_nbits_op_cuda.h"

#include <cuda_runtime.h>

#include <cstdio>
#include <string>
#include <type_traits>

#include "cuda/common/hc_device_caps.h"
#include "cuda/fast/hc_fast_path.h"
#include "cuda/fast/hc_fast_plan.h"
#include "cuda/general/hc_gemm.h"
#include "cuda/nbits/hc_nbits_cuda.h"
#include "cuda/nbits/hc_nbits_gemm.h"
#include "ort/cuda_glue.h"
#include "ort/hc_lowrank_mix_nbits_op.h"

namespace hcfuse {
namespace {

template <typename T>
struct NBitsCudaKernel {
  using S = typename CudaTypeOf<T>::type;

  NBitsCudaKernel(const OrtApi& api, const OrtKernelInfo* info, const HcNBitsAttrs& attrs)
      : attrs_(attrs), forced_(ReadForcedPath(kNBitsOpName)), debug_(ReadDebugFlag()), gemm_(debug_) {
    ThrowIfCudaFailed(cudaGetDevice(&device_), "cudaGetDevice", kNBitsOpName);
    ThrowIfCudaFailed(cuda::QueryHcDeviceCaps(device_, &caps_), "cudaDeviceGetAttribute (the device's capabilities)",
                      kNBitsOpName);
    options_.pdl = HcRunsSm90Code(caps_.sm_major);
    // each projection's weight, scales and zero points (three inputs from its weight)
    options_.down_inject_constant =
        options_.pdl && InputsAreConstant(api, info, kDownInjectWeight, kDownInjectWeight + 3);
    options_.up_constant = options_.pdl && InputsAreConstant(api, info, kUpWeight, kUpWeight + 3);
    fast_weights_constant_ = options_.down_inject_constant && options_.up_constant &&
                             InputsAreConstant(api, info, kNormScale, kNormScale + 1);
    gemm_options_.pdl = options_.pdl;
#if defined(HCFUSE_DEV_KNOBS)
    // a benchmark switch: the rows from which the general path takes the GEMM route (both routes meet the
    // contract; their last bits may differ)
    gemm_options_.min_rows =
        ReadIntegerSwitch("HCFUSE_NBITS_GEMM_MIN_ROWS", 1, kNBitsOpName).value_or(cuda::kHcNBitsGemmMinRows);
#endif
    if constexpr (std::is_same_v<S, __half>) {
      // a quantized projection's scales (the input after its B); a dense projection has none
      auto in_range = [&](size_t weight) {
        size_t count = 0;
        Ort::ThrowOnError(api.KernelInfo_GetInputCount(info, &count));
        const bool quantized = weight + 1 < count && !Ort::ConstKernelInfo(info).GetInputName(weight + 1).empty();
        return !quantized || Float16ScalesInRange(info, weight + 1, attrs_.bits);
      };
      gemm_options_.float16_weights_in_range = in_range(kDownInjectWeight) && in_range(kUpWeight);
    }
  }

  Ort::Status Compute(OrtKernelContext* context) {
    HcNBitsCall<T> call;
    Ort::Status st = PrepareHcNBitsCall<T>(context, attrs_, &call);
    const HcNBitsParams& params = call.form.params;
    if (!st.IsOK() || params.mix.rows == 0) return st;

    const HcNBitsTensors<S> tensors = call.template Tensors<S>();

    auto stream = static_cast<cudaStream_t>(Ort::KernelContext(context).GetGPUComputeStream());
    const HcFastPlan plan = forced_ == PathChoice::kGeneral ? HcFastPlanRefused("HCFUSE_FORCE_PATH=general")
                                                            : PlanFast(call, tensors);
    if (forced_ == PathChoice::kFast && !plan.ok()) {
      return Ort::Status((std::string(kNBitsOpName) + " (CUDA): HCFUSE_FORCE_PATH=fast, but the fast path cannot run "
                                                      "this call: " + plan.reason)
                             .c_str(),
                         ORT_FAIL);
    }
    if (debug_) PrintCall(call, plan);
    if (plan.ok()) return RunFast(context, params, tensors, plan, stream);
    const std::string gemm_refusal = cuda::HcNBitsGemmRefusal<S>(params, tensors, gemm_options_);
    if (debug_) {
      const std::string route =
          gemm_refusal.empty() ? "GEMM route" : "CUDA-core kernels (GEMM route: " + gemm_refusal + ")";
      std::fprintf(stderr, "hcfuse: %s general path: %s\n", kNBitsOpName, route.c_str());
    }
    if (gemm_refusal.empty()) return RunGemm(context, params, tensors, stream);
    const CudaScratch scratch =
        AllocateCudaScratch(context, device_, cuda::HcNBitsScratchBytes<S>(params), kNBitsOpName);
    const cuda::HcLaunchStatus s = cuda::LaunchHcNBits<S>(params, tensors, scratch.get(), options_, stream);
    if (s.ok()) return Ort::Status{nullptr};
    return Ort::Status((std::string(kNBitsOpName) + " (CUDA): LaunchHcNBits failed: " + s.Message()).c_str(),
                       ORT_RUNTIME_EXCEPTION);
  }

 private:
  // The fast path's plan, or why it does not run the call.
  HcFastPlan PlanFast(const HcNBitsCall<T>& call, const HcNBitsTensors<S>& t) const {
    const HcNBitsForm& f = call.form;
    if constexpr (std::is_same_v<S, float>) return HcFastPlanRefused("the fast path runs float16 and bfloat16 only");
    if (f.params.bits != 4) return HcFastPlanRefused("the quantized fast path runs 4 bits only");
    if (!f.down_inject.quantized || !f.up.quantized) {
      return HcFastPlanRefused("the quantized fast path needs both projections quantized");
    }
    if (f.down_inject.zero_points == HcNBitsTensorInfo::kT || f.up.zero_points == HcNBitsTensorInfo::kT) {
      return HcFastPlanRefused("the quantized fast path takes packed uint8 zero points or none, not T");
    }
    HcFastRequest request;
    request.element_bytes = static_cast<int>(sizeof(S));
    request.pointers_aligned = cuda::HcFastTensorsAligned(DenseTensors(t));
    request.forced = forced_ == PathChoice::kFast;
    request.quant_block_size = f.params.block_size;
    return HcFastPlanFor(f.params.mix, caps_, HcFastTuning{}, request);
  }

  // The call's tensors but its weights (the fast path's quantized kernels take those from HcFastQuant).
  static cuda::HcDeviceTensors<S> DenseTensors(const HcNBitsTensors<S>& t) {
    cuda::HcDeviceTensors<S> d;
    d.streams = t.streams;
    d.norm_scale = t.norm_scale;
    d.prev_block_output = t.prev_block_output;
    d.prev_post_gate = t.prev_post_gate;
    d.pre_output = t.pre_output;
    d.post_gate = t.post_gate;
    d.streams_out = t.streams_out;
    return d;
  }

  static HcFastQuantWeights<S> QuantWeights(const HcNBitsProjection<S>& p) { return {p.q, p.scales, p.zero_points}; }

  Ort::Status RunFast(OrtKernelContext* context, const HcNBitsParams& params, const HcNBitsTensors<S>& t,
                      const HcFastPlan& plan, cudaStream_t stream) {
    if constexpr (std::is_same_v<S, float>) {
      return Ort::Status((std::string(kNBitsOpName) + " (CUDA): the fast path has no float kernel").c_str(),
                         ORT_RUNTIME_EXCEPTION);
    } else {
      const CudaScratch scratch = AllocateCudaScratch(context, device_, plan.scratch.total, kNBitsOpName);
      if (debug_) {
        std::fprintf(stderr, "hcfuse: %s fast path: %s\n", kNBitsOpName, cuda::HcFastLaunchSummary<S>(plan).c_str());
      }
      const HcFastQuant<S> quant{QuantWeights(t.down_inject), QuantWeights(t.up)};
      const cuda::HcLaunchStatus s = cuda::LaunchHcFastQuant<S>(params.mix, DenseTensors(t), quant, scratch.get(),
                                                                 plan, stream, fast_weights_constant_);
      if (s.ok()) return Ort::Status{nullptr};
      return Ort::Status((std::string(kNBitsOpName) + " (CUDA): LaunchHcFastQuant failed: " + s.Message()).c_str(),
                         ORT_RUNTIME_EXCEPTION);
    }
  }

  Ort::Status RunGemm(OrtKernelContext* context, const HcNBitsParams& params, const HcNBitsTensors<S>& t,
                      cudaStream_t stream) {
    const CudaScratch scratch =
        AllocateCudaScratch(context, device_, cuda::HcNBitsGemmScratchBytes<S>(params, t, caps_), kNBitsOpName);
    const cuda::HcLaunchStatus s =
        cuda::LaunchHcNBitsGemm<S>(params, t, caps_, gemm_options_, scratch.get(), gemm_, stream, debug_);
    if (s.ok()) return Ort::Status{nullptr};
    return Ort::Status((std::string(kNBitsOpName) + " (CUDA): LaunchHcNBitsGemm failed: " + s.Message()).c_str(),
                       ORT_RUNTIME_EXCEPTION);
  }

  // HCFUSE_DEBUG's line: the call, the path and where each projection's weights are read.
  void PrintCall(const HcNBitsCall<T>& call, const HcFastPlan& plan) const {
    const HcLowRankMixParams& m = call.form.params.mix;
    auto where = [&](const HcNBitsProjectionForm& f, bool constant) {
      return !f.quantized      ? "dense"
             : !options_.pdl   ? "quantized"
             : constant        ? "quantized, constant (read before the wait)"
                               : "quantized, produced upstream (read after the wait)";
    };
    const auto ll = [](int64_t v) { return static_cast<long long>(v); };
    std::fprintf(stderr,
                 "hcfuse: %s %s rows=%lld C=%lld H=%lld R=%lld bits=%lld block_size=%lld sm_%d%d: %s path (%s), "
                 "PDL %s; down_inject %s; up %s\n",
                 kNBitsOpName, CudaTypeOf<T>::name, ll(m.rows), ll(m.C), ll(m.H), ll(m.R), ll(call.form.params.bits),
                 ll(call.form.params.block_size), caps_.sm_major, caps_.sm_minor, plan.ok() ? "fast" : "general",
                 plan.ok() ? "decode-sized" : plan.reason.c_str(), options_.pdl ? "on" : "off",
                 where(call.form.down_inject, options_.down_inject_constant), where(call.form.up, options_.up_constant));
  }

  HcNBitsAttrs attrs_;
  const PathChoice forced_;
  const bool debug_;
  bool fast_weights_constant_ = false;  // norm_scale and every quantized weight input: read before the wait
  int device_ = 0;
  HcDeviceCaps caps_;  // read once: whether the kernels run their sm_90 code (PDL)
  cuda::HcNBitsLaunchOptions options_;
  cuda::HcNBitsGemmOptions gemm_options_;
  cuda::HcLtGemm gemm_;  // the GEMM route's cuBLASLt handle and pinned plans, one per kernel instance
};

constexpr const char* kCudaProvider = "CUDAExecutionProvider";

}  // namespace

void RegisterNBitsCudaOps(Ort::CustomOpDomain& domain) {
  // ORT keeps raw pointers to the ops: they live as long as the process.
  static HcNBitsOp<float, NBitsCudaKernel<float>> f32(kCudaProvider);
  static HcNBitsOp<Ort::Float16_t, NBitsCudaKernel<Ort::Float16_t>> f16(kCudaProvider);
  static HcNBitsOp<Ort::BFloat16_t, NBitsCudaKernel<Ort::BFloat16_t>> bf16(kCudaProvider);
  domain.Add(&f32);
  domain.Add(&f16);
  domain.Add(&bf16);
}

}  // namespace hcfuse
