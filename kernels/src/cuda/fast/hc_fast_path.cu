// Fused fast decode path of HyperConnectionLowRankMix: two kernels per node, weights streamed into
// shared memory with cp.async (before the grid-dependency wait when they are constant initializers;
// the real shape's stage 1 loads its down weights into registers instead, DownWeightRegs),
// both products on tensor cores (mma.sync m16n8k16, fp32 accumulation, rows as the M = 16 side), fp32
// partials of the down/inject product reduced inside a thread-block cluster through distributed
// shared memory (sm_90), then in a fixed order across clusters by stage 2.
//
// Stage 1 (HcFastStage1Kernel), one CTA per K slice of ks features of one branch:
//   the branch's sum of squares per row in 8 fixed parts (every CTA all 8, or 8 / cluster parts per
//   cluster rank pushed to its peers), S and hn of the slice (hn to scratch for stage 2's pre-mix),
//   streams_out of the slice, and the slice's share of [down | inject] = hn @ [down_weight |
//   inject_weight] for up to 16 rows per pass; each cluster rank reduces a column range over the ranks.
// Stage 2 (HcFastStage2Kernel), one CTA per hs features h of all C branches (so pre_output is local):
//   down / inject from the partials (groups in order), ScaledSiLU (all of R, or one slice per cluster
//   rank pushed to its peers), up = hidden @ up_weight for its C*hs columns, g, pre-mix; CTA 0 also
//   computes post_gate.
// Every sum has one fixed order whatever the row count and the tuning: a part of a sum of squares is
// lane-strided then a butterfly, parts in order; partials are added rank by rank, then group by group;
// an mma tile's rows never mix. So results are deterministic and row independent.
#include "cuda/fast/hc_fast_path.h"

#include <algorithm>
#include <string>
#include <type_traits>
#include <utility>

#include "cuda/common/hc_common.cuh"
#include "cuda/fast/hc_fast_device.cuh"
#include "cuda/fast/hc_fast_plan.h"
#include "cuda/fast/hc_fast_quant.cuh"

