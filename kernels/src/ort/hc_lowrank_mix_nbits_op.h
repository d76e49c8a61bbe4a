// Attributes, inputs and shapes of ai.hcfuse::HyperConnectionLowRankMixNBits, checked once for every
// provider, and the op's registration shared by the CPU and CUDA kernels (HcNBitsOp). The inputs and
// attributes it shares with the dense op (streams, norm_scale, the prologue, num_branches and the five
// float attributes) go through the dense op's own checks (ReadHcLowRankMixAttrs,
// ResolveHcLowRankMixParams), under this op's name; what is the quantized op's own (each projection dense
// or MatMulNBits' B, scales and zero points; bits and block_size) is checked here, every shape against K,
// N, bits and block_size before a kernel reads a byte.
#pragma once

#include <onnxruntime_cxx_api.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "cpu/hc_nbits_cpu.h"
#include "hcfuse/hc_params.h"
#include "ort/hc_lowrank_mix_op.h"

namespace hcfuse {

inline constexpr const char* kNBitsDomain = "ai.hcfuse";
inline constexpr const char* kNBitsOpName = "HyperConnectionLowRankMixNBits";
inline constexpr int kNBitsSinceVersion = 1;

// Inputs by position (hcfuse/_op_nbits.py names them).
enum HcNBitsInput : size_t {
  kStreams = 0,
  kNormScale,
  kDownInjectWeight,
  kDownInjectScales,
  kDownInjectZeroPoints,
  kUpWeight,
  kUpScales,
  kUpZeroPoints,
  kPrevBlockOutput,
  kPrevPostGate,
  kNumNBitsInputs
};
inline constexpr std::array<const char*, kNumNBitsInputs> kNBitsInputNames = {
    "streams",   "norm_scale", "down_inject_weight", "down_inject_scales", "down_inject_zero_points",
    "up_weight", "up_scales",  "up_zero_points",     "prev_block_output",  "prev_post_gate"};

// bits and block_size (the dense op's attributes live in mix; accuracy_level is only carried for unfuse).
struct HcNBitsAttrs {
  HcLowRankMixAttrs mix;
  int64_t bits = 4;
  int64_t block_size = 32;
};

// Reads and checks the node's attributes. Returns a null OrtStatus* on success.
inline OrtStatus* ReadHcNBitsAttrs(const OrtApi& api, const OrtKernelInfo* info, HcNBitsAttrs* attrs) {
  if (OrtStatus* st = ReadHcLowRankMixAttrs(api, info, &attrs->mix, kNBitsOpName)) return st;
  const std::string label = NodeLabel(api, info, kNBitsOpName);
  auto error = [&](const std::string& what) { return api.CreateStatus(ORT_INVALID_ARGUMENT, (label + ": " + what).c_str()); };
  const std::pair<const char*, int64_t*> ints[] = {{"bits", &attrs->bits}, {"block_size", &attrs->block_size}};
  for (const auto& [name, slot] : ints) {
    OrtStatus* st = api.KernelInfoGetAttribute_int64(info, name, slot);
    if (st == nullptr) continue;
    api.ReleaseStatus(st);
    float as_float = 0.0f;
    if (OrtStatus* st2 = api.KernelInfoGetAttribute_float(info, name, &as_float)) {
      api.ReleaseStatus(st2);  // absent: the default
      continue;
    }
    return error(std::string("attribute ") + name + " must be an int; got the float " + std::to_string(as_float));
  }
  if (attrs->bits != 4 && attrs->bits != 8) return error("attribute bits must be 4 or 8; got " + std::to_string(attrs->bits));
  const int64_t bs = attrs->block_size;
  if (bs < 16 || (bs & (bs - 1)) != 0 || bs > (int64_t{1} << 30)) {
    return error("attribute block_size must be a power of two >= 16; got " + std::to_string(bs));
  }
  return nullptr;
}

// One input as given at run time: absent, or its element type (T, uint8 or another) and shape.
struct HcNBitsTensorInfo {
  enum Kind { kAbsent, kT, kUInt8, kOther } kind = kAbsent;
  std::string type_name;  // as ONNX spells it, for messages
  std::vector<int64_t> dims;
  bool present() const { return kind != kAbsent; }
};

// Which of the projection's tensors are given, once checked.
struct HcNBitsProjectionForm {
  bool quantized = false;
  HcNBitsTensorInfo::Kind zero_points = HcNBitsTensorInfo::kAbsent;  // kUInt8 (packed) or kT
};

struct HcNBitsForm {
  HcNBitsParams params;
  HcNBitsProjectionForm down_inject, up;
};

namespace detail {

inline std::string NBitsMismatch(size_t input, const std::string& expected, const std::vector<int64_t>& got) {
  return Mismatch(kNBitsInputNames[input], expected, got, kNBitsOpName);
}

inline std::string Dims(std::initializer_list<int64_t> dims) { return DimsToString(std::vector<int64_t>(dims)); }

// Types and shapes of one projection [K, N] (inputs weight, weight + 1 scales, weight + 2 zero points).
inline std::string CheckProjection(const std::vector<HcNBitsTensorInfo>& in, size_t weight, int64_t K, int64_t N,
                                   const HcNBitsAttrs& a, HcNBitsProjectionForm* form) {
  const std::string op = kNBitsOpName;
  const HcNBitsTensorInfo &w = in[weight], &scales = in[weight + 1], &zp = in[weight + 2];
  const std::string name = kNBitsInputNames[weight];
  if (w.kind == HcNBitsTensorInfo::kT) {
    if (scales.present() || zp.present()) {
      return op + ": " + kNBitsInputNames[scales.present() ? weight + 1 : weight + 2] + " is given but " + name +
             " is dense (T); scales and zero points come only with a uint8 (MatMulNBits) " + name;
    }
    if (w.dims != std::vector<int64_t>{K, N}) return NBitsMismatch(weight, "dense (K, N) = " + Dims({K, N}), w.dims);
    return {};
  }
  form->quantized = true;
  const int64_t kb = (K + a.block_size - 1) / a.block_size, blob = a.block_size * a.bits / 8;
  const std::vector<int64_t> b_dims{N, kb, blob};
  if (w.dims != b_dims) {
    return NBitsMismatch(weight, "MatMulNBits' B (N, ceil(K / block_size), block_size * bits / 8) = " + Dims({N, kb, blob}) +
                                     " for K = " + std::to_string(K) + ", N = " + std::to_string(N) + ", bits = " +
                                     std::to_string(a.bits) + ", block_size = " + std::to_string(a.block_size),
                         w.dims);
  }
  // the kernels address one column's bytes of B from a vector's first column in int32 offsets
  if (kb * blob > std::numeric_limits<int32_t>::max() / 64) {
    return op + ": " + name + " has " + std::to_string(kb * blob) + " bytes per column, more than the kernel addresses";
  }
  if (!scales.present()) return op + ": " + kNBitsInputNames[weight + 1] + " is required with a uint8 " + name;
  if (scales.kind != HcNBitsTensorInfo::kT) {
    return op + ": " + kNBitsInputNames[weight + 1] + " must have the type of streams; got " + scales.type_name;
  }
  if (scales.dims != std::vector<int64_t>{N, kb}) {
    return NBitsMismatch(weight + 1, "(N, ceil(K / block_size)) = " + Dims({N, kb}), scales.dims);
  }
  form->zero_points = zp.kind;
  if (zp.kind == HcNBitsTensorInfo::kUInt8) {
    const int64_t bytes = (kb * a.bits + 7) / 8;
    if (zp.dims != std::vector<int64_t>{N, bytes}) {
      return NBitsMismatch(weight + 2, "packed uint8 (N, ceil(ceil(K / block_size) * bits / 8)) = " + Dims({N, bytes}),
                           zp.dims);
    }
  } else if (zp.kind == HcNBitsTensorInfo::kT) {
    if (zp.dims != std::vector<int64_t>{N, kb}) {
      return NBitsMismatch(weight + 2, "(N, ceil(K / block_size)) = " + Dims({N, kb}) + " as T", zp.dims);
    }
  } else if (zp.kind == HcNBitsTensorInfo::kOther) {
    return op + ": " + kNBitsInputNames[weight + 2] + " must be uint8 (packed) or the type of streams; got " +
           zp.type_name;
  }
  return {};
}

}  // namespace detail

// Checks every input's presence, type and shape and the attributes' fit to them, and fills form.
// Returns an empty string on success, else one line naming the op, the input and what is wrong.
inline std::string ResolveHcNBitsForm(const std::vector<HcNBitsTensorInfo>& in, bool has_streams_out,
                                      const HcNBitsAttrs& a, HcNBitsForm* form) {
  const std::string op = kNBitsOpName;
  for (size_t i : {kStreams, kNormScale, kDownInjectWeight, kUpWeight}) {
    if (!in[i].present()) return op + ": input " + kNBitsInputNames[i] + " is required";
  }
  for (size_t i : {kStreams, kNormScale, kPrevBlockOutput, kPrevPostGate}) {
    if (in[i].present() && in[i].kind != HcNBitsTensorInfo::kT) {
      return op + ": " + kNBitsInputNames[i] + " must have the type of streams; got " + in[i].type_name;
    }
  }
  for (size_t i : {kDownInjectWeight, kUpWeight}) {
    if (in[i].kind == HcNBitsTensorInfo::kOther) {
      return op + ": " + kNBitsInputNames[i] + " must be the type of streams (dense) or uint8 (MatMulNBits' B); got " +
             in[i].type_name;
    }
  }
  if (in[kDownInjectWeight].kind != HcNBitsTensorInfo::kUInt8 && in[kUpWeight].kind != HcNBitsTensorInfo::kUInt8) {
    return op + ": neither down_inject_weight nor up_weight is quantized (uint8); a block with both dense is "
                "com.microsoft::HyperConnectionLowRankMix";
  }
  const int64_t C = a.mix.num_branches;
  const HcNBitsTensorInfo& di = in[kDownInjectWeight];
  const bool di_quantized = di.kind == HcNBitsTensorInfo::kUInt8;
  const size_t n_axis = di_quantized ? 0 : 1;
  if (C > 0 && (di.dims.size() != (di_quantized ? 3u : 2u) || di.dims[n_axis] <= C)) {
    return detail::NBitsMismatch(kDownInjectWeight,
                                 di_quantized ? "MatMulNBits' B (R + C, k_blocks, blob) with R >= 1"
                                              : "dense (C*H, R + C) with R >= 1",
                                 di.dims) + " (C = " + std::to_string(C) + ")";
  }
  // streams, norm_scale, the prologue and the attributes: the dense op's checks, with dense
  // projections of the shapes this node's imply
  const std::vector<int64_t>& st = in[kStreams].dims;
  const int64_t width = st.empty() ? 0 : st.back();
  const int64_t R = C > 0 ? di.dims[n_axis] - C : 1;
  HcLowRankMixShapes shapes;
  auto dense_shape = [](size_t i, const std::vector<HcNBitsTensorInfo>& v) { return HcTensorShape{v[i].present(), v[i].dims}; };
  shapes.streams = dense_shape(kStreams, in);
  shapes.norm_scale = dense_shape(kNormScale, in);
  shapes.down_weight = HcTensorShape{true, {width, R}};
  shapes.up_weight = HcTensorShape{true, {R, width}};
  shapes.inject_weight = HcTensorShape{true, {width, C}};
  shapes.prev_block_output = dense_shape(kPrevBlockOutput, in);
  shapes.prev_post_gate = dense_shape(kPrevPostGate, in);
  shapes.has_streams_out = has_streams_out;
  if (std::string e = ResolveHcLowRankMixParams(shapes, a.mix, &form->params.mix, kNBitsOpName); !e.empty()) return e;
  form->params.bits = a.bits;
  form->params.block_size = a.block_size;
  if (std::string e = detail::CheckProjection(in, kDownInjectWeight, width, R + C, a, &form->down_inject); !e.empty()) {
    return e;
  }
  return detail::CheckProjection(in, kUpWeight, R, width, a, &form->up);
}

// ORT's element type of T (float, Ort::Float16_t, Ort::BFloat16_t).
template <typename T>
constexpr ONNXTensorElementDataType kNBitsElementType =
    std::is_same_v<T, float> ? ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT
    : std::is_same_v<T, Ort::Float16_t> ? ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16
                                        : ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16;

namespace detail {

inline const char* ElementTypeName(ONNXTensorElementDataType t) {
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

}  // namespace detail

// One call of the op, checked: the form, each input's data (null where absent) and the outputs.
template <typename T>
struct HcNBitsCall {
  HcNBitsForm form;
  std::array<const void*, kNumNBitsInputs> data{};
  HcOutputPtrs<T> out;

