// CUDAExecutionProvider kernel of ai.hcfuse::HyperConnectionLowRankMixNBits (float, float16, bfloat16): the
// call checked and its outputs allocated as on the CPU (PrepareHcNBitsCall, hc_lowrank_mix_nbits_op.h),
// scratch from ORT's CUDA allocator, the kernels (cuda/nbits/hc_nbits_cuda.h) launched on ORT's compute
// stream. It never synchronizes the host and keeps no state beyond the node's attributes and device, so
// the op is CUDA-graph capturable. On sm_90 the kernels launch with programmatic dependent launch; a product
// reads its quantized weight before the kernel before it has ended only where B, scales and zero points are
// constant initializers (never written), everything else after.
#include "ort/hc_lowrank_mix_nbits_op_cuda.h"

#include <cuda_runtime.h>

#include <cstdio>
#include <string>

#include "cuda/common/hc_device_caps.h"
#include "cuda/nbits/hc_nbits_cuda.h"
#include "ort/cuda_glue.h"
#include "ort/hc_lowrank_mix_nbits_op.h"

namespace hcfuse {
namespace {

template <typename T>
struct NBitsCudaKernel {
  using S = typename CudaTypeOf<T>::type;

  NBitsCudaKernel(const OrtApi& api, const OrtKernelInfo* info, const HcNBitsAttrs& attrs)
      : attrs_(attrs), debug_(ReadDebugFlag()) {
    ThrowIfCudaFailed(cudaGetDevice(&device_), "cudaGetDevice", kNBitsOpName);
    ThrowIfCudaFailed(cuda::QueryHcDeviceCaps(device_, &caps_), "cudaDeviceGetAttribute (the device's capabilities)",
                      kNBitsOpName);
    options_.pdl = HcRunsSm90Code(caps_.sm_major);
    // each projection's weight, scales and zero points (three inputs from its weight)
    options_.down_inject_constant =
        options_.pdl && InputsAreConstant(api, info, kDownInjectWeight, kDownInjectWeight + 3);
    options_.up_constant = options_.pdl && InputsAreConstant(api, info, kUpWeight, kUpWeight + 3);
  }

  Ort::Status Compute(OrtKernelContext* context) {
    HcNBitsCall<T> call;
    Ort::Status st = PrepareHcNBitsCall<T>(context, attrs_, &call);
    const HcNBitsParams& params = call.form.params;
    if (!st.IsOK() || params.mix.rows == 0) return st;

    const HcNBitsTensors<S> tensors = call.template Tensors<S>();

    if (debug_) PrintCall(call);
    auto stream = static_cast<cudaStream_t>(Ort::KernelContext(context).GetGPUComputeStream());
    const CudaScratch scratch =
        AllocateCudaScratch(context, device_, cuda::HcNBitsScratchBytes<S>(params), kNBitsOpName);
    const cuda::HcLaunchStatus s = cuda::LaunchHcNBits<S>(params, tensors, scratch.get(), options_, stream);
    if (s.ok()) return Ort::Status{nullptr};
    return Ort::Status((std::string(kNBitsOpName) + " (CUDA): LaunchHcNBits failed: " + s.Message()).c_str(),
                       ORT_RUNTIME_EXCEPTION);
  }

 private:
  // HCFUSE_DEBUG's line: the call and where each projection's weights are read.
  void PrintCall(const HcNBitsCall<T>& call) const {
    const HcLowRankMixParams& m = call.form.params.mix;
    auto where = [&](const HcNBitsProjectionForm& f, bool constant) {
      return !f.quantized      ? "dense"
             : !options_.pdl   ? "quantized"
             : constant        ? "quantized, constant (read before the wait)"
                               : "quantized, produced upstream (read after the wait)";
    };
    const auto ll = [](int64_t v) { return static_cast<long long>(v); };
    std::fprintf(stderr,
                 "hcfuse: %s %s rows=%lld C=%lld H=%lld R=%lld bits=%lld block_size=%lld sm_%d%d: CUDA kernel, "
                 "PDL %s; down_inject %s; up %s\n",
                 kNBitsOpName, CudaTypeOf<T>::name, ll(m.rows), ll(m.C), ll(m.H), ll(m.R), ll(call.form.params.bits),
                 ll(call.form.params.block_size), caps_.sm_major, caps_.sm_minor, options_.pdl ? "on" : "off",
                 where(call.form.down_inject, options_.down_inject_constant), where(call.form.up, options_.up_constant));
  }

  HcNBitsAttrs attrs_;
  const bool debug_;
  int device_ = 0;
  HcDeviceCaps caps_;  // read once: whether the kernels run their sm_90 code (PDL)
  cuda::HcNBitsLaunchOptions options_;
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
