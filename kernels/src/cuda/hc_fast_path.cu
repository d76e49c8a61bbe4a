// Fused fast decode path of HyperConnectionLowRankMix: two kernels, weights streamed into shared
// memory with cp.async (before the grid-dependency wait when they are constant initializers), fp32
// partials of the down/inject GEMVs reduced inside a thread-block cluster through distributed shared
// memory (sm_90), then in a fixed order across clusters by stage 2.
//
// Stage 1 (HcFastStage1Kernel), one CTA per K slice of ks = H / ctas_per_branch features of one branch:
//   S of the whole branch for every row (prologue), its sum of squares, hn of the slice (kept in smem
//   and written to scratch for stage 2's pre-mix), streams_out of the slice, and the slice's share of
//   [down | inject] = hn @ [down_weight | inject_weight] for all rows at once (weights read once).
// Stage 2 (HcFastStage2Kernel), one CTA per hs features h, for all C branches (so pre_output is local):
//   down / inject from the partials (clusters in order), ScaledSiLU (each cluster rank a slice of R,
//   shared through distributed shared memory), up = hidden @ up_weight for its C*hs columns, g,
//   pre-mix; CTA 0 also computes post_gate.
// Reduction order is fixed and independent of the row count: each thread sums a contiguous k range
// in order, k groups are added in order, then cluster ranks, then clusters. Rows are processed in
// chunks of RC; a row's arithmetic is the same in every chunk position.
#include "cuda/hc_fast_path.h"

#include <algorithm>
#include <cooperative_groups.h>

#include "cuda/hc_common.cuh"
#include "cuda/hc_fast_path_eligibility.h"

namespace hcfuse {
namespace {

using cuda::FromFloat;
using cuda::RoundToT;
using cuda::ToFloat;

constexpr int kStage1Threads = 384;
constexpr int kStage2Threads = 320;
constexpr int kMaxRowChunk = 8;
constexpr int kVec = 4;  // columns per GEMV thread (one 8-byte load of T; one float4 of partial sums)
static_assert(kVec == 4, "GEMV partials are stored as float4 and S slices as float4");
static_assert(kStage1Threads % 32 == 0 && kStage2Threads % 32 == 0, "warp sums assume whole warps");
static_assert(kStage1Threads / 32 <= 32, "stage 1 keeps one warp sum per warp in [32][RC]");
static_assert(kHcFastClusterSize <= 8, "a portable cluster size (no non-portable attribute is set)");

// Run-time tiling shared by both kernels (derived on the host from HcLowRankMixParams).
struct FastDims {
  int rows, C, H, R, K;
  int ks, ctas_per_branch;  // stage 1: K slice length, slices per branch
  int kg1;                  // stage 1: k groups per column group
  int hs;                   // stage 2: features per CTA (C * hs columns)
  int kg2;                  // stage 2: r groups per column group
  int groups;               // partial sets stage 2 reduces (stage 1 CTAs / cluster size)
  bool has_prologue;
  float epsilon, reduction_scale, silu_alpha, gate_div, gate_mul;
};

// ---- PTX wrappers: programmatic dependent launch (sm_90) and cp.async (sm_80).
__device__ __forceinline__ void WaitOnProducer() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void ReleaseDependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

template <int BYTES>
__device__ __forceinline__ void CpAsync(void* smem, const void* gmem) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  if constexpr (BYTES == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(gmem) : "memory");
  } else {
    static_assert(BYTES == 8, "cp.async copies 8 or 16 bytes here");
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(dst), "l"(gmem) : "memory");
  }
}

__device__ __forceinline__ void CpAsyncWaitAll() { asm volatile("cp.async.wait_all;" ::: "memory"); }

