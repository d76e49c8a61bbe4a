// CPU kernel of HyperConnectionLowRankMixNBits (see the header for its order of operations). Phases
// per pass of up to kHcCpuRowsPerPass rows, each a set of independent tasks over output elements
// handed to the task runner (ORT's thread pool):
//   1. S, streams_out and hn per (rows, branch); with a quantized down_inject, hn arranged for its lanes
//      per row;
//   2. the down/inject product per block of its R + C columns, then down -> Z -> SG -> hidden or
//      inject -> post_gate on those columns;
//      With a quantized up, hidden arranged for its lanes per row;
//   3. the up product per block of features h (all C branches), then g and pre_output on them.
// The products (hc_nbits_cpu_product.inc) and the elementwise spans (hc_lowrank_mix_cpu_gemm.inc, the
// dense kernel's, so both ops round and take sigmoids alike) are compiled for AVX-512, AVX2 and plain
// x86-64 (or the target's default; hc_cpu_isa.inc) and picked at run time. No variant fuses a
// multiply-add and all take the reference's order, so all give the same bits. The norm and the epilogues are the dense kernel's
// (hc_cpu_steps.h).
#include "cpu/hc_nbits_cpu.h"

#include <algorithm>

namespace hcfuse {
namespace {

// Columns [n0, n1) of x (rows x K, row stride ldx) times one projection [K, N], into out (row stride ldo).
// A quantized projection reads xq instead: x arranged for its lanes (ArrangeLanes; row stride ldxq).
template <typename T>
struct ProductArgs {
  HcNBitsProjection<T> w;
  int64_t K, N, bits, block_size;
  const float* x;
  int64_t ldx, rows;  // rows <= kHcCpuRowTile
  const float* xq;
  int64_t ldxq;
  int64_t n0, n1;
  float* out;
  int64_t ldo;
};

// One instruction set's product and elementwise spans.
template <typename T>
struct NBitsOps {
  void (*product)(const ProductArgs<T>&);
  void (*widen)(const T* src, int64_t n, float* dst);  // dst[i] = ToFloat(src[i])
  void (*narrow)(const float* x, int64_t n, T* out);   // out[i] = FromFloat<T>(x[i])
  void (*round)(float* x, int64_t n);                  // x[i] = RoundToT<T>(x[i])
  void (*sigmoid)(float* x, int64_t n);                // x[i] = Sigmoid(x[i])
};

}  // namespace
}  // namespace hcfuse

// this kernel's products, compiled inside each instruction set's namespace of hc_cpu_isa.inc
#define HCFUSE_CPU_ISA_PRODUCTS "cpu/hc_nbits_cpu_product.inc"
#include "cpu/hc_cpu_isa.inc"
#include "cpu/hc_cpu_steps.h"

namespace hcfuse {
namespace {

constexpr int64_t kColumnBlock = 64;   // down/inject columns per task: R + C = 324 in 6 tasks
constexpr int64_t kFeatureBlock = 64;  // features h per up/mix task (C x 64 columns of up)

inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Row x (K values) as the quantized products read it, out (HcNBitsLanePadded(K) values): per chunk of 32 k,
// at 4 bits the 16 even k then the 16 odd (the low and high nibbles of the chunk's 16 bytes), at 8 bits the
// k in order; 0 past K.
inline void ArrangeLanes(const float* x, int64_t K, int64_t bits, float* out) {
  const int64_t padded = HcNBitsLanePadded(K);
  for (int64_t k = 0; k < padded; ++k) {
    const int64_t chunk = k / kHcNBitsLanes * kHcNBitsLanes, i = k % kHcNBitsLanes;
    const int64_t from = bits == 8 ? k : chunk + (i < 16 ? 2 * i : 2 * (i - 16) + 1);
    out[k] = from < K ? x[from] : 0.0f;
  }
}

template <typename T>
class Pass {
 public:
  // Rows [row0, row0 + rows) of the call, rows <= kHcCpuRowsPerPass.
  Pass(const HcNBitsParams& p, const HcNBitsTensors<T>& a, const NBitsOps<T>& ops, float* scratch, int64_t row0,
       int64_t rows)
      : p_(p), m_(p.mix), a_(a), ops_(ops), row0_(row0), rows_(rows) {
    hn_ = scratch;
    g_ = hn_ + rows * m_.width();
    di_ = g_ + rows * m_.width();
    hidden_ = di_ + rows * (m_.R + m_.C);
    hn_lanes_ = hidden_ + rows * m_.R;
    hidden_lanes_ = hn_lanes_ + rows * HcNBitsLanePadded(m_.width());
  }