namespace hcfuse {
namespace {

using namespace fast;  // NOLINT: the device building blocks (hc_fast_device.cuh)

constexpr int kStage1Threads = 384;
constexpr int kStage2Threads = 320;
static_assert(kParts % 8 == 0, "whole sum-of-squares parts per rank of a 4- or 8-CTA cluster");

// The kernels' arguments and shared-memory layouts: the plan's (hc_fast_plan.h, filled on the host).
using FastDims = HcFastClusterDims;
using Stage1Layout = HcFastStage1Layout;
using Stage2Layout = HcFastStage2Layout;

// The real shape's tiling with clusters of 8 (HcFastRealShape: C=4, H=2560, R=320) as compile-time
// constants. The kernels are templates on their dims type D; with D = RealShapeDims, `d.ks` and the rest
// name these constants (they hide the base's fields of the same name), so the post-wait index math
// folds into shifts and constant multiplies instead of runtime divisions and 64-bit arithmetic on
// loaded values. The arithmetic on data is the generic kernels', so are the bits; the plan picks these
// kernels when its dims equal the constants (HcFastPlan::real_shape_kernels).
struct RealShapeDims : FastDims {
  using S = HcFastRealShape;
  static constexpr int C = S::C, H = S::H, R = S::R, K = S::K, np = S::np;
  static constexpr int ks = S::ks, ldb1 = S::ldb1, lda1 = S::lda1, cpb = S::cpb, per1 = S::per1, groups = S::groups,
                       g4 = S::g4;
  static constexpr int hs = S::hs, n2 = S::n2, ldu = S::ldu, piece = S::piece, rp = S::rp, lda2 = S::lda2,
                       per2 = S::per2;
  static constexpr int block_size = 0;  // dense weights
  static RealShapeDims From(const FastDims& d) {
    RealShapeDims r;
    static_cast<FastDims&>(r) = d;
    return r;
  }
};

// ------------------------------------------------------------------------------------------------
// Stage 1. CL: cluster size (1 without clusters). PRO: the node has the prologue. A lane's stream loads
// of a part are issued together (one L2 round trip instead of one per 128 features: 3 at H = 2560), and
// streams_out / hn_out are stored after the pass's last cluster barrier (its release is a GPU-scope
// MEMBAR in SASS that waits for every global store still in flight).
template <typename D, bool REGW>
struct RegWeightSteps {  // k steps of the down weights a lane holds (REGW: D's slice, a constant)
  static constexpr int value = 1;
};
template <typename D>
struct RegWeightSteps<D, true> {
  static constexpr int value = D::ks / 16;
};

// REGW (the real shape's tiling only; same bits): the down weights go from global memory straight into
// registers as mma fragments (DownWeightRegs), not through a shared-memory tile (the weights are then
// read from shared memory by no product). QUANT (the quantized op): [down | inject] from `quant`'s 4-bit
// bytes, copied into shared memory (QuantSlice), every column tile of the CTA in one pass of the warps; ZP:
// its zero points may be given (else none are read).
template <typename T, int CL, bool PRO, typename D, bool REGW, bool QUANT, bool ZP = false>
__device__ __forceinline__ void Stage1Body(const HcFastArgs<T>& args, const HcFastQuant<T>& quant, const D& d,
                                           float* __restrict__ partials, T* __restrict__ hn_out,
                                           bool weights_are_constant) {
  extern __shared__ __align__(16) unsigned char smem[];
  TimelineMark(d.timeline, d.slot, kTimelineStart);
  const Stage1Layout layout(d, CL);
  T* tile = reinterpret_cast<T*>(smem + layout.tile);
  T* a_tile = reinterpret_cast<T*>(smem + layout.a);
  T* scale = reinterpret_cast<T*>(smem + layout.scale);
  float* s_slice = reinterpret_cast<float*>(smem + layout.s_slice);
  float* part_sum = reinterpret_cast<float*>(smem + layout.part_sum);
  float* red = reinterpret_cast<float*>(smem + layout.red);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, num_warps = blockDim.x >> 5;
  const int branch = blockIdx.x / d.cpb;
  const int h0 = (blockIdx.x % d.cpb) * d.ks;
  const int k0 = branch * d.H + h0;
  const int rank = CL > 1 ? ClusterRank() : 0;

  // The tile's columns past [down | inject] and the A tile's zero row are never copied into: zero
  // them once (zero inject columns keep the padded mma tile exact).
  const int pad_cols = d.ldb1 - d.np;
  for (int idx = tid; idx < d.ks * pad_cols; idx += blockDim.x) {
    tile[(idx / pad_cols) * d.ldb1 + d.np + idx % pad_cols] = FromFloat<T>(0.0f);
  }
  for (int idx = tid; idx < d.lda1; idx += blockDim.x) a_tile[d.rt * d.lda1 + idx] = FromFloat<T>(0.0f);

  DownWeightRegs<RegWeightSteps<D, REGW>::value> wregs;
  const int ntiles = d.R / 8 + 1;  // down's column tiles, then inject's (padded)
  const QuantSlice<T, ZP> qslice(smem, layout, d.K, QUANT ? d.block_size : 1, k0);
  // QUANT: warp w multiplies tiles w, w + warps, ... (at most 4 a warp); their reducing ranks, found before
  // the wait (a division)
  constexpr int kQuantTilesPerWarp = 4;
  static_assert(kQuantTilesPerWarp * (kStage1Threads / 32) >= kHcFastQuantMaxR / 8 + 1,
                "every quantized stage 1 tile (R / 8 of down, one of inject) has a warp");
  int quant_owner[kQuantTilesPerWarp];
#pragma unroll
  for (int u = 0; u < kQuantTilesPerWarp; ++u) quant_owner[u] = (warp + u * num_warps) * 8 / d.per1;
  auto load_weights = [&] {
    if constexpr (kAblateWeights) return;
    if constexpr (QUANT) {
      qslice.Copy(quant.down_inject, d.np, 8 * ntiles, tid, blockDim.x);
    } else if constexpr (REGW) {
      wregs.Load(args.down_weight + static_cast<size_t>(k0) * d.R, d.R, warp, lane);
    } else {
      const int chunks = d.R / 8;  // 16-byte pieces of a down_weight row
      for (int idx = tid; idx < d.ks * chunks; idx += blockDim.x) {
        const int k = idx / chunks, j = (idx % chunks) * 8;
        CpAsync<16>(tile + k * d.ldb1 + j, args.down_weight + static_cast<size_t>(k0 + k) * d.R + j);
      }
    }
    if constexpr (!QUANT) {
      const int pieces = d.C / 4;  // 8-byte pieces of an inject_weight row
      for (int idx = tid; idx < d.ks * pieces; idx += blockDim.x) {
        const int k = idx / pieces, j = (idx % pieces) * 4;
        CpAsync<8>(tile + k * d.ldb1 + d.R + j, args.inject_weight + static_cast<size_t>(k0 + k) * d.C + j);
      }
    }
    for (int idx = tid; idx < d.ks / 4; idx += blockDim.x) CpAsync<8>(scale + idx * 4, args.norm_scale + k0 + idx * 4);
    CpAsyncCommit();
  };
  if (weights_are_constant) load_weights();
  ReleaseDependents();  // stage 2 may become resident now and prefetch its weights
  if constexpr (CL > 1) ClusterArriveRelaxed();
  WaitOnProducer();  // streams / prev_* come from upstream nodes; scratch was read by the last stage 2
  TimelineMark(d.timeline, d.slot, kTimelineWaited);
  if (!weights_are_constant) load_weights();
  if constexpr (kAblateWork) {
    CpAsyncWaitAll();
    if constexpr (CL > 1) ClusterWait();
    return;
  }

  const int L = d.H / kParts;  // features in one part of a branch
  // S of four slice features q.. of pass row i, to shared memory (streams_out is stored from there).
  auto store_slice = [&](const float (&s)[4], int i, int q) {
    *reinterpret_cast<float4*>(s_slice + i * d.ks + q) = make_float4(s[0], s[1], s[2], s[3]);
  };
  const int ksteps = d.ks / 16;
  const int c_begin = rank * d.per1, c_len = max(0, min(d.np, c_begin + d.per1) - c_begin);
  const int group = blockIdx.x / CL;

  for (int r0 = 0; r0 < d.rows; r0 += d.rt) {
    const int nr = min(d.rt, d.rows - r0);
    if constexpr (CL > 1) {
      if (r0 == 0) {
        ClusterWait();  // the peers run: DSMEM may be written
      } else if (d.ss_local) {
        ClusterSync();  // peers are done reading this CTA's red of the last pass
      }
    } else if (r0 > 0) {
      __syncthreads();  // red of the last pass is read
    }

    // A: one warp per (part, row) pair sums that part's squares (lane-strided, then a butterfly) and
    // forms S of the slice where the part covers it (kept in shared memory, copied to streams_out);
    // with cluster part sums the slice lies elsewhere and one more warp per row forms it.
    // With REGW the pairs go to the last warps first: warps R / 32 .. hold no down weights, and ptxas gives
    // a stream load the scoreboard of the weight loads, so in a warp that holds weights the part sum waits
    // for all of them. (At the real shape there are more pairs than weight-free warps at every row count,
    // so this order alone does not take that wait off the critical path.)
    const int part_pairs = d.ss_parts * nr;
    const int slice_pairs = d.ss_local ? 0 : nr;
    for (int pair = REGW ? num_warps - 1 - warp : warp; pair < part_pairs + slice_pairs; pair += num_warps) {
      const int i = pair < part_pairs ? pair / d.ss_parts : pair - part_pairs;
      const size_t row = r0 + i;
      const T* srow = args.streams + row * d.K + branch * d.H;
      const T* prow = PRO ? args.prev_block_output + row * d.H : nullptr;
      const float gate = PRO ? ToFloat<T>(args.prev_post_gate[row * d.C + branch]) : 0.0f;
      if (pair < part_pairs) {
        const int p = (d.ss_local ? 0 : rank * d.ss_parts) + pair % d.ss_parts;
        float ss = 0.0f;
        constexpr int kBatch = 4;  // 128-feature steps whose loads are in flight together
        for (int q0 = lane * 4; q0 < L; q0 += 128 * kBatch) {
          // unconditional loads (past the part: its last vector, unused), so that none waits on a use
          cuda::Vec<T, 4> sv[kBatch], pv[kBatch] = {};
#pragma unroll
          for (int b = 0; b < kBatch; ++b) {
            const int q = p * L + min(q0 + b * 128, L - 4);
            sv[b] = LoadVec4<T>(srow + q);
            if constexpr (PRO) pv[b] = LoadVec4<T>(prow + q);
          }
#pragma unroll
          for (int b = 0; b < kBatch; ++b) {  // q ascending, 128 features a step: the sum's fixed order
            const int q = q0 + b * 128;
            if (q >= L) continue;
            float s[4];
            S4FromVecs<T, PRO>(sv[b], pv[b], gate, s);
#pragma unroll
            for (int j = 0; j < 4; ++j) ss = cuda::MulAdd<T>(s[j], s[j], ss);
            if (d.ss_local && p * L + q >= h0 && p * L + q < h0 + d.ks) store_slice(s, i, p * L + q - h0);
          }
        }
        ss = cuda::WarpSum(ss);
        if (lane == 0) {
          if (d.ss_local || CL == 1) {
            part_sum[p * d.rt + i] = ss;
          } else {
            for (int dst = 0; dst < CL; ++dst) *PeerShared(part_sum + p * d.rt + i, dst) = ss;
          }
        }
      } else {
        for (int q = lane * 4; q < d.ks; q += 128) {
          float s[4];
          LoadS4<T, PRO>(srow + h0 + q, PRO ? prow + h0 + q : nullptr, gate, s);
          store_slice(s, i, q);
        }
      }
    }
    if (r0 == 0) TimelineMark(d.timeline, d.slot, kPhase1);  // part sums formed
    if (r0 == 0) CpAsyncWaitAll();  // the weight tile and norm_scale
    if (CL > 1 && !d.ss_local) {
      ClusterSync();  // every rank's part sums have arrived
    } else {
      __syncthreads();
    }
    if (r0 == 0) TimelineMark(d.timeline, d.slot, kPhase2);  // weights there

    // B: hn of the slice (rounding point: hn) into the A tile and to scratch.
    for (int idx = tid; idx < nr * (d.ks / 4); idx += blockDim.x) {
      const int i = idx / (d.ks / 4), q = (idx % (d.ks / 4)) * 4;
      float sum_sq = 0.0f;
#pragma unroll
      for (int p = 0; p < kParts; ++p) sum_sq += part_sum[p * d.rt + i];
      const float inv_rms = cuda::BranchInvRms(sum_sq, d.H, d.epsilon);
      const float4 s = *reinterpret_cast<const float4*>(s_slice + i * d.ks + q);
      const float sv[4] = {s.x, s.y, s.z, s.w};
      cuda::Vec<T, 4> hn;
#pragma unroll
      for (int j = 0; j < 4; ++j) hn.v[j] = FromFloat<T>(cuda::NormalizeHn(sv[j], inv_rms, ToFloat<T>(scale[q + j])));
      if constexpr (QUANT) {  // the quantized products' k order (hc_fast_quant.cuh)
#pragma unroll
        for (int j = 0; j < 4; ++j) a_tile[i * d.lda1 + (q & ~7) + QuantPosition(q % 8 + j)] = hn.v[j];
      } else {
        cuda::StoreVec<T, 4>(a_tile + i * d.lda1 + q, hn);
      }
    }
    __syncthreads();

    if (r0 == 0) TimelineMark(d.timeline, d.slot, kPhase3);  // hn formed
    // C: [down | inject] of the slice on tensor cores, four column tiles per warp; each value goes
    // to the rank that reduces its column, into that rank's red[this rank][row][column].
    // per1 is a whole number of tiles, so a tile has one owner: one address per tile and one 8-byte
    // store per row (a lane's two adjacent columns). The padding columns past np go along (zeros,
    // inside the owner's per1 columns, never read).
    auto scatter_tile_to = [&](int n0, int owner, const float (&acc)[4]) {
      float* dst = red + rank * d.rt * d.per1 + n0 - owner * d.per1 + (lane & 3) * 2;
      if constexpr (CL > 1) dst = PeerShared(dst, owner);
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int i = (lane >> 2) + half * 8;
        if (i < nr) *reinterpret_cast<float2*>(dst + i * d.per1) = make_float2(acc[2 * half], acc[2 * half + 1]);
      }
    };
    auto scatter_tile = [&](int n0, const float (&acc)[4]) { scatter_tile_to(n0, n0 / d.per1, acc); };
    if constexpr (QUANT) {
      const bool has_zero_points = quant.down_inject.zero_points != nullptr;
#pragma unroll
      for (int u = 0; u < kQuantTilesPerWarp; ++u) {
        const int tile_index = warp + u * num_warps;
        if (tile_index >= ntiles) break;
        float acc[4];
        qslice.MultiplyTile(a_tile, d.rt, d.lda1, 8 * tile_index, has_zero_points, acc);
        scatter_tile_to(8 * tile_index, quant_owner[u], acc);
      }
      if (r0 == 0 && warp == 0) TimelineMark(d.timeline, d.slot, kPhase5);  // warp 0's tiles multiplied
    } else if constexpr (REGW) {
      // warps 0 .. R/32 - 1: 32 down columns each from their registers; the next warp: inject's padded tile
      if (warp < d.R / 32) {
        float acc[4][4];
        wregs.template Multiply<T>(a_tile, d.rt, d.lda1, lane, acc);
        if (r0 == 0 && warp == 0) TimelineMark(d.timeline, d.slot, kPhase5);  // warp 0's tiles multiplied
        // lane (g, t) holds rows g and g + 8 of the 8 adjacent columns 32 w + 8 t .. + 7 (DownWeightRegs)
        const int col = 32 * warp + 8 * (lane & 3), owner = col / d.per1;
        float* dst = red + rank * d.rt * d.per1 + col - owner * d.per1;
        if constexpr (CL > 1) dst = PeerShared(dst, owner);
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int i = (lane >> 2) + half * 8;
          if (i < nr) {
            float4* row = reinterpret_cast<float4*>(dst + i * d.per1);
            row[0] = make_float4(acc[0][2 * half], acc[1][2 * half], acc[2][2 * half], acc[3][2 * half]);
            row[1] = make_float4(acc[0][2 * half + 1], acc[1][2 * half + 1], acc[2][2 * half + 1],
                                 acc[3][2 * half + 1]);
          }
        }
      } else if (warp == d.R / 32) {
        const int n0[1] = {d.R};
        float acc[1][4];
        WarpMma<T, 1, 1>(a_tile, d.rt, d.lda1, tile, d.ldb1, ksteps, n0, acc);
        scatter_tile(d.R, acc[0]);
      }
    } else {
      for (int t0 = warp; t0 < ntiles; t0 += 4 * num_warps) {
        int n0[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) n0[u] = t0 + u * num_warps < ntiles ? (t0 + u * num_warps) * 8 : -1;
        float acc[4][4];
        if constexpr (kAblateMma) {
          for (auto& tile_acc : acc) tile_acc[0] = tile_acc[1] = tile_acc[2] = tile_acc[3] = 0.0f;
        } else {
          WarpMma<T, 4, 1>(a_tile, d.rt, d.lda1, tile, d.ldb1, ksteps, n0, acc);
        }
        if (r0 == 0 && t0 == warp) TimelineMark(d.timeline, d.slot, kPhase5);  // warp 0's first tiles multiplied
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          if (n0[u] >= 0) scatter_tile(n0[u], acc[u]);
        }
      }
    }
    // A cluster barrier, not st.async counted on the owner's mbarrier: that made the phase after it (rank
    // sums, stores, exit) slower.
    if constexpr (CL > 1) {
      ClusterSync();  // every rank's share of this rank's columns has arrived
    } else {
      __syncthreads();
    }
    if (r0 == 0) TimelineMark(d.timeline, d.slot, kPhase4);  // products exchanged

