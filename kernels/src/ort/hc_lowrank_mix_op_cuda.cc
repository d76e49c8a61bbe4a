// CUDAExecutionProvider glue of HyperConnectionLowRankMix: validates like the CPU kernel, picks the
// fast or the general path, takes scratch from ORT's allocator and launches on ORT's compute stream.
// It never computes, never synchronizes the host and keeps no process-wide state: everything lives in
// the kernel instance (attributes, path override, device properties, the cuBLASLt plans).
#include "ort/hc_lowrank_mix_op_cuda.h"

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "cuda/common/hc_lowrank_mix_cuda.h"
#include "cuda/fast/hc_fast_path.h"
#include "cuda/fast/hc_fast_plan.h"
#include "cuda/general/hc_gemm.h"
#include "ort/cuda_glue.h"
#include "ort/hc_lowrank_mix_op.h"

namespace hcfuse {
namespace {

constexpr const char* kCudaProvider = "CUDAExecutionProvider";

#if defined(HCFUSE_DEV_KNOBS)
// Benchmark and test switches, compiled in only with the CMake option HCFUSE_DEV_KNOBS (off in the
// shipped library, which runs the defaults). None changes a result except HCFUSE_UP_GATE (the general
// path's up product: both routes keep the contract, the last bits of pre_output may differ).

// The switch `name` (0 or 1); empty where it is unset or empty, an error naming it for any other value.
std::optional<bool> ReadZeroOrOne(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  if (std::strcmp(value, "0") != 0 && std::strcmp(value, "1") != 0) {
    throw Ort::Exception(std::string(kOpName) + ": " + name + " must be 0 or 1 (or unset); got '" + value + "'",
                         ORT_INVALID_ARGUMENT);
  }
  return *value == '1';
}

// HCFUSE_FAST_SS_LOCAL_ROWS / HCFUSE_FAST_HIDDEN_LOCAL_ROWS: the fast path's work split,
// HCFUSE_FAST_REAL_SHAPE (0|1): whether the real shape runs its constant-tiling kernels,
// HCFUSE_FAST_AHEAD: how many later kernels may wait next to them, HCFUSE_FAST_STAGE2_CTAS: the most
// stage 2 CTAs (HcFastTuning).
HcFastTuning ReadFastTuning() {
  HcFastTuning tuning;
  for (auto [name, field] : {std::pair{"HCFUSE_FAST_SS_LOCAL_ROWS", &tuning.ss_local_max_rows},
                             std::pair{"HCFUSE_FAST_HIDDEN_LOCAL_ROWS", &tuning.hidden_local_max_rows},
                             std::pair{"HCFUSE_FAST_AHEAD", &tuning.kernels_ahead},
                             std::pair{"HCFUSE_FAST_STAGE2_CTAS", &tuning.stage2_max_ctas}}) {
    if (const std::optional<long long> value = ReadIntegerSwitch(name, 0, kOpName)) *field = *value;
  }
  if (const std::optional<bool> value = ReadZeroOrOne("HCFUSE_FAST_REAL_SHAPE")) tuning.real_shape_kernels = *value;
  return tuning;
}

// HCFUSE_UP_GATE (1: fused, 0: unfused; unset or empty: HcUpGateRoute::kAuto) pins how the general path
// runs its up product and gate epilogue.
cuda::HcGeneralOptions ReadGeneralOptions() {
  cuda::HcGeneralOptions options;
  if (const std::optional<bool> fused = ReadZeroOrOne("HCFUSE_UP_GATE")) {
    options.up_gate = *fused ? cuda::HcUpGateRoute::kFused : cuda::HcUpGateRoute::kUnfused;
  }
  return options;
}
#else
HcFastTuning ReadFastTuning() { return {}; }
cuda::HcGeneralOptions ReadGeneralOptions() { return {}; }
#endif

Ort::Status LaunchFailure(const char* launcher, const std::string& error) {
  return Ort::Status((std::string(kOpName) + " (CUDA): " + launcher + " failed: " + error).c_str(),
                     ORT_RUNTIME_EXCEPTION);
}

template <typename T>
class CudaProvider {
 public:
  using CT = typename CudaTypeOf<T>::type;
  using Args = cuda::HcDeviceTensors<CT>;
  static constexpr bool kHasFastPath = !std::is_same_v<CT, float>;  // the fast path is fp16/bf16 only

  CudaProvider(const OrtApi& api, const OrtKernelInfo* info)
      : forced_(ReadForcedPath(kOpName)),
        debug_(ReadDebugFlag()),
        tuning_(ReadFastTuning()),
        general_(ReadGeneralOptions()),
        gemm_(debug_) {
    // norm_scale and the three weight matrices (inputs 1-4): only constant ones may the fast path read before
    // it waits on the producer of the activations (programmatic dependent launch)
    weights_constant_ = InputsAreConstant(api, info, 1, 5);
    ThrowIfCudaFailed(cudaGetDevice(&device_), "cudaGetDevice", kOpName);
    ThrowIfCudaFailed(cuda::QueryHcDeviceCaps(device_, &caps_), "cudaDeviceGetAttribute (the device's capabilities)",
                      kOpName);
  }

