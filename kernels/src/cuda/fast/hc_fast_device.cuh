// Device building blocks of the fast path's kernels (hc_fast_path.cu): the warp-level tensor-core
// products, S of four features, the fixed-order group and rank sums, the pre-mix, the timeline probe's
// records and the ablation switches (HCFUSE_DEV_KNOBS builds only).
#pragma once

#include <cstddef>
#include <cstring>

#include <cuda_runtime.h>

#include "cuda/common/hc_common.cuh"
#include "cuda/common/hc_ptx.cuh"
#include "cuda/fast/hc_fast_plan.h"

namespace hcfuse {
namespace fast {

using cuda::FromFloat;
using cuda::RoundToT;
using cuda::ToFloat;
using namespace ptx;


// Ablations for "where the time goes" measurements: HCFUSE_FAST_ABLATE=<bits> in a build with
// HCFUSE_DEV_KNOBS (results are then wrong): 1 skips the weight loads, 2 returns right after the
// grid-dependency wait, 4 skips the tensor-core products, 8 skips the weight fragments' shared-memory
// loads (the products run on constant weight fragments). Other builds ignore the macro.
#if defined(HCFUSE_DEV_KNOBS) && defined(HCFUSE_FAST_ABLATE)
inline constexpr int kAblate = HCFUSE_FAST_ABLATE;
#else
inline constexpr int kAblate = 0;
#endif
constexpr bool kAblateWeights = (kAblate & 1) != 0;
constexpr bool kAblateWork = (kAblate & 2) != 0;
constexpr bool kAblateMma = (kAblate & 4) != 0;
constexpr bool kAblateWeightFragments = (kAblate & 8) != 0;
constexpr int kParts = static_cast<int>(kHcFastSsParts);

// The k loop both warp products share: group(k, steps) issues steps k .. k + steps - 1 (at most CHAINS, step
// k + c into chain c), then the chains are added in order into out (the fixed order both operand
// layouts keep).
template <int TILES, int CHAINS, typename Group>
__device__ __forceinline__ void RunChains(int ksteps, Group&& group, const float (&acc)[CHAINS][TILES][4],
                                          float (&out)[TILES][4]) {
  int k = 0;
#pragma unroll 1
  for (; k + CHAINS <= ksteps; k += CHAINS) group(k, CHAINS);
  if (k < ksteps) group(k, ksteps - k);
#pragma unroll
  for (int t = 0; t < TILES; ++t) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      float s = acc[0][t][j];
#pragma unroll
      for (int c = 1; c < CHAINS; ++c) s += acc[c][t][j];
      out[t][j] = s;
    }
  }
}

// One warp: out[t] = A[16 x 16*ksteps] @ B[:, n0[t] .. n0[t] + 8) for TILES column tiles (n0 < 0: none),
// A and B in shared memory (row strides lda, ldb); A has a_rows rows and a zero row after them, which
// stands in for rows a_rows..15. k step k goes to accumulator chain k % CHAINS (independent mma chains),
// the chains added in order at the end. The accumulator layout is mma's: lane l holds rows l/4 and
// l/4 + 8, columns 2 * (l % 4) + {0, 1}.
// The code runs once per launch on the critical path after the grid-dependency wait, where every
// instruction counts: lane addresses are shared-memory byte addresses computed once
// and advanced by a constant per step, a missing tile multiplies tile 0's columns into a discarded
// accumulator instead of branching, and only the last partial group of steps is checked.
template <typename T, int TILES, int CHAINS>
__device__ __forceinline__ void WarpMma(const T* A, int a_rows, int lda, const T* B, int ldb, int ksteps,
                                        const int (&n0)[TILES], float (&out)[TILES][4]) {
  const int lane = threadIdx.x & 31;
  float acc[CHAINS][TILES][4] = {};
  const unsigned a_row = SharedAddress(A + min(lane & 15, a_rows) * lda + (lane >> 4) * 8);
  const unsigned b_row = SharedAddress(B + (lane & 15) * ldb);
  unsigned b_col[TILES];
#pragma unroll
  for (int t = 0; t < TILES; ++t) b_col[t] = b_row + 2 * max(n0[t], 0);
  const unsigned a_step = 16 * 2, b_step = 16 * 2 * ldb;  // bytes from one k step to the next
  // Every fragment of a group of CHAINS steps is loaded before the group's products are issued: the asm
  // statements keep their program order, and a product issued right after its own loads would wait out
  // their latency one by one.
  auto group = [&](int k, int steps) {
    unsigned a[CHAINS][4], b[CHAINS][TILES][2];
#pragma unroll
    for (int c = 0; c < CHAINS; ++c) {
      if (c >= steps) continue;
      LoadAFragment(a[c], a_row + (k + c) * a_step);
#pragma unroll
      for (int t = 0; t < TILES; ++t) {
        if constexpr (kAblateWeightFragments) {
          b[c][t][0] = b[c][t][1] = 0x3f803f80u + k + c;
        } else {
          LoadBFragment(b[c][t], b_col[t] + (k + c) * b_step);
        }
      }
    }
#pragma unroll
    for (int c = 0; c < CHAINS; ++c) {
      if (c >= steps) continue;
#pragma unroll
      for (int t = 0; t < TILES; ++t) Mma<T>(acc[c][t], a[c], b[c][t]);
    }
  };
  RunChains<TILES, CHAINS>(ksteps, group, acc, out);
}