    // D: this rank's columns summed over the ranks in order -> the cluster's partial.
    for (int idx = tid; idx < nr * c_len; idx += blockDim.x) {
      const int i = idx / c_len, c = idx % c_len;
      partials[(static_cast<size_t>(r0 + i) * d.np + c_begin + c) * d.g4 + group] = SumRanks<CL>(red, d.rt, d.per1, i, c);
    }
    // streams_out and hn_out of the slice from shared memory (8-byte stores: K, k0 and q are
    // multiples of 4), now that no cluster barrier of this pass is left to wait for them
    for (int idx = tid; idx < nr * (d.ks / 4); idx += blockDim.x) {
      const int i = idx / (d.ks / 4), q = (idx % (d.ks / 4)) * 4;
      const size_t off = static_cast<size_t>(r0 + i) * d.K + k0 + q;
      if (args.streams_out != nullptr) {
        const float4 s = *reinterpret_cast<const float4*>(s_slice + i * d.ks + q);
        const T out[4] = {FromFloat<T>(s.x), FromFloat<T>(s.y), FromFloat<T>(s.z), FromFloat<T>(s.w)};
        uint2 u;
        memcpy(&u, out, sizeof(u));
        *reinterpret_cast<uint2*>(args.streams_out + off) = u;
      }
      if constexpr (QUANT) {
        const T* row = a_tile + i * d.lda1 + (q & ~7);
        const T hn[4] = {row[QuantPosition(q % 8)], row[QuantPosition(q % 8 + 1)], row[QuantPosition(q % 8 + 2)],
                         row[QuantPosition(q % 8 + 3)]};
        uint2 u;
        memcpy(&u, hn, sizeof(u));
        *reinterpret_cast<uint2*>(hn_out + off) = u;
      } else {
        *reinterpret_cast<uint2*>(hn_out + off) = *reinterpret_cast<const uint2*>(a_tile + i * d.lda1 + q);
      }
    }
    if (r0 + d.rt < d.rows) __syncthreads();  // s_slice and the A tile are rewritten next pass
  }
  TimelineEndOfCta(d.timeline, d.slot);
}

