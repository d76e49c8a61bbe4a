// The fast path's plan for one call: the cluster size, which kernels run it (the real shape's or the
// generic ones), the kernels' arguments (the tiling), grids, shared memory and scratch, or the reason the
// fast path cannot run it. Pure C++ (no CUDA header, no device call): the CUDA glue plans once per call
// and the launcher (hc_fast_path.cu) launches from the plan as given; tests/kernels/test_fast_plan.py
// builds hc_fast_plan.cc with the host compiler alone and checks the plan without a GPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>

#include "cuda/common/hc_device_caps.h"
#include "hcfuse/hc_params.h"

// The shared-memory layouts below are computed by the planner and by the kernels (offsets).
#if defined(__CUDACC__)
#define HCFUSE_HOST_DEVICE __host__ __device__
#else
#define HCFUSE_HOST_DEVICE
#endif

namespace hcfuse {

inline constexpr int64_t kHcFastClusterSize = 8;           // CTAs per thread-block cluster on sm_90
inline constexpr int64_t kHcFastMaxTileBytes = 64 * 1024;  // weight tile per CTA in shared memory
inline constexpr int64_t kHcFastSsParts = 8;               // a branch's sum of squares: 8 fixed parts
inline constexpr int64_t kHcFastMaxStage1Ctas = 128;       // about one CTA per SM (an H100 or H200 has 132)
inline constexpr int64_t kHcFastMaxStage2Ctas = 160;  // with 16-byte pieces (hs % 8 == 0); else 128
// The stage 2 weight tile HcFastTuning::stage2_max_ctas may grow to (fewer CTAs, more features each).
inline constexpr int64_t kHcFastMaxTunedStage2TileBytes = 128 * 1024;
inline constexpr int64_t kHcFastRowTile = 16;         // rows per pass: the M of mma.m16n8k16
inline constexpr int64_t kHcFastMaxRows = int64_t{1} << 24;  // the kernels count rows in int
// Row counts up to which the glue picks the fast path by itself: up to 16 rows (one pass of the row
// tile) it beats the general path and the stock chain (bench/bench_decode.py); at 32 rows the general
// path is faster.
inline constexpr int64_t kHcFastMaxAutoRows = 16;
// The quantized op's fast path (4-bit weights, hc_fast_quant.cuh): stage 1 takes K slices of
// kHcFastQuantKs features (two groups of 32 k), its 12 warps at most four 8-column tiles each (R + C <= 384),
// and stage 2's warps hold half of a column's R / 32 groups each (R a multiple of 32, at most kHcFastQuantMaxR),
// two warps a 16-column tile (at most kHcFastQuantMaxStage2Columns columns a CTA).
inline constexpr int64_t kHcFastQuantKs = 64;
inline constexpr int64_t kHcFastQuantMaxR = 352;
inline constexpr int64_t kHcFastQuantMaxStage2Columns = 64;
// Row counts up to which the glue gives the quantized op's calls to the fast path by itself: it beats the
// general kernels at every row count 1-64 (bench_decode.py's nbits-fast against nbits-general on an H100: 2.1x
// at 64 rows).
inline constexpr int64_t kHcFastQuantMaxAutoRows = 64;

// Choices of the fast path that never change a result (every choice sums in the same order). The
// library runs the defaults; builds with HCFUSE_DEV_KNOBS let benchmarks set them (HCFUSE_FAST_*).
// Up to ss_local_max_rows rows every stage 1 CTA sums all of its branch's squares itself instead of
// exchanging part sums inside its cluster (faster at 1 row only); up to hidden_local_max_rows rows every
// stage 2 CTA forms all R hidden values itself instead of sharing slices through distributed shared
// memory (never faster: every CTA would read all partials).
// timeline / timeline_slot: the timeline probe's record buffer and the slot of stage 1 (stage 2 takes
// the next one); only builds with HCFUSE_FAST_TIMELINE write to it (bench/timeline).
struct HcFastTuning {
  int64_t ss_local_max_rows = 1;
  int64_t hidden_local_max_rows = 0;
  // the real shape's kernels, compiled with its tiling as constants, where the call's tiling is theirs
  // (HcFastRealShape; same bits)
  bool real_shape_kernels = true;
  // with the real shape's kernels: their shared memory is padded so that at most this many later
  // kernels' CTAs wait on an SM next to a running one (0: no limit). They take fewer registers than the
  // generic ones, so without a limit 3 kernels wait ahead instead of 2, and the chain is slower.
  int64_t kernels_ahead = 1;
  // at most this many stage 2 CTAs (0: kHcFastMaxStage2Ctas, tiles of at most kHcFastMaxTileBytes); set,
  // the planner takes the largest valid count up to it with a tile of up to kHcFastMaxTunedStage2TileBytes
  int64_t stage2_max_ctas = 0;
  unsigned long long* timeline = nullptr;
  int timeline_slot = 0;
};

// What the plan needs to know of the call besides its shapes.
struct HcFastRequest {
  int element_bytes = 2;          // the fast path runs 2-byte types (float16, bfloat16) only
  bool pointers_aligned = true;   // HcFastPointersAligned over every tensor of the call
  bool forced = false;            // HCFUSE_FORCE_PATH=fast: any row count, not only decode-sized ones
  // the quantized op's call (4-bit weights, packed or no zero points, both projections quantized): its
  // block_size (at least 32); 0: the dense op
  int64_t quant_block_size = 0;
};

// The kernels' arguments (hc_fast_path.cu), filled by the planner.
struct HcFastClusterDims {
  int rows, C, H, R, K;
  int rt;             // rows per pass: min(rows, 16) (the mma's M is 16; missing rows read a zero row)
  int np;             // R + C: columns of a partial row
  int ks, ldb1, lda1;  // stage 1: K slice, weight tile and A tile strides (elements)
  int cpb;            // stage 1: CTAs per branch
  int per1;           // stage 1: partial columns each cluster rank reduces
  int groups, g4;     // partial sets stage 2 adds (stage 1 CTAs / cluster), padded to 4
  int hs, n2, ldu;    // stage 2: features per CTA, C * hs columns, weight tile stride
  int piece;          // stage 2: elements per copy (8: 16-byte copies, 4: 8-byte copies)
  int rp, lda2, per2;  // stage 2: R rounded to 16, A tile stride, hidden values per cluster rank
  int ss_parts;       // sum-of-squares parts one CTA sums: all kParts, or kParts / cluster when shared
  bool ss_local, hidden_local, has_prologue;
  int block_size;     // the quantized op's block_size; 0: dense weights
  // 8-byte aligned, so that the kernels may load two attributes as one 64-bit constant
  alignas(8) float epsilon;
  float reduction_scale, silu_alpha, gate_div, gate_mul;
  unsigned long long* timeline;  // the timeline probe's records (HCFUSE_FAST_TIMELINE builds)
  int slot;
};

// ---- Shared-memory layouts (bytes), the same on host and device.
// The quantized op's weights are copied into shared memory before the kernels' wait (hc_fast_quant.cuh), a
// column's bytes at a stride of an odd number of 16-byte pieces: the 8 columns of an mma fragment then fall
// in distinct banks.
HCFUSE_HOST_DEVICE constexpr size_t HcFastQuantStride(size_t bytes) { return bytes % 32 == 0 ? bytes + 16 : bytes; }

struct HcFastStage1Layout {
  size_t tile, q_scales, q_zero_points, a, scale, s_slice, part_sum, red, total;
  template <typename D>  // HcFastClusterDims, or a type whose constant fields hide its fields (hc_fast_path.cu)
  HCFUSE_HOST_DEVICE explicit HcFastStage1Layout(const D& d, int cluster) {
    // quantized: the K slice's bytes of R + 8 columns ([down | inject], inject's tile padded), then each
    // column's 4-byte word of scales and of packed zero points that holds the slice's
    const size_t quant_cols = d.block_size > 0 ? d.R + 8 : 0;
    tile = 0;                                                       // T [ks][ldb1]; quantized: u8 [cols][stride]
    q_scales = tile + size_t{2} * d.ks * d.ldb1 + quant_cols * HcFastQuantStride(kHcFastQuantKs / 2);
    q_zero_points = q_scales + 4 * quant_cols;                      // u32 [cols] each
    a = q_zero_points + 4 * quant_cols;                             // T [rt + 1][lda1] (last row zero)
    scale = a + size_t{2} * (d.rt + 1) * d.lda1;                    // T [ks]
    s_slice = scale + (size_t{2} * d.ks + 15) / 16 * 16;            // f32 [rt][ks]
    part_sum = s_slice + size_t{4} * d.rt * d.ks;                   // f32 [parts][rt]
    red = part_sum + size_t{4} * kHcFastSsParts * d.rt;             // f32 [cluster][rt][per1]
    total = red + size_t{4} * cluster * d.rt * d.per1;
  }
};

struct HcFastStage2Layout {
  size_t tile, q_scales, q_zero_points, quant_sum, a, hn, g, bar, total;
  template <typename D>
  HCFUSE_HOST_DEVICE explicit HcFastStage2Layout(const D& d) {
    // quantized: up's first R / 2 bytes of each of the CTA's n2 columns, their scales [n2][k_blocks] (T) and
    // packed zero points [n2][(k_blocks + 1) / 2] (u8), as up holds them
    const bool quant = d.block_size > 0;
    const size_t k_blocks = quant ? (d.R + d.block_size - 1) / d.block_size : 0;
    tile = 0;                                         // T [rp][ldu]; quantized: u8 [n2][stride]
    q_scales = tile + size_t{2} * d.rp * d.ldu + (quant ? d.n2 * HcFastQuantStride(d.R / 2) : 0);
    q_zero_points = q_scales + (size_t{2} * d.n2 * k_blocks + 15) / 16 * 16;
    // quantized: f32 [n2 / 16][2][32][4], the second K half's up accumulators of each (tile, 8 rows)
    quant_sum = q_zero_points + (d.n2 * ((k_blocks + 1) / 2) + 15) / 16 * 16;
    a = quant_sum + (quant ? size_t{4} * d.n2 / 16 * 2 * 32 * 4 : 0);  // T [rt][lda2]
    hn = a + size_t{2} * d.rt * d.lda2;               // T [rt][n2]
    g = hn + (size_t{2} * d.rt * d.n2 + 15) / 16 * 16;  // f32 [rt][n2]
    bar = (g + size_t{4} * d.rt * d.n2 + 7) / 8 * 8;   // u64: the hidden exchange's mbarrier
    total = bar + 8;
  }
};

// Byte offsets of the parts of one call's device scratch (256-byte aligned) and its size: the fp32
// partials of down and inject (inject's in the partials' last C columns), then hn (T).
struct HcFastScratch {
  size_t partials = 0, hn = 0, total = 0;
};

// The plan of one call: ok() and everything the launchers need, or the reason the fast path cannot
// run the call (for HCFUSE_DEBUG and the forced-path error).
struct HcFastPlan {
  std::string reason;  // empty: the fast path runs this call as planned
  int cluster = 1;      // CTAs per thread-block cluster (1: none, below sm_90; else kHcFastClusterSize)
  bool use_pdl = false;  // programmatic dependent launch (sm_90); a caller may turn it off
  int stage1_ctas = 0, stage2_ctas = 0;
  size_t stage1_shared_bytes = 0, stage2_shared_bytes = 0;  // dynamic shared memory per block
  HcFastScratch scratch;          // all zero for zero rows
  HcFastClusterDims cluster_dims{};  // the kernels' arguments
  // launch the real shape's kernels (HcFastRealShape, down weights in registers): decided here only,
  // the launcher takes it as given
  bool real_shape_kernels = false;