  Ort::Status Run(OrtKernelContext* ctx, const HcLowRankMixParams& params, const Args& t) {
    auto stream = static_cast<cudaStream_t>(Ort::KernelContext(ctx).GetGPUComputeStream());

    // One plan per call: the fast path when it is ok, else the general path; its reason goes to
    // HCFUSE_DEBUG and the forced-path error.
    const HcFastPlan plan =
        forced_ == PathChoice::kGeneral ? HcFastPlanRefused("HCFUSE_FORCE_PATH=general") : PlanFast(params, t);
    const bool fast = plan.ok();
    if (forced_ == PathChoice::kFast && !fast) {
      return Ort::Status((std::string(kOpName) + " (CUDA): HCFUSE_FORCE_PATH=fast, but the fast path cannot run this "
                                                 "call: " + plan.reason + "; unset HCFUSE_FORCE_PATH or set it to 'general'")
                             .c_str(),
                         ORT_FAIL);
    }
    if (debug_) {
      const std::string why = !fast                         ? plan.reason
                              : forced_ == PathChoice::kFast ? "HCFUSE_FORCE_PATH=fast"
                              : weights_constant_           ? "decode-sized, constant weights"
                                                            : "decode-sized, weights produced by the graph";
      std::fprintf(stderr, "hcfuse: %s %s rows=%lld C=%lld H=%lld R=%lld sm_%d%d: %s path (%s)\n", kOpName,
                   CudaTypeOf<T>::name, static_cast<long long>(params.rows), static_cast<long long>(params.C),
                   static_cast<long long>(params.H), static_cast<long long>(params.R), caps_.sm_major, caps_.sm_minor,
                   fast ? "fast" : "general", why.c_str());
    }
    return fast ? RunFast(ctx, params, t, plan, stream) : RunGeneral(ctx, params, t, stream);
  }

 private:
  HcFastPlan PlanFast(const HcLowRankMixParams& p, const Args& t) const {
    HcFastRequest request;
    request.element_bytes = static_cast<int>(sizeof(CT));
    request.pointers_aligned = cuda::HcFastTensorsAligned(t);
    request.forced = forced_ == PathChoice::kFast;
    return HcFastPlanFor(p, caps_, tuning_, request);
  }

  Ort::Status RunGeneral(OrtKernelContext* ctx, const HcLowRankMixParams& p, const Args& t, cudaStream_t stream) {
    CudaScratch scratch =
        AllocateCudaScratch(ctx, device_, cuda::HcGeneralScratchBytes<CT>(p, t, caps_, general_), kOpName);
    const cuda::HcLaunchStatus s =
        cuda::LaunchHcGeneral<CT>(p, t, caps_, general_, scratch.get(), gemm_, stream, debug_);
    return s.ok() ? Ort::Status{nullptr} : LaunchFailure("LaunchHcGeneral", s.Message());
  }

  Ort::Status RunFast(OrtKernelContext* ctx, const HcLowRankMixParams& p, const Args& t, const HcFastPlan& plan,
                      cudaStream_t stream) {
    if constexpr (kHasFastPath) {
      CudaScratch scratch = AllocateCudaScratch(ctx, device_, plan.scratch.total, kOpName);
      if (debug_) {
        std::fprintf(stderr, "hcfuse: %s fast path: %s; PDL %s, weights %s\n", kOpName,
                     cuda::HcFastLaunchSummary<CT>(plan).c_str(), plan.use_pdl ? "on" : "off",
                     weights_constant_ ? "constant (read before the wait)" : "produced upstream (read after the wait)");
      }
      const cuda::HcLaunchStatus s = cuda::LaunchHcFast<CT>(p, t, scratch.get(), plan, stream, weights_constant_);
      return s.ok() ? Ort::Status{nullptr} : LaunchFailure("LaunchHcFast", s.Message());
    } else {
      return LaunchFailure("LaunchHcFast", "the fast path has no float kernel");
    }
  }

  const PathChoice forced_;
  const bool debug_;
  const HcFastTuning tuning_;
  const cuda::HcGeneralOptions general_;
  bool weights_constant_ = false;
  int device_ = 0;
  HcDeviceCaps caps_;
  cuda::HcLtGemm gemm_;  // one cuBLASLt handle and pinned plans per kernel instance
};

template <typename T>
using HcLowRankMixCudaKernel = HcLowRankMixKernel<T, CudaProvider<T>>;

}  // namespace

void RegisterCudaOps(Ort::CustomOpDomain& domain) {
  AddHcLowRankMixOp<HcLowRankMixCudaKernel<float>>(domain, kCudaProvider);
  AddHcLowRankMixOp<HcLowRankMixCudaKernel<Ort::Float16_t>>(domain, kCudaProvider);
  AddHcLowRankMixOp<HcLowRankMixCudaKernel<Ort::BFloat16_t>>(domain, kCudaProvider);
}

}  // namespace hcfuse