// Copies `bytes` (a multiple of BYTES) of contiguous global memory into shared memory.
template <int BYTES>
__device__ __forceinline__ void CpAsyncContiguous(void* smem, const void* gmem, int bytes) {
  for (int off = threadIdx.x * BYTES; off < bytes; off += blockDim.x * BYTES) {
    CpAsync<BYTES>(static_cast<char*>(smem) + off, static_cast<const char*>(gmem) + off);
  }
}

// Four T from shared memory (8 bytes) as fp32.
template <typename T>
__device__ __forceinline__ void Load4(const T* p, float (&w)[kVec]) {
  const auto v = cuda::LoadVec<T, kVec>(p);
#pragma unroll
  for (int j = 0; j < kVec; ++j) w[j] = ToFloat<T>(v.v[j]);
}

// sum over g = 0..groups-1 of p[g * stride], in that order, with up to kBatch loads in flight
// (a plain loop would wait one L2 round trip per group).
__device__ __forceinline__ float SumPartials(const float* p, size_t stride, int groups) {
  constexpr int kBatch = 16;
  float acc = 0.0f;
  for (int base = 0; base < groups; base += kBatch) {
    float v[kBatch];
#pragma unroll
    for (int g = 0; g < kBatch; ++g) v[g] = base + g < groups ? p[(base + g) * stride] : 0.0f;
#pragma unroll
    for (int g = 0; g < kBatch; ++g) {
      if (base + g < groups) acc += v[g];
    }
  }
  return acc;
}

// hn = S * (1 / sqrt(mean(S^2) + eps)) * norm_scale, in hcfuse.reference's order (rounded by the caller).
__device__ __forceinline__ float InverseRms(float sum_sq, int H, float epsilon) {
  return __fdiv_rn(1.0f, sqrtf(__fadd_rn(__fdiv_rn(sum_sq, static_cast<float>(H)), epsilon)));
}

// RC consecutive floats of shared memory (16-byte aligned when RC >= 4) into registers.
template <int RC>
__device__ __forceinline__ void LoadRows(const float* p, float (&v)[RC]) {
  if constexpr (RC % 4 == 0) {
#pragma unroll
    for (int i = 0; i < RC; i += 4) {
      const float4 q = *reinterpret_cast<const float4*>(p + i);
      v[i] = q.x, v[i + 1] = q.y, v[i + 2] = q.z, v[i + 3] = q.w;
    }
  } else {
#pragma unroll
    for (int i = 0; i < RC; ++i) v[i] = p[i];
  }
}

// Block GEMV on shared memory: red[g][i][n] = sum over k in group g's contiguous range of
// x[k][i] * w[k][n] (x holds the RC rows of one k side by side), for column groups of 4, then
// red[0] = sum over g in order. red is 16-byte aligned and ncols a multiple of 4.
// Columns [0, n_a) come from w_a (row stride ld_a), [n_a, n_a + n_b) from w_b (row stride ld_b).
template <typename T, int RC>
__device__ __forceinline__ void BlockGemv(const float* x, const T* w_a, int n_a, int ld_a, const T* w_b, int n_b,
                                          int ld_b, int kdim, int kg, float* red) {
  const int ncols = n_a + n_b;
  const int klen = kdim / kg;
  const int ngroups = ncols / kVec;
  for (int item = threadIdx.x; item < ngroups * kg; item += blockDim.x) {
    // column groups fastest: a warp's lanes read one k row of w (no bank conflicts) and share x
    const int col = (item % ngroups) * kVec;
    const int g = item / ngroups;
    const int ldw = col < n_a ? ld_a : ld_b;
    const T* w = (col < n_a ? w_a + col : w_b + (col - n_a)) + g * klen * ldw;
    const float* xk = x + g * klen * RC;
    float acc[RC][kVec] = {};
#pragma unroll 2
    for (int k = 0; k < klen; ++k, w += ldw, xk += RC) {
      float wv[kVec], xv[RC];
      Load4<T>(w, wv);
      LoadRows<RC>(xk, xv);
#pragma unroll
      for (int i = 0; i < RC; ++i) {
#pragma unroll
        for (int j = 0; j < kVec; ++j) acc[i][j] = fmaf(xv[i], wv[j], acc[i][j]);
      }
    }
#pragma unroll
    for (int i = 0; i < RC; ++i) {
      *reinterpret_cast<float4*>(red + (g * RC + i) * ncols + col) = make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
    }
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < RC * ncols; idx += blockDim.x) {
    float s = red[idx];
    for (int g = 1; g < kg; ++g) s += red[g * RC * ncols + idx];
    red[idx] = s;
  }
  __syncthreads();
}