  // Projection `weight` (kDownInjectWeight or kUpWeight) as the math's pointers of S, T's storage type
  // there (same bits): dense, or B, scales and the zero points in their form.
  template <typename S>
  HcNBitsProjection<S> Projection(size_t weight) const {
    const HcNBitsProjectionForm& f = weight == kDownInjectWeight ? form.down_inject : form.up;
    HcNBitsProjection<S> p;
    if (!f.quantized) {
      p.dense = static_cast<const S*>(data[weight]);
      return p;
    }
    p.q = static_cast<const uint8_t*>(data[weight]);
    p.scales = static_cast<const S*>(data[weight + 1]);
    if (f.zero_points == HcNBitsTensorInfo::kUInt8) p.zero_points = static_cast<const uint8_t*>(data[weight + 2]);
    if (f.zero_points == HcNBitsTensorInfo::kT) p.zero_points_t = static_cast<const S*>(data[weight + 2]);
    return p;
  }

  // Every input and output as the math's pointers of S.
  template <typename S>
  HcNBitsTensors<S> Tensors() const {
    auto t = [&](size_t i) { return static_cast<const S*>(data[i]); };
    const HcLowRankMixParams& mix = form.params.mix;
    HcNBitsTensors<S> a;
    a.streams = t(kStreams);
    a.norm_scale = t(kNormScale);
    a.down_inject = Projection<S>(kDownInjectWeight);
    a.up = Projection<S>(kUpWeight);
    if (mix.has_prologue) {
      a.prev_block_output = t(kPrevBlockOutput);
      a.prev_post_gate = t(kPrevPostGate);
    }
    a.pre_output = reinterpret_cast<S*>(out.pre_output);
    a.post_gate = reinterpret_cast<S*>(out.post_gate);
    a.streams_out = mix.has_streams_out ? reinterpret_cast<S*>(out.streams_out) : nullptr;
    return a;
  }
};

// Reads the call's inputs from the kernel context (each typed per call: T, uint8 or another), checks them
// (ResolveHcNBitsForm) and allocates the outputs. On success with rows == 0 there is nothing to compute.
template <typename T>
Ort::Status PrepareHcNBitsCall(OrtKernelContext* context, const HcNBitsAttrs& attrs, HcNBitsCall<T>* call) {
  Ort::KernelContext ctx(context);
  const size_t count = std::min<size_t>(ctx.GetInputCount(), kNumNBitsInputs);
  std::vector<HcNBitsTensorInfo> info(kNumNBitsInputs);
  for (size_t i = 0; i < count; ++i) {
    const Ort::ConstValue value = ctx.GetInput(i);
    if (!value) continue;  // an optional input given as an empty name
    const Ort::TensorTypeAndShapeInfo ts = value.GetTensorTypeAndShapeInfo();
    const ONNXTensorElementDataType type = ts.GetElementType();
    info[i].kind = type == kNBitsElementType<T>                 ? HcNBitsTensorInfo::kT
                   : type == ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8 ? HcNBitsTensorInfo::kUInt8
                                                                 : HcNBitsTensorInfo::kOther;
    info[i].type_name = detail::ElementTypeName(type);
    info[i].dims = ts.GetShape();
    call->data[i] = value.GetTensorRawData();
  }
  const bool has_streams_out = ctx.GetOutputCount() > 2;
  Ort::Status st = InvalidArgument(ResolveHcNBitsForm(info, has_streams_out, attrs, &call->form));
  if (!st.IsOK()) return st;
  return AllocateHcLowRankMixOutputs<T>(context, &call->form.params.mix, &call->out);
}

// The kernel ORT holds: Kernel(api, info, attrs) (may throw) with Ort::Status Compute(OrtKernelContext*)
// (may throw); no exception crosses into ORT.
template <typename Kernel>
struct HcNBitsGuardedKernel {
  HcNBitsGuardedKernel(const OrtApi& api, const OrtKernelInfo* info, const HcNBitsAttrs& attrs)
      : kernel(api, info, attrs) {}