  bool ok() const { return reason.empty(); }
  size_t shared_memory_bytes() const {
    return stage1_shared_bytes > stage2_shared_bytes ? stage1_shared_bytes : stage2_shared_bytes;
  }
};

// The real shape's cluster tiling (C=4, H=2560, R=320: Qwen3.8-Flash-Next, clusters of 8), which
// hc_fast_path.cu also compiles as constants (RealShapeDims): the planner picks those kernels when the
// call's dims equal these (HcFastPlan::real_shape_kernels).
struct HcFastRealShape {
  static constexpr int cluster = 8, C = 4, H = 2560, R = 320, K = 10240, np = 324;
  static constexpr int ks = 80, ldb1 = 328, lda1 = 88, cpb = 32, per1 = 48, groups = 16, g4 = 16;
  static constexpr int hs = 16, n2 = 64, ldu = 72, piece = 8, rp = 320, lda2 = 328, per2 = 40;
  static bool Matches(const HcFastClusterDims& d, int cluster_size);
};

// A plan that says only why the fast path does not run a call.
inline HcFastPlan HcFastPlanRefused(std::string reason) {
  HcFastPlan plan;
  plan.reason = std::move(reason);
  return plan;
}

// The fast path's plan for this call on this device with this tuning. The reasons, first that
// applies: not a 2-byte type; compute capability below 8.0; a shape the kernels do not tile (C, H or
// R not positive, C % 4, C > 8, R % 8, R > 1024, H % 32, no stage 1 or stage 2 tiling); a pointer
// not 16-byte aligned; more shared memory per block than the device allows; more than
// kHcFastMaxAutoRows rows (unless forced); more than kHcFastMaxRows rows.
HcFastPlan HcFastPlanFor(const HcLowRankMixParams& params, const HcDeviceCaps& caps, const HcFastTuning& tuning,
                         const HcFastRequest& request);

// Every pointer the kernels read with 16-byte (cp.async / vector) accesses is 16-byte aligned.
inline bool HcFastPointersAligned(std::initializer_list<const void*> ptrs) {
  for (const void* p : ptrs) {
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  }
  return true;
}

}  // namespace hcfuse
