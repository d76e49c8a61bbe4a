// Stage 1 of the cluster design split by columns instead of K (HcFastTuning::columns_max_rows): the
// same partials, bit for bit, without the cluster exchange. Included by hc_fast_path.cu only.
//
// The cluster design's stage 1 gives every CTA a K slice (ks features of one branch) and all R + C
// columns; its cluster of 8 then sums the 8 slices' products column by column through distributed
// shared memory behind a cluster barrier: the longest phase of the 1-row block (bench/README.md).
// Here CTA (branch b, pair j) takes the whole branch (H features) and two 8-column mma tiles of
// [down | inject] (tiles 2j, 2j + 1; the last is inject's, padded with zero columns), so it forms the
// branch's norm itself and one warp holds all 8 ranks of a group for one tile:
//   part p's squares: warp p (PartSumsOfSquares, the cluster design's order), S of the part into the
//     A tile (S is exact in T), streams_out of the 128-feature chunks this CTA owns;
//   hn of the whole branch (the cluster design's NormalizeHn), hn_out of the owned chunks;
//   group g, tile t: rank r's slice (features (8 g + r) ks ...) is the same chain of ks / 16 mma steps
//     from zero as cluster rank r's WarpMma, the 8 chains in flight together; the ranks are added in
//     order (SumRanks's order) into the group's partial, stored where the cluster design stores it.
// Stage 2 is the cluster design's, unchanged. The cost against K slices: every CTA reads its branch's
// whole rows (pairs times the L2 reads of stage 1's streams and prev_block_output) and forms the
// branch's norm, so it pays off at few rows (HcFastTuning::columns_max_rows).
#pragma once

#include "cuda/hc_fast_device.cuh"