  OrtStatusPtr ComputeV2(OrtKernelContext* ctx) noexcept {
    try {
      return kernel.Compute(ctx).release();
    } catch (...) {
      return detail::StatusFromCurrentException(Ort::GetApi(), kNBitsOpName);
    }
  }

  Kernel kernel;
};

// The op for one provider and T. Inputs: streams, norm_scale, the prologue and the scales are T; each
// projection's weight (T or uint8) and zero points (uint8 or T) are left open and checked per call, so the
// op is a plain OrtCustomOp that reads its inputs from the kernel context, not a lite op with fixed types.
template <typename T, typename Kernel>
struct HcNBitsOp : Ort::CustomOpBase<HcNBitsOp<T, Kernel>, HcNBitsGuardedKernel<Kernel>, /*WithStatus=*/true> {
  explicit HcNBitsOp(const char* provider) : provider_(provider) {}

  OrtStatusPtr CreateKernelV2(const OrtApi& api, const OrtKernelInfo* info, void** kernel) const noexcept {
    HcNBitsAttrs attrs;
    if (OrtStatus* st = ReadHcNBitsAttrs(api, info, &attrs)) return st;
    try {
      *kernel = new HcNBitsGuardedKernel<Kernel>(api, info, attrs);
      return nullptr;
    } catch (...) {
      return detail::StatusFromCurrentException(api, kNBitsOpName);
    }
  }
  const char* GetName() const { return kNBitsOpName; }
  const char* GetExecutionProviderType() const { return provider_; }
  size_t GetInputTypeCount() const { return kNumNBitsInputs; }
  ONNXTensorElementDataType GetInputType(size_t i) const {
    switch (i) {
      case kDownInjectWeight:
      case kDownInjectZeroPoints:
      case kUpWeight:
      case kUpZeroPoints:
        return ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
      default:
        return kNBitsElementType<T>;
    }
  }
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t i) const {
    const bool required = i == kStreams || i == kNormScale || i == kDownInjectWeight || i == kUpWeight;
    return required ? INPUT_OUTPUT_REQUIRED : INPUT_OUTPUT_OPTIONAL;
  }
  size_t GetOutputTypeCount() const { return 3; }
  ONNXTensorElementDataType GetOutputType(size_t /*i*/) const { return kNBitsElementType<T>; }
  OrtCustomOpInputOutputCharacteristic GetOutputCharacteristic(size_t i) const {
    return i < 2 ? INPUT_OUTPUT_REQUIRED : INPUT_OUTPUT_OPTIONAL;
  }

 private:
  const char* provider_;
};

}  // namespace hcfuse
