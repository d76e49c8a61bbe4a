// CPUExecutionProvider kernel of ai.hcfuse::HyperConnectionLowRankMixNBits (float, float16, bfloat16):
// the call checked and its outputs allocated (PrepareHcNBitsCall, hc_lowrank_mix_nbits_op.h, shared with
// the CUDA kernel), then raw pointers and fp32 scratch from ORT's CPU allocator handed to the CPU math
// (cpu/hc_nbits_cpu.h), whose tasks run on ORT's thread pool.
#include "ort/hc_lowrank_mix_nbits_op_cpu.h"

#include "cpu/hc_nbits_cpu.h"
#include "ort/cpu_runtime.h"
#include "ort/hc_lowrank_mix_nbits_op.h"

namespace hcfuse {
namespace {

template <typename T>
struct NBitsCpuKernel {
  using S = CpuType<T>;

  NBitsCpuKernel(const OrtApi& /*api*/, const OrtKernelInfo* /*info*/, const HcNBitsAttrs& attrs) : attrs_(attrs) {}

  Ort::Status Compute(OrtKernelContext* context) {
    HcNBitsCall<T> call;
    Ort::Status st = PrepareHcNBitsCall<T>(context, attrs_, &call);
    const HcNBitsParams& params = call.form.params;
    if (!st.IsOK() || params.mix.rows == 0) return st;

    const HcNBitsTensors<S> args = call.template Tensors<S>();
    const CpuScratch scratch = AllocateCpuScratch(context, HcNBitsCpuScratchFloats(params), kNBitsOpName);
    HcNBitsCpu(params, args, OrtTaskRunner(context), scratch.get());
    return Ort::Status{nullptr};
  }

 private:
  HcNBitsAttrs attrs_;
};

}  // namespace

void RegisterNBitsCpuOps(Ort::CustomOpDomain& domain) {
  // ORT keeps raw pointers to the ops: they live as long as the process.
  static HcNBitsOp<float, NBitsCpuKernel<float>> f32("CPUExecutionProvider");
  static HcNBitsOp<Ort::Float16_t, NBitsCpuKernel<Ort::Float16_t>> f16("CPUExecutionProvider");
  static HcNBitsOp<Ort::BFloat16_t, NBitsCpuKernel<Ort::BFloat16_t>> bf16("CPUExecutionProvider");
  domain.Add(&f32);
  domain.Add(&f16);
  domain.Add(&bf16);
}

}  // namespace hcfuse
