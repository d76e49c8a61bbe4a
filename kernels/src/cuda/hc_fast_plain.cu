// The fast path's plain design: two kernels per node like the cluster design (hc_fast_path.cu), but
// no thread-block clusters, no distributed shared memory and no cluster barriers, grids of at most
// one CTA per SM (128), 256 threads and a register cap that lets three kernels' CTAs share an SM, so
// programmatic dependent launch keeps two later kernels resident and streaming their weights.
//
// Stage 1 (HcFastPlainStage1Kernel): CTA (g, ns) takes the K slice of one cluster-design group g
//   (8 ranks' slices of kso features: 8 * kso features of one branch) and the ns-th eighth of down's
//   columns. Warp w sums part w of the branch's squares (the cluster design's 8 parts), forms S and
//   hn of the slice, and multiplies rank w's kso features by the CTA's column tiles; warps are added in
//   order (the cluster design's rank order), giving group g's partial. Warp ns also multiplies rank
//   ns's features by inject_weight: that rank's inject value, added in rank then group order by
//   stage 2. streams_out and hn of rank ns's features are written by this CTA.
// Stage 2 (HcFastPlainStage2Kernel): CTA j takes hs features of every branch (the 16-byte chunks
//   covering them, a window per branch row); every CTA reduces all down partials (groups in order),
//   applies ScaledSiLU, multiplies by its up_weight window on tensor cores, and forms g and the pre-mix;
//   the last CTA also forms post_gate.
// Every value is summed in the cluster design's order (cluster size 8), so the bits are the same as
// that design's and any row count or pass size gives the same bits for a row.
#include "cuda/hc_fast_plain.h"

#include <algorithm>
#include <string>

#include "cuda/hc_common.cuh"
#include "cuda/hc_fast_device.cuh"