// ------------------------------------------------------------------------------------------------
// Stage 1. Shared memory: down tile [ks][R] T | inject tile [ks][C] T | norm_scale [ks] T |
// hn [ks][RC] f32 | S of the slice [RC][ks] f32 | red [kg1][RC][R + C] f32 (red[0] ends as this CTA's
// partial) | inv_rms [RC] f32 | warp sums [32][RC] f32. PRO: the node has the prologue.
template <typename T, int RC, int CL, bool PRO>
__global__ void __launch_bounds__(kStage1Threads, 2) HcFastStage1Kernel(
    HcFastArgs<T> args, FastDims d, float* __restrict__ partials, T* __restrict__ hn_out, bool weights_are_constant) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int ncols = d.R + d.C;
  T* w_down = reinterpret_cast<T*>(smem);
  T* w_inj = w_down + d.ks * d.R;
  T* scale = w_inj + d.ks * d.C;
  float* xs = reinterpret_cast<float*>(smem + (((d.ks * (d.R + d.C + 1)) * sizeof(T) + 15) / 16) * 16);
  float* s_slice = xs + RC * d.ks;
  float* red = s_slice + RC * d.ks;
  float* inv_rms = red + d.kg1 * RC * ncols;
  float* warp_sums = inv_rms + RC;

  const int branch = blockIdx.x / d.ctas_per_branch;
  const int h0 = (blockIdx.x % d.ctas_per_branch) * d.ks;
  const int k0 = branch * d.H + h0;
  auto load_weights = [&] {
    CpAsyncContiguous<16>(w_down, args.down_weight + static_cast<size_t>(k0) * d.R, d.ks * d.R * sizeof(T));
    CpAsyncContiguous<16>(w_inj, args.inject_weight + static_cast<size_t>(k0) * d.C, d.ks * d.C * sizeof(T));
    CpAsyncContiguous<8>(scale, args.norm_scale + k0, d.ks * sizeof(T));
    asm volatile("cp.async.commit_group;" ::: "memory");
  };
  if (weights_are_constant) load_weights();
  ReleaseDependents();  // stage 2 may become resident now and prefetch its weights
  WaitOnProducer();     // streams / prev_* come from upstream nodes; scratch was read by the last stage 2
  if (!weights_are_constant) load_weights();

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, num_warps = blockDim.x >> 5;
  for (int r0 = 0; r0 < d.rows; r0 += RC) {
    const int nr = min(RC, d.rows - r0);
    // Sum of squares of S over the branch, per row: strided per thread (all rows' loads issued
    // before any use), butterfly, warps in order. The slice's S values stay in shared memory.
    // Padding rows of the chunk repeat the last row (cheap L1/L2 hits, no branches); unused.
    float ss[RC], gate[RC];
    const T* srow[RC];
    const T* prow[RC];
#pragma unroll
    for (int i = 0; i < RC; ++i) {
      const size_t row = r0 + min(i, nr - 1);
      ss[i] = 0.0f;
      srow[i] = args.streams + row * d.K + branch * d.H;
      prow[i] = PRO ? args.prev_block_output + row * d.H : nullptr;
      gate[i] = PRO ? ToFloat<T>(args.prev_post_gate[row * d.C + branch]) : 0.0f;
    }
    for (int h = threadIdx.x * kVec; h < d.H; h += blockDim.x * kVec) {
      cuda::Vec<T, kVec> sv[RC], pv[RC];
#pragma unroll
      for (int i = 0; i < RC; ++i) {
        sv[i] = cuda::LoadVec<T, kVec>(srow[i] + h);
        if constexpr (PRO) pv[i] = cuda::LoadVec<T, kVec>(prow[i] + h);
      }
      const bool in_slice = h >= h0 && h < h0 + d.ks;
#pragma unroll
      for (int i = 0; i < RC; ++i) {
        float sq[kVec];
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          float s = ToFloat<T>(sv[i].v[j]);
          if constexpr (PRO) s = RoundToT<T>(cuda::PrologueS(s, gate[i], ToFloat<T>(pv[i].v[j])));  // rounding point: S
          ss[i] = __fadd_rn(ss[i], __fmul_rn(s, s));
          sq[j] = s;
        }
        if (in_slice) *reinterpret_cast<float4*>(s_slice + i * d.ks + h - h0) = make_float4(sq[0], sq[1], sq[2], sq[3]);
      }
    }