// Stage 1 with the down weights in a shared-memory tile: every tiling but the real shape's. It takes 68
// registers in bf16 with the prologue, so stage 1 + stage 2 + the next stage 1 do not fit the SM's 64K
// registers at once (one kernel ahead, not two); capping it at 56 (__maxnreg__) spills 240 bytes,
// reloaded after cluster barriers, and is slower.
template <typename T, int CL, bool PRO>
__global__ void __launch_bounds__(kStage1Threads) HcFastStage1Kernel(
    HcFastArgs<T> args, FastDims d, float* __restrict__ partials, T* __restrict__ hn_out, bool weights_are_constant) {
  Stage1Body<T, CL, PRO, FastDims, false, false>(args, {}, d, partials, hn_out, weights_are_constant);
}

// Stage 1 of the quantized op (QUANT): [down | inject] from 4-bit weights. Two CTAs an SM, as
// stage 2 and the next stage 1 run next to each other (at most 85 registers a thread).
template <typename T, int CL, bool PRO, bool ZP>
__global__ void __launch_bounds__(kStage1Threads, 2) HcFastQuantStage1Kernel(
    HcFastArgs<T> args, FastDims d, float* __restrict__ partials, T* __restrict__ hn_out, bool weights_are_constant,
    HcFastQuant<T> quant) {
  Stage1Body<T, CL, PRO, FastDims, false, true, ZP>(args, quant, d, partials, hn_out, weights_are_constant);
}