namespace hcfuse {
namespace {

using namespace fast;  // NOLINT: the device building blocks of both designs

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMinBlocks = 3;  // three CTAs (of any of the chain's kernels) per SM: <= 85 registers
constexpr int kRowBatch = 2;   // stage 1: rows whose stream loads are in flight together (more spill)
constexpr int kRanks = static_cast<int>(kHcFastPlainRanks);
static_assert(kWarps == kRanks && kParts == kRanks, "warp w is cluster rank w and sums part w");

// The kernels' arguments and shared-memory layouts: the plan's (hc_fast_plan.h, filled on the host).
using PlainDims = HcFastPlainDims;
using Plain1Layout = HcFastPlain1Layout;
using Plain2Layout = HcFastPlain2Layout;

// The bulk copies' barrier, initialized before any copy is issued (one phase per kernel).
__device__ __forceinline__ void InitTileBarrier(bool bulk, unsigned long long* bar) {
  if (!bulk) return;
  if (threadIdx.x == 0) MbarrierInit(bar, 1);
  __syncthreads();
}

// Inject partials: one value per (row, branch column, group, rank), ranks innermost.
__host__ __device__ inline size_t InjectIndex(const PlainDims& d, size_t row, int c, int g, int rank) {
  return (row * d.C + c) * (static_cast<size_t>(d.groups) * kRanks) + g * kRanks + rank;
}

// ------------------------------------------------------------------------------------------------
template <typename T, bool PRO>
__global__ void __launch_bounds__(kThreads, kMinBlocks) HcFastPlainStage1Kernel(
    cuda::HcDeviceTensors<T> args, PlainDims d, float* __restrict__ partials, float* __restrict__ inject_partials,
    T* __restrict__ hn_out, bool weights_are_constant) {
  extern __shared__ __align__(16) unsigned char smem[];
  TimelineMark(d.timeline, d.slot, kTimelineStart);
  const Plain1Layout layout(d);
  T* tile = reinterpret_cast<T*>(smem + layout.tile);
  T* itile = reinterpret_cast<T*>(smem + layout.itile);
  T* scale = reinterpret_cast<T*>(smem + layout.scale);
  T* a_tile = reinterpret_cast<T*>(smem + layout.a);
  float* part_sum = reinterpret_cast<float*>(smem + layout.part_sum);
  float* red = reinterpret_cast<float*>(smem + layout.red);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = blockIdx.x / kRanks, ns = blockIdx.x % kRanks;
  const int branch = g / d.slices_per_branch;
  const int h0 = (g % d.slices_per_branch) * d.slice;
  const int k0 = branch * d.H + h0;
  const int c0 = ns * d.ncols;                          // first down column of this CTA
  const int cvalid = max(0, min(d.ncols, d.R - c0));    // its columns inside R

  // Columns past R, inject columns past C and the A tile's zero row are never copied into: zero.
  for (int idx = tid; idx < d.slice * (d.ncols - cvalid); idx += blockDim.x) {
    const int k = idx / (d.ncols - cvalid);
    tile[k * d.ldw1 + cvalid + idx % (d.ncols - cvalid)] = FromFloat<T>(0.0f);
  }
  for (int idx = tid; idx < d.kso * (8 - d.C); idx += blockDim.x) {
    itile[(idx / (8 - d.C)) * 8 + d.C + idx % (8 - d.C)] = FromFloat<T>(0.0f);
  }
  for (int idx = tid; idx < d.lda1; idx += blockDim.x) a_tile[d.rt * d.lda1 + idx] = FromFloat<T>(0.0f);

  __shared__ unsigned long long tile_bar;  // bulk copies' completion
  InitTileBarrier(d.bulk, &tile_bar);
  auto load_weights = [&] {
    if constexpr (kAblateWeights) return;
    const int chunks = cvalid / 8;
    if (d.bulk) {  // one copy per down row piece and one for norm_scale, all counted on tile_bar
      if (tid == 0) MbarrierExpectBytes(&tile_bar, (d.slice * cvalid + d.slice) * 2);
      for (int k = tid; k < d.slice && chunks > 0; k += blockDim.x) {
        BulkCopy(tile + k * d.ldw1, args.down_weight + static_cast<size_t>(k0 + k) * d.R + c0, cvalid * 2, &tile_bar);
      }
      if (tid == 0) BulkCopy(scale, args.norm_scale + k0, d.slice * 2, &tile_bar);
    } else {
      for (int idx = tid; idx < d.slice * chunks; idx += blockDim.x) {
        const int k = idx / chunks, j = (idx % chunks) * 8;
        CpAsync<16>(tile + k * d.ldw1 + j, args.down_weight + static_cast<size_t>(k0 + k) * d.R + c0 + j);
      }
      for (int idx = tid; idx < d.slice / 4; idx += blockDim.x) {
        CpAsync<8>(scale + idx * 4, args.norm_scale + k0 + idx * 4);
      }
    }
    const int pieces = d.C / 4;
    for (int idx = tid; idx < d.kso * pieces; idx += blockDim.x) {
      const int k = idx / pieces, j = (idx % pieces) * 4;
      CpAsync<8>(itile + k * 8 + j, args.inject_weight + static_cast<size_t>(k0 + ns * d.kso + k) * d.C + j);
    }
    CpAsyncCommit();
  };
  if (weights_are_constant) load_weights();
  ReleaseDependents();
  WaitOnProducer();  // streams / prev_* come from upstream nodes; scratch was read by the last stage 2
  TimelineMark(d.timeline, d.slot, kTimelineWaited);
  if (!weights_are_constant) load_weights();
  if constexpr (kAblateWork) {
    CpAsyncWaitAll();
    if (d.bulk && !kAblateWeights) MbarrierWait(&tile_bar, 0);
    return;
  }

  const int L = d.H / kParts;  // features of one part of the branch
  const int own0 = ns * d.kso;  // this CTA writes streams_out and hn of slice features [own0, own0 + kso)
  const int ksteps = d.kso / 16;
  for (int r0 = 0; r0 < d.rows; r0 += d.rt) {
    const int nr = min(d.rt, d.rows - r0);
    if (r0 > 0) __syncthreads();  // the last pass's A tile, part sums and red are read

    // A: warp w sums part w of each row's squares (lane-strided, then a butterfly) and forms S of the
    // slice where the part covers it (into the A tile as T; S is a rounding point) and streams_out.
    // Rows go in groups of kRowBatch whose loads are in flight together (one round trip per group).
    {
      const int p = warp;
      for (int i0 = 0; i0 < nr; i0 += kRowBatch) {
        float gate[kRowBatch], ss[kRowBatch];
#pragma unroll
        for (int u = 0; u < kRowBatch; ++u) {
          const size_t row = r0 + min(i0 + u, nr - 1);
          gate[u] = PRO && i0 + u < nr ? ToFloat<T>(args.prev_post_gate[row * d.C + branch]) : 0.0f;
          ss[u] = 0.0f;
        }
#pragma unroll 4
        for (int q = lane * 4; q < L; q += 128) {
          float s[kRowBatch][4] = {};
#pragma unroll
          for (int u = 0; u < kRowBatch; ++u) {
            if (i0 + u >= nr) continue;
            const size_t row = r0 + i0 + u;
            const T* srow = args.streams + row * d.K + branch * d.H + p * L;
            const T* prow = PRO ? args.prev_block_output + row * d.H + p * L : nullptr;
            LoadS4<T, PRO>(srow + q, PRO ? prow + q : nullptr, gate[u], s[u]);
          }
          const int f = p * L + q - h0;  // feature within the slice
#pragma unroll
          for (int u = 0; u < kRowBatch; ++u) {
            if (i0 + u >= nr) continue;
#pragma unroll
            for (int j = 0; j < 4; ++j) ss[u] = cuda::MulAdd<T>(s[u][j], s[u][j], ss[u]);
            if (f >= 0 && f < d.slice) {
              cuda::Vec<T, 4> sv;
#pragma unroll
              for (int j = 0; j < 4; ++j) sv.v[j] = FromFloat<T>(s[u][j]);
              cuda::StoreVec<T, 4>(a_tile + (i0 + u) * d.lda1 + f, sv);
              if (args.streams_out != nullptr && f >= own0 && f < own0 + d.kso) {
                cuda::StoreVec<T, 4>(args.streams_out + static_cast<size_t>(r0 + i0 + u) * d.K + k0 + f, sv);
              }
            }
          }
        }
#pragma unroll
        for (int u = 0; u < kRowBatch; ++u) {
          const float total = cuda::WarpSum(ss[u]);
          if (lane == 0 && i0 + u < nr) part_sum[p * d.rt + i0 + u] = total;
        }
      }
    }
    if (r0 == 0) TimelineMark(d.timeline, d.slot, kPhase1);  // part sums formed
    if (r0 == 0) {  // the weight tiles and norm_scale
      CpAsyncWaitAll();
      if (d.bulk && !kAblateWeights) MbarrierWait(&tile_bar, 0);
    }
    __syncthreads();
    if (r0 == 0) TimelineMark(d.timeline, d.slot, kPhase2);  // weights there

    // B: hn of the slice (rounding point: hn) in place in the A tile; rank ns's share to scratch.
    for (int idx = tid; idx < nr * (d.slice / 4); idx += blockDim.x) {
      const int i = idx / (d.slice / 4), q = (idx % (d.slice / 4)) * 4;
      float sum_sq = 0.0f;
#pragma unroll
      for (int p = 0; p < kParts; ++p) sum_sq += part_sum[p * d.rt + i];
      const float inv_rms = cuda::BranchInvRms(sum_sq, d.H, d.epsilon);
      const cuda::Vec<T, 4> sv = cuda::LoadVec<T, 4>(a_tile + i * d.lda1 + q);
      cuda::Vec<T, 4> hn;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        hn.v[j] = FromFloat<T>(cuda::NormalizeHn(ToFloat<T>(sv.v[j]), inv_rms, ToFloat<T>(scale[q + j])));
      }
      cuda::StoreVec<T, 4>(a_tile + i * d.lda1 + q, hn);
      if (q >= own0 && q < own0 + d.kso) cuda::StoreVec<T, 4>(hn_out + static_cast<size_t>(r0 + i) * d.K + k0 + q, hn);
    }
    __syncthreads();

    if (r0 == 0) TimelineMark(d.timeline, d.slot, kPhase3);  // hn formed
    // C: warp w = rank w: its kso features times this CTA's column tiles, four at a time, into red[w];
    // warp ns also times inject_weight (rank ns's inject value, straight to scratch).
    const T* a_rank = a_tile + warp * d.kso;
    constexpr int kTiles = 5;  // column tiles per call (the real shape's five: one call)
    for (int t0 = 0; t0 < d.tpn; t0 += kTiles) {
      int n0[kTiles];
#pragma unroll
      for (int u = 0; u < kTiles; ++u) n0[u] = t0 + u < d.tpn && (t0 + u) * 8 < cvalid ? (t0 + u) * 8 : -1;
      float acc[kTiles][4];
      if constexpr (kAblateMma) {
        for (auto& tile_acc : acc) tile_acc[0] = tile_acc[1] = tile_acc[2] = tile_acc[3] = 0.0f;
      } else {
        WarpMma<T, kTiles, 1>(a_rank, d.rt, d.lda1, tile + warp * d.kso * d.ldw1, d.ldw1, ksteps, n0, acc);
      }
#pragma unroll
      for (int u = 0; u < kTiles; ++u) {
        if (n0[u] < 0) continue;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = (lane >> 2) + (e >> 1) * 8;
          const int col = n0[u] + (lane & 3) * 2 + (e & 1);
          if (i < nr) red[(warp * d.rt + i) * d.ncols + col] = acc[u][e];
        }
      }
    }
    if (warp == ns) {
      const int n0[1] = {0};
      float acc[1][4];
      if constexpr (kAblateMma) {
        acc[0][0] = acc[0][1] = acc[0][2] = acc[0][3] = 0.0f;
      } else {
        WarpMma<T, 1, 1>(a_rank, d.rt, d.lda1, itile, 8, ksteps, n0, acc);
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = (lane >> 2) + (e >> 1) * 8;
        const int col = (lane & 3) * 2 + (e & 1);
        if (i < nr && col < d.C) inject_partials[InjectIndex(d, r0 + i, col, g, ns)] = acc[0][e];
      }
    }
    __syncthreads();

