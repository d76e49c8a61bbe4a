// CPU kernel of HyperConnectionLowRankMix; the order of operations is hcfuse/reference.py's (see the
// header). Inner loops run over contiguous output columns (n) and vectorise; the k loops stay in order.
#include "cpu/hc_lowrank_mix_cpu.h"

#include <algorithm>
#include <cmath>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace hcfuse {
namespace {

// sigmoid(x) = 1 / (1 + e), e = exp(-x) correctly rounded to fp32 (computed in double, rounded once).
inline float Sigmoid(float x) {
  const float e = static_cast<float>(std::exp(-static_cast<double>(x)));
  return 1.0f / (1.0f + e);
}

// A weight row as fp32: float rows are used in place, 16-bit rows are widened into buf (exactly,
// so the F16C path gives the same values as the portable one).
inline const float* RowAsFloat(const float* row, int64_t, float*) { return row; }
template <typename T>
const float* RowAsFloat(const T* row, int64_t n, float* buf) {
  for (int64_t i = 0; i < n; ++i) buf[i] = ToFloat(row[i]);
  return buf;
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx,f16c"))) void WidenHalfF16c(const Half* row, int64_t n, float* buf) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + i));
    _mm256_storeu_ps(buf + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) buf[i] = ToFloat(row[i]);
}

const float* RowAsFloat(const Half* row, int64_t n, float* buf) {
  static const bool has_f16c = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
  if (!has_f16c) return RowAsFloat<Half>(row, n, buf);
  WidenHalfF16c(row, n, buf);
  return buf;
}
#endif

// acc[n] += a * w[n]: one step k of the sequential accumulation (separate multiply and add; the
// AVX2 clone only widens the lanes, -ffp-contract=off keeps FMA out of both).
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target_clones("avx2", "default")))
#endif
void Axpy(float a, const float* __restrict w, float* __restrict acc, int64_t n) {
  for (int64_t i = 0; i < n; ++i) acc[i] += a * w[i];
}

template <typename T>
class TileKernel {
 public:
  TileKernel(const HcLowRankMixParams& p, const HcLowRankMixCpuArgs<T>& a) : p_(p), a_(a) {}

  // Rows [row0, row0 + n), n <= kHcCpuRowTile.
  void Run(int64_t row0, int64_t n) {
    const int64_t W = p_.width(), R = p_.R, C = p_.C;
    hn_.assign(n * W, 0.0f);
    acc_.assign(n * (R + C), 0.0f);
    hidden_.assign(n * R, 0.0f);
    up_.assign(n * W, 0.0f);
    wbuf_.resize(std::max(W, R));
    for (int64_t r = 0; r < n; ++r) NormRow(row0 + r, hn_.data() + r * W);
    DownAndInject(n);
    for (int64_t r = 0; r < n; ++r) GateRow(row0 + r, acc_.data() + r * (R + C), hidden_.data() + r * R);
    Up(n);
    for (int64_t r = 0; r < n; ++r) MixRow(row0 + r, hn_.data() + r * W, up_.data() + r * W);
  }

 private:
  // S (prologue) and hn for one row, into x (W floats).
  void NormRow(int64_t row, float* x) {
    const int64_t C = p_.C, H = p_.H, W = p_.width();
    const T* s = a_.streams + row * W;
    for (int64_t i = 0; i < W; ++i) x[i] = ToFloat(s[i]);
    if (p_.has_prologue) {
      const T* pbo = a_.prev_block_output + row * H;
      const T* ppg = a_.prev_post_gate + row * C;
      for (int64_t c = 0; c < C; ++c) {
        const float gate = ToFloat(ppg[c]);
        float* xc = x + c * H;
        for (int64_t h = 0; h < H; ++h) xc[h] = RoundToT<T>(xc[h] + gate * ToFloat(pbo[h]));  // rounding point: S
      }
    }
    if (p_.has_streams_out) {
      T* out = a_.streams_out + row * W;
      for (int64_t i = 0; i < W; ++i) out[i] = FromFloat<T>(x[i]);
    }
    for (int64_t c = 0; c < C; ++c) {
      float* xc = x + c * H;
      float ss = 0.0f;
      for (int64_t h = 0; h < H; ++h) ss += xc[h] * xc[h];
      const float inv_rms = 1.0f / std::sqrt(ss / static_cast<float>(H) + p_.epsilon);
      const T* scale = a_.norm_scale + c * H;
      for (int64_t h = 0; h < H; ++h) xc[h] = RoundToT<T>(xc[h] * inv_rms * ToFloat(scale[h]));  // rounding point: hn
    }
  }

