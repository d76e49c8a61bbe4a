// Attributes, inputs and shapes of ai.hcfuse::HyperConnectionLowRankMixNBits, checked once for every
// provider. The inputs and attributes it shares with the dense op (streams, norm_scale, the prologue,
// num_branches and the five float attributes) go through the dense op's own checks
// (ReadHcLowRankMixAttrs, ResolveHcLowRankMixParams), under this op's name;
// what is the quantized op's own (each projection dense or MatMulNBits' B, scales and zero points;
// bits and block_size) is checked here, every shape against K, N, bits and block_size before a
// kernel reads a byte.
#pragma once

#include <onnxruntime_cxx_api.h>

#include <array>
#include <cstdint>
#include <limits>
#include <string>
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

}  // namespace hcfuse
