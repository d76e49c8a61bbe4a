// Which calls the fused fast path takes: a pure predicate of the shapes, the element type and the
// device's compute capability, so the glue (and its tests) can decide without touching the GPU.
// The tiling here is the one hc_fast_path.cu runs (its shared-memory layout is derived from it).
#pragma once

#include <cstdint>
#include <initializer_list>

#include "hcfuse/hc_params.h"

namespace hcfuse {

inline constexpr int64_t kHcFastClusterSize = 8;           // CTAs per thread-block cluster on sm_90 (default)
inline constexpr int64_t kHcFastMaxTileBytes = 64 * 1024;  // weight tile per CTA in shared memory
inline constexpr int64_t kHcFastSsParts = 8;               // a branch's sum of squares: 8 fixed parts
inline constexpr int64_t kHcFastMaxStage1Ctas = 128;       // about one CTA per SM of an H100/H200
inline constexpr int64_t kHcFastMaxStage2Ctas = 160;  // with 16-byte pieces (hs % 8 == 0); else 128
// Row counts up to which the glue picks the fast path by itself: on the H200 (bench/bench_decode.py,
// bf16 and fp16) it beats the general path and the stock chain up to 16 rows (26.9 / 25.8 us per block
// against stock 32.8 / 31.4 at 16 rows); at 32 rows the general path (32-35 us per block) is faster
// than the fast path (50 us).
inline constexpr int64_t kHcFastMaxAutoRows = 16;

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
  unsigned long long* timeline = nullptr;
  int timeline_slot = 0;
};

// Thread-block clusters and programmatic dependent launch need the kernels' sm_90 code. The build
// carries sm_80 and sm_90a code plus compute_80 PTX, so any other compute capability runs sm_80 code
// (sm_100 and later JIT-compile the compute_80 PTX, where the cluster step traps and the PDL wait is
// compiled out) and must take the sm_80 configuration: no clusters, no PDL.
inline bool HcFastUsesSm90Features(int sm_major) { return sm_major == 9; }
inline int64_t HcFastClusterSize(int sm_major, int64_t requested = 0) {
  if (!HcFastUsesSm90Features(sm_major)) return 1;
  return requested == 4 || requested == 8 ? requested : kHcFastClusterSize;
}

