// The fast path's plan for one call: which design and cluster size run it, the kernels' arguments
// (the tiling), grids, shared memory and scratch, or the reason the fast path cannot run it.
// Pure C++ (no CUDA header, no device call): the CUDA glue plans once per call and the launchers
// (hc_fast_path.cu, hc_fast_plain.cu) launch from the plan as given; tests/test_fast_plan.py builds
// hc_fast_plan.cc with the host compiler alone and checks the plan without a GPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>

#include "hcfuse/hc_params.h"

// The shared-memory layouts below are computed by the planner and by the kernels (offsets).
#if defined(__CUDACC__)
#define HCFUSE_HOST_DEVICE __host__ __device__
#else
#define HCFUSE_HOST_DEVICE
#endif

namespace hcfuse {

inline constexpr int64_t kHcFastClusterSize = 8;           // CTAs per thread-block cluster on sm_90 (default)
inline constexpr int64_t kHcFastMaxTileBytes = 64 * 1024;  // weight tile per CTA in shared memory
inline constexpr int64_t kHcFastSsParts = 8;               // a branch's sum of squares: 8 fixed parts
inline constexpr int64_t kHcFastMaxStage1Ctas = 128;       // about one CTA per SM of an H100/H200
inline constexpr int64_t kHcFastMaxStage2Ctas = 160;  // with 16-byte pieces (hs % 8 == 0); else 128
// The stage 2 weight tile HcFastTuning::stage2_max_ctas may grow to (fewer CTAs, more features each).
inline constexpr int64_t kHcFastMaxTunedStage2TileBytes = 128 * 1024;
inline constexpr int64_t kHcFastRowTile = 16;         // rows per pass: the M of mma.m16n8k16
inline constexpr int64_t kHcFastMaxRows = int64_t{1} << 24;  // the kernels count rows in int
// Row counts up to which the glue picks the fast path by itself: on the H200 (bench/bench_decode.py,
// bf16 and fp16) it beats the general path and the stock chain up to 16 rows (26.9 / 25.8 us per block
// against stock 32.8 / 31.4 at 16 rows); at 32 rows the general path (32-35 us per block) is faster
// than the fast path (50 us).
inline constexpr int64_t kHcFastMaxAutoRows = 16;

// ---- The plain design (hc_fast_plain.cu): no clusters, one CTA per SM per kernel, each stage 1 CTA
// doing what one cluster of 8 does in the cluster design for one eighth of the columns, so the bits
// are the cluster design's (cluster size 8). It needs sm_90 (the cluster design's order on sm_90),
// 8 cluster-design CTAs per group inside one branch, and a stage 2 tiling.
inline constexpr int64_t kHcFastPlainRanks = 8;             // = kHcFastClusterSize = warps of stage 1
inline constexpr int64_t kHcFastPlainMaxStage2Ctas = 128;   // at most one CTA per SM
inline constexpr int64_t kHcFastPlainMaxTileBytes = 72 * 1024;
// Row counts up to which kAuto takes the plain design: none. Measured on the H200 (bench/README.md,
// issue 15 notes): the plain design ties the cluster design at 1 row in bf16 (14.3 vs 14.4 us per
// block), loses in fp16 (14.1 vs 12.8) and from 2 rows on (every CTA adds all partials and reads
// whole branch rows from L2), so it runs only when HCFUSE_FAST_DESIGN=plain asks for it.
inline constexpr int64_t kHcFastPlainMaxRows = 0;

// Tuning of the fast path that never changes a result (every choice sums in the same order):
// up to ss_local_max_rows rows every stage 1 CTA sums all of its branch's squares itself instead of
// exchanging part sums inside its cluster; up to hidden_local_max_rows rows every stage 2 CTA forms
// all R hidden values itself instead of sharing slices through distributed shared memory.
// cluster (sm_90 only; 0: kHcFastClusterSize) is the one setting that does change bits: it groups
// stage 1's partial sums (a rank's CTAs first, then the groups), so it is for benchmarks only.
// Defaults measured on the H200 (bench/README.md): local sums of squares win at 1 row only, local
// hidden values never (every CTA would read all partials).
// design picks the kernels: kAuto (the plain design up to kHcFastPlainMaxRows rows where it can run,
// else the cluster design), kCluster or kPlain (benchmarks and tests; kPlain falls back to the cluster
// design where it cannot run). Both designs give the same bits (hc_fast_plain.cu says why).
// timeline / timeline_slot: the timeline probe's record buffer and the slot of stage 1 (stage 2 takes
// the next one); only builds with HCFUSE_FAST_TIMELINE write to it (bench/fast_path_timeline.cu).
enum class HcFastDesign { kAuto = 0, kCluster = 1, kPlain = 2 };
struct HcFastTuning {
  int64_t ss_local_max_rows = 1;
  int64_t hidden_local_max_rows = 0;
  int64_t cluster = 0;  // 0, 4 or 8
  HcFastDesign design = HcFastDesign::kAuto;
  bool bulk_copies = true;  // plain design: weight tiles by the copy engine (cp.async.bulk), not cp.async
  // cluster design: stage 1's stream loads of a part in one batch, streams_out / hn_out stored after
  // the pass's last cluster barrier (hc_fast_path.cu, HcFastStage1Kernel's BATCH; same bits)
  // (the default for both types, measured faster; HCFUSE_FAST_BATCH=0 turns it off)
  bool batched_stage1 = true;
  // cluster design, the real shape's kernels with stage 1 batched: from this many rows stage 1 loads its down
  // weights straight into registers as mma fragments instead of a shared-memory tile (DownWeightRegs; same
  // bits). Measured side by side on an H200 with the weight-free warps taking the part sums first (bench/README.md,
  // twenty-fifth session), us a block, tile -> registers, bf16: 9.59 -> 9.36 / 10.35 -> 9.79 / 10.83 -> 10.51 /
  // 12.52 -> 12.17 / 18.00 -> 16.95 at 1 / 2 / 4 / 8 / 16 rows, fp16 0.26-1.09 less too: registers at every row
  // count. HCFUSE_FAST_REG_WEIGHTS=1 / 0: always / never.
  int64_t reg_weights_min_rows = 1;
  // cluster design: the real shape's kernels compiled with its tiling as constants where the call's
  // tiling is theirs (HcFastRealShape; same bits; HCFUSE_FAST_REAL_SHAPE=0 turns it off)
  bool real_shape_kernels = true;
  // with the real shape's kernels: their shared memory is padded so that at most this many later
  // kernels' CTAs wait on an SM next to a running one (0: no limit; HCFUSE_FAST_AHEAD). They take 40
  // registers where the generic ones take 62, so without a limit 3 kernels wait ahead instead of 2,
  // and the chain is slower: measured on the H200 (bench/README.md, issue 15), 1 ahead is fastest.
  int64_t kernels_ahead = 1;
  // cluster design: at most this many stage 2 CTAs (0: kHcFastMaxStage2Ctas, tiles of at most
  // kHcFastMaxTileBytes); set, the planner takes the largest valid count up to it with a tile of up to
  // kHcFastMaxTunedStage2TileBytes (HCFUSE_FAST_STAGE2_CTAS; a measurement knob: the real shape at 80
  // CTAs of 32 features fits next to stage 1's 128 CTAs on an H200's 132 SMs, where 160 leave 28 CTAs
  // waiting for stage 1 to exit)
  int64_t stage2_max_ctas = 0;
  unsigned long long* timeline = nullptr;
  int timeline_slot = 0;
};

// What the plan needs to know of the device (the glue reads it once, at kernel creation).
struct HcDeviceCaps {
  int sm_major = 0;
  int sm_minor = 0;
  int64_t max_shared_memory_per_block = 0;  // cudaDevAttrMaxSharedMemoryPerBlockOptin
  // cudaDevAttrMaxSharedMemoryPerMultiprocessor and cudaDevAttrReservedSharedMemoryPerBlock (0: not
  // known, then HcFastTuning::kernels_ahead sets no limit)
  int64_t shared_memory_per_sm = 0;
  int64_t reserved_shared_memory_per_block = 0;
  int sm_count = 0;  // cudaDevAttrMultiProcessorCount (the general path's persistent grids)
};

// Thread-block clusters and programmatic dependent launch need the kernels' sm_90 code. The build
// carries sm_80 and sm_90a code plus compute_80 PTX, so any other compute capability runs sm_80 code
// (sm_100 and later JIT-compile the compute_80 PTX, where the cluster step traps and the PDL wait is
// compiled out) and must take the sm_80 configuration: no clusters, no PDL. Both CUDA paths (the fast
// path's plan, the general path's launchers) decide by it.
inline bool HcRunsSm90Code(int sm_major) { return sm_major == 9; }

// What the plan needs to know of the call besides its shapes.
struct HcFastRequest {
  int element_bytes = 2;          // the fast path runs 2-byte types (float16, bfloat16) only
  bool pointers_aligned = true;   // HcFastPointersAligned over every tensor of the call
  bool forced = false;            // HCFUSE_FORCE_PATH=fast: any row count, not only decode-sized ones
};

// Kernel arguments of the cluster design (hc_fast_path.cu), filled by the planner.
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
  int ss_parts;       // sum-of-squares parts one CTA sums: all kParts, or kParts / cluster in cluster mode
  bool ss_local, hidden_local, has_prologue, batch, reg_weights;
  float epsilon, reduction_scale, silu_alpha, gate_div, gate_mul;
  unsigned long long* timeline;  // the timeline probe's records (HCFUSE_FAST_TIMELINE builds)
  int slot;
};

