// CPUExecutionProvider kernel of HyperConnectionLowRankMix: validates, allocates, and hands raw
// pointers and fp32 scratch (from ORT's CPU allocator) to the CPU math (cpu/hc_lowrank_mix_cpu.h),
// whose tasks (blocks of output elements) run on ORT's thread pool.
#include "ort/hc_lowrank_mix_op.h"

#include "cpu/hc_lowrank_mix_cpu.h"
#include "ort/cpu_runtime.h"

namespace hcfuse {
namespace {

template <typename T>
struct CpuProvider {
  using Args = HcLowRankMixCpuArgs<CpuType<T>>;

  CpuProvider(const OrtApi& /*api*/, const OrtKernelInfo* /*info*/) {}

  Ort::Status Run(OrtKernelContext* ctx, const HcLowRankMixParams& params, const Args& args) {
    const CpuScratch scratch = AllocateCpuScratch(ctx, HcLowRankMixCpuScratchFloats(params), kOpName);
    HcLowRankMixCpu(params, args, OrtTaskRunner(ctx), scratch.get());
    return Ort::Status{nullptr};
  }
};

template <typename T>
using HcLowRankMixCpuKernel = HcLowRankMixKernel<T, CpuProvider<T>>;

}  // namespace

void RegisterCpuOps(Ort::CustomOpDomain& domain) {
  constexpr const char* kCpu = "CPUExecutionProvider";
  AddHcLowRankMixOp<HcLowRankMixCpuKernel<float>>(domain, kCpu);
  AddHcLowRankMixOp<HcLowRankMixCpuKernel<Ort::Float16_t>>(domain, kCpu);
  AddHcLowRankMixOp<HcLowRankMixCpuKernel<Ort::BFloat16_t>>(domain, kCpu);
}

}  // namespace hcfuse