  // acc[r] = [hn @ down_weight | hn @ inject_weight], one pass over k for the tile's rows.
  void DownAndInject(int64_t n) {
    const int64_t W = p_.width(), R = p_.R, C = p_.C;
    std::vector<float> inject_row(C);
    for (int64_t k = 0; k < W; ++k) {
      const float* dw = RowAsFloat(a_.down_weight + k * R, R, wbuf_.data());
      for (int64_t c = 0; c < C; ++c) inject_row[c] = ToFloat(a_.inject_weight[k * C + c]);
      for (int64_t r = 0; r < n; ++r) {
        const float h = hn_[r * W + k];
        float* acc = acc_.data() + r * (R + C);
        Axpy(h, dw, acc, R);
        Axpy(h, inject_row.data(), acc + R, C);
      }
    }
  }

  // down -> Z -> SG -> hidden, and inject -> post_gate, for one row.
  void GateRow(int64_t row, const float* acc, float* hidden) {
    const int64_t R = p_.R, C = p_.C;
    for (int64_t j = 0; j < R; ++j) {
      const float down = RoundToT<T>(acc[j]);          // rounding point: down
      const float z = RoundToT<T>(p_.silu_alpha * down);  // rounding point: Z
      const float sg = RoundToT<T>(Sigmoid(z));           // rounding point: SG
      hidden[j] = RoundToT<T>(z * sg);                    // rounding point: hidden
    }
    T* gate = a_.post_gate + row * C;
    for (int64_t c = 0; c < C; ++c) {
      const float inject = RoundToT<T>(acc[R + c]);                               // rounding point: inject
      gate[c] = FromFloat<T>(Sigmoid(inject / p_.gate_div) * p_.gate_mul);  // rounding point: post_gate
    }
  }

  // up[r] = hidden[r] @ up_weight for the tile's rows.
  void Up(int64_t n) {
    const int64_t W = p_.width(), R = p_.R;
    for (int64_t k = 0; k < R; ++k) {
      const float* uw = RowAsFloat(a_.up_weight + k * W, W, wbuf_.data());
      for (int64_t r = 0; r < n; ++r) Axpy(hidden_[r * R + k], uw, up_.data() + r * W, W);
    }
  }

  // g and pre_output for one row.
  void MixRow(int64_t row, const float* hn, float* up) {
    const int64_t C = p_.C, H = p_.H, W = p_.width();
    for (int64_t i = 0; i < W; ++i) up[i] = RoundToT<T>(Sigmoid(RoundToT<T>(up[i])));  // rounding points: up, g
    T* pre = a_.pre_output + row * H;
    for (int64_t h = 0; h < H; ++h) {
      float mix = 0.0f;
      for (int64_t c = 0; c < C; ++c) mix += hn[c * H + h] * up[c * H + h];
      pre[h] = FromFloat<T>(p_.reduction_scale * mix);  // rounding point: pre_output
    }
  }

  const HcLowRankMixParams& p_;
  const HcLowRankMixCpuArgs<T>& a_;
  std::vector<float> hn_, acc_, hidden_, up_, wbuf_;
};

}  // namespace

template <typename T>
void HcLowRankMixCpu(const HcLowRankMixParams& params, const HcLowRankMixCpuArgs<T>& args, const HcTaskRunner& run) {
  if (params.rows == 0) return;
  const int64_t tiles = (params.rows + kHcCpuRowTile - 1) / kHcCpuRowTile;
  run(tiles, [&](int64_t tile) {
    const int64_t row0 = tile * kHcCpuRowTile;
    TileKernel<T>(params, args).Run(row0, std::min(kHcCpuRowTile, params.rows - row0));
  });
}

template void HcLowRankMixCpu<float>(const HcLowRankMixParams&, const HcLowRankMixCpuArgs<float>&,
                                     const HcTaskRunner&);
template void HcLowRankMixCpu<Half>(const HcLowRankMixParams&, const HcLowRankMixCpuArgs<Half>&, const HcTaskRunner&);
template void HcLowRankMixCpu<BFloat16>(const HcLowRankMixParams&, const HcLowRankMixCpuArgs<BFloat16>&,
                                        const HcTaskRunner&);

}  // namespace hcfuse