// Kernel arguments of the plain design (hc_fast_plain.cu), filled by the planner.
struct HcFastPlainDims {
  int rows, C, H, R, K, np;
  int rt;              // rows per pass
  int kso;             // features of one cluster rank's slice
  int slice;           // kRanks * kso: features of one stage 1 CTA
  int slices_per_branch;
  int groups, g4;      // stage 1 groups (CTAs / kRanks), padded to 4 (down partial stride)
  int tpn, ncols;      // down n-tiles per column slice, tpn * 8
  int ldw1, lda1;      // stage 1 tile and A strides
  int hs, ctas2, win, ldw2;  // stage 2: features per CTA, CTAs, window, window stride
  int rp, lda2;        // R rounded to 16, stage 2 A stride
  bool has_prologue, bulk;  // bulk: weight tiles by cp.async.bulk
  float epsilon, reduction_scale, silu_alpha, gate_div, gate_mul;
  unsigned long long* timeline;
  int slot;
};

// ---- Shared-memory layouts (bytes), the same on host and device.
struct HcFastStage1Layout {
  size_t tile, a, scale, s_slice, part_sum, red, total;
  template <typename D>  // HcFastClusterDims, or a type whose constant fields hide its fields (hc_fast_path.cu)
  HCFUSE_HOST_DEVICE explicit HcFastStage1Layout(const D& d, int cluster) {
    tile = 0;                                                       // T [ks][ldb1]
    a = tile + size_t{2} * d.ks * d.ldb1;                           // T [rt + 1][lda1] (last row zero)
    scale = a + size_t{2} * (d.rt + 1) * d.lda1;                    // T [ks]
    s_slice = scale + (size_t{2} * d.ks + 15) / 16 * 16;            // f32 [rt][ks]
    part_sum = s_slice + size_t{4} * d.rt * d.ks;                   // f32 [parts][rt]
    red = part_sum + size_t{4} * kHcFastSsParts * d.rt;             // f32 [cluster][rt][per1]
    total = red + size_t{4} * cluster * d.rt * d.per1;
  }
};

