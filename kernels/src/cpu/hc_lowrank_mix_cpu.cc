// CPU kernel of HyperConnectionLowRankMix; the order of operations is hcfuse/reference.py's (see the
// header; float32 sums down in fixed slices of k). Phases per pass of up to kHcCpuRowsPerPass rows,
// each a set of independent tasks over output elements handed to the task runner (ORT's thread pool):
//   1. S, streams_out and hn per (row, branch);
//   2. down -> Z -> SG -> hidden and inject -> post_gate per (row tile, block of output columns);
//      float32: the down slices per (row tile, group of 4 slices), then one phase adding them in
//      order and computing Z, SG and hidden;
//   3. up -> g and pre_output per (row tile, block of features h, all C branches); at 1-4 rows up in
//      two parts of its rows (runs of 10-20 KB), then g and pre_output per block of features.
// The products run in hc_lowrank_mix_cpu_gemm.inc, compiled for AVX-512, AVX2 and plain x86-64 (or
// the target's default; hc_cpu_isa.inc) and picked at run time; the variants differ only in FMA (see the header).
// At 1-4 rows they are bound by reading the weights from memory, which goes fastest as several long
// sequential streams: up in halves of its rows (any T), float32's down slices two or four at once;
// 16-bit down goes through tiles that prefetch the next tile as they consume this one.
#include "cpu/hc_lowrank_mix_cpu.h"

#include <algorithm>
#include <type_traits>

#include "cpu/hc_cpu_isa.inc"
#include "cpu/hc_cpu_steps.h"

namespace hcfuse {
namespace {

constexpr int64_t kColumnBlock = 160;   // down / inject output columns per task: R = 320 in two halves
// Features h per up/mix task (C * that many output columns) from 5 rows: 128; 1-4 rows stream up in
// kUpParts parts and compute g and pre_output in tasks of 256 features.
constexpr int64_t kFeatureBlock = 128;
constexpr int64_t kFeatureBlockMax = 256;
constexpr int64_t kSpan = 256;          // elementwise work in stack spans of this many floats
// 1-4 rows: up in this many parts of its rows, a task each (runs of 20 KB at the Qwen shape, 10 KB
// for 16-bit; float32: up in 4 parts measured 9-13% slower on 2 threads, bench/cpu_stream_micro.cc)
constexpr int64_t kUpParts = 2;

inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

template <typename T>
class Pass {
 public:
  // Rows [row0, row0 + rows) of the call, rows <= kHcCpuRowsPerPass.
  Pass(const HcLowRankMixParams& p, const HcLowRankMixCpuArgs<T>& a, const CpuOps<T>& ops, float* scratch,
       int64_t row0, int64_t rows)
      : p_(p), a_(a), ops_(ops), row0_(row0), rows_(rows), tiles_(CeilDiv(rows, kHcCpuRowTile)) {
    hn_ = scratch;
    g_ = hn_ + rows * p.width();
    hidden_ = g_ + rows * p.width();
    down_part_ = hidden_ + rows * p.R;
  }

  void Run(const HcTaskRunner& run) {
    const int64_t C = p_.C;
    run(CeilDiv(rows_, kHcCpuNormRows) * C, [this, C](int64_t task) {
      HcCpuNorm(p_, a_, ops_, hn_, row0_, rows_, task / C, task % C);
    });
    const int64_t inject_blocks = CeilDiv(C, kColumnBlock);
    if constexpr (kSplitK) {  // float32: down's k in slices, 2 or 4 to a task, added in order afterwards
      const int64_t down_tasks = CeilDiv(down_.count, down_.per_task) * down_blocks_;
      run((down_tasks + inject_blocks) * tiles_, [this, down_tasks](int64_t task) {
        const int64_t block = task / tiles_, tile = task % tiles_;
        if (block < down_tasks) {
          DownSlices(block / down_blocks_, block % down_blocks_, tile);
        } else {
          DownInject(CeilDiv(p_.R, kColumnBlock) + block - down_tasks, tile);
        }
      });
      run(tiles_, [this](int64_t tile) { DownEpilogue(tile); });
    } else {
      const int64_t column_blocks = CeilDiv(p_.R, kColumnBlock) + inject_blocks;
      run(column_blocks * tiles_, [this](int64_t task) { DownInject(task / tiles_, task % tiles_); });
    }
    const int64_t feature_blocks = CeilDiv(p_.H, feature_block_);
    if (stream_up_) {  // 1-4 rows: up in kUpParts parts of its rows, then g and pre_output
      run(kUpParts, [this](int64_t part) { UpPart(part); });
      run(feature_blocks, [this](int64_t block) {
        const int64_t h0 = block * feature_block_;
        MixRows(0, rows_, h0, std::min(feature_block_, p_.H - h0));
      });
    } else {
      run(feature_blocks * tiles_, [this](int64_t task) { UpMix(task / tiles_, task % tiles_); });
    }
  }