// Stage 1 with the down weights in registers (REGW), the real shape's tiling only. Two CTAs an SM, as the
// shared-memory kernels run: at most 80 registers a thread.
template <typename T, int CL, bool PRO>
__global__ void __launch_bounds__(kStage1Threads, 2) HcFastStage1RegWeightsKernel(
    HcFastArgs<T> args, RealShapeDims d, float* __restrict__ partials, T* __restrict__ hn_out,
    bool weights_are_constant) {
  Stage1Body<T, CL, PRO, RealShapeDims, true, false>(args, {}, d, partials, hn_out, weights_are_constant);
}

// ------------------------------------------------------------------------------------------------
// Stage 2. QUANT (the quantized op): the CTA's 4-bit up weights are copied into shared memory (QuantUpSlice);
// after the wait warps m and m + mtiles (mtiles = C * hs / 16) take those of its 16-column tile m into
// registers (QuantUpRegs), the first and the second half of up's k groups, and multiply every row of the
// pass with them; warp m adds the second half's sums to its own (ZP: the zero points may be given).
template <typename T, int CL, typename D, bool QUANT, bool ZP = false>
__device__ __forceinline__ void Stage2Body(const HcFastArgs<T>& args, const HcFastQuant<T>& quant, const D& d,
                                           const float* __restrict__ partials, const T* __restrict__ hn_in,
                                           bool weights_are_constant) {
  extern __shared__ __align__(16) unsigned char smem[];
  TimelineMark(d.timeline, d.slot + 1, kTimelineStart);
  const Stage2Layout layout(d);
  T* tile = reinterpret_cast<T*>(smem + layout.tile);
  T* a_tile = reinterpret_cast<T*>(smem + layout.a);
  T* hn_s = reinterpret_cast<T*>(smem + layout.hn);
  float* g_s = reinterpret_cast<float*>(smem + layout.g);
  auto* exchange = reinterpret_cast<unsigned long long*>(smem + layout.bar);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, num_warps = blockDim.x >> 5;
  const int h0 = blockIdx.x * d.hs;
  const int rank = CL > 1 ? ClusterRank() : 0;
  const int segs = d.hs / d.piece;  // copy pieces of one branch's hs features
  // one piece of `piece` elements: 16-byte copies where hs allows (sector-aligned), else 8-byte ones
  auto copy_piece = [&](T* dst, const T* src) {
    if (d.piece == 8) {
      CpAsync<16>(dst, src);
    } else {
      CpAsync<8>(dst, src);
    }
  };

  // Rows R..rp of the tile and columns R..rp of the A tile pad K to whole mma steps: zero. (The up product
  // loads only the real rows of the A tile, so it needs no zero row.)
  for (int idx = tid; idx < (d.rp - d.R) * d.ldu; idx += blockDim.x) tile[d.R * d.ldu + idx] = FromFloat<T>(0.0f);
  const int k_pad = max(d.rp - d.R, 1);  // the divisor below (no columns to zero where rp == R)
  for (int idx = tid; idx < d.rt * (d.rp - d.R); idx += blockDim.x) {
    a_tile[(idx / k_pad) * d.lda2 + d.R + idx % k_pad] = FromFloat<T>(0.0f);
  }

  const int mtiles = d.n2 / 16;
  const int quant_tile = warp % mtiles, quant_half = warp / mtiles;  // QUANT: warps below 2 * mtiles
  const QuantUpSlice<T, ZP> qslice(smem, layout, d.R, QUANT ? d.block_size : 1);
  auto load_weights = [&] {
    if constexpr (kAblateWeights) return;
    if constexpr (QUANT) {
      qslice.Copy(quant.up, d.R, d.C, d.H, h0, d.hs, tid, blockDim.x);
      CpAsyncCommit();
      return;
    }
    const int pieces = d.C * segs;  // copy pieces in one row of the tile
    for (int idx = tid; idx < d.R * pieces; idx += blockDim.x) {
      const int r = idx / pieces, p = idx % pieces, c = p / segs, j = (p % segs) * d.piece;
      copy_piece(tile + r * d.ldu + c * d.hs + j, args.up_weight + static_cast<size_t>(r) * d.K + c * d.H + h0 + j);
    }
    CpAsyncCommit();
  };
  if (weights_are_constant) load_weights();
  ReleaseDependents();
  if (CL > 1 && tid == 0) MbarrierInit(exchange, 1);  // published to the peers by the cluster barrier below
  if constexpr (CL > 1) ClusterArriveRelaxed();
  WaitOnProducer();  // stage 1's partials and hn
  TimelineMark(d.timeline, d.slot + 1, kTimelineWaited);
  if (!weights_are_constant) load_weights();
  if constexpr (kAblateWork) {
    CpAsyncWaitAll();
    if constexpr (CL > 1) ClusterWait();
    return;
  }

  const bool share = CL > 1 && !d.hidden_local;  // hidden slices pushed to the cluster's peers
  const int r_begin = share ? rank * d.per2 : 0;
  const int r_len = share ? max(0, min(d.R, r_begin + d.per2) - r_begin) : d.R;
  const bool gate_cta = blockIdx.x == 0;  // CTA 0 also computes post_gate
  QuantUpRegs<T, ZP> qup;  // QUANT: this warp's up weights, taken from shared memory in the first pass
  for (int r0 = 0; r0 < d.rows; r0 += d.rt) {
    const int nr = min(d.rt, d.rows - r0);
    if constexpr (CL > 1) {
      if (r0 == 0) {
        ClusterWait();
      } else if (share) {
        ClusterSync();  // peers are done with their A tiles of the last pass
      }
    }
    // hn of this CTA's columns for the pre-mix, in flight while the partials are added
    for (int idx = tid; idx < nr * d.C * segs; idx += blockDim.x) {
      const int i = idx / (d.C * segs), p = idx % (d.C * segs), c = p / segs, j = (p % segs) * d.piece;
      copy_piece(hn_s + i * d.n2 + c * d.hs + j, hn_in + static_cast<size_t>(r0 + i) * d.K + c * d.H + h0 + j);
    }
    CpAsyncCommit();
    // down -> hidden for this CTA's share of R (rounding points: down, Z, SG, hidden).
    for (int idx = tid; idx < nr * r_len; idx += blockDim.x) {
      const int i = idx / r_len, n = r_begin + idx % r_len;
      const float v = RoundToT<T>(SumGroups(partials + (static_cast<size_t>(r0 + i) * d.np + n) * d.g4, d.groups));
      // the quantized up product reads hidden in its k order (hc_fast_quant.cuh)
      const int at = QUANT ? (n & ~7) + QuantPosition(n % 8) : n;
      a_tile[i * d.lda2 + at] = FromFloat<T>(cuda::ScaledSilu<T>(v, d.silu_alpha));
    }
    // inject -> post_gate (rounding points: inject, gate logit, its sigmoid, post_gate), CTA 0 only, by the warps that own no up
    // tile below (the real shape: 6 of 10 up to 8 rows, 2 at 16; else the last warp), while this CTA's hidden slice travels
    // to its peers: nothing in the kernel reads it. (In the loop above, its C items a row gave CTA 0 one
    // more pass of L2 round trips than the other CTAs at 8 and 16 rows.)
    // the up product's warp tasks below: (16-column tile, 8-row group) pairs (C * hs: a multiple of 16,
    // C being 4 or 8 and hs a multiple of 4)
    const int up_items = d.n2 / 16 * ((nr + 7) / 8);
    const int gate_first = min(QUANT ? 2 * mtiles : up_items, num_warps - 1) * 32;
    auto post_gate = [&] {
      if (!gate_cta || tid < gate_first) return;
      for (int idx = tid - gate_first; idx < nr * d.C; idx += blockDim.x - gate_first) {
        const int i = idx / d.C, c = idx % d.C;
        const float v =
            RoundToT<T>(SumGroups(partials + (static_cast<size_t>(r0 + i) * d.np + d.R + c) * d.g4, d.groups));
        args.post_gate[static_cast<size_t>(r0 + i) * d.C + c] = FromFloat<T>(cuda::PostGate<T>(v, d.gate_div, d.gate_mul));
      }
    };
    if (r0 == 0) TimelineMark(d.timeline, d.slot + 1, kPhase1);  // hidden slice formed
    CpAsyncWaitAll();  // the weight tile (first pass) and hn
    __syncthreads();
    if (r0 == 0) TimelineMark(d.timeline, d.slot + 1, kPhase2);  // weights there
    if (share) {
      // This rank's slice goes to every peer with st.async counted on the peer's exchange barrier,
      // which expects the other ranks' slices: 2 bytes per hidden value of the R - r_len it lacks.
      if (tid == 0) MbarrierExpectBytesCluster(exchange, static_cast<unsigned>(2 * nr * (d.R - r_len)));
      const int vecs = r_len / 8;  // 16-byte pieces of this rank's slice of a row
      for (int idx = tid; idx < (CL - 1) * nr * vecs; idx += blockDim.x) {
        int dst = idx / (nr * vecs);
        dst += dst >= rank;
        const int i = (idx % (nr * vecs)) / vecs, off = i * d.lda2 + r_begin + (idx % vecs) * 8;
        StoreAsyncToPeer(PeerSharedAddress(SharedAddress(a_tile + off), dst), *reinterpret_cast<const uint4*>(a_tile + off),
                         PeerSharedAddress(SharedAddress(exchange), dst));
      }
      post_gate();  // while the slices travel
      MbarrierWait<true>(exchange, (r0 / d.rt) & 1);  // every other rank's slice has arrived
    } else {
      post_gate();
    }
    if (r0 == 0) TimelineMark(d.timeline, d.slot + 1, kPhase3);  // hidden values exchanged

    // up on tensor cores with the rows on mma's N side (WarpMmaRowsN: one 16-column tile of 8 rows a warp,
    // four k chains), then g (rounding points: up, g). Against 8-column tiles of 16 rows (WarpMma, the
    // same bits) that is half the products up to 8 rows and the weights read from shared memory once.
    if constexpr (QUANT) {
      // the second half's sums of (tile, 8 rows) through shared memory, then the first half adds them
      if (r0 == 0 && quant_half < 2) {  // the copies have landed (first pass); later passes reuse them
        const int col[2] = {quant_tile * 16 + (lane >> 2), quant_tile * 16 + (lane >> 2) + 8};
        const int groups = d.R / kQuantGroupK, first_half = (groups + 1) / 2;
        qup.Load(qslice, quant.up.zero_points != nullptr, quant_half * first_half,
                 quant_half == 0 ? first_half : groups - first_half, col, lane);
      }
      float* quant_sum = reinterpret_cast<float*>(smem + layout.quant_sum);
      auto sum_at = [&](int xr) { return quant_sum + ((quant_tile * 2 + xr / 8) * 32 + lane) * 4; };
      for (int xr = 0; quant_half == 1 && xr < nr; xr += 8) {
        float acc[4];
        qup.Multiply(a_tile, nr, d.lda2, xr, acc);
        *reinterpret_cast<float4*>(sum_at(xr)) = make_float4(acc[0], acc[1], acc[2], acc[3]);
      }
      __syncthreads();
      for (int xr = 0; quant_half == 0 && xr < nr; xr += 8) {
        float acc[4];
        qup.Multiply(a_tile, nr, d.lda2, xr, acc);
        const float4 second = *reinterpret_cast<const float4*>(sum_at(xr));
        const float sum[4] = {acc[0] + second.x, acc[1] + second.y, acc[2] + second.z, acc[3] + second.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = xr + 2 * (lane & 3) + (e & 1), col = quant_tile * 16 + (lane >> 2) + (e >> 1) * 8;
          if (i < nr) g_s[i * d.n2 + col] = RoundToT<T>(cuda::Sigmoid(RoundToT<T>(sum[e])));
        }
      }
    }
    for (int item = warp; !QUANT && item < up_items; item += num_warps) {
      const int m0[1] = {(item % mtiles) * 16}, xr[1] = {(item / mtiles) * 8};
      float acc[1][4];
      if constexpr (kAblateMma) {
        acc[0][0] = acc[0][1] = acc[0][2] = acc[0][3] = 0.0f;
      } else {
        WarpMmaRowsN<T, 1, 4>(a_tile, nr, d.lda2, tile, d.ldu, d.rp / 16, m0, xr, acc);
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = xr[0] + 2 * (lane & 3) + (e & 1), col = m0[0] + (lane >> 2) + (e >> 1) * 8;
        if (i < nr) g_s[i * d.n2 + col] = RoundToT<T>(cuda::Sigmoid(RoundToT<T>(acc[0][e])));
      }
    }
    __syncthreads();
    if (r0 == 0) TimelineMark(d.timeline, d.slot + 1, kPhase4);  // up tiles done
    PreMix<T>(hn_s, g_s, nr, d.hs, d.C, d.H, d.reduction_scale, args.pre_output + static_cast<size_t>(r0) * d.H + h0);
    if (r0 + d.rt < d.rows) __syncthreads();  // hn_s, g_s and the A tile are rewritten next pass
  }
  TimelineEndOfCta(d.timeline, d.slot + 1);
}