// Stage 1's down weights as mma B fragments in registers (the real shape's kernel, at every row count):
// no shared-memory tile, so the products read no weights from shared memory. Warp w holds columns 32 w .. 32 w + 31 of its
// CTA's K slice, KSTEPS k steps of 16 rows: lane (g = lane / 4, t = lane % 4) the 8 bytes at columns 32 w + 4 g
// .. + 3 of rows 2t, 2t + 1, 2t + 8 and 2t + 9 of each step. Tile j (0..3) of the warp takes column 32 w + 4 g
// + j as mma's column g, so its B fragment is that column's k pairs, packed with byte permutes, and its
// accumulators are the lane's columns 32 w + 8 t + j (acc[j][0], [2]) and 32 w + 8 t + 4 + j (acc[j][1], [3]):
// eight adjacent columns a lane. Every output sums the same k steps in the same order as WarpMma<T, 4, 1>
// (one chain), so the bits are WarpMma's.
template <int KSTEPS>
struct DownWeightRegs {
  uint2 w[KSTEPS][4];

  // slice: the K slice's first row of down_weight (ld elements a row; warps past ld / 32 load nothing)
  template <typename T>
  __device__ __forceinline__ void Load(const T* slice, int ld, int warp, int lane) {
    if (32 * (warp + 1) > ld) return;
    const T* base = slice + 32 * warp + 4 * (lane >> 2);
    const int t = lane & 3;
#pragma unroll
    for (int s = 0; s < KSTEPS; ++s) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int row = 16 * s + 2 * t + (r & 1) + (r >> 1) * 8;
        w[s][r] = __ldg(reinterpret_cast<const uint2*>(base + static_cast<size_t>(row) * ld));
      }
    }
  }

  // acc[j] = A[16 x 16 * KSTEPS] @ tile j, A in shared memory as WarpMma reads it (a_rows rows, then a zero row)
  template <typename T>
  __device__ __forceinline__ void Multiply(const T* A, int a_rows, int lda, int lane, float (&acc)[4][4]) const {
    const unsigned a_row = SharedAddress(A + min(lane & 15, a_rows) * lda + (lane >> 4) * 8);
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
#pragma unroll
    for (int s = 0; s < KSTEPS; ++s) {
      unsigned a[4];
      LoadAFragment(a, a_row + s * 16 * 2);
      unsigned b[4][2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {  // k rows 2t, 2t + 1 (b[.][0]), then 2t + 8, 2t + 9 (b[.][1])
        const uint2 lo = w[s][2 * h], hi = w[s][2 * h + 1];
        b[0][h] = __byte_perm(lo.x, hi.x, 0x5410);
        b[1][h] = __byte_perm(lo.x, hi.x, 0x7632);
        b[2][h] = __byte_perm(lo.y, hi.y, 0x5410);
        b[3][h] = __byte_perm(lo.y, hi.y, 0x7632);
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) Mma<T>(acc[j], a, b[j]);
    }
  }
};

