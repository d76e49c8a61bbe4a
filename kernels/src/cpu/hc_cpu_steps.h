// The steps outside the products that both CPU kernels (hc_lowrank_mix_cpu.cc, hc_nbits_cpu.cc) take
// in the same order with the same rounding points (docs/NUMERICS.md): the norm phase, the epilogues of
// down and inject, and g with the branch mix. Each takes the kernel's instruction-set Ops (CpuOps,
// NBitsOps: their widen, narrow, round and sigmoid spans) and, for the norm, its args struct (the
// fields streams, norm_scale, prev_block_output, prev_post_gate and streams_out).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "cpu/hc_lowrank_mix_cpu.h"

namespace hcfuse {

inline constexpr int64_t kHcCpuNormRows = 4;  // rows per norm task (their sums of squares interleaved)
inline constexpr int64_t kHcCpuSpan = 256;    // the norm's elementwise work in stack spans of this many floats

// One norm task of a pass (rows [row0, row0 + rows) of the call; hn: the pass's rows x C*H floats):
// S (prologue), streams_out and hn of branch c for the pass's rows of group `group` (kHcCpuNormRows rows).
template <typename Args, typename Ops>
void HcCpuNorm(const HcLowRankMixParams& p, const Args& a, const Ops& ops, float* hn, int64_t row0, int64_t rows,
               int64_t group, int64_t c) {
  const int64_t C = p.C, H = p.H, W = p.width();
  const int64_t r0 = group * kHcCpuNormRows, nr = std::min(kHcCpuNormRows, rows - r0);
  float* x[kHcCpuNormRows];
  for (int64_t r = 0; r < nr; ++r) {
    const int64_t row = row0 + r0 + r;
    x[r] = hn + (r0 + r) * W + c * H;
    ops.widen(a.streams + row * W + c * H, H, x[r]);
    if (p.has_prologue) {
      const float gate = ToFloat(a.prev_post_gate[row * C + c]);
      float pbo[kHcCpuSpan];
      for (int64_t h0 = 0; h0 < H; h0 += kHcCpuSpan) {
        const int64_t n = std::min(kHcCpuSpan, H - h0);
        ops.widen(a.prev_block_output + row * H + h0, n, pbo);
        float* xs = x[r] + h0;
        for (int64_t h = 0; h < n; ++h) xs[h] = xs[h] + gate * pbo[h];
      }
      ops.round(x[r], H);  // rounding point: S
    }
    if (p.has_streams_out) ops.narrow(x[r], H, a.streams_out + row * W + c * H);
  }
  // sum of squares, sequential over h per row; the group's rows interleaved (independent chains)
  for (int64_t r = nr; r < kHcCpuNormRows; ++r) x[r] = x[0];  // padding rows, results unused
  float ss[kHcCpuNormRows] = {};
  for (int64_t h = 0; h < H; ++h) {
    for (int64_t r = 0; r < kHcCpuNormRows; ++r) ss[r] += x[r][h] * x[r][h];
  }
  float scale[kHcCpuSpan];
  for (int64_t h0 = 0; h0 < H; h0 += kHcCpuSpan) {
    const int64_t n = std::min(kHcCpuSpan, H - h0);
    ops.widen(a.norm_scale + c * H + h0, n, scale);
    for (int64_t r = 0; r < nr; ++r) {
      const float inv_rms = 1.0f / std::sqrt(ss[r] / static_cast<float>(H) + p.epsilon);
      float* xs = x[r] + h0;
      for (int64_t h = 0; h < n; ++h) xs[h] = xs[h] * inv_rms * scale[h];
      ops.round(xs, n);  // rounding point: hn
    }
  }
}

// down (n sums in v, overwritten) -> Z -> SG (in sg, n floats) -> hidden (n values).
template <typename Ops>
void HcCpuDownToHidden(const HcLowRankMixParams& p, const Ops& ops, float* v, float* sg, int64_t n, float* hidden) {
  ops.round(v, n);  // rounding point: down
  for (int64_t j = 0; j < n; ++j) v[j] = p.silu_alpha * v[j];
  ops.round(v, n);  // rounding point: Z
  std::memcpy(sg, v, n * sizeof(float));
  ops.sigmoid(sg, n);
  ops.round(sg, n);  // rounding point: SG
  for (int64_t j = 0; j < n; ++j) hidden[j] = v[j] * sg[j];
  ops.round(hidden, n);  // rounding point: hidden
}

// inject (n rounded values in v, overwritten) -> post_gate, rounded where the stock Div, Sigmoid and
// Mul round.
template <typename T, typename Ops>
void HcCpuInjectToPostGate(const HcLowRankMixParams& p, const Ops& ops, float* v, int64_t n, T* post_gate) {
  for (int64_t j = 0; j < n; ++j) v[j] = v[j] / p.gate_div;
  ops.round(v, n);  // rounding point: gate logit
  ops.sigmoid(v, n);
  ops.round(v, n);  // rounding point: sigmoid of the gate logit
  for (int64_t j = 0; j < n; ++j) v[j] = v[j] * p.gate_mul;
  ops.narrow(v, n, post_gate);  // rounding point: post_gate
}

// g and pre_output for n <= kMaxFeatures features of one row: g holds up's sums of branch c at
// g + c * H (overwritten by g), hn the row's hn at the same offsets.
template <int64_t kMaxFeatures, typename T, typename Ops>
void HcCpuMixRow(const HcLowRankMixParams& p, const Ops& ops, float* g, const float* hn, int64_t n, T* pre_output) {
  const int64_t C = p.C, H = p.H;
  float mix[kMaxFeatures] = {};
  for (int64_t c = 0; c < C; ++c) {
    float* v = g + c * H;
    ops.round(v, n);  // rounding point: up
    ops.sigmoid(v, n);
    ops.round(v, n);  // rounding point: g
    const float* hc = hn + c * H;
    for (int64_t h = 0; h < n; ++h) mix[h] += hc[h] * v[h];  // branches in order c = 0..C-1
  }
  for (int64_t h = 0; h < n; ++h) mix[h] = p.reduction_scale * mix[h];
  ops.narrow(mix, n, pre_output);  // rounding point: pre_output
}

}  // namespace hcfuse