    if (r0 == 0) TimelineMark(d.timeline, d.slot, kPhase4);  // products done
    // D: the column tiles summed over the ranks in order -> group g's partial.
    for (int idx = tid; idx < nr * cvalid; idx += blockDim.x) {
      const int i = idx / cvalid, c = idx % cvalid;
      partials[(static_cast<size_t>(r0 + i) * d.np + c0 + c) * d.g4 + g] = SumRanks<kRanks>(red, d.rt, d.ncols, i, c);
    }
  }
  TimelineEndOfCta(d.timeline, d.slot);
}

// ------------------------------------------------------------------------------------------------
template <typename T>
__global__ void __launch_bounds__(kThreads, kMinBlocks) HcFastPlainStage2Kernel(
    cuda::HcDeviceTensors<T> args, PlainDims d, const float* __restrict__ partials,
    const float* __restrict__ inject_partials, const T* __restrict__ hn_in, bool weights_are_constant) {
  extern __shared__ __align__(16) unsigned char smem[];
  TimelineMark(d.timeline, d.slot + 1, kTimelineStart);
  const Plain2Layout layout(d);
  T* tile = reinterpret_cast<T*>(smem + layout.tile);
  T* a_tile = reinterpret_cast<T*>(smem + layout.a);
  T* hn_s = reinterpret_cast<T*>(smem + layout.hn);
  float* g_s = reinterpret_cast<float*>(smem + layout.g);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int h0 = blockIdx.x * d.hs;
  const int w0 = h0 / 8 * 8, off = h0 - w0;                   // window start and the features' offset in it
  const int chunks = (((h0 + d.hs + 7) / 8) * 8 - w0) / 8;   // 16-byte chunks this CTA copies per row
  const int n2 = d.C * d.hs;

  // Window columns past this CTA's chunks, rows R..rp, and the A tile's padding and zero row: zero.
  const int wpad = d.ldw2 - chunks * 8;
  for (int idx = tid; idx < d.C * d.rp * wpad; idx += blockDim.x) {
    tile[(idx / wpad) * d.ldw2 + chunks * 8 + idx % wpad] = FromFloat<T>(0.0f);
  }
  for (int idx = tid; idx < d.C * (d.rp - d.R) * chunks * 8; idx += blockDim.x) {
    const int c = idx / ((d.rp - d.R) * chunks * 8), rest = idx % ((d.rp - d.R) * chunks * 8);
    tile[(c * d.rp + d.R + rest / (chunks * 8)) * d.ldw2 + rest % (chunks * 8)] = FromFloat<T>(0.0f);
  }
  for (int idx = tid; idx < (d.rt + 1) * d.lda2; idx += blockDim.x) {
    if (idx >= d.rt * d.lda2 || idx % d.lda2 >= d.R) a_tile[idx] = FromFloat<T>(0.0f);
  }

  __shared__ unsigned long long tile_bar;  // bulk copies' completion
  InitTileBarrier(d.bulk, &tile_bar);
  auto load_weights = [&] {
    if constexpr (kAblateWeights) return;
    if (d.bulk) {  // one copy per (row, branch) window
      if (tid == 0) MbarrierExpectBytes(&tile_bar, d.R * d.C * chunks * 16);
      for (int idx = tid; idx < d.R * d.C; idx += blockDim.x) {
        const int r = idx / d.C, c = idx % d.C;
        BulkCopy(tile + (c * d.rp + r) * d.ldw2, args.up_weight + static_cast<size_t>(r) * d.K + c * d.H + w0,
                 chunks * 16, &tile_bar);
      }
      return;
    }
    const int per_row = d.C * chunks;
    for (int idx = tid; idx < d.R * per_row; idx += blockDim.x) {
      const int r = idx / per_row, c = (idx % per_row) / chunks, j = (idx % chunks) * 8;
      CpAsync<16>(tile + (c * d.rp + r) * d.ldw2 + j, args.up_weight + static_cast<size_t>(r) * d.K + c * d.H + w0 + j);
    }
    CpAsyncCommit();
  };
  if (weights_are_constant) load_weights();
  ReleaseDependents();
  WaitOnProducer();  // stage 1's partials and hn
  TimelineMark(d.timeline, d.slot + 1, kTimelineWaited);
  if (!weights_are_constant) load_weights();
  if constexpr (kAblateWork) {
    CpAsyncWaitAll();
    if (d.bulk && !kAblateWeights) MbarrierWait(&tile_bar, 0);
    return;
  }

  const int inject_items = blockIdx.x == gridDim.x - 1 ? d.C : 0;  // the last CTA also forms post_gate
  for (int r0 = 0; r0 < d.rows; r0 += d.rt) {
    const int nr = min(d.rt, d.rows - r0);
    if (r0 > 0) __syncthreads();  // hn_s, g_s and the A tile of the last pass are read

    // hn of this CTA's features for the pre-mix, in flight while the partials are added.
    if (d.hs % 4 == 0) {
      const int segs = d.hs / 4;
      for (int idx = tid; idx < nr * d.C * segs; idx += blockDim.x) {
        const int i = idx / (d.C * segs), c = (idx / segs) % d.C, j = (idx % segs) * 4;
        CpAsync<8>(hn_s + i * n2 + c * d.hs + j, hn_in + static_cast<size_t>(r0 + i) * d.K + c * d.H + h0 + j);
      }
    } else {
      for (int idx = tid; idx < nr * n2; idx += blockDim.x) {
        const int i = idx / n2, c = (idx % n2) / d.hs, j = idx % d.hs;
        hn_s[i * n2 + c * d.hs + j] = hn_in[static_cast<size_t>(r0 + i) * d.K + c * d.H + h0 + j];
      }
    }
    CpAsyncCommit();

    // down -> hidden (rounding points: down, Z, SG, hidden): groups in order (at most 16: four float4
    // per item), two items per thread with all their loads in flight together (three spill).
    const int items = nr * d.R;
    for (int base = tid; base < items; base += 2 * blockDim.x) {
      float4 q[2][4];
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const int idx = base + u * blockDim.x;
        const float4* p = reinterpret_cast<const float4*>(
            partials + (static_cast<size_t>(r0 + idx / d.R) * d.np + idx % d.R) * d.g4);
#pragma unroll
        for (int k = 0; k < 4; ++k) q[u][k] = idx < items && 4 * k < d.groups ? __ldg(p + k) : make_float4(0, 0, 0, 0);
      }
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const int idx = base + u * blockDim.x;
        float acc = 0.0f;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const float e[4] = {q[u][k].x, q[u][k].y, q[u][k].z, q[u][k].w};
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            if (4 * k + j < d.groups) acc += e[j];
          }
        }
        if (idx < items) {
          a_tile[(idx / d.R) * d.lda2 + idx % d.R] = FromFloat<T>(cuda::ScaledSilu<T>(RoundToT<T>(acc), d.silu_alpha));
        }
      }
    }
    // inject -> post_gate (rounding points: inject, post_gate): lane l adds group l's ranks in order,
    // then the groups are added in order (the cluster design's order).
    for (int item = warp; item < nr * inject_items; item += kWarps) {
      const int i = item / d.C, c = item % d.C;
      float s = 0.0f;
      if (lane < d.groups) {
        const float* p = inject_partials + InjectIndex(d, r0 + i, c, lane, 0);
#pragma unroll
        for (int r = 0; r < kRanks; ++r) s += __ldg(p + r);
      }
      float acc = 0.0f;
      for (int gi = 0; gi < d.groups; ++gi) acc += __shfl_sync(0xffffffffu, s, gi);
      if (lane == 0) {
        args.post_gate[static_cast<size_t>(r0 + i) * d.C + c] =
            FromFloat<T>(cuda::PostGate(RoundToT<T>(acc), d.gate_div, d.gate_mul));
      }
    }
    if (r0 == 0) TimelineMark(d.timeline, d.slot + 1, kPhase1);  // hidden formed
    CpAsyncWaitAll();  // the weight tile (first pass) and hn
    if (r0 == 0 && d.bulk && !kAblateWeights) MbarrierWait(&tile_bar, 0);
    __syncthreads();
    if (r0 == 0) TimelineMark(d.timeline, d.slot + 1, kPhase2);  // weights there

    // up on tensor cores (four k chains), one window column tile per warp and call (two tiles at once
    // spill at the register cap), then g for the CTA's features (rounding points: up, g).
    const int tiles_per_branch = d.win / 8;
    for (int t = warp; t < d.C * tiles_per_branch; t += kWarps) {
      const int c = t / tiles_per_branch;
      const int n0[1] = {(t % tiles_per_branch) * 8};
      float acc[1][4];
      if constexpr (kAblateMma) {
        acc[0][0] = acc[0][1] = acc[0][2] = acc[0][3] = 0.0f;
      } else {
        WarpMma<T, 1, 4>(a_tile, d.rt, d.lda2, tile + c * d.rp * d.ldw2, d.ldw2, d.rp / 16, n0, acc);
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = (lane >> 2) + (e >> 1) * 8;
        const int col = n0[0] + (lane & 3) * 2 + (e & 1) - off;  // feature within the CTA's hs
        if (i < nr && col >= 0 && col < d.hs) {
          g_s[i * n2 + c * d.hs + col] = RoundToT<T>(cuda::Sigmoid(RoundToT<T>(acc[0][e])));
        }
      }
    }
    if (r0 == 0) TimelineMark(d.timeline, d.slot + 1, kPhase3);  // this thread's up tiles done
    __syncthreads();
    if (r0 == 0) TimelineMark(d.timeline, d.slot + 1, kPhase4);  // all up tiles done
    PreMix<T>(hn_s, g_s, nr, d.hs, d.C, d.H, d.reduction_scale, args.pre_output + static_cast<size_t>(r0) * d.H + h0);
  }
  TimelineEndOfCta(d.timeline, d.slot + 1);
}