#pragma unroll
    for (int i = 0; i < RC; ++i) ss[i] = cuda::WarpSum(ss[i]);
    if (lane == 0) {
#pragma unroll
      for (int i = 0; i < RC; ++i) warp_sums[warp * RC + i] = ss[i];
    }
    if (r0 == 0) CpAsyncWaitAll();
    __syncthreads();
    if (threadIdx.x < RC) {
      float total = 0.0f;
      for (int w = 0; w < num_warps; ++w) total += warp_sums[w * RC + threadIdx.x];
      inv_rms[threadIdx.x] = InverseRms(total, d.H, d.epsilon);
    }
    __syncthreads();
    // hn of the slice (zero for the padding rows of the chunk), streams_out of the slice.
    for (int idx = threadIdx.x; idx < RC * d.ks; idx += blockDim.x) {
      const int i = idx / d.ks, kk = idx % d.ks;
      float hn = 0.0f;
      if (i < nr) {
        const size_t row = r0 + i;
        const float s = s_slice[idx];
        hn = RoundToT<T>(__fmul_rn(__fmul_rn(s, inv_rms[i]), ToFloat<T>(scale[kk])));  // rounding point: hn
        hn_out[row * d.K + k0 + kk] = FromFloat<T>(hn);
        if (args.streams_out != nullptr) args.streams_out[row * d.K + k0 + kk] = FromFloat<T>(s);
      }
      xs[kk * RC + i] = hn;
    }
    __syncthreads();
    BlockGemv<T, RC>(xs, w_down, d.R, d.R, w_inj, d.C, d.C, d.ks, d.kg1, red);

    // red[0] = this CTA's partial [RC][R + C]; reduce the cluster's partials rank by rank.
    if constexpr (CL > 1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      namespace cg = cooperative_groups;
      cg::cluster_group cluster = cg::this_cluster();
      cluster.sync();
      const int rank = static_cast<int>(cluster.block_rank());
      const int per_rank = (ncols + CL - 1) / CL;
      const int n_begin = rank * per_rank, n_len = max(0, min(ncols, n_begin + per_rank) - n_begin);
      float* out = partials + static_cast<size_t>(blockIdx.x / CL) * d.rows * ncols;
      for (int idx = threadIdx.x; idx < nr * n_len; idx += blockDim.x) {
        const int i = idx / n_len, n = n_begin + idx % n_len;
        float s = *cluster.map_shared_rank(red + i * ncols + n, 0);
        for (int q = 1; q < CL; ++q) s += *cluster.map_shared_rank(red + i * ncols + n, q);
        out[static_cast<size_t>(r0 + i) * ncols + n] = s;
      }
      cluster.sync();  // peers are done reading red before it is reused or the CTA exits
#else
      __trap();
#endif
    } else {
      float* out = partials + static_cast<size_t>(blockIdx.x) * d.rows * ncols;
      for (int idx = threadIdx.x; idx < nr * ncols; idx += blockDim.x) {
        out[static_cast<size_t>(r0) * ncols + idx] = red[idx];
      }
      __syncthreads();
    }
  }
}