struct HcFastStage2Layout {
  size_t tile, a, hn, g, bar, total;
  template <typename D>
  HCFUSE_HOST_DEVICE explicit HcFastStage2Layout(const D& d) {
    tile = 0;                                         // T [rp][ldu]
    a = tile + size_t{2} * d.rp * d.ldu;              // T [rt][lda2]
    hn = a + size_t{2} * d.rt * d.lda2;               // T [rt][n2]
    g = hn + (size_t{2} * d.rt * d.n2 + 15) / 16 * 16;  // f32 [rt][n2]
    bar = (g + size_t{4} * d.rt * d.n2 + 7) / 8 * 8;   // u64: the hidden exchange's mbarrier
    total = bar + 8;
  }
};

struct HcFastPlain1Layout {
  size_t tile, itile, scale, a, part_sum, red, total;
  HCFUSE_HOST_DEVICE explicit HcFastPlain1Layout(const HcFastPlainDims& d) {
    tile = 0;                                                  // T [slice][ldw1]
    itile = tile + size_t{2} * d.slice * d.ldw1;               // T [kso][8]
    scale = itile + size_t{2} * d.kso * 8;                     // T [slice]
    a = scale + (size_t{2} * d.slice + 15) / 16 * 16;          // T [rt + 1][lda1] (S, then hn; last row zero)
    part_sum = a + (size_t{2} * (d.rt + 1) * d.lda1 + 15) / 16 * 16;  // f32 [kParts][rt]
    red = part_sum + size_t{4} * kHcFastSsParts * d.rt;        // f32 [warps][rt][ncols]
    total = red + size_t{4} * kHcFastPlainRanks * d.rt * d.ncols;
  }
};

