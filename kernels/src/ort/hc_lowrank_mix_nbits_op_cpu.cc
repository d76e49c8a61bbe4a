// CPUExecutionProvider kernel of ai.hcfuse::HyperConnectionLowRankMixNBits (float, float16, bfloat16):
// checks (hc_lowrank_mix_nbits_op.h), allocates the outputs (the dense op's allocation), and hands raw
// pointers and fp32 scratch from ORT's CPU allocator to the CPU math (cpu/hc_nbits_cpu.h), whose
// tasks run on ORT's thread pool. A projection's tensors are typed per call (T when dense, uint8 B;
// zero points uint8 or T), so the op is a plain OrtCustomOp that reads its inputs from the kernel
// context, not a lite op with fixed input types.
#include <algorithm>
#include <string>
#include <type_traits>
#include <vector>

#include "cpu/hc_nbits_cpu.h"
#include "ort/cpu_runtime.h"
#include "ort/hc_lowrank_mix_nbits_op.h"
#include "ort/hc_lowrank_mix_nbits_op_cpu.h"

namespace hcfuse {
namespace {

template <typename T>
constexpr ONNXTensorElementDataType kElementType =
    std::is_same_v<T, float> ? ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT
    : std::is_same_v<T, Ort::Float16_t> ? ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16
                                        : ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16;

const char* TypeName(ONNXTensorElementDataType t) {
  switch (t) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: return "float";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: return "float16";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16: return "bfloat16";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8: return "uint8";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8: return "int8";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE: return "double";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32: return "int32";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64: return "int64";
    default: return "another element type";
  }
}

template <typename T>
struct NBitsCpuKernel {
  using S = CpuType<T>;

  explicit NBitsCpuKernel(const HcNBitsAttrs& attrs) : attrs_(attrs) {}

  OrtStatusPtr ComputeV2(OrtKernelContext* ctx) noexcept {
    const OrtApi& api = Ort::GetApi();
    try {
      Ort::Status st = Compute(ctx);
      return st.release();
    } catch (...) {
      return detail::StatusFromCurrentException(api, kNBitsOpName);
    }
  }

 private:
  Ort::Status Compute(OrtKernelContext* context) {
    Ort::KernelContext ctx(context);
    const size_t count = std::min<size_t>(ctx.GetInputCount(), kNumNBitsInputs);
    std::vector<HcNBitsTensorInfo> info(kNumNBitsInputs);
    std::vector<const void*> data(kNumNBitsInputs, nullptr);
    for (size_t i = 0; i < count; ++i) {
      const Ort::ConstValue value = ctx.GetInput(i);
      if (!value) continue;  // an optional input given as an empty name
      const Ort::TensorTypeAndShapeInfo ts = value.GetTensorTypeAndShapeInfo();
      const ONNXTensorElementDataType type = ts.GetElementType();
      info[i].kind = type == kElementType<T>                       ? HcNBitsTensorInfo::kT
                     : type == ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8 ? HcNBitsTensorInfo::kUInt8
                                                                   : HcNBitsTensorInfo::kOther;
      info[i].type_name = TypeName(type);
      info[i].dims = ts.GetShape();
      data[i] = value.GetTensorRawData();
    }
    const bool has_streams_out = ctx.GetOutputCount() > 2;
    HcNBitsForm form;
    Ort::Status st = InvalidArgument(ResolveHcNBitsForm(info, has_streams_out, attrs_, &form));
    if (!st.IsOK()) return st;
    HcOutputPtrs<T> out;
    st = AllocateHcLowRankMixOutputs<T>(context, &form.params.mix, &out);
    if (!st.IsOK() || form.params.mix.rows == 0) return st;

    auto t = [&](size_t i) { return static_cast<const S*>(data[i]); };
    auto projection = [&](size_t w, const HcNBitsProjectionForm& f) {
      HcNBitsProjection<S> p;
      if (!f.quantized) {
        p.dense = t(w);
        return p;
      }
      p.q = static_cast<const uint8_t*>(data[w]);
      p.scales = t(w + 1);
      if (f.zero_points == HcNBitsTensorInfo::kUInt8) p.zero_points = static_cast<const uint8_t*>(data[w + 2]);
      if (f.zero_points == HcNBitsTensorInfo::kT) p.zero_points_t = t(w + 2);
      return p;
    };
    HcNBitsCpuArgs<S> args;
    args.streams = t(kStreams);
    args.norm_scale = t(kNormScale);
    args.down_inject = projection(kDownInjectWeight, form.down_inject);
    args.up = projection(kUpWeight, form.up);
    if (form.params.mix.has_prologue) {
      args.prev_block_output = t(kPrevBlockOutput);
      args.prev_post_gate = t(kPrevPostGate);
    }
    args.pre_output = reinterpret_cast<S*>(out.pre_output);
    args.post_gate = reinterpret_cast<S*>(out.post_gate);
    args.streams_out = form.params.mix.has_streams_out ? reinterpret_cast<S*>(out.streams_out) : nullptr;

    const CpuScratch scratch = AllocateCpuScratch(context, HcNBitsCpuScratchFloats(form.params), kNBitsOpName);
    HcNBitsCpu(form.params, args, OrtTaskRunner(context), scratch.get());
    return Ort::Status{nullptr};
  }