// ------------------------------------------------------------------------------------------------
// Stage 2. Shared memory: up tile [R][C*hs] T | hn of the CTA's columns [RC][C*hs] T |
// hidden [R][RC] f32 | red [kg2][RC][C*hs] f32.
template <typename T, int RC, int CL>
__global__ void __launch_bounds__(kStage2Threads) HcFastStage2Kernel(
    HcFastArgs<T> args, FastDims d, const float* __restrict__ partials, const T* __restrict__ hn_in,
    bool weights_are_constant) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int ncols = d.C * d.hs;
  const int pcols = d.R + d.C;  // columns of a partial row
  const int segs = d.hs / kVec;  // 8-byte pieces of one branch's hs features
  T* w_up = reinterpret_cast<T*>(smem);
  T* hn_s = w_up + d.R * ncols;
  float* hid = reinterpret_cast<float*>(smem + (((d.R + RC) * ncols * sizeof(T) + 15) / 16) * 16);
  float* red = hid + RC * d.R;

  const int h0 = blockIdx.x * d.hs;
  auto load_weights = [&] {
    const int pieces = d.C * segs;  // 8-byte pieces in one row of the tile
    const int t = threadIdx.x;
    if (pieces <= static_cast<int>(blockDim.x)) {
      // each thread keeps one piece and walks down the rows (no index division per copy)
      const int step = blockDim.x / pieces;
      if (t < step * pieces) {
        const int p = t % pieces, c = p / segs, j = (p % segs) * kVec;
        T* dst = w_up + c * d.hs + j;
        const T* src = args.up_weight + c * d.H + h0 + j;
        for (int r = t / pieces; r < d.R; r += step) CpAsync<8>(dst + r * ncols, src + static_cast<size_t>(r) * d.K);
      }
    } else {
      for (int idx = t; idx < d.R * pieces; idx += blockDim.x) {
        const int r = idx / pieces, p = idx % pieces, c = p / segs, j = (p % segs) * kVec;
        CpAsync<8>(w_up + r * ncols + c * d.hs + j, args.up_weight + static_cast<size_t>(r) * d.K + c * d.H + h0 + j);
      }
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
  };
  if (weights_are_constant) load_weights();
  ReleaseDependents();
  WaitOnProducer();  // stage 1's partials and hn
  if (!weights_are_constant) load_weights();

  int r_begin = 0, r_len = d.R;  // the slice of R whose hidden values this CTA computes
  if constexpr (CL > 1) {
    const int per_rank = (d.R + CL - 1) / CL;
    r_begin = static_cast<int>(blockIdx.x % CL) * per_rank;
    r_len = max(0, min(d.R, r_begin + per_rank) - r_begin);
  }
  const int gate_items = blockIdx.x == 0 ? d.C : 0;  // CTA 0 also computes post_gate
  for (int r0 = 0; r0 < d.rows; r0 += RC) {
    const int nr = min(RC, d.rows - r0);
    // hn of this CTA's columns for the pre-mix, in flight while the partials are reduced
    for (int idx = threadIdx.x; idx < nr * d.C * segs; idx += blockDim.x) {
      const int i = idx / (d.C * segs), rem = idx % (d.C * segs);
      const int c = rem / segs, j = (rem % segs) * kVec;
      CpAsync<8>(hn_s + i * ncols + c * d.hs + j, hn_in + static_cast<size_t>(r0 + i) * d.K + c * d.H + h0 + j);
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
    // down -> hidden for this rank's slice of R, and (CTA 0) inject -> post_gate, side by side.
    for (int idx = threadIdx.x; idx < RC * (r_len + gate_items); idx += blockDim.x) {
      const int i = idx / (r_len + gate_items), col = idx % (r_len + gate_items);
      const size_t stride = static_cast<size_t>(d.rows) * pcols;
      if (col < r_len) {
        const int r = r_begin + col;
        float hidden = 0.0f;
        if (i < nr) {
          const float down = RoundToT<T>(SumPartials(partials + static_cast<size_t>(r0 + i) * pcols + r, stride,
                                                     d.groups));  // rounding point: down
          hidden = cuda::ScaledSilu<T>(down, d.silu_alpha);  // rounding points: Z, SG, hidden
        }
        hid[r * RC + i] = hidden;
      } else if (i < nr) {
        const int c = col - r_len;
        const float inject = RoundToT<T>(SumPartials(partials + static_cast<size_t>(r0 + i) * pcols + d.R + c, stride,
                                                     d.groups));  // rounding point: inject
        args.post_gate[static_cast<size_t>(r0 + i) * d.C + c] =
            FromFloat<T>(cuda::PostGate(inject, d.gate_div, d.gate_mul));  // rounding point: post_gate
      }
    }
    if constexpr (CL > 1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      namespace cg = cooperative_groups;
      cg::cluster_group cluster = cg::this_cluster();
      cluster.sync();
      const int per_rank = (d.R + CL - 1) / CL;
      for (int r = threadIdx.x; r < d.R; r += blockDim.x) {
        const int owner = r / per_rank;
        if (owner == static_cast<int>(cluster.block_rank())) continue;
        float v[RC];
        LoadRows<RC>(cluster.map_shared_rank(hid + r * RC, owner), v);
#pragma unroll
        for (int i = 0; i < RC; ++i) hid[r * RC + i] = v[i];
      }
      cluster.sync();  // every rank has its copy before anyone overwrites its slice or exits
#else
      __trap();
#endif
    }
    CpAsyncWaitAll();  // the up tile (first chunk) and hn
    __syncthreads();
    BlockGemv<T, RC>(hid, w_up, ncols, ncols, w_up, 0, ncols, d.R, d.kg2, red);
    // red[0][i][j] = up (fp32) of column j = c * hs + hh.
    for (int idx = threadIdx.x; idx < RC * ncols; idx += blockDim.x) {
      const float up = RoundToT<T>(red[idx]);     // rounding point: up
      red[idx] = RoundToT<T>(cuda::Sigmoid(up));  // rounding point: g
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < nr * d.hs; idx += blockDim.x) {
      const int i = idx / d.hs, hh = idx % d.hs;
      float mix = 0.0f;
      for (int c = 0; c < d.C; ++c) {
        const int j = i * ncols + c * d.hs + hh;
        mix = __fadd_rn(mix, __fmul_rn(ToFloat<T>(hn_s[j]), red[j]));
      }
      args.pre_output[static_cast<size_t>(r0 + i) * d.H + h0 + hh] =
          FromFloat<T>(__fmul_rn(d.reduction_scale, mix));  // rounding point: pre_output
    }
    __syncthreads();  // red, hid and hn_s are rewritten by the next chunk
  }
}

// ------------------------------------------------------------------------------------------------
// Host side.

// Largest divisor of n with ncol_groups * divisor <= threads (the GEMV's k groups).
int KGroups(int n, int ncol_groups, int threads) {
  int best = 1;
  for (int g = 1; g <= n && g * ncol_groups <= threads; ++g) {
    if (n % g == 0) best = g;
  }
  return best;
}

FastDims MakeDims(const HcLowRankMixParams& p, int cluster) {
  FastDims d{};
  d.rows = static_cast<int>(p.rows);
  d.C = static_cast<int>(p.C);
  d.H = static_cast<int>(p.H);
  d.R = static_cast<int>(p.R);
  d.K = d.C * d.H;
  d.ctas_per_branch = static_cast<int>(HcFastStage1CtasPerBranch(p, cluster));
  d.ks = d.ctas_per_branch > 0 ? d.H / d.ctas_per_branch : 0;
  d.kg1 = d.ks > 0 ? KGroups(d.ks, (d.R + d.C) / kVec, kStage1Threads) : 1;
  const int ctas2 = static_cast<int>(HcFastStage2Ctas(p, cluster));
  d.hs = ctas2 > 0 ? d.H / ctas2 : 0;
  d.kg2 = KGroups(d.R, d.C * d.hs / kVec, kStage2Threads);
  d.groups = d.ctas_per_branch * d.C / cluster;
  d.has_prologue = p.has_prologue;
  d.epsilon = p.epsilon;
  d.reduction_scale = p.reduction_scale;
  d.silu_alpha = p.silu_alpha;
  d.gate_div = p.gate_div;
  d.gate_mul = p.gate_mul;
  return d;
}

size_t Align256(size_t n) { return (n + 255) / 256 * 256; }

// Partials for the worst case of both cluster sizes (at most C * ceil(128 / C) stage 1 CTAs).
size_t PartialBytes(const HcLowRankMixParams& p) {
  const size_t max_ctas = static_cast<size_t>(p.C) * ((128 + p.C - 1) / p.C);
  return Align256(max_ctas * p.rows * (p.R + p.C) * sizeof(float));
}

size_t Stage1SmemBytes(const FastDims& d, int rc) {
  const size_t tiles = ((static_cast<size_t>(d.ks) * (d.R + d.C + 1) * 2 + 15) / 16) * 16;
  return tiles + sizeof(float) * (2 * static_cast<size_t>(rc) * d.ks + static_cast<size_t>(d.kg1) * rc * (d.R + d.C) +
                                  rc + 32 * rc);
}

size_t Stage2SmemBytes(const FastDims& d, int rc) {
  const size_t tile = ((static_cast<size_t>(d.R + rc) * d.C * d.hs * 2 + 15) / 16) * 16;
  return tile + sizeof(float) * (static_cast<size_t>(rc) * d.R + static_cast<size_t>(d.kg2) * rc * d.C * d.hs);
}

template <typename Kernel, typename... Args>
cudaError_t Launch(Kernel kernel, int grid, int threads, size_t smem, int cluster, bool use_pdl, cudaStream_t stream,
                   Args... args) {
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (err != cudaSuccess) return err;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(grid);
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attrs[2];
  int n = 0;
  if (cluster > 1) {
    attrs[n].id = cudaLaunchAttributeClusterDimension;
    attrs[n].val.clusterDim.x = cluster;
    attrs[n].val.clusterDim.y = 1;
    attrs[n].val.clusterDim.z = 1;
    ++n;
  }
  if (use_pdl) {
    attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  config.attrs = attrs;
  config.numAttrs = n;
  return cudaLaunchKernelEx(&config, kernel, args...);
}

template <typename T, int RC, int CL>
cudaError_t LaunchStages(const HcFastArgs<T>& args, const FastDims& d, float* partials, T* hn, cudaStream_t stream,
                         bool weights_are_constant, bool use_pdl) {
  const auto stage1 = d.has_prologue ? HcFastStage1Kernel<T, RC, CL, true> : HcFastStage1Kernel<T, RC, CL, false>;
  cudaError_t err = Launch(stage1, d.ctas_per_branch * d.C, kStage1Threads, Stage1SmemBytes(d, RC), CL, use_pdl,
                           stream, args, d, partials, hn, weights_are_constant);
  if (err != cudaSuccess) return err;
  return Launch(HcFastStage2Kernel<T, RC, CL>, d.H / d.hs, kStage2Threads, Stage2SmemBytes(d, RC), CL, use_pdl,
                stream, args, d, static_cast<const float*>(partials), static_cast<const T*>(hn), weights_are_constant);
}

// The row chunk RC of a call with `rows` rows (DispatchRows' template argument).
int RowChunk(int64_t rows) { return rows == 1 ? 1 : rows == 2 ? 2 : rows <= 4 ? 4 : kMaxRowChunk; }

template <typename T, int CL>
cudaError_t DispatchRows(const HcFastArgs<T>& args, const FastDims& d, float* partials, T* hn, cudaStream_t stream,
                         bool weights_are_constant, bool use_pdl) {
  static_assert(kMaxRowChunk == 8, "the row-chunk dispatch below covers 1, 2, 4, 8");
  switch (RowChunk(d.rows)) {
    case 1: return LaunchStages<T, 1, CL>(args, d, partials, hn, stream, weights_are_constant, use_pdl);
    case 2: return LaunchStages<T, 2, CL>(args, d, partials, hn, stream, weights_are_constant, use_pdl);
    case 4: return LaunchStages<T, 4, CL>(args, d, partials, hn, stream, weights_are_constant, use_pdl);
    default: return LaunchStages<T, 8, CL>(args, d, partials, hn, stream, weights_are_constant, use_pdl);
  }
}

}  // namespace

size_t HcFastScratchBytes(const HcLowRankMixParams& params) {
  if (params.rows == 0) return 0;
  return PartialBytes(params) + Align256(static_cast<size_t>(params.rows) * params.width() * 2);
}

size_t HcFastSharedMemoryBytes(const HcLowRankMixParams& params, int sm_major) {
  if (params.rows == 0 || !IsHcFastPathSupported(params, sm_major, 0, 2)) return 0;
  const FastDims d = MakeDims(params, static_cast<int>(HcFastClusterSize(sm_major)));
  const int rc = RowChunk(params.rows);
  return std::max(Stage1SmemBytes(d, rc), Stage2SmemBytes(d, rc));
}

template <typename T>
cudaError_t LaunchHcFast(const HcFastArgs<T>& args, const HcLowRankMixParams& params, void* scratch,
                         size_t scratch_bytes, cudaStream_t stream, bool weights_are_constant, bool use_pdl) {
  static_assert(sizeof(T) == 2, "the fast path is for float16 and bfloat16");
  if (params.rows == 0) return cudaSuccess;
  int device = 0, sm_major = 0, sm_minor = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sm_major, cudaDevAttrComputeCapabilityMajor, device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sm_minor, cudaDevAttrComputeCapabilityMinor, device);
  if (err != cudaSuccess) return err;
  if (!IsHcFastPathSupported(params, sm_major, sm_minor, static_cast<int>(sizeof(T))) ||
      params.rows > (int64_t{1} << 24) || scratch_bytes < HcFastScratchBytes(params) ||
      !HcFastPointersAligned({args.streams, args.norm_scale, args.down_weight, args.up_weight, args.inject_weight,
                              args.prev_block_output, args.prev_post_gate, args.pre_output, args.post_gate,
                              args.streams_out, scratch})) {
    return cudaErrorInvalidValue;
  }
  const int cluster = static_cast<int>(HcFastClusterSize(sm_major));
  const FastDims d = MakeDims(params, cluster);
  float* partials = static_cast<float*>(scratch);
  T* hn = reinterpret_cast<T*>(static_cast<char*>(scratch) + PartialBytes(params));
  use_pdl = use_pdl && HcFastUsesSm90Features(sm_major);
  if (cluster > 1) return DispatchRows<T, kHcFastClusterSize>(args, d, partials, hn, stream, weights_are_constant, use_pdl);
  return DispatchRows<T, 1>(args, d, partials, hn, stream, weights_are_constant, use_pdl);
}

template cudaError_t LaunchHcFast<__half>(const HcFastArgs<__half>&, const HcLowRankMixParams&, void*, size_t,
                                          cudaStream_t, bool, bool);
template cudaError_t LaunchHcFast<__nv_bfloat16>(const HcFastArgs<__nv_bfloat16>&, const HcLowRankMixParams&, void*,
                                                 size_t, cudaStream_t, bool, bool);

}  // namespace hcfuse