template <typename T, int CL, typename D = FastDims>
__global__ void __launch_bounds__(kStage2Threads) HcFastStage2Kernel(
    HcFastArgs<T> args, D d, const float* __restrict__ partials, const T* __restrict__ hn_in,
    bool weights_are_constant) {
  Stage2Body<T, CL, D, false>(args, {}, d, partials, hn_in, weights_are_constant);
}

// Stage 2 of the quantized op: two CTAs an SM (at most 102 registers a thread).
template <typename T, int CL, bool ZP>
__global__ void __launch_bounds__(kStage2Threads, 2) HcFastQuantStage2Kernel(
    HcFastArgs<T> args, FastDims d, const float* __restrict__ partials, const T* __restrict__ hn_in,
    bool weights_are_constant, HcFastQuant<T> quant) {
  Stage2Body<T, CL, FastDims, true, ZP>(args, quant, d, partials, hn_in, weights_are_constant);
}

// ------------------------------------------------------------------------------------------------
// Host side.
// Launches from the plan (HcFastPlanFor, hc_fast_plan.cc), which holds the kernels' arguments.

// Stage 1 and stage 2 on `stream`, from the plan: the quantized op's kernels with `quant`, else the real
// shape's kernels where the plan says so (HcFastPlan::real_shape_kernels, clusters of 8 only), the generic
// ones elsewhere.
template <typename T, int CL>
cuda::HcLaunchStatus LaunchStages(const HcFastArgs<T>& args, const HcFastQuant<T>* quant, const HcFastPlan& plan,
                                  void* scratch, cudaStream_t stream, bool weights_are_constant) {
  float* partials = static_cast<float*>(scratch);
  T* hn = reinterpret_cast<T*>(static_cast<char*>(scratch) + plan.scratch.hn);
  const FastDims& d = plan.cluster_dims;
  // the quantized kernels take `quant` after the dense ones' arguments
  const auto launch = [&](auto stage1, auto stage2, const auto& dims, const auto&... extra) -> cuda::HcLaunchStatus {
    cudaError_t err = Launch(stage1, plan.stage1_ctas, kStage1Threads, plan.stage1_shared_bytes, CL, plan.use_pdl,
                             stream, args, dims, partials, hn, weights_are_constant, extra...);
    if (err != cudaSuccess) return {"stage 1 kernel", err};
    err = Launch(stage2, plan.stage2_ctas, kStage2Threads, plan.stage2_shared_bytes, CL, plan.use_pdl, stream, args,
                 dims, static_cast<const float*>(partials), static_cast<const T*>(hn), weights_are_constant, extra...);
    if (err != cudaSuccess) return {"stage 2 kernel", err};
    return {};
  };
  if (quant != nullptr) {
    if (quant->down_inject.zero_points != nullptr || quant->up.zero_points != nullptr) {
      return launch(d.has_prologue ? HcFastQuantStage1Kernel<T, CL, true, true> : HcFastQuantStage1Kernel<T, CL, false, true>,
                    HcFastQuantStage2Kernel<T, CL, true>, d, *quant);
    }
    return launch(d.has_prologue ? HcFastQuantStage1Kernel<T, CL, true, false> : HcFastQuantStage1Kernel<T, CL, false, false>,
                  HcFastQuantStage2Kernel<T, CL, false>, d, *quant);
  }
  if constexpr (CL == HcFastRealShape::cluster) {
    if (plan.real_shape_kernels) {
      return launch(d.has_prologue ? HcFastStage1RegWeightsKernel<T, CL, true> : HcFastStage1RegWeightsKernel<T, CL, false>,
                    HcFastStage2Kernel<T, CL, RealShapeDims>, RealShapeDims::From(d));
    }
  }
  return launch(d.has_prologue ? HcFastStage1Kernel<T, CL, true> : HcFastStage1Kernel<T, CL, false>,
                HcFastStage2Kernel<T, CL, FastDims>, d);
}