 private:
  // Column block `block` of [hn @ down_weight | hn @ inject_weight] for row tile `tile`, and its
  // epilogue: hidden (into scratch) for down columns, post_gate for inject columns.
  void DownInject(int64_t block, int64_t tile) {
    const int64_t R = p_.R, C = p_.C, W = p_.width();
    const int64_t r0 = tile * kHcCpuRowTile, nr = std::min(kHcCpuRowTile, rows_ - r0);
    const int64_t down_blocks = CeilDiv(R, kColumnBlock);
    const bool down = block < down_blocks;
    const int64_t N = down ? R : C;
    const int64_t n0 = (down ? block : block - down_blocks) * kColumnBlock, n1 = std::min(N, n0 + kColumnBlock);
    const int64_t n = n1 - n0;
    float acc[kHcCpuRowTile * kColumnBlock];
    ops_.gemm({hn_ + r0 * W, W, nr, down ? a_.down_weight : a_.inject_weight, N, W, n0, n1, acc, kColumnBlock});
    for (int64_t r = 0; r < nr; ++r) {
      float* v = acc + r * kColumnBlock;
      if (down) {
        float sg[kColumnBlock];
        HcCpuDownToHidden(p_, ops_, v, sg, n, hidden_ + (r0 + r) * R + n0);
        continue;
      }
      ops_.round(v, n);  // rounding point: inject
      HcCpuInjectToPostGate(p_, ops_, v, n, a_.post_gate + (row0_ + r0 + r) * C + n0);
    }
  }

  // up = hidden @ up_weight, g and pre_output for features [h0, h1) of every branch, row tile `tile`.
  void UpMix(int64_t block, int64_t tile) {
    const int64_t R = p_.R, C = p_.C, H = p_.H, W = p_.width();
    const int64_t r0 = tile * kHcCpuRowTile, nr = std::min(kHcCpuRowTile, rows_ - r0);
    const int64_t h0 = block * feature_block_, h1 = std::min(H, h0 + feature_block_), n = h1 - h0;
    float* g = g_ + r0 * W;
    for (int64_t c = 0; c < C; ++c) {
      const T* next = c + 1 < C ? a_.up_weight + (c + 1) * H + h0 : nullptr;
      ops_.gemm({hidden_ + r0 * R, R, nr, a_.up_weight, W, R, c * H + h0, c * H + h1, g + c * H + h0, W, next, n,
                 c > 0});
    }
    MixRows(r0, nr, h0, n);
  }

  // g and pre_output for features [h0, h0 + n) of rows [r0, r0 + nr) of the pass, from up's sums in g_.
  void MixRows(int64_t r0, int64_t nr, int64_t h0, int64_t n) {
    const int64_t H = p_.H, W = p_.width();
    for (int64_t r = 0; r < nr; ++r) {
      HcCpuMixRow<kFeatureBlockMax>(p_, ops_, g_ + (r0 + r) * W + h0, hn_ + (r0 + r) * W + h0, n,
                                    a_.pre_output + (row0_ + r0 + r) * H + h0);
    }
  }

  // --- float32 (kSplitK): the down product in slices of k; 1-4 rows of any type: up in parts. ---

  // A product's K in `count` slices of `len` rows of k (the last one shorter), `per_task` to a task.
  struct Slices {
    int64_t len, count, per_task;
    Slices(int64_t K, int64_t max_count, int64_t per_task_)
        : len(CeilDiv(K, max_count)), count(CeilDiv(K, len)), per_task(per_task_) {}
  };

  // Slices [group * per_task, ...) of hn @ down_weight, columns of block `block`, each into its
  // down_part_ slot.
  void DownSlices(int64_t group, int64_t block, int64_t tile) {
    const int64_t R = p_.R, W = p_.width();
    const int64_t r0 = tile * kHcCpuRowTile, nr = std::min(kHcCpuRowTile, rows_ - r0);
    const int64_t s0 = group * down_.per_task, s1 = std::min(down_.count, s0 + down_.per_task);
    const int64_t k0 = s0 * down_.len, k1 = std::min(W, s1 * down_.len);
    const int64_t n0 = block * down_block_, n1 = std::min(R, n0 + down_block_);
    GemmArgs<T> g{hn_ + r0 * W + k0, W, nr, a_.down_weight + k0 * R, R, k1 - k0, n0, n1,
                  down_part_ + (s0 * rows_ + r0) * R + n0, R};
    g.slice_k = down_.len;
    g.slice_out = rows_ * R;
    ops_.gemm(g);
  }