struct HcFastPlain2Layout {
  size_t tile, a, hn, g, total;
  HCFUSE_HOST_DEVICE explicit HcFastPlain2Layout(const HcFastPlainDims& d) {
    tile = 0;                                                   // T [C][rp][ldw2]
    a = tile + size_t{2} * d.C * d.rp * d.ldw2;                 // T [rt + 1][lda2] (last row zero)
    hn = a + size_t{2} * (d.rt + 1) * d.lda2;                   // T [rt][C * hs]
    g = hn + (size_t{2} * d.rt * d.C * d.hs + 15) / 16 * 16;    // f32 [rt][C * hs]
    total = g + size_t{4} * d.rt * d.C * d.hs;
  }
};

// Byte offsets of the parts of one call's device scratch (256-byte aligned) and its size: the fp32
// partials of down and inject (the plain design keeps inject's apart, at `inject`; the cluster design
// in the partials' last C columns), then hn (T).
struct HcFastScratch {
  size_t partials = 0, inject = 0, hn = 0, total = 0;
};

// The plan of one call: ok() and everything the launchers need, or the reason the fast path cannot
// run the call (for HCFUSE_DEBUG and the forced-path error).
struct HcFastPlan {
  std::string reason;  // empty: the fast path runs this call as planned
  HcFastDesign design = HcFastDesign::kCluster;  // kCluster or kPlain
  int cluster = 1;      // CTAs per thread-block cluster (1: none; the plain design has none)
  bool use_pdl = false;  // programmatic dependent launch (sm_90); a caller may turn it off
  int stage1_ctas = 0, stage2_ctas = 0;
  size_t stage1_shared_bytes = 0, stage2_shared_bytes = 0;  // dynamic shared memory per block
  HcFastScratch scratch;          // all zero for zero rows
  HcFastClusterDims cluster_dims{};  // the kernels' arguments when design == kCluster
  HcFastPlainDims plain_dims{};      // when design == kPlain
  bool real_shape_kernels = false;   // launch the real shape's kernels (HcFastRealShape)

  bool ok() const { return reason.empty(); }
  size_t shared_memory_bytes() const {
    return stage1_shared_bytes > stage2_shared_bytes ? stage1_shared_bytes : stage2_shared_bytes;
  }
};

// The real shape's cluster tiling (C=4, H=2560, R=320: Qwen3.8-Flash-Next, clusters of 8), which
// hc_fast_path.cu also compiles as constants (RealShapeDims): the plan runs those kernels when the
// call's dims equal these.
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