// How many clusters (or CTAs without clusters) of `kernel` the device holds at once, alone.
template <typename Kernel>
int MaxActive(Kernel kernel, int threads, size_t smem, int cluster) {
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)) != cudaSuccess) {
    return -1;
  }
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(cluster * 64);
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = smem;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = cluster;
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  config.attrs = &attr;
  config.numAttrs = 1;
  int n = -1;
  if (cluster > 1) return cudaOccupancyMaxActiveClusters(&n, kernel, &config) == cudaSuccess ? n : -1;
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, smem) == cudaSuccess ? n : -1;
}

template <typename T, int CL>
std::string Summary(const HcFastPlan& plan) {
  const FastDims& d = plan.cluster_dims;
  const size_t smem1 = plan.stage1_shared_bytes, smem2 = plan.stage2_shared_bytes;
  const char* fit = CL > 1 ? "clusters fit at once" : "CTAs fit per SM";
  return "stage 1: " + std::to_string(plan.stage1_ctas) + " CTAs x " + std::to_string(kStage1Threads) + " threads, " +
         std::to_string(smem1) + " B shared, clusters of " + std::to_string(CL) + " (" +
         std::to_string(MaxActive(HcFastStage1Kernel<T, CL, true>, kStage1Threads, smem1, CL)) + " " + fit +
         "); stage 2: " + std::to_string(plan.stage2_ctas) + " CTAs x " + std::to_string(kStage2Threads) +
         " threads, " + std::to_string(smem2) + " B shared (" +
         std::to_string(MaxActive(HcFastStage2Kernel<T, CL>, kStage2Threads, smem2, CL)) + " " + fit +
         "); rows per pass " + std::to_string(d.rt) + ", sums of squares " + (d.ss_local ? "local" : "shared") +
         ", hidden " + (d.hidden_local ? "local" : "shared") +
         (plan.real_shape_kernels ? ", the real shape's kernels (stage 1's down weights in registers)" : "");
}