  void Run(const HcTaskRunner& run) {
    const int64_t C = m_.C;
    run(CeilDiv(rows_, kHcCpuNormRows) * C, [this, C](int64_t task) {
      HcCpuNorm(m_, a_, ops_, hn_, row0_, rows_, task / C, task % C);
    });
    if (a_.down_inject.q != nullptr) {
      run(rows_, [this](int64_t r) { Arrange(hn_, m_.width(), hn_lanes_, r); });
    }
    run(CeilDiv(m_.R + C, kColumnBlock), [this](int64_t block) { DownInject(block); });
    if (a_.up.q != nullptr) {
      run(rows_, [this](int64_t r) { Arrange(hidden_, m_.R, hidden_lanes_, r); });
    }
    run(CeilDiv(m_.H, kFeatureBlock), [this](int64_t block) { UpMix(block); });
  }

 private:
  ProductArgs<T> Args(const HcNBitsProjection<T>& w, int64_t K, int64_t N, const float* x, const float* xq,
                      int64_t n0, int64_t n1, float* out, int64_t ldo) const {
    return {w, K, N, p_.bits, p_.block_size, x, K, rows_, xq, HcNBitsLanePadded(K), n0, n1, out, ldo};
  }

  void Arrange(const float* x, int64_t K, float* lanes, int64_t r) const {
    ArrangeLanes(x + r * K, K, p_.bits, lanes + r * HcNBitsLanePadded(K));
  }

  // Columns [n0, n1) of hn @ down_inject and their epilogue: hidden for down's columns (< R),
  // post_gate for inject's.
  void DownInject(int64_t block) {
    const int64_t R = m_.R, C = m_.C, N = R + C, W = m_.width();
    const int64_t n0 = block * kColumnBlock, n1 = std::min(N, n0 + kColumnBlock);
    ops_.product(Args(a_.down_inject, W, N, hn_, hn_lanes_, n0, n1, di_ + n0, N));
    for (int64_t r = 0; r < rows_; ++r) {
      float* v = di_ + r * N;
      if (n0 < R) {
        const int64_t e = std::min(n1, R);
        float sg[kColumnBlock];
        HcCpuDownToHidden(m_, ops_, v + n0, sg, e - n0, hidden_ + r * R + n0);
      }
      if (n1 > R) {
        const int64_t s = std::max(n0, R);
        ops_.round(v + s, n1 - s);  // rounding point: inject
        HcCpuInjectToPostGate(m_, ops_, v + s, n1 - s, a_.post_gate + (row0_ + r) * C + (s - R));
      }
    }
  }

  // up = hidden @ up for features [h0, h1) of every branch, then g and pre_output on them.
  void UpMix(int64_t block) {
    const int64_t R = m_.R, C = m_.C, H = m_.H, W = m_.width();
    const int64_t h0 = block * kFeatureBlock, h1 = std::min(H, h0 + kFeatureBlock), n = h1 - h0;
    for (int64_t c = 0; c < C; ++c) {
      ops_.product(Args(a_.up, R, W, hidden_, hidden_lanes_, c * H + h0, c * H + h1, g_ + c * H + h0, W));
    }
    for (int64_t r = 0; r < rows_; ++r) {
      HcCpuMixRow<kFeatureBlock>(m_, ops_, g_ + r * W + h0, hn_ + r * W + h0, n, a_.pre_output + (row0_ + r) * H + h0);
    }
  }

  const HcNBitsParams& p_;
  const HcLowRankMixParams& m_;
  const HcNBitsTensors<T>& a_;
  const NBitsOps<T> ops_;
  const int64_t row0_, rows_;
  float* hn_;      // rows x W: S, then hn
  float* g_;       // rows x W: up's sums, then g
  float* di_;      // rows x (R + C): the down/inject sums
  float* hidden_;  // rows x R
  float* hn_lanes_;      // rows x HcNBitsLanePadded(W): hn arranged for a quantized down_inject
  float* hidden_lanes_;  // rows x HcNBitsLanePadded(R): hidden arranged for a quantized up
};

}  // namespace

template <typename T>
void HcNBitsCpu(const HcNBitsParams& p, const HcNBitsTensors<T>& args, const HcTaskRunner& run, float* scratch) {
  const NBitsOps<T> ops = PickOps<NBitsOps<T>>();
  for (int64_t row0 = 0; row0 < p.mix.rows; row0 += kHcCpuRowsPerPass) {
    Pass<T>(p, args, ops, scratch, row0, std::min(kHcCpuRowsPerPass, p.mix.rows - row0)).Run(run);
  }
}

template void HcNBitsCpu<float>(const HcNBitsParams&, const HcNBitsTensors<float>&, const HcTaskRunner&, float*);
template void HcNBitsCpu<Half>(const HcNBitsParams&, const HcNBitsTensors<Half>&, const HcTaskRunner&, float*);
template void HcNBitsCpu<BFloat16>(const HcNBitsParams&, const HcNBitsTensors<BFloat16>&, const HcTaskRunner&,
                                   float*);

}  // namespace hcfuse