// WarpMma with the rows on mma's N side (stage 2's up product): one mma covers 16 columns of 8 rows
// instead of 8 columns of 16 rows, so up to 8 rows need half the products and the weights (mma's A
// operand, through the transposing load) are read from shared memory once. Tile t: out[t] = X[xr[t] ..
// xr[t] + 8) @ W[:, m0[t] .. m0[t] + 16) (m0 < 0: none; tile 0's columns go into a discarded accumulator),
// X [rows][k] (stride ldx), W [k][columns] (stride ldw), k steps and chains as in WarpMma. Only the
// x_rows real rows of X are read (two 4-byte loads a lane, no ldmatrix of 8 rows for one); the others
// multiply as zeros. Lane l holds columns m0 + l/4 (e = 0, 1) and m0 + l/4 + 8 (e = 2, 3) of rows xr +
// 2 (l % 4) + (e & 1).
template <typename T, int TILES, int CHAINS>
__device__ __forceinline__ void WarpMmaRowsN(const T* X, int x_rows, int ldx, const T* W, int ldw, int ksteps,
                                             const int (&m0)[TILES], const int (&xr)[TILES], float (&out)[TILES][4]) {
  const int lane = threadIdx.x & 31;
  float acc[CHAINS][TILES][4] = {};
  const unsigned* x_row[TILES];
  bool x_real[TILES];
  unsigned w_row[TILES];
#pragma unroll
  for (int t = 0; t < TILES; ++t) {
    // B: lane l takes row xr + l/4, k pairs 2 (l % 4) (b[0]) and 8 + 2 (l % 4) (b[1]) of each step
    x_real[t] = xr[t] + (lane >> 2) < x_rows;
    x_row[t] = reinterpret_cast<const unsigned*>(X + min(xr[t] + (lane >> 2), x_rows - 1) * ldx + 2 * (lane & 3));
    // A (transposed): lane l addresses k row (l & 7) + 8 (l >= 16), columns m0 + 8 ((l >> 3) & 1)
    w_row[t] = SharedAddress(W + ((lane & 7) + ((lane >> 4) << 3)) * ldw + max(m0[t], 0) + ((lane >> 3) & 1) * 8);
  }
  const unsigned w_step = 16 * 2 * ldw;  // bytes from one k step to the next (X: 8 words)
  auto group = [&](int k, int steps) {
    unsigned a[CHAINS][TILES][4], b[CHAINS][TILES][2];
#pragma unroll
    for (int c = 0; c < CHAINS; ++c) {
      if (c >= steps) continue;
#pragma unroll
      for (int t = 0; t < TILES; ++t) {
        if constexpr (kAblateWeightFragments) {
          a[c][t][0] = a[c][t][1] = a[c][t][2] = a[c][t][3] = 0x3f803f80u + k + c;
        } else {
          LoadAFragmentTrans(a[c][t], w_row[t] + (k + c) * w_step);
        }
        b[c][t][0] = x_real[t] ? x_row[t][(k + c) * 8] : 0u;
        b[c][t][1] = x_real[t] ? x_row[t][(k + c) * 8 + 4] : 0u;
      }
    }
#pragma unroll
    for (int c = 0; c < CHAINS; ++c) {
      if (c >= steps) continue;
#pragma unroll
      for (int t = 0; t < TILES; ++t) Mma<T>(acc[c][t], a[c][t], b[c][t]);
    }
  };
  RunChains<TILES, CHAINS>(ksteps, group, acc, out);
}

// Four T at p (8-byte aligned, written by an earlier kernel) through the read-only path.
template <typename T>
__device__ __forceinline__ cuda::Vec<T, 4> LoadVec4(const T* p) {
  const uint2 u = __ldg(reinterpret_cast<const uint2*>(p));
  cuda::Vec<T, 4> v;
  static_assert(sizeof(v) == sizeof(u), "four 16-bit values");
  memcpy(&v, &u, sizeof(u));
  return v;
}

// S for four features of one row from their streams (sv) and prev_block_output (pv, PRO only) values
// (the prologue folded in and rounded, rounding point: S).
template <typename T, bool PRO>
__device__ __forceinline__ void S4FromVecs(const cuda::Vec<T, 4>& sv, const cuda::Vec<T, 4>& pv, float gate,
                                           float (&s)[4]) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    s[j] = ToFloat<T>(sv.v[j]);
    if constexpr (PRO) s[j] = RoundToT<T>(cuda::PrologueS<T>(s[j], gate, ToFloat<T>(pv.v[j])));
  }
}

// S for four features of one row, loaded from streams and prev (PRO only).
template <typename T, bool PRO>
__device__ __forceinline__ void LoadS4(const T* streams, const T* prev, float gate, float (&s)[4]) {
  const cuda::Vec<T, 4> sv = LoadVec4<T>(streams);
  cuda::Vec<T, 4> pv{};
  if constexpr (PRO) pv = LoadVec4<T>(prev);
  S4FromVecs<T, PRO>(sv, pv, gate, s);
}