// Shared-memory row strides (elements of T) of the tensor-core operands: a row of n (a multiple of 8)
// elements padded to an odd number of 16-byte chunks, so ldmatrix's eight row reads hit distinct banks.
inline int64_t HcFastPaddedStride(int64_t n) { return (n / 8) % 2 == 1 ? n : n + 8; }
inline int64_t HcFastRoundUp(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// Stage 1 weight tile: ks rows of [down (R) | inject (C, padded to one 8-column mma tile)].
inline int64_t HcFastStage1TileBytes(const HcLowRankMixParams& p, int64_t ks) {
  return ks * HcFastPaddedStride(p.R + 8) * 2;
}
// Stage 2 weight tile: R (rounded up to 16) rows of the C * hs columns a CTA owns.
inline int64_t HcFastStage2TileBytes(const HcLowRankMixParams& p, int64_t hs) {
  return HcFastRoundUp(p.R, 16) * HcFastPaddedStride(p.C * hs) * 2;
}

// Stage 1 CTAs per branch: each takes a K slice of ks = H / ctas features of one branch (ks a
// multiple of the mma's k = 16); C branches side by side, a whole number of clusters. 0: no tiling.
inline int64_t HcFastStage1CtasPerBranch(const HcLowRankMixParams& p, int64_t cluster) {
  for (int64_t ctas = kHcFastMaxStage1Ctas / p.C; ctas >= 1; --ctas) {
    if (p.H % ctas != 0 || (p.H / ctas) % 16 != 0 || (ctas * p.C) % cluster != 0) continue;
    return HcFastStage1TileBytes(p, p.H / ctas) <= kHcFastMaxTileBytes ? ctas : 0;
  }
  return 0;
}

// Stage 2 CTAs: each takes hs = H / ctas features of every branch (C * hs columns, a whole number
// of 8-column mma tiles). Preferred: hs a multiple of 8, so every up_weight row piece is 16-byte
// copies of whole 32-byte sectors (the real shape: 160 CTAs of 16 features); else hs a multiple of
// 4 (8-byte copies), at most 128 CTAs. 0: no tiling.
inline int64_t HcFastStage2Ctas(const HcLowRankMixParams& p, int64_t cluster) {
  for (const int64_t piece : {8, 4}) {
    for (int64_t ctas = piece == 8 ? kHcFastMaxStage2Ctas : 128; ctas >= 1; --ctas) {
      const int64_t hs = p.H / ctas;
      if (p.H % ctas != 0 || hs % piece != 0 || (p.C * hs) % 8 != 0 || ctas % cluster != 0) continue;
      if (HcFastStage2TileBytes(p, hs) > kHcFastMaxTileBytes) break;  // fewer CTAs only grow the tile
      return ctas;
    }
  }
  return 0;
}

// The fast path can run this call: fp16/bf16 (element_bytes == 2), sm_80+, C % 4 == 0 and C <= 8
// (8-byte inject rows, one mma tile), R % 8 == 0 and R <= 1024 (16-byte down rows), H % 32 == 0
// (8 sum-of-squares parts of whole 4-element vectors), and a tiling of both stages (see above).
// Any row count.
inline bool IsHcFastPathSupported(const HcLowRankMixParams& p, int sm_major, int /*sm_minor*/, int element_bytes) {
  if (element_bytes != 2 || sm_major < 8) return false;
  if (p.C % 4 != 0 || p.C > 8 || p.R % 8 != 0 || p.R > 1024 || p.H % (4 * kHcFastSsParts) != 0) return false;
  const int64_t cluster = HcFastClusterSize(sm_major);
  return HcFastStage1CtasPerBranch(p, cluster) > 0 && HcFastStage2Ctas(p, cluster) > 0;
}

// The glue's automatic choice: supported and a decode-sized row count (zero rows goes anywhere).
inline bool IsHcFastPathEligible(const HcLowRankMixParams& p, int sm_major, int sm_minor, int element_bytes) {
  return p.rows <= kHcFastMaxAutoRows && IsHcFastPathSupported(p, sm_major, sm_minor, element_bytes);
}

// ---- The plain design (hc_fast_plain.cu): no clusters, one CTA per SM per kernel, each stage 1 CTA
// doing what one cluster of 8 does in the cluster design for one eighth of the columns, so the bits
// are the cluster design's (cluster size 8). It needs sm_90 (the cluster design's order on sm_90),
// 8 cluster-design CTAs per group inside one branch, and a stage 2 tiling (below).
inline constexpr int64_t kHcFastPlainRanks = 8;             // = kHcFastClusterSize = warps of stage 1
inline constexpr int64_t kHcFastPlainMaxStage2Ctas = 128;   // at most one CTA per SM
inline constexpr int64_t kHcFastPlainMaxTileBytes = 72 * 1024;
// Row counts up to which kAuto takes the plain design: none. Measured on the H200 (bench/README.md,
// issue 15 notes): the plain design ties the cluster design at 1 row in bf16 (14.3 vs 14.4 us per
// block), loses in fp16 (14.1 vs 12.8) and from 2 rows on (every CTA adds all partials and reads
// whole branch rows from L2), so it runs only when HCFUSE_FAST_DESIGN=plain asks for it.
inline constexpr int64_t kHcFastPlainMaxRows = 0;

// Stage 2 of the plain design: ctas CTAs of hs = H / ctas features of every branch; each copies the
// 16-byte chunks that cover its features, a window of `window` elements per branch row.
struct HcFastPlainStage2Tiling {
  int64_t ctas = 0, hs = 0, window = 0;
};
inline HcFastPlainStage2Tiling HcFastPlainStage2(const HcLowRankMixParams& p) {
  HcFastPlainStage2Tiling t;
  if (p.H % 8 != 0) return t;
  for (int64_t ctas = kHcFastPlainMaxStage2Ctas; ctas >= 1; --ctas) {
    if (p.H % ctas != 0) continue;
    t.ctas = ctas;
    t.hs = p.H / ctas;
    for (int64_t j = 0; j < ctas; ++j) {
      const int64_t h0 = j * t.hs, begin = h0 / 8 * 8, end = HcFastRoundUp(h0 + t.hs, 8);
      t.window = end - begin > t.window ? end - begin : t.window;
    }
    return t;
  }
  return t;
}
// Down n-tiles (8 columns) of one of the 8 column slices of stage 1.
inline int64_t HcFastPlainTilesPerSlice(const HcLowRankMixParams& p) {
  return (p.R / 8 + kHcFastPlainRanks - 1) / kHcFastPlainRanks;
}
inline int64_t HcFastPlainStage1TileBytes(const HcLowRankMixParams& p, int64_t slice) {
  return slice * HcFastPaddedStride(HcFastPlainTilesPerSlice(p) * 8) * 2;
}
inline int64_t HcFastPlainStage2TileBytes(const HcLowRankMixParams& p, const HcFastPlainStage2Tiling& t) {
  return p.C * HcFastRoundUp(p.R, 16) * HcFastPaddedStride(t.window) * 2;
}

// The plain design can run this call (IsHcFastPathSupported assumed): sm_90 with the default
// cluster size, the cluster design's groups of 8 stage 1 CTAs inside one branch, and both tiles fit.
inline bool IsHcFastPlainSupported(const HcLowRankMixParams& p, int sm_major, int64_t cluster_request) {
  if (!HcFastUsesSm90Features(sm_major) || HcFastClusterSize(sm_major, cluster_request) != kHcFastPlainRanks) {
    return false;
  }
  const int64_t cpb = HcFastStage1CtasPerBranch(p, kHcFastPlainRanks);
  // groups of 8 inside one branch; at most 16 groups (stage 2 adds them as four float4)
  if (cpb <= 0 || cpb % kHcFastPlainRanks != 0 || cpb * p.C / kHcFastPlainRanks > 16) return false;
  const HcFastPlainStage2Tiling t = HcFastPlainStage2(p);
  const int64_t slice = p.H / cpb * kHcFastPlainRanks;
  return t.ctas > 0 && HcFastPlainStage1TileBytes(p, slice) <= kHcFastPlainMaxTileBytes &&
         HcFastPlainStage2TileBytes(p, t) <= kHcFastPlainMaxTileBytes;
}

// Which design LaunchHcFast runs (for a call the fast path supports).
inline bool HcFastRunsPlain(const HcLowRankMixParams& p, int sm_major, const HcFastTuning& tuning) {
  if (tuning.design == HcFastDesign::kCluster || !IsHcFastPlainSupported(p, sm_major, tuning.cluster)) return false;
  return tuning.design == HcFastDesign::kPlain || p.rows <= kHcFastPlainMaxRows;
}

// Every pointer the kernels read with 16-byte (cp.async / vector) accesses is 16-byte aligned.
inline bool HcFastPointersAligned(std::initializer_list<const void*> ptrs) {
  for (const void* p : ptrs) {
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  }
  return true;
}

}  // namespace hcfuse
