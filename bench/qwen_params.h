// The real shape (Qwen3.8-Flash-Next: C=4, H=2560, R=320) and its attributes as HcLowRankMixParams, for
// the C++ probes under bench/ (timeline/fast_path_timeline.cu, cpu_stream_micro.cc); the Python side
// takes the same values from hcfuse._op (QWEN_SHAPE, QWEN_ATTRIBUTES).
#pragma once

#include <cstdint>

#include "hcfuse/hc_params.h"

namespace hcfuse_bench {

inline constexpr int kQwenC = 4, kQwenH = 2560, kQwenR = 320;

// `rows` rows of one leading dim; H may be changed (a probe's smaller, cache-resident variant).
inline hcfuse::HcLowRankMixParams QwenParams(int64_t rows, bool prologue, int64_t H = kQwenH) {
  hcfuse::HcLowRankMixParams p;
  p.rows = rows;
  p.C = kQwenC;
  p.H = H;
  p.R = kQwenR;
  p.has_prologue = prologue;
  p.has_streams_out = true;
  p.epsilon = 1e-6f;
  p.reduction_scale = 0.25f;
  p.silu_alpha = 0.25f;
  p.gate_div = 4.0f;
  p.gate_mul = 2.0f;
  p.leading_dims = {rows};
  return p;
}

}  // namespace hcfuse_bench
