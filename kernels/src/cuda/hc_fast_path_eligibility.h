// Which calls the fused fast path takes: a pure predicate of the shapes, the element type and the
// device's compute capability, so the glue (and its tests) can decide without touching the GPU.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "hcfuse/hc_params.h"

namespace hcfuse {

// Tiling limits of hc_fast_path.cu (see the static asserts and the tile choice there).
inline constexpr int64_t kHcFastClusterSize = 8;         // CTAs per thread-block cluster on sm_90 (HcFastClusterSize)
inline constexpr int64_t kHcFastMaxTileBytes = 64 * 1024;  // weight tile per CTA in shared memory
// Row counts up to which the fast path beats the general path on the H200 (bench/bench_decode.py).
inline constexpr int64_t kHcFastMaxAutoRows = 32;

// Thread-block clusters and programmatic dependent launch need the kernels' sm_90 code. The build
// carries sm_80 and sm_90a code plus compute_80 PTX, so any other compute capability runs sm_80 code
// (sm_100 and later JIT-compile the compute_80 PTX, where the cluster step traps and the PDL wait is
// compiled out) and must take the sm_80 configuration: no clusters, no PDL.
inline bool HcFastUsesSm90Features(int sm_major) { return sm_major == 9; }
inline int64_t HcFastClusterSize(int sm_major) { return HcFastUsesSm90Features(sm_major) ? kHcFastClusterSize : 1; }

// Stage 1 CTAs per branch (K slices of one branch) and stage 2 CTAs; 0 when the shape has no tiling.
inline int64_t HcFastStage1CtasPerBranch(const HcLowRankMixParams& p, int64_t cluster) {
  // a slice never straddles two branches, so tile the H features of one branch; C branches side by side
  const int64_t per_branch_target = (128 + p.C - 1) / p.C;
  for (int64_t ctas = per_branch_target; ctas >= 1; --ctas) {
    if (p.H % ctas != 0 || (p.H / ctas) % 4 != 0 || (ctas * p.C) % cluster != 0) continue;
    if ((p.H / ctas) * (p.R + p.C) * 2 > kHcFastMaxTileBytes) return 0;
    return ctas;
  }
  return 0;
}

inline int64_t HcFastStage2Ctas(const HcLowRankMixParams& p, int64_t cluster) {
  for (int64_t ctas = 128; ctas >= 1; --ctas) {
    if (p.H % ctas != 0 || (p.H / ctas) % 4 != 0 || ctas % cluster != 0) continue;
    if (p.R * p.C * (p.H / ctas) * 2 > kHcFastMaxTileBytes) return 0;
    return ctas;
  }
  return 0;
}

// The fast path can run this call: fp16/bf16 (element_bytes == 2), sm_80+, R % 8 == 0 (16-byte rows of
// down_weight), C % 4 == 0 and C <= 8, H % 4 == 0 with a tiling of both stages (see above). Any row count.
inline bool IsHcFastPathSupported(const HcLowRankMixParams& p, int sm_major, int /*sm_minor*/, int element_bytes) {
  if (element_bytes != 2 || sm_major < 8) return false;
  if (p.C % 4 != 0 || p.C > 8 || p.R % 8 != 0 || p.R > 1024 || p.H % 4 != 0) return false;
  const int64_t cluster = HcFastClusterSize(sm_major);
  return HcFastStage1CtasPerBranch(p, cluster) > 0 && HcFastStage2Ctas(p, cluster) > 0;
}

// The glue's automatic choice: supported and a decode-sized row count (zero rows goes anywhere).
inline bool IsHcFastPathEligible(const HcLowRankMixParams& p, int sm_major, int sm_minor, int element_bytes) {
  return p.rows <= kHcFastMaxAutoRows && IsHcFastPathSupported(p, sm_major, sm_minor, element_bytes);
}

// Every pointer the kernels read with 16-byte (cp.async / vector) accesses is 16-byte aligned.
inline bool HcFastPointersAligned(std::initializer_list<const void*> ptrs) {
  for (const void* p : ptrs) {
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  }
  return true;
}

}  // namespace hcfuse