  // down = the slices' sums added in order, then Z, SG and hidden, for row tile `tile`.
  void DownEpilogue(int64_t tile) {
    const int64_t R = p_.R;
    const int64_t r0 = tile * kHcCpuRowTile, nr = std::min(kHcCpuRowTile, rows_ - r0);
    for (int64_t r = r0; r < r0 + nr; ++r) {
      float* hidden = hidden_ + r * R;
      for (int64_t n0 = 0; n0 < R; n0 += kSpan) {
        const int64_t n = std::min(kSpan, R - n0);
        float z[kSpan], sg[kSpan];
        for (int64_t j = 0; j < n; ++j) z[j] = down_part_[r * R + n0 + j];
        for (int64_t s = 1; s < down_.count; ++s)
          for (int64_t j = 0; j < n; ++j) z[j] += down_part_[(s * rows_ + r) * R + n0 + j];
        HcCpuDownToHidden(p_, ops_, z, sg, n, hidden + n0);
      }
    }
  }

  // Part `part` of kUpParts of up = hidden @ up_weight's columns (1-4 rows, one tile) into g_: a run of
  // 20 KB (16-bit: 10 KB) of each weight row at the Qwen shape, streamed four rows of k at a time
  // (GemmBlock); each column's sum still sequential over k, as everywhere.
  void UpPart(int64_t part) {
    const int64_t W = p_.width();
    const int64_t len = CeilDiv(CeilDiv(W, kUpParts), 16) * 16;  // whole vectors of any width
    const int64_t n0 = std::min(W, part * len), n1 = std::min(W, n0 + len);
    if (n0 < n1) ops_.gemm({hidden_, p_.R, rows_, a_.up_weight, W, p_.R, n0, n1, g_ + n0, W});
  }

  static constexpr bool kSplitK = std::is_same_v<T, float>;

  const HcLowRankMixParams& p_;
  const HcLowRankMixCpuArgs<T>& a_;
  const CpuOps<T> ops_;
  const int64_t row0_, rows_, tiles_;
  const int64_t feature_block_ = rows_ <= 4 ? kFeatureBlockMax : kFeatureBlock;
  // 1-4 rows: up in kUpParts parts of its rows (any T: each column's sum stays sequential over k)
  const bool stream_up_ = rows_ <= 4;
  const int64_t down_block_ = kSplitK && rows_ <= 4 ? p_.R : kColumnBlock;
  const int64_t down_blocks_ = CeilDiv(p_.R, down_block_);
  // down: up to 8 slices of W (1280 rows each at the Qwen shape), read 4 slices to a task (4 streams)
  // at 1-2 rows, 2 at 3-4 rows (down/inject at 4 rows 1.8 ms against 2.3 with 4 slices; at 1 row 1.1
  // against 0.96, at 2 rows 1.34 against 1.19; bench/cpu_stream_micro.cc)
  const Slices down_{p_.width(), kHcCpuDownSlices, rows_ <= 2 ? 4 : 2};
  float* hn_;         // rows x W: S, then hn
  float* g_;          // rows x W: up accumulators, then g
  float* hidden_;     // rows x R
  float* down_part_;  // float32: kHcCpuDownSlices x rows x R, the down product's slices
};

}  // namespace

template <typename T>
void HcLowRankMixCpu(const HcLowRankMixParams& params, const HcLowRankMixCpuArgs<T>& args, const HcTaskRunner& run,
                     float* scratch) {
  const CpuOps<T> ops = PickOps<CpuOps<T>>();
  for (int64_t row0 = 0; row0 < params.rows; row0 += kHcCpuRowsPerPass) {
    Pass<T>(params, args, ops, scratch, row0, std::min(kHcCpuRowsPerPass, params.rows - row0)).Run(run);
  }
}

template void HcLowRankMixCpu<float>(const HcLowRankMixParams&, const HcLowRankMixCpuArgs<float>&,
                                     const HcTaskRunner&, float*);
template void HcLowRankMixCpu<Half>(const HcLowRankMixParams&, const HcLowRankMixCpuArgs<Half>&, const HcTaskRunner&,
                                    float*);
template void HcLowRankMixCpu<BFloat16>(const HcLowRankMixParams&, const HcLowRankMixCpuArgs<BFloat16>&,
                                        const HcTaskRunner&, float*);

}  // namespace hcfuse