  HcNBitsAttrs attrs_;
};

// Inputs: streams, norm_scale, the prologue and the scales are T; each projection's weight (T or
// uint8) and zero points (uint8 or T) are left open and checked per call.
template <typename T>
struct NBitsCpuOp : Ort::CustomOpBase<NBitsCpuOp<T>, NBitsCpuKernel<T>, /*WithStatus=*/true> {
  OrtStatusPtr CreateKernelV2(const OrtApi& api, const OrtKernelInfo* info, void** kernel) const noexcept {
    HcNBitsAttrs attrs;
    if (OrtStatus* st = ReadHcNBitsAttrs(api, info, &attrs)) return st;
    try {
      *kernel = new NBitsCpuKernel<T>(attrs);
      return nullptr;
    } catch (...) {
      return detail::StatusFromCurrentException(api, kNBitsOpName);
    }
  }
  const char* GetName() const { return kNBitsOpName; }
  const char* GetExecutionProviderType() const { return "CPUExecutionProvider"; }
  size_t GetInputTypeCount() const { return kNumNBitsInputs; }
  ONNXTensorElementDataType GetInputType(size_t i) const {
    switch (i) {
      case kDownInjectWeight:
      case kDownInjectZeroPoints:
      case kUpWeight:
      case kUpZeroPoints:
        return ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
      default:
        return kElementType<T>;
    }
  }
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t i) const {
    const bool required = i == kStreams || i == kNormScale || i == kDownInjectWeight || i == kUpWeight;
    return required ? INPUT_OUTPUT_REQUIRED : INPUT_OUTPUT_OPTIONAL;
  }
  size_t GetOutputTypeCount() const { return 3; }
  ONNXTensorElementDataType GetOutputType(size_t /*i*/) const { return kElementType<T>; }
  OrtCustomOpInputOutputCharacteristic GetOutputCharacteristic(size_t i) const {
    return i < 2 ? INPUT_OUTPUT_REQUIRED : INPUT_OUTPUT_OPTIONAL;
  }
};

}  // namespace

void RegisterNBitsCpuOps(Ort::CustomOpDomain& domain) {
  // ORT keeps raw pointers to the ops: they live as long as the process.
  static NBitsCpuOp<float> f32;
  static NBitsCpuOp<Ort::Float16_t> f16;
  static NBitsCpuOp<Ort::BFloat16_t> bf16;
  domain.Add(&f32);
  domain.Add(&f16);
  domain.Add(&bf16);
}

}  // namespace hcfuse
