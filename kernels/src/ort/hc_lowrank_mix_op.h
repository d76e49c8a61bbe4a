// ONNX Runtime glue for HyperConnectionLowRankMix shared by the CPU and CUDA kernels: attributes,
// shapes, statuses, output allocation and exception-safe registration. The glue never computes;
// the math (kernels/src/cpu, kernels/src/cuda) never sees an ORT type.
//
// A provider's kernel is HcLowRankMixKernel<T, Provider> (T: float, Ort::Float16_t, Ort::BFloat16_t):
// one Compute for every provider (validation, outputs, zero rows), the provider's math behind
// Provider::Run. It is registered with AddHcLowRankMixOp<Kernel>(domain, provider).
#pragma once

#include <onnxruntime_lite_custom_op.h>

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "hcfuse/hc_params.h"

namespace hcfuse {

inline constexpr size_t kNumRequiredInputs = 5;  // streams, norm_scale, down_weight, up_weight, inject_weight

template <typename T>
using HcInput = const Ort::Custom::Tensor<T>&;
template <typename T>
using HcOptionalInput = std::optional<const Ort::Custom::Tensor<T>*>;
template <typename T>
using HcOutput = Ort::Custom::Tensor<T>&;
template <typename T>
using HcOptionalOutput = std::optional<Ort::Custom::Tensor<T>*>;

// Validation text -> status: OK when empty, else ORT_INVALID_ARGUMENT carrying the text.
inline Ort::Status InvalidArgument(const std::string& message) {
  if (message.empty()) return Ort::Status{nullptr};
  return Ort::Status(message.c_str(), ORT_INVALID_ARGUMENT);
}

// "HyperConnectionLowRankMix node 'name'" (op_name in front) for errors raised before Compute (ORT does
// not add the name).
inline std::string NodeLabel(const OrtApi& api, const OrtKernelInfo* info, const char* op_name = kOpName) {
  std::string label = std::string(op_name) + " node";
  size_t size = 0;
  if (OrtStatus* st = api.KernelInfo_GetNodeName(info, nullptr, &size)) {
    api.ReleaseStatus(st);
    return label;
  }
  std::string name(size, '\0');
  if (OrtStatus* st = api.KernelInfo_GetNodeName(info, name.data(), &size)) {
    api.ReleaseStatus(st);
    return label;
  }
  name.resize(size > 0 ? size - 1 : 0);  // size counts the terminating NUL
  return label + " '" + name + "'";
}

// "the float 2.5", "the string \"2\"", "a list of 3 ints": what a present attribute holds when it is not
// of the type asked for; empty when the node has no such attribute (or one of another kind: tensor, graph).
inline std::string DescribeAttribute(const OrtApi& api, const OrtKernelInfo* info, const char* name) {
  auto ok = [&](OrtStatus* st) {
    if (st == nullptr) return true;
    api.ReleaseStatus(st);
    return false;
  };
  int64_t as_int = 0;
  if (ok(api.KernelInfoGetAttribute_int64(info, name, &as_int))) return "the int " + std::to_string(as_int);
  float as_float = 0.0f;
  if (ok(api.KernelInfoGetAttribute_float(info, name, &as_float))) return "the float " + std::to_string(as_float);
  size_t size = 0;
  if (ok(api.KernelInfoGetAttribute_string(info, name, nullptr, &size))) {
    std::string text(size, '\0');
    if (!ok(api.KernelInfoGetAttribute_string(info, name, text.data(), &size))) return "a string";
    text.resize(size > 0 ? size - 1 : 0);  // size counts the terminating NUL
    return "the string \"" + text + "\"";
  }
  // ORT reads a list attribute of either element type as the other with no element: count both
  size_t ints = 0, floats = 0;
  const bool is_list = ok(api.KernelInfoGetAttributeArray_int64(info, name, nullptr, &ints)) |
                       ok(api.KernelInfoGetAttributeArray_float(info, name, nullptr, &floats));
  if (ints > 0) return "a list of " + std::to_string(ints) + " ints";
  if (floats > 0) return "a list of " + std::to_string(floats) + " floats";
  if (is_list) return "an empty list";
  return "";
}

// Reads the node's attributes; num_branches is required. Returns a null OrtStatus* on success, else a
// status whose message names the node as an op_name node.
inline OrtStatus* ReadHcLowRankMixAttrs(const OrtApi& api, const OrtKernelInfo* info, HcLowRankMixAttrs* attrs,
                                        const char* op_name = kOpName) {
  auto error = [&](const std::string& what) {
    return api.CreateStatus(ORT_INVALID_ARGUMENT, (NodeLabel(api, info, op_name) + ": " + what).c_str());
  };
  int64_t num_branches = 0;
  if (OrtStatus* st = api.KernelInfoGetAttribute_int64(info, "num_branches", &num_branches)) {
    api.ReleaseStatus(st);
    const std::string found = DescribeAttribute(api, info, "num_branches");
    if (found.empty()) {
      return error("attribute num_branches (int, the number of streams C) is required and was not found");
    }
    return error("attribute num_branches must be an int; got " + found);
  }
  attrs->num_branches = num_branches;
  const std::pair<const char*, float*> floats[] = {
      {"epsilon", &attrs->epsilon},       {"reduction_scale", &attrs->reduction_scale},
      {"silu_alpha", &attrs->silu_alpha}, {"gate_div", &attrs->gate_div},
      {"gate_mul", &attrs->gate_mul}};
  for (const auto& [name, slot] : floats) {
    float value = 0.0f;
    // absent -> keep the default; a present attribute of another type is an error
    OrtStatus* st = api.KernelInfoGetAttribute_float(info, name, &value);
    if (st == nullptr) {
      *slot = value;
      continue;
    }
    api.ReleaseStatus(st);
    const std::string found = DescribeAttribute(api, info, name);
    if (!found.empty()) return error(std::string("attribute ") + name + " must be a float; got " + found);
  }
  return nullptr;
}

// The seven inputs of one call, as the lite API hands them to Compute; an absent optional input is null.
template <typename T>
struct HcInputs {
  const Ort::Custom::Tensor<T>* streams = nullptr;
  const Ort::Custom::Tensor<T>* norm_scale = nullptr;
  const Ort::Custom::Tensor<T>* down_weight = nullptr;
  const Ort::Custom::Tensor<T>* up_weight = nullptr;
  const Ort::Custom::Tensor<T>* inject_weight = nullptr;
  const Ort::Custom::Tensor<T>* prev_block_output = nullptr;
  const Ort::Custom::Tensor<T>* prev_post_gate = nullptr;
};

// Sets the seven input fields of `out` to f(tensor) (null for an absent optional input). The structs
// that describe one call (HcLowRankMixShapes, the CPU's HcLowRankMixCpuArgs, CUDA's HcDeviceTensors)
// share these field names.
template <typename Out, typename T, typename F>
void MapHcInputs(const HcInputs<T>& in, Out* out, F f) {
  out->streams = f(in.streams);
  out->norm_scale = f(in.norm_scale);
  out->down_weight = f(in.down_weight);
  out->up_weight = f(in.up_weight);
  out->inject_weight = f(in.inject_weight);
  out->prev_block_output = f(in.prev_block_output);
  out->prev_post_gate = f(in.prev_post_gate);
}

// Input shapes as ResolveHcLowRankMixParams wants them.
template <typename T>
HcLowRankMixShapes CollectHcLowRankMixShapes(const HcInputs<T>& in, bool has_streams_out) {
  HcLowRankMixShapes s;
  MapHcInputs(in, &s, [](const Ort::Custom::Tensor<T>* t) {
    return t != nullptr ? HcTensorShape{true, t->Shape()} : HcTensorShape{};
  });
  s.has_streams_out = has_streams_out;
  return s;
}

template <typename T>
struct HcOutputPtrs {
  T* pre_output = nullptr;
  T* post_gate = nullptr;
  T* streams_out = nullptr;  // null when the node does not produce streams_out
};

// Allocates pre_output (..., H), post_gate (..., C) and, when the node has it, streams_out (..., C*H).
// Goes through the C API so an output the node leaves unnamed comes back null instead of throwing.
// Clears params->has_streams_out when streams_out is not produced.
template <typename T>
Ort::Status AllocateHcLowRankMixOutputs(OrtKernelContext* ctx, HcLowRankMixParams* params, HcOutputPtrs<T>* out) {
  const OrtApi& api = Ort::GetApi();
  const int64_t lasts[3] = {params->H, params->C, params->width()};
  T** slots[3] = {&out->pre_output, &out->post_gate, &out->streams_out};
  const int count = params->has_streams_out ? 3 : 2;
  for (int i = 0; i < count; ++i) {
    std::vector<int64_t> dims = params->leading_dims;
    dims.push_back(lasts[i]);
    OrtValue* value = nullptr;
    if (OrtStatus* st = api.KernelContext_GetOutput(ctx, static_cast<size_t>(i), dims.data(), dims.size(), &value)) {
      return Ort::Status(st);
    }
    if (value == nullptr) {
      if (i < 2) return Ort::Status((std::string(kOpName) + ": could not allocate output " +
                                     (i == 0 ? "pre_output" : "post_gate")).c_str(), ORT_RUNTIME_EXCEPTION);
      params->has_streams_out = false;
      continue;
    }
    void* data = nullptr;
    if (OrtStatus* st = api.GetTensorMutableData(value, &data)) return Ort::Status(st);
    *slots[i] = static_cast<T*>(data);
  }
  return Ort::Status{nullptr};
}

// The pointers of one call in the math's args struct (CPU: HcLowRankMixCpuArgs, CUDA: HcDeviceTensors;
// the same field names), each reinterpreted as the math's storage type of T (same bits). Optional
// ones stay null unless given (validated: the prologue's two inputs come together, or not at all).
template <typename Args, typename T>
Args HcPointers(const HcInputs<T>& in, const HcLowRankMixParams& params, const HcOutputPtrs<T>& out) {
  using S = std::remove_pointer_t<decltype(std::declval<Args>().pre_output)>;
  Args a;
  MapHcInputs(in, &a, [](const Ort::Custom::Tensor<T>* t) {
    return t != nullptr ? reinterpret_cast<const S*>(t->Data()) : nullptr;
  });
  a.pre_output = reinterpret_cast<S*>(out.pre_output);
  a.post_gate = reinterpret_cast<S*>(out.post_gate);
  a.streams_out = params.has_streams_out ? reinterpret_cast<S*>(out.streams_out) : nullptr;
  return a;
}

// Everything above, in the order every Compute needs it: shapes -> validated params -> outputs.
template <typename T>
Ort::Status PrepareHcLowRankMix(OrtKernelContext* ctx, const HcLowRankMixAttrs& attrs, const HcInputs<T>& in,
                                bool has_streams_out, HcLowRankMixParams* params, HcOutputPtrs<T>* out) {
  const HcLowRankMixShapes shapes = CollectHcLowRankMixShapes(in, has_streams_out);
  Ort::Status st = InvalidArgument(ResolveHcLowRankMixParams(shapes, attrs, params));
  if (!st.IsOK()) return st;
  return AllocateHcLowRankMixOutputs<T>(ctx, params, out);
}

// The kernel struct of every provider: the lite API's Compute signature, validation, output
// allocation and the zero-row exit (empty outputs, nothing run) live here once; Provider runs the math:
//   Provider(const OrtApi& api, const OrtKernelInfo* info);   // may throw
//   using Args = ...;   // the math's pointer struct (HcLowRankMixCpuArgs, cuda::HcDeviceTensors)
//   Ort::Status Run(OrtKernelContext* ctx, const HcLowRankMixParams& params, const Args& args);
template <typename T, typename Provider>
struct HcLowRankMixKernel {
  HcLowRankMixKernel(const OrtApi* api, const OrtKernelInfo* info) : provider_(*api, info) {
    Ort::ThrowOnError(ReadHcLowRankMixAttrs(*api, info, &attrs_));
  }