// ------------------------------------------------------------------------------------------------
// Host side.
// Launches from the plan (HcFastPlanFor, hc_fast_plan.cc), which holds the kernels' arguments.

template <typename Kernel>
int CtasPerSm(Kernel kernel, size_t smem) {
  int n = -1;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kThreads, smem) != cudaSuccess) {
    return -1;
  }
  return n;
}

}  // namespace

namespace cuda {

std::string HcFastPlainSummary(const HcFastPlan& plan) {
  const PlainDims& d = plan.plain_dims;
  const size_t smem1 = plan.stage1_shared_bytes, smem2 = plan.stage2_shared_bytes;
  return "plain design: stage 1: " + std::to_string(plan.stage1_ctas) + " CTAs x " + std::to_string(kThreads) +
         " threads, " + std::to_string(smem1) + " B shared (" +
         std::to_string(CtasPerSm(HcFastPlainStage1Kernel<__nv_bfloat16, true>, smem1)) + " per SM alone); stage 2: " +
         std::to_string(plan.stage2_ctas) + " CTAs of " + std::to_string(d.hs) + " features, " + std::to_string(smem2) +
         " B shared (" + std::to_string(CtasPerSm(HcFastPlainStage2Kernel<__nv_bfloat16>, smem2)) +
         " per SM alone); rows per pass " + std::to_string(d.rt);
}

template <typename T>
HcLaunchStatus LaunchHcFastPlain(const HcDeviceTensors<T>& tensors, void* scratch, const HcFastPlan& plan,
                                 cudaStream_t stream, bool weights_are_constant) {
  const PlainDims& d = plan.plain_dims;
  char* base = static_cast<char*>(scratch);
  float* partials = reinterpret_cast<float*>(base + plan.scratch.partials);
  float* inject = reinterpret_cast<float*>(base + plan.scratch.inject);
  T* hn = reinterpret_cast<T*>(base + plan.scratch.hn);
  const auto stage1 = d.has_prologue ? HcFastPlainStage1Kernel<T, true> : HcFastPlainStage1Kernel<T, false>;
  cudaError_t err = Launch(stage1, plan.stage1_ctas, kThreads, plan.stage1_shared_bytes, 1, plan.use_pdl, stream,
                           tensors, d, partials, inject, hn, weights_are_constant);
  if (err != cudaSuccess) return {"plain stage 1 kernel", err};
  err = Launch(HcFastPlainStage2Kernel<T>, plan.stage2_ctas, kThreads, plan.stage2_shared_bytes, 1, plan.use_pdl,
               stream, tensors, d, static_cast<const float*>(partials), static_cast<const float*>(inject),
               static_cast<const T*>(hn), weights_are_constant);
  if (err != cudaSuccess) return {"plain stage 2 kernel", err};
  return {};
}

template HcLaunchStatus LaunchHcFastPlain<__half>(const HcDeviceTensors<__half>&, void*, const HcFastPlan&,
                                                  cudaStream_t, bool);
template HcLaunchStatus LaunchHcFastPlain<__nv_bfloat16>(const HcDeviceTensors<__nv_bfloat16>&, void*,
                                                         const HcFastPlan&, cudaStream_t, bool);

}  // namespace cuda
}  // namespace hcfuse
