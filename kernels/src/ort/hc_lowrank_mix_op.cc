// CPUExecutionProvider kernel of HyperConnectionLowRankMix: validates, allocates, and hands raw
// pointers to the CPU math (cpu/hc_lowrank_mix_cpu.h), parallel over row tiles on ORT's thread pool.
#include "ort/hc_lowrank_mix_op.h"

#include <type_traits>

#include "cpu/hc_lowrank_mix_cpu.h"

namespace hcfuse {
namespace {

// The CPU math's storage type for an ORT element type (same bits).
template <typename T>
using CpuType = std::conditional_t<std::is_same_v<T, Ort::Float16_t>, Half,
                                   std::conditional_t<std::is_same_v<T, Ort::BFloat16_t>, BFloat16, float>>;
static_assert(sizeof(Ort::Float16_t) == sizeof(Half) && sizeof(Ort::BFloat16_t) == sizeof(BFloat16));

// Runs the tasks on the session's intra-op thread pool; serially when it cannot.
HcTaskRunner OrtTaskRunner(OrtKernelContext* ctx) {
  return [ctx](int64_t num_tasks, const std::function<void(int64_t)>& fn) {
    if (num_tasks > 1) {
      auto trampoline = [](void* data, size_t task) {
        (*static_cast<const std::function<void(int64_t)>*>(data))(static_cast<int64_t>(task));
      };
      void* data = const_cast<std::function<void(int64_t)>*>(&fn);
      OrtStatus* st = Ort::GetApi().KernelContext_ParallelFor(ctx, trampoline, static_cast<size_t>(num_tasks), 0, data);
      if (st == nullptr) return;
      Ort::GetApi().ReleaseStatus(st);  // no thread pool offered: fall through (no task has run then)
    }
    for (int64_t t = 0; t < num_tasks; ++t) fn(t);
  };
}

template <typename T>
struct HcLowRankMixCpuKernel {
  HcLowRankMixCpuKernel(const OrtApi* api, const OrtKernelInfo* info) {
    Ort::ThrowOnError(ReadHcLowRankMixAttrs(*api, info, &attrs_));
  }

  Ort::Status Compute(OrtKernelContext* ctx, HcInput<T> streams, HcInput<T> norm_scale, HcInput<T> down_weight,
                      HcInput<T> up_weight, HcInput<T> inject_weight, HcOptionalInput<T> prev_block_output,
                      HcOptionalInput<T> prev_post_gate, HcOutput<T> /*pre_output*/, HcOutput<T> /*post_gate*/,
                      HcOptionalOutput<T> streams_out) {
    HcLowRankMixParams params;
    HcOutputPtrs<T> out;
    Ort::Status st = PrepareHcLowRankMix<T>(ctx, attrs_, streams, norm_scale, down_weight, up_weight, inject_weight,
                                            prev_block_output, prev_post_gate, streams_out.has_value(), &params, &out);
    if (!st.IsOK() || params.rows == 0) return st;
    const auto args = HcPointers<HcLowRankMixCpuArgs<CpuType<T>>>(
        streams, norm_scale, down_weight, up_weight, inject_weight, prev_block_output, prev_post_gate, params, out);
    HcLowRankMixCpu(params, args, OrtTaskRunner(ctx));
    return Ort::Status{nullptr};
  }

  HcLowRankMixAttrs attrs_;
};

}  // namespace

void RegisterCpuOps(Ort::CustomOpDomain& domain) {
  constexpr const char* kCpu = "CPUExecutionProvider";
  AddHcLowRankMixOp<HcLowRankMixCpuKernel<float>>(domain, kCpu);
  AddHcLowRankMixOp<HcLowRankMixCpuKernel<Ort::Float16_t>>(domain, kCpu);
  AddHcLowRankMixOp<HcLowRankMixCpuKernel<Ort::BFloat16_t>>(domain, kCpu);
}

}  // namespace hcfuse