// sum over g = 0..groups-1 of p[g] in that order (p 16-byte aligned, written by stage 1).
__device__ __forceinline__ float SumGroups(const float* p, int groups) {
  float acc = 0.0f;
  int g = 0;
#pragma unroll 4
  for (; g + 4 <= groups; g += 4) {
    const float4 v = __ldg(reinterpret_cast<const float4*>(p + g));
    acc += v.x;
    acc += v.y;
    acc += v.z;
    acc += v.w;
  }
  for (; g < groups; ++g) acc += __ldg(p + g);
  return acc;
}

// Timeline probe (HCFUSE_FAST_TIMELINE with HCFUSE_DEV_KNOBS, defined only by the probe's build in
// bench/timeline): thread 0 of each CTA writes %globaltimer at its start, after the grid-dependency wait
// and at its end, and the SM's cycle counter after the wait and at the end, %globaltimer after each
// phase of the first pass (kPhase1..4; kPhase5: a mark inside a phase, where a kernel sets one) and, at
// the start, the SM it runs on, into timeline[((slot * kTimelineCtas) + cta) * kTimelineFields + field].
// Nothing is recorded in other builds.
inline constexpr int kTimelineCtas = 256;
inline constexpr int kTimelineFields = 11;
enum TimelineEvent { kTimelineStart = 0, kTimelineWaited = 1, kTimelineEnd = 2, kPhase1 = 5, kPhase2, kPhase3, kPhase4, kPhase5 = 10 };
inline constexpr int kTimelineSm = 9;
__device__ __forceinline__ void TimelineMark(unsigned long long* timeline, int slot, TimelineEvent event) {
#if defined(HCFUSE_DEV_KNOBS) && defined(HCFUSE_FAST_TIMELINE)
  if (timeline != nullptr && threadIdx.x == 0 && blockIdx.x < kTimelineCtas) {
    unsigned long long* rec = timeline + (static_cast<size_t>(slot) * kTimelineCtas + blockIdx.x) * kTimelineFields;
    rec[event] = GlobalTimer();
    if (event == kTimelineWaited || event == kTimelineEnd) rec[2 + event] = clock64();
    if (event == kTimelineStart) rec[kTimelineSm] = SmId();
  }
#else
  (void)timeline, (void)slot, (void)event;
#endif
}

// The end-of-CTA record (after every thread is done), timeline probe builds only.
__device__ __forceinline__ void TimelineEndOfCta(unsigned long long* timeline, int slot) {
#if defined(HCFUSE_DEV_KNOBS) && defined(HCFUSE_FAST_TIMELINE)
  __syncthreads();
  TimelineMark(timeline, slot, kTimelineEnd);
#else
  (void)timeline, (void)slot;
#endif
}

// One value of a group's partial: column c of row i summed over RANKS contributions in rank order
// (red is [rank][rt][stride]).
template <int RANKS>
__device__ __forceinline__ float SumRanks(const float* red, int rt, int stride, int i, int c) {
  float s = 0.0f;
#pragma unroll
  for (int src = 0; src < RANKS; ++src) s += red[(src * rt + i) * stride + c];
  return s;
}

// Stage 2's pre-mix for nr rows of a CTA's hs features (hn and g in shared memory as [row][C * hs]):
// pre_output = reduction_scale * sum over c of hn * g, branches in order (rounding point: pre_output).
// g is rounded to T, so MulAdd's one FMA gives the bits of a multiply then an add.
// pre_output points at the pass's first row and the CTA's first feature (row stride H).
template <typename T>
__device__ __forceinline__ void PreMix(const T* hn_s, const float* g_s, int nr, int hs, int C, int H,
                                       float reduction_scale, T* pre_output) {
  for (int idx = threadIdx.x; idx < nr * hs; idx += blockDim.x) {
    const int i = idx / hs, hh = idx % hs;
    float mix = 0.0f;
    for (int c = 0; c < C; ++c) {
      const int j = (i * C + c) * hs + hh;
      mix = cuda::MulAdd<T>(ToFloat<T>(hn_s[j]), g_s[j], mix);
    }
    pre_output[static_cast<size_t>(i) * H + hh] = FromFloat<T>(__fmul_rn(reduction_scale, mix));
  }
}

// ---- Host side.
using cuda::Launch;  // hc_common.cuh

}  // namespace fast
}  // namespace hcfuse