  Ort::Status Compute(OrtKernelContext* ctx, HcInput<T> streams, HcInput<T> norm_scale, HcInput<T> down_weight,
                      HcInput<T> up_weight, HcInput<T> inject_weight, HcOptionalInput<T> prev_block_output,
                      HcOptionalInput<T> prev_post_gate, HcOutput<T> /*pre_output*/, HcOutput<T> /*post_gate*/,
                      HcOptionalOutput<T> streams_out) {
    const HcInputs<T> in{&streams, &norm_scale, &down_weight, &up_weight, &inject_weight,
                         prev_block_output.value_or(nullptr), prev_post_gate.value_or(nullptr)};
    HcLowRankMixParams params;
    HcOutputPtrs<T> out;
    Ort::Status st = PrepareHcLowRankMix<T>(ctx, attrs_, in, streams_out.has_value(), &params, &out);
    if (!st.IsOK() || params.rows == 0) return st;
    return provider_.Run(ctx, params, HcPointers<typename Provider::Args>(in, params, out));
  }

  Provider provider_;
  HcLowRankMixAttrs attrs_;
};

namespace detail {

// The exception being handled as a status: an Ort::Exception's own code and message, anything else
// a runtime error under op_name. Call it only inside a catch block.
inline OrtStatus* StatusFromCurrentException(const OrtApi& api, const char* op_name = kOpName) {
  try {
    throw;
  } catch (const Ort::Exception& e) {
    return api.CreateStatus(e.GetOrtErrorCode(), e.what());
  } catch (const std::exception& e) {
    return api.CreateStatus(ORT_RUNTIME_EXCEPTION, (std::string(op_name) + ": " + e.what()).c_str());
  } catch (...) {
    return api.CreateStatus(ORT_RUNTIME_EXCEPTION, (std::string(op_name) + ": unknown exception").c_str());
  }
}

// The lite API's kernel creation and compute may throw (a missing attribute, an ORT call failing);
// these wrappers run them behind the C boundary and turn any exception into a returned status.
template <typename Kernel>
struct GuardedOp {
  using ComputeFn = OrtStatusPtr(ORT_API_CALL*)(void*, OrtKernelContext*);