// The plan was made for these params (the kernels read the shapes from the plan, the tensors' sizes
// follow the params).
bool PlannedFor(const HcFastPlan& plan, const HcLowRankMixParams& p) {
  const HcFastClusterDims& d = plan.cluster_dims;
  return d.rows == p.rows && d.C == p.C && d.H == p.H && d.R == p.R && d.has_prologue == p.has_prologue;
}

}  // namespace

namespace cuda {

template <typename T>
std::string HcFastLaunchSummary(const HcFastPlan& plan) {
  if (!plan.ok()) return "not planned: " + plan.reason;
  return plan.cluster == kHcFastClusterSize ? Summary<T, kHcFastClusterSize>(plan) : Summary<T, 1>(plan);
}

template <typename T>
HcLaunchStatus LaunchHcFast(const HcLowRankMixParams& params, const HcDeviceTensors<T>& tensors, void* scratch,
                            const HcFastPlan& plan, cudaStream_t stream, bool weights_are_constant) {
  static_assert(sizeof(T) == 2, "the fast path is for float16 and bfloat16");
  if (!plan.ok() || !PlannedFor(plan, params) || plan.cluster_dims.block_size != 0 || !HcFastTensorsAligned(tensors) ||
      !HcFastPointersAligned({scratch})) {
    return {"fast path plan", cudaErrorInvalidValue};
  }
  if (params.rows == 0) return {};
  return plan.cluster == kHcFastClusterSize
             ? LaunchStages<T, kHcFastClusterSize>(tensors, nullptr, plan, scratch, stream, weights_are_constant)
             : LaunchStages<T, 1>(tensors, nullptr, plan, scratch, stream, weights_are_constant);
}

template <typename T>
HcLaunchStatus LaunchHcFastQuant(const HcLowRankMixParams& params, const HcDeviceTensors<T>& tensors,
                                 const HcFastQuant<T>& quant, void* scratch, const HcFastPlan& plan,
                                 cudaStream_t stream, bool weights_are_constant) {
  if (!plan.ok() || !PlannedFor(plan, params) || plan.cluster_dims.block_size < 32 ||
      !HcFastTensorsAligned(tensors) || !HcFastPointersAligned({scratch})) {
    return {"fast path plan", cudaErrorInvalidValue};
  }
  if (params.rows == 0) return {};
  return plan.cluster == kHcFastClusterSize
             ? LaunchStages<T, kHcFastClusterSize>(tensors, &quant, plan, scratch, stream, weights_are_constant)
             : LaunchStages<T, 1>(tensors, &quant, plan, scratch, stream, weights_are_constant);
}

template HcLaunchStatus LaunchHcFast<__half>(const HcLowRankMixParams&, const HcDeviceTensors<__half>&, void*,
                                             const HcFastPlan&, cudaStream_t, bool);
template HcLaunchStatus LaunchHcFast<__nv_bfloat16>(const HcLowRankMixParams&, const HcDeviceTensors<__nv_bfloat16>&,
                                                    void*, const HcFastPlan&, cudaStream_t, bool);
template HcLaunchStatus LaunchHcFastQuant<__half>(const HcLowRankMixParams&, const HcDeviceTensors<__half>&,
                                                  const HcFastQuant<__half>&, void*, const HcFastPlan&, cudaStream_t,
                                                  bool);
template HcLaunchStatus LaunchHcFastQuant<__nv_bfloat16>(const HcLowRankMixParams&,
                                                         const HcDeviceTensors<__nv_bfloat16>&,
                                                         const HcFastQuant<__nv_bfloat16>&, void*, const HcFastPlan&,
                                                         cudaStream_t, bool);
template std::string HcFastLaunchSummary<__half>(const HcFastPlan&);
template std::string HcFastLaunchSummary<__nv_bfloat16>(const HcFastPlan&);

}  // namespace cuda
}  // namespace hcfuse
