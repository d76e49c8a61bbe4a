// Shapes, attributes and their validation for HyperConnectionLowRankMix, shared by the CPU and
// CUDA glue. No ONNX Runtime type appears here: the glue copies shapes in, the math reads
// HcLowRankMixParams out.
#pragma once

#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace hcfuse {

inline constexpr const char* kOpName = "HyperConnectionLowRankMix";

struct HcLowRankMixAttrs {
  int64_t num_branches = 0;  // required; 0 means "missing"
  float epsilon = 1e-5f;
  float reduction_scale = 1.0f;
  float silu_alpha = 1.0f;
  float gate_div = 1.0f;
  float gate_mul = 1.0f;
};

// Shapes of the inputs as given at run time; an absent optional input has present == false.
struct HcTensorShape {
  bool present = false;
  std::vector<int64_t> dims;
};

struct HcLowRankMixShapes {
  HcTensorShape streams, norm_scale, down_weight, up_weight, inject_weight;
  HcTensorShape prev_block_output, prev_post_gate;
  bool has_streams_out = false;
};

struct HcLowRankMixParams {
  int64_t rows = 0;  // product of the leading dims of streams
  int64_t C = 0;     // num_branches
  int64_t H = 0;     // features per branch
  int64_t R = 0;     // rank of the low-rank gate
  bool has_prologue = false;
  bool has_streams_out = false;
  float epsilon = 1e-5f;
  float reduction_scale = 1.0f;
  float silu_alpha = 1.0f;
  float gate_div = 1.0f;
  float gate_mul = 1.0f;
  std::vector<int64_t> leading_dims;  // output shapes are leading_dims + [H], [C], [C*H]

  int64_t width() const { return C * H; }
};

namespace detail {

inline std::string DimsToString(const std::vector<int64_t>& dims) {
  std::ostringstream os;
  os << "(";
  for (size_t i = 0; i < dims.size(); ++i) os << (i ? ", " : "") << dims[i];
  if (dims.size() == 1) os << ",";
  os << ")";
  return os.str();
}

inline std::string Mismatch(const char* input, const std::string& expected, const std::vector<int64_t>& got,
                            const char* op = kOpName) {
  return std::string(op) + ": " + input + " must be " + expected + "; got " + DimsToString(got);
}

inline std::vector<int64_t> WithLast(std::vector<int64_t> dims, int64_t last) {
  dims.push_back(last);
  return dims;
}

}  // namespace detail

// Validates every shape and attribute against docs/NUMERICS.md and fills `params`.
// Returns an empty string on success, else a message naming the op (op_name: the quantized op checks
// its shared inputs and attributes here under its own name), the input and what is wrong.
inline std::string ResolveHcLowRankMixParams(const HcLowRankMixShapes& s, const HcLowRankMixAttrs& a,
                                             HcLowRankMixParams* params, const char* op_name = kOpName) {
  using detail::DimsToString;
  using detail::Mismatch;
  const std::string op = op_name;
  if (a.num_branches <= 0) {
    return op + ": attribute num_branches must be a positive integer; got " + std::to_string(a.num_branches);
  }
  for (const HcTensorShape* t : {&s.streams, &s.norm_scale, &s.down_weight, &s.up_weight, &s.inject_weight}) {
    if (!t->present) return op + ": the five required inputs (streams, norm_scale, down_weight, up_weight, inject_weight) must all be given";
  }
  if (s.prev_block_output.present != s.prev_post_gate.present) {
    return op + ": prev_block_output and prev_post_gate must be given together or not at all; got only " +
           (s.prev_block_output.present ? "prev_block_output" : "prev_post_gate");
  }
  const std::pair<const char*, const HcTensorShape*> named[] = {
      {"streams", &s.streams},         {"norm_scale", &s.norm_scale},
      {"down_weight", &s.down_weight}, {"up_weight", &s.up_weight},
      {"inject_weight", &s.inject_weight}, {"prev_block_output", &s.prev_block_output},
      {"prev_post_gate", &s.prev_post_gate}};
  for (const auto& [name, t] : named) {
    for (int64_t d : t->dims) {
      if (d < 0) return op + ": " + name + " must have non-negative dimensions; got " + DimsToString(t->dims);
    }
  }
  const auto& st = s.streams.dims;
  if (st.empty()) return op + ": streams must have rank >= 1 (..., C*H); got a scalar";
  const int64_t C = a.num_branches;
  const int64_t width = st.back();
  if (width == 0 || width % C != 0) {
    return op + ": the last dim of streams (C*H = " + std::to_string(width) +
           ") must be a positive multiple of num_branches = " + std::to_string(C);
  }
  const int64_t H = width / C;
  const std::string w = std::to_string(width);
  if (s.norm_scale.dims != std::vector<int64_t>{width}) {
    return Mismatch("norm_scale", "(C*H,) = (" + w + ",)", s.norm_scale.dims, op_name);
  }
  const auto& dw = s.down_weight.dims;
  if (dw.size() != 2 || dw[0] != width || dw[1] <= 0) {
    return Mismatch("down_weight", "(C*H, R) = (" + w + ", R) with R >= 1", dw, op_name);
  }
  const int64_t R = dw[1];
  const std::string r = std::to_string(R);
  if (s.up_weight.dims != std::vector<int64_t>{R, width}) {
    return Mismatch("up_weight", "(R, C*H) = (" + r + ", " + w + ")", s.up_weight.dims, op_name);
  }
  if (s.inject_weight.dims != std::vector<int64_t>{width, C}) {
    return Mismatch("inject_weight", "(C*H, C) = (" + w + ", " + std::to_string(C) + ")", s.inject_weight.dims,
                    op_name);
  }
  std::vector<int64_t> leading(st.begin(), st.end() - 1);
  int64_t rows = 1;
  for (int64_t d : leading) {
    if (d != 0 && rows > std::numeric_limits<int64_t>::max() / d / width) {
      return op + ": streams " + DimsToString(st) + " has too many elements";
    }
    rows *= d;
  }
  if (s.prev_block_output.present) {
    if (s.prev_block_output.dims != detail::WithLast(leading, H)) {
      return Mismatch("prev_block_output", "(..., H) = " + DimsToString(detail::WithLast(leading, H)) +
                                               " (the leading dims of streams, no broadcasting)",
                      s.prev_block_output.dims, op_name);
    }
    if (s.prev_post_gate.dims != detail::WithLast(leading, C)) {
      return Mismatch("prev_post_gate", "(..., C) = " + DimsToString(detail::WithLast(leading, C)) +
                                            " (the leading dims of streams, no broadcasting)",
                      s.prev_post_gate.dims, op_name);
    }
  }
  params->rows = rows;
  params->C = C;
  params->H = H;
  params->R = R;
  params->has_prologue = s.prev_block_output.present;
  params->has_streams_out = s.has_streams_out;
  params->epsilon = a.epsilon;
  params->reduction_scale = a.reduction_scale;
  params->silu_alpha = a.silu_alpha;
  params->gate_div = a.gate_div;
  params->gate_mul = a.gate_mul;
  params->leading_dims = std::move(leading);
  return {};
}

}  // namespace hcfuse