  // The lite op's own compute: a captureless function, the same for every instance of this Kernel
  // type. Taken once from a local instance (thread-safe initialization, never written again).
  static ComputeFn LiteCompute() {
    static const ComputeFn compute = Ort::Custom::OrtLiteCustomStruct<Kernel>(kOpName, "").KernelComputeV2;
    return compute;
  }

  // op is the registered lite op: its CreateKernel is still the lite API's own.
  static OrtStatusPtr ORT_API_CALL CreateV2(const OrtCustomOp* op, const OrtApi* api, const OrtKernelInfo* info,
                                            void** kernel) noexcept {
    try {
      *kernel = op->CreateKernel(op, api, info);
      return nullptr;
    } catch (...) {
      return StatusFromCurrentException(*api);
    }
  }

  static OrtStatusPtr ORT_API_CALL ComputeV2(void* kernel, OrtKernelContext* ctx) noexcept {
    const OrtApi& api = Ort::GetApi();
    try {
      // checked before the lite API builds its tensors: it would throw a bare "invalid indice" for a
      // missing required input and dereference an input given as an empty name
      size_t count = 0;
      if (OrtStatus* st = api.KernelContext_GetInputCount(ctx, &count)) return st;
      if (count < kNumRequiredInputs) {
        return api.CreateStatus(ORT_INVALID_ARGUMENT,
                                (std::string(kOpName) + ": needs the 5 inputs streams, norm_scale, down_weight, "
                                                        "up_weight, inject_weight; the node has " +
                                 std::to_string(count))
                                    .c_str());
      }
      for (size_t i = 0; i < count; ++i) {
        const OrtValue* value = nullptr;
        if (OrtStatus* st = api.KernelContext_GetInput(ctx, i, &value)) return st;
        if (value == nullptr) {
          return api.CreateStatus(ORT_INVALID_ARGUMENT,
                                  (std::string(kOpName) + ": input " + std::to_string(i) +
                                   " is given as an empty name; leave unused optional inputs off the node")
                                      .c_str());
        }
      }
      return LiteCompute()(kernel, ctx);
    } catch (...) {
      return StatusFromCurrentException(api);
    }
  }
};

// Keeps the registered ops alive for the life of the process (ORT holds raw pointers to them).
// Held as OrtLiteCustomOp, as the lite API asks (the hierarchy has no virtual destructor).
inline void KeepAlive(std::unique_ptr<Ort::Custom::OrtLiteCustomOp> op) {
  static std::mutex mu;
  static std::vector<std::unique_ptr<Ort::Custom::OrtLiteCustomOp>> ops;
  std::lock_guard<std::mutex> lock(mu);
  ops.push_back(std::move(op));
}

}  // namespace detail

// Registers Kernel for one provider in domain under kOpName, with exceptions turned into statuses.
template <typename Kernel>
void AddHcLowRankMixOp(Ort::CustomOpDomain& domain, const char* provider) {
  std::unique_ptr<Ort::Custom::OrtLiteCustomOp> op{Ort::Custom::CreateLiteCustomOp<Kernel>(kOpName, provider)};
  using Guard = detail::GuardedOp<Kernel>;
  op->CreateKernelV2 = &Guard::CreateV2;
  op->KernelComputeV2 = &Guard::ComputeV2;
  domain.Add(op.get());
  detail::KeepAlive(std::move(op));
}

// CPU registrations (float, float16, bfloat16), in hc_lowrank_mix_op_cpu.cc.
void RegisterCpuOps(Ort::CustomOpDomain& domain);

}  // namespace hcfuse
