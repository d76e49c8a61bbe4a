// The fast path's planner (hc_fast_plan.h): the tiling, shared memory and scratch of a call, and the
// reasons a call cannot run. Host C++ only.
#include "cuda/fast/hc_fast_plan.h"

#include <algorithm>
#include <string>
#include <utility>

namespace hcfuse {
namespace {

// Shared-memory row strides (elements of T) of the tensor-core operands: a row of n (a multiple of 8)
// elements padded to an odd number of 16-byte chunks, so ldmatrix's eight row reads hit distinct banks.
int64_t PaddedStride(int64_t n) { return (n / 8) % 2 == 1 ? n : n + 8; }
int64_t RoundUp(int64_t n, int64_t m) { return (n + m - 1) / m * m; }
size_t Align256(size_t n) { return (n + 255) / 256 * 256; }

int64_t ClusterSize(int sm_major) { return HcRunsSm90Code(sm_major) ? kHcFastClusterSize : 1; }

// Stage 1 weight tile: ks rows of [down (R) | inject (C, padded to one 8-column mma tile)].
int64_t Stage1TileBytes(const HcLowRankMixParams& p, int64_t ks) { return ks * PaddedStride(p.R + 8) * 2; }
// Stage 2 weight tile: R (rounded up to 16) rows of the C * hs columns a CTA owns (quantized: none, the
// weights are in registers).
int64_t Stage2TileBytes(const HcLowRankMixParams& p, int64_t hs, bool quant) {
  return quant ? 0 : RoundUp(p.R, 16) * PaddedStride(p.C * hs) * 2;
}

// Stage 1 CTAs per branch: each takes a K slice of ks = H / ctas features of one branch (ks a
// multiple of the mma's k = 16; quantized: kHcFastQuantKs); C branches side by side, a whole number of
// clusters. 0: no tiling.
int64_t Stage1CtasPerBranch(const HcLowRankMixParams& p, int64_t cluster, bool quant) {
  if (quant) {
    const int64_t ctas = p.H / kHcFastQuantKs;
    return p.H % kHcFastQuantKs == 0 && (ctas * p.C) % cluster == 0 ? ctas : 0;
  }
  for (int64_t ctas = kHcFastMaxStage1Ctas / p.C; ctas >= 1; --ctas) {
    if (p.H % ctas != 0 || (p.H / ctas) % 16 != 0 || (ctas * p.C) % cluster != 0) continue;
    return Stage1TileBytes(p, p.H / ctas) <= kHcFastMaxTileBytes ? ctas : 0;
  }
  return 0;
}

// The largest stage 2 weight tile: the tuned limit once HcFastTuning::stage2_max_ctas is set.
int64_t Stage2MaxTileBytes(int64_t max_ctas) {
  return max_ctas > 0 ? kHcFastMaxTunedStage2TileBytes : kHcFastMaxTileBytes;
}

// Stage 2 CTAs: each takes hs = H / ctas features of every branch (C * hs columns, a whole number
// of 8-column mma tiles). Preferred: hs a multiple of 8, so every up_weight row piece is 16-byte
// copies of whole 32-byte sectors (the real shape: 160 CTAs of 16 features); else hs a multiple of
// 4 (8-byte copies), at most 128 CTAs. max_ctas: HcFastTuning::stage2_max_ctas. 0: no tiling.
int64_t Stage2Ctas(const HcLowRankMixParams& p, int64_t cluster, int64_t max_ctas, bool quant) {
  const int64_t top = max_ctas > 0 ? max_ctas : kHcFastMaxStage2Ctas;
  const int64_t max_tile = Stage2MaxTileBytes(max_ctas);
  for (const int64_t piece : {8, 4}) {
    for (int64_t ctas = piece == 8 ? top : std::min<int64_t>(top, 128); ctas >= 1; --ctas) {
      const int64_t hs = p.H / ctas;
      // C * hs: whole 16-column tiles of the up product (C % 4 == 0 and hs % 4 == 0 give it)
      if (p.H % ctas != 0 || hs % piece != 0 || (p.C * hs) % 16 != 0 || ctas % cluster != 0) continue;
      if (quant && p.C * hs > kHcFastQuantMaxStage2Columns) break;  // fewer CTAs only grow it
      if (Stage2TileBytes(p, hs, quant) > max_tile) break;  // fewer CTAs only grow the tile
      return ctas;
    }
  }
  return 0;
}

// Why the kernels cannot tile this shape with this cluster size; empty when they can. C % 4 == 0 and
// C <= 8 (8-byte inject rows, one mma tile), R % 8 == 0 and R <= 1024 (16-byte down rows), H % 32 == 0
// (8 sum-of-squares parts of whole 4-element vectors), and a tiling of both stages (above).
// Quantized: also H % 64 == 0, R % 32 == 0 and R <= kHcFastQuantMaxR (hc_fast_plan.h).
std::string ShapeReason(const HcLowRankMixParams& p, int64_t cluster, int64_t stage2_max_ctas, bool quant) {
  const auto refuse = [&](const std::string& why) {
    return "C=" + std::to_string(p.C) + " H=" + std::to_string(p.H) + " R=" + std::to_string(p.R) + ": " + why;
  };
  const auto tile = [&](int64_t max_bytes) {  // strings only for a refusal: the accepted call allocates nothing here
    return std::to_string(max_bytes) + " bytes) with clusters of " + std::to_string(cluster);
  };
  if (p.C <= 0 || p.H <= 0 || p.R <= 0) return refuse("the fast path needs positive C, H and R");
  if (p.C % 4 != 0 || p.C > 8) return refuse("the fast path needs C a multiple of 4, at most 8");
  if (p.R % 8 != 0 || p.R > 1024) return refuse("the fast path needs R a multiple of 8, at most 1024");
  if (p.H % (4 * kHcFastSsParts) != 0) return refuse("the fast path needs H a multiple of 32");
  if (quant && (p.H % kHcFastQuantKs != 0 || p.R % 32 != 0 || p.R > kHcFastQuantMaxR)) {
    return refuse("the quantized fast path needs H a multiple of " + std::to_string(kHcFastQuantKs) +
                  " and R a multiple of 32, at most " + std::to_string(kHcFastQuantMaxR));
  }
  if (Stage1CtasPerBranch(p, cluster, quant) == 0) {
    return refuse("no stage 1 tiling (K slices of a multiple of 16 features, a weight tile of at most " +
                  tile(kHcFastMaxTileBytes));
  }
  if (Stage2Ctas(p, cluster, stage2_max_ctas, quant) == 0) {
    return refuse("no stage 2 tiling (4 or 8 features per CTA, a weight tile of at most " +
                  tile(Stage2MaxTileBytes(stage2_max_ctas)));
  }
  return {};
}

HcFastClusterDims ClusterDims(const HcLowRankMixParams& p, int cluster, const HcFastTuning& tuning,
                              int64_t quant_block_size) {
  const bool quant = quant_block_size > 0;
  const int parts = static_cast<int>(kHcFastSsParts);
  HcFastClusterDims d{};
  d.rows = static_cast<int>(p.rows);
  d.C = static_cast<int>(p.C);
  d.H = static_cast<int>(p.H);
  d.R = static_cast<int>(p.R);
  d.K = d.C * d.H;
  d.np = d.R + d.C;
  d.rt = static_cast<int>(std::min<int64_t>(std::max<int64_t>(p.rows, 1), kHcFastRowTile));  // rows per pass
  d.has_prologue = p.has_prologue;
  d.epsilon = p.epsilon;
  d.reduction_scale = p.reduction_scale;
  d.silu_alpha = p.silu_alpha;
  d.gate_div = p.gate_div;
  d.gate_mul = p.gate_mul;
  d.timeline = tuning.timeline;
  d.slot = tuning.timeline_slot;
  d.block_size = static_cast<int>(quant_block_size);
  d.cpb = static_cast<int>(Stage1CtasPerBranch(p, cluster, quant));
  d.ks = d.H / d.cpb;
  d.ldb1 = quant ? 0 : static_cast<int>(PaddedStride(p.R + 8));  // quantized: no weight tile
  d.lda1 = static_cast<int>(PaddedStride(d.ks));
  // partial columns per cluster rank: whole 8-column mma tiles (stage 1 stores a tile to one rank)
  d.per1 = static_cast<int>(RoundUp((d.np + 7) / 8, cluster) / cluster * 8);
  d.groups = d.cpb * d.C / cluster;
  d.g4 = static_cast<int>(RoundUp(d.groups, 4));
  d.hs = d.H / static_cast<int>(Stage2Ctas(p, cluster, tuning.stage2_max_ctas, quant));
  d.n2 = d.C * d.hs;
  d.ldu = quant ? 0 : static_cast<int>(PaddedStride(d.n2));
  d.piece = d.hs % 8 == 0 ? 8 : 4;
  d.rp = static_cast<int>(RoundUp(p.R, 16));
  d.lda2 = static_cast<int>(PaddedStride(d.rp));
  d.per2 = static_cast<int>(RoundUp((p.R + cluster - 1) / cluster, 8));
  d.ss_local = cluster == 1 || parts % cluster != 0 || d.cpb % cluster != 0 || p.rows <= tuning.ss_local_max_rows;
  d.ss_parts = d.ss_local ? parts : parts / cluster;
  d.hidden_local = cluster == 1 || p.rows <= tuning.hidden_local_max_rows;
  return d;
}

// Pads both stages' shared memory so that no three of their CTAs fit an SM (at most `ahead` = 1 later
// kernel's CTA waits next to a running one: the smallest three need more than the SM has), while any
// two still do; larger `ahead` values leave room for ahead + 1. Nothing changes where the device's
// figures are not known or the stages already take more.
void LimitKernelsAhead(HcFastPlan& plan, const HcDeviceCaps& caps, int64_t ahead) {
  if (ahead <= 0 || caps.shared_memory_per_sm <= 0) return;
  const int64_t per_block = caps.shared_memory_per_sm / (ahead + 2) - caps.reserved_shared_memory_per_block + 1;
  const size_t floor = static_cast<size_t>(RoundUp(std::max<int64_t>(per_block, 0), 128));
  if ((ahead + 1) * static_cast<int64_t>(std::max(floor, plan.shared_memory_bytes()) +
                                         caps.reserved_shared_memory_per_block) > caps.shared_memory_per_sm) {
    return;  // the padded stages would not fit ahead + 1 to an SM
  }
  plan.stage1_shared_bytes = std::max(plan.stage1_shared_bytes, floor);
  plan.stage2_shared_bytes = std::max(plan.stage2_shared_bytes, floor);
}

}  // namespace

bool HcFastRealShape::Matches(const HcFastClusterDims& d, int cluster_size) {
  return cluster_size == cluster && d.C == C && d.H == H && d.R == R && d.K == K && d.np == np && d.ks == ks &&
         d.ldb1 == ldb1 && d.lda1 == lda1 && d.cpb == cpb && d.per1 == per1 && d.groups == groups && d.g4 == g4 &&
         d.hs == hs && d.n2 == n2 && d.ldu == ldu && d.piece == piece && d.rp == rp && d.lda2 == lda2 &&
         d.per2 == per2;
}

HcFastPlan HcFastPlanFor(const HcLowRankMixParams& params, const HcDeviceCaps& caps, const HcFastTuning& tuning,
                         const HcFastRequest& request) {
  if (request.element_bytes != 2) return HcFastPlanRefused("the fast path runs float16 and bfloat16 only");
  if (caps.sm_major < 8) {
    return HcFastPlanRefused("compute capability " + std::to_string(caps.sm_major) + "." +
                             std::to_string(caps.sm_minor) + " is below 8.0");
  }
  const int64_t cluster = ClusterSize(caps.sm_major);
  const bool quant = request.quant_block_size > 0;
  if (quant && request.quant_block_size < 32) {
    return HcFastPlanRefused("the quantized fast path needs block_size >= 32");
  }
  if (std::string why = ShapeReason(params, cluster, tuning.stage2_max_ctas, quant); !why.empty()) {
    return HcFastPlanRefused(std::move(why));
  }
  if (!request.pointers_aligned) return HcFastPlanRefused("a tensor is not 16-byte aligned");

  HcFastPlan plan;
  plan.use_pdl = HcRunsSm90Code(caps.sm_major);
  const size_t rows = static_cast<size_t>(params.rows);
  const HcFastClusterDims& d = plan.cluster_dims = ClusterDims(params, static_cast<int>(cluster), tuning, request.quant_block_size);
  plan.cluster = static_cast<int>(cluster);
  plan.stage1_ctas = d.cpb * d.C;
  plan.stage2_ctas = d.H / d.hs;
  plan.stage1_shared_bytes = HcFastStage1Layout(d, plan.cluster).total;
  plan.stage2_shared_bytes = HcFastStage2Layout(d).total;
  plan.scratch.hn = Align256(rows * d.np * d.g4 * sizeof(float));
  plan.real_shape_kernels = !quant && tuning.real_shape_kernels && HcFastRealShape::Matches(d, plan.cluster);
  if (plan.real_shape_kernels) LimitKernelsAhead(plan, caps, tuning.kernels_ahead);
  plan.scratch.total = plan.scratch.hn + Align256(rows * params.width() * 2);

  if (plan.shared_memory_bytes() > static_cast<size_t>(std::max<int64_t>(caps.max_shared_memory_per_block, 0))) {
    return HcFastPlanRefused("it needs " + std::to_string(plan.shared_memory_bytes()) +
                             " bytes of shared memory per block; the device allows " +
                             std::to_string(caps.max_shared_memory_per_block));
  }
  const int64_t max_auto_rows = quant ? kHcFastQuantMaxAutoRows : kHcFastMaxAutoRows;
  if (!request.forced && params.rows > max_auto_rows) {
    return HcFastPlanRefused("more than " + std::to_string(max_auto_rows) + " rows");
  }
  if (params.rows > kHcFastMaxRows) {
    return HcFastPlanRefused("more than " + std::to_string(kHcFastMaxRows) + " rows (the kernels count rows in int)");
  }
  return plan;
}

}  // namespace hcfuse