namespace hcfuse {
namespace fast {

inline constexpr int kColumnThreads = 256;  // 8 warps: one per sum-of-squares part, then per (group, tile)
inline constexpr int kColumnRanks = static_cast<int>(kHcFastClusterSize);  // the cluster design's ranks a group
inline constexpr int kColumnChunk = 128;    // features of an owned streams_out / hn_out chunk
static_assert(kColumnThreads / 32 == kParts, "warp p sums part p");

template <typename T, bool PRO, typename D>
__global__ void __launch_bounds__(kColumnThreads) HcFastColumnStage1Kernel(
    cuda::HcDeviceTensors<T> args, D d, float* __restrict__ partials, T* __restrict__ hn_out, bool weights_are_constant) {
  extern __shared__ __align__(16) unsigned char smem[];
  TimelineMark(d.timeline, d.slot, kTimelineStart);
  const HcFastColumnLayout layout(d);
  T* tile = reinterpret_cast<T*>(smem + layout.tile);  // [2][H][8]: plane u holds tile 2 j + u
  T* scale = reinterpret_cast<T*>(smem + layout.scale);
  T* a_tile = reinterpret_cast<T*>(smem + layout.a);
  float* part_sum = reinterpret_cast<float*>(smem + layout.part_sum);
  float* inv_rms = reinterpret_cast<float*>(smem + layout.inv_rms);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int branch = blockIdx.x / d.pairs, pair = blockIdx.x % d.pairs;
  const int inject_tile = d.R / 8;
  const int tiles = min(2, inject_tile + 1 - 2 * pair);
  const size_t kb = static_cast<size_t>(branch) * d.H;  // the branch's first row of the weights
  // the 128-feature chunks whose streams_out / hn_out this CTA writes: chunk c goes to pair c % pairs
  auto owned = [&](int f) { return (f / kColumnChunk) % d.pairs == pair; };

  // Never copied into: inject's padding columns (zero: its mma tile stays exact) and the A tile's zero row.
  for (int u = 0; u < tiles; ++u) {
    if (2 * pair + u != inject_tile || d.C == 8) continue;
    for (int k = tid; k < d.H; k += blockDim.x) {
      *reinterpret_cast<uint2*>(tile + (static_cast<size_t>(u) * d.H + k) * 8 + 4) = make_uint2(0u, 0u);
    }
  }
  for (int idx = tid; idx < d.ldac; idx += blockDim.x) a_tile[d.rt * d.ldac + idx] = FromFloat<T>(0.0f);

  auto load_weights = [&] {
    if constexpr (kAblateWeights) return;
    // two threads a weight row (the pair's two 16-byte pieces: one 32-byte sector of down_weight)
    for (int idx = tid; idx < tiles * d.H; idx += blockDim.x) {
      const int k = idx / tiles, u = idx % tiles, t = 2 * pair + u;
      T* dst = tile + (static_cast<size_t>(u) * d.H + k) * 8;
      if (t < inject_tile) {
        CpAsync<16>(dst, args.down_weight + (kb + k) * d.R + t * 8);
      } else if (d.C == 8) {
        CpAsync<16>(dst, args.inject_weight + (kb + k) * 8);
      } else {
        CpAsync<8>(dst, args.inject_weight + (kb + k) * 4);
      }
    }
    for (int idx = tid; idx < d.H / 8; idx += blockDim.x) CpAsync<16>(scale + idx * 8, args.norm_scale + kb + idx * 8);
    CpAsyncCommit();
  };
  if (weights_are_constant) load_weights();
  ReleaseDependents();  // stage 2 may become resident now and prefetch its weights
  WaitOnProducer();     // streams / prev_* come from upstream nodes; scratch was read by the last stage 2
  TimelineMark(d.timeline, d.slot, kTimelineWaited);
  if (!weights_are_constant) load_weights();
  if constexpr (kAblateWork) {
    CpAsyncWaitAll();
    return;
  }

  const int L = d.H / kParts;
  const int ksteps = d.ks / 16;
  const int gpb = d.cpb / kColumnRanks;  // the cluster design's groups inside one branch
  for (int r0 = 0; r0 < d.rows; r0 += d.rt) {
    const int nr = min(d.rt, d.rows - r0);
    if (r0 > 0) __syncthreads();  // the last pass's A tile is read

    // A: part `warp` of the branch's squares, two rows at a time (one round trip for both)
    for (int i0 = 0; i0 < nr; i0 += 2) {
      const int rows2 = min(2, nr - i0);
      const T* srows[2];
      const T* prows[2];
      float gates[2];
      for (int r = 0; r < 2; ++r) {
        const size_t row = r0 + i0 + min(r, rows2 - 1);  // a missing second row repeats the first, unused
        srows[r] = args.streams + row * d.K + kb + warp * L;
        prows[r] = PRO ? args.prev_block_output + row * d.H + warp * L : nullptr;
        gates[r] = PRO ? ToFloat<T>(args.prev_post_gate[row * d.C + branch]) : 0.0f;
      }
      float ss[2];
      PartSumsOfSquares<T, PRO, 2>(srows, prows, gates, L, ss, [&](const float (&s)[4], int r, int q) {
        if (r >= rows2) return;
        const int i = i0 + r, f = warp * L + q;
        cuda::Vec<T, 4> v;
#pragma unroll
        for (int j = 0; j < 4; ++j) v.v[j] = FromFloat<T>(s[j]);
        cuda::StoreVec<T, 4>(a_tile + i * d.ldac + f, v);
        if (args.streams_out != nullptr && owned(f)) {
          cuda::StoreVec<T, 4>(args.streams_out + static_cast<size_t>(r0 + i) * d.K + kb + f, v);
        }
      });
      if (lane == 0) {
        part_sum[warp * d.rt + i0] = ss[0];
        if (rows2 > 1) part_sum[warp * d.rt + i0 + 1] = ss[1];
      }
    }
    if (r0 == 0) TimelineMark(d.timeline, d.slot, kPhase1);  // part sums formed
    if (r0 == 0) CpAsyncWaitAll();  // the weight planes and norm_scale
    __syncthreads();
    if (r0 == 0) TimelineMark(d.timeline, d.slot, kPhase2);  // weights there

    // B: each row's inverse RMS once (two divisions and a square root: not per vector), then hn of the
    // branch in place of S (rounding point: hn), hn_out of the owned chunks.
    if (tid < nr) {
      float sum_sq = 0.0f;
#pragma unroll
      for (int p = 0; p < kParts; ++p) sum_sq += part_sum[p * d.rt + tid];
      inv_rms[tid] = cuda::BranchInvRms(sum_sq, d.H, d.epsilon);
    }
    __syncthreads();
    for (int idx = tid; idx < nr * (d.H / 4); idx += blockDim.x) {
      const int i = idx / (d.H / 4), f = (idx % (d.H / 4)) * 4;
      T* a = a_tile + i * d.ldac + f;
      cuda::Vec<T, 4> hn;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        hn.v[j] = FromFloat<T>(cuda::NormalizeHn(ToFloat<T>(a[j]), inv_rms[i], ToFloat<T>(scale[f + j])));
      }
      cuda::StoreVec<T, 4>(a, hn);
      if (owned(f)) cuda::StoreVec<T, 4>(hn_out + static_cast<size_t>(r0 + i) * d.K + kb + f, hn);
    }
    __syncthreads();
    if (r0 == 0) TimelineMark(d.timeline, d.slot, kPhase3);  // hn formed

    // C: one warp a (group, tile): the group's 8 rank slices as 8 mma chains in flight together, each
    // from zero over its ks / 16 steps (a cluster rank's WarpMma), then added in rank order.
    for (int task = warp; task < gpb * tiles; task += kColumnThreads / 32) {
      const int gl = task / tiles, u = task % tiles, t = 2 * pair + u;
      const int k_first = gl * kColumnRanks * d.ks;  // the group's first feature in the branch
      const unsigned a_row =
          SharedAddress(a_tile + min(lane & 15, d.rt) * d.ldac + (lane >> 4) * 8 + k_first);
      const unsigned b_row = SharedAddress(tile + (static_cast<size_t>(u) * d.H + k_first + (lane & 15)) * 8);
      float acc[kColumnRanks][4] = {};
      for (int s = 0; s < ksteps; ++s) {
        unsigned a[kColumnRanks][4], b[kColumnRanks][2];
#pragma unroll
        for (int r = 0; r < kColumnRanks; ++r) {
          LoadAFragment(a[r], a_row + (r * d.ks + s * 16) * 2);
          LoadBFragment(b[r], b_row + (r * d.ks + s * 16) * 16);
        }
#pragma unroll
        for (int r = 0; r < kColumnRanks; ++r) Mma<T>(acc[r], a[r], b[r]);
      }
      const int group = branch * gpb + gl;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float sum = 0.0f;
#pragma unroll
        for (int r = 0; r < kColumnRanks; ++r) sum += acc[r][e];
        const int i = (lane >> 2) + (e >> 1) * 8, col = t * 8 + (lane & 3) * 2 + (e & 1);
        if (i < nr && col < d.np) partials[(static_cast<size_t>(r0 + i) * d.np + col) * d.g4 + group] = sum;
      }
    }
    if (r0 == 0) TimelineMark(d.timeline, d.slot, kPhase4);  // products stored
  }
  TimelineEndOfCta(d.timeline, d.slot);
}

}  // namespace fast
}  // namespace hcfuse
