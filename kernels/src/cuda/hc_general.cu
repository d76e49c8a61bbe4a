// General CUDA path of HyperConnectionLowRankMix: any C/H/R, any row count, every T.
//
//   HcNormInjectKernel  S (prologue), per-branch rms, hn, inject = hn @ inject_weight (a fixed-order
//                      fp32 dot product per row) and post_gate   -> streams_out, hn (scratch), post_gate;
//                      S stays in shared memory between its two passes (from 2048 rows cp.async-prefetched
//                      a row group ahead), so streams and the prologue inputs are read once
//   per chunk of at most ChunkRows rows:
//     GEMM (cuBLASLt, strided-batched)  fp32 partials of down = hn @ down_weight over a fixed number
//                      of K slices (HcFallbackGemmKernel where cuBLASLt has no algorithm)
//     HcSplitReduceKernel  down = the slices' sum in order b = 0, 1, ..., rounded to T;
//                      hidden = ScaledSiLU(down)
//   GEMM (cuBLASLt)    up = hidden @ up_weight
//   HcGateEpilogueKernel  g = sigmoid(up), pre_output
//
// Three row ranges (hc_gemm.h), which differ in the down and up products only:
//   few rows   rows <  kHcMidMinRows (256): HcSplitCount(C*H) slices (40 for the real shape: enough
//              CTAs at a few rows), algorithms planned at kSplitPlanRows / kPlanRows rows;
//   mid        kHcMidMinRows <= rows < kHcPrefillMinRows (1024): HcMidSplitCount(C*H) slices (16),
//              planned at kMidPlanRows (measured: 256 rows 10.3 us for product and reduction against 14.0
//              with 40 slices, 512 rows 13.2 against 19.3);
//   prefill    rows >= kHcPrefillMinRows: HcPrefillSplitCount(C*H) slices (4: the partials' traffic
//              is small next to the product), both algorithms planned at kPrefillPlanRows rows.
// Within a range each output element is computed by a fixed sequence of operations that does not
// depend on the row count or on which block runs it (row-stride and grid-stride loops; reductions in
// fixed order; the K split depends on K and the range only; GEMM algorithms pinned in HcLtGemm, the
// same for every chunk), so results are deterministic and row independent within the range. S, hn,
// inject and post_gate do not depend on the range at all (one kernel, one order, for every row count);
// pre_output does (another K split of down).
#include <algorithm>
#include <cstdio>
#include <string>

#include "cuda/hc_common.cuh"
#include "cuda/hc_gemm.h"
#include "cuda/hc_lowrank_mix_cuda.h"
#include "cuda/hc_ptx.cuh"

namespace hcfuse {
namespace cuda {
namespace {

constexpr int kMaxNormThreads = 256;
constexpr int kElementwiseThreads = 256;
// Grid caps: the kernels loop over rows / elements, so any count fits the grid limits.
constexpr int64_t kMaxRowBlocks = int64_t{1} << 20;
constexpr int64_t kMaxElementwiseBlocks = int64_t{1} << 16;

// Row chunks of the split down product (SplitChunkRows).
constexpr int64_t kChunkRowsMultiple = 128;
constexpr int64_t kMaxChunkRows = 1024;
constexpr int64_t kMaxPrefillChunkRows = 4096;
constexpr int64_t kPartialBudgetBytes = int64_t{64} << 20;

constexpr size_t kScratchAlign = 256;
size_t AlignUp(size_t bytes) { return (bytes + kScratchAlign - 1) / kScratchAlign * kScratchAlign; }

// Inject columns one pass of HcNormInjectKernel accumulates (one pass when C <= 8).
constexpr int kInjectGroup = 8;

template <typename T>
struct NormArgs {
  const T* streams;
  const T* norm_scale;
  const T* inject_weight;      // (C*H, C)
  const T* prev_block_output;  // null without prologue
  const T* prev_post_gate;
  T* streams_out;  // null when not requested
  T* hn;
  T* post_gate;
  int64_t rows, C, H;
  float epsilon, gate_div, gate_mul;
};

// S = streams + gate * prev for VEC consecutive features, each rounded to T.
template <typename T, int VEC>
__device__ __forceinline__ Vec<T, VEC> PrologueVec(Vec<T, VEC> s, float gate, const Vec<T, VEC>& prev) {
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    // rounding point: S
    s.v[j] = FromFloat<T>(PrologueS(ToFloat(s.v[j]), gate, ToFloat(prev.v[j])));
  }
  return s;
}

// S for VEC consecutive features h of branch c of one row, from global memory.
template <typename T, int VEC>
__device__ __forceinline__ Vec<T, VEC> LoadS(const NormArgs<T>& a, int64_t row, int64_t c, int64_t h) {
  const int64_t width = a.C * a.H;
  Vec<T, VEC> s = LoadVec<T, VEC>(a.streams + row * width + c * a.H + h);
  if (a.prev_block_output != nullptr) {
    s = PrologueVec<T, VEC>(s, ToFloat(a.prev_post_gate[row * a.C + c]),
                            LoadVec<T, VEC>(a.prev_block_output + row * a.H + h));
  }
  return s;
}

// N block sums at once, each exactly as BlockSum computes it (butterfly in the warp, warp sums added
// in order), with two barriers for all N. `scratch` holds N * 32 floats; every thread gets the sums.
template <int N>
__device__ __forceinline__ void BlockSums(float (&v)[N], float* scratch) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int num_warps = blockDim.x >> 5;
#pragma unroll
  for (int i = 0; i < N; ++i) v[i] = WarpSum(v[i]);
  __syncthreads();  // the previous call's readers are done with scratch
  if (lane == 0) {
#pragma unroll
    for (int i = 0; i < N; ++i) scratch[i * 32 + warp] = v[i];
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < N; ++i) {
    float total = 0.0f;
    for (int w = 0; w < num_warps; ++w) total += scratch[i * 32 + w];  // same order in every thread
    v[i] = total;
  }
}

// Branches of one pass-1 round of HcNormInjectKernel: one barrier per round.
constexpr int kBranchGroup = 8;

// Where HcNormInjectKernel's pass 2 gets S (the choice changes no bit: S is formed by the same
// operations from the same inputs either way):
//   kFormTwice  forms it again from global memory (rows too wide for shared memory);
//   kCache      pass 1 keeps S in shared memory;
//   kPrefetch   cp.async brings the block's NEXT row group (streams, prev_block_output) into the other
//               of two shared-memory stages while this one is processed, pass 1 forms S in place; the
//               grid is persistent (at most the resident blocks), so a block has a next group.
enum NormMode : int { kFormTwice = 0, kCache = 1, kPrefetch = 2 };

// Dynamic shared memory of HcNormInjectKernel: inv_rms [ROWS][C] floats (16-byte aligned), then
// kCache: S [ROWS][C][H] in T; kPrefetch: two stages of streams/S [ROWS][C][H] and, with the prologue,
// prev_block_output [ROWS][H], in T.
__host__ __device__ inline size_t NormInvRmsBytes(int rows_per_block, int64_t C) {
  return (static_cast<size_t>(rows_per_block * C) * sizeof(float) + 15) / 16 * 16;
}
__host__ __device__ inline int64_t NormStageElements(int rows_per_block, int64_t C, int64_t H, bool prologue) {
  return rows_per_block * (C + (prologue ? 1 : 0)) * H;
}
size_t NormSmemBytes(NormMode mode, int rows_per_block, int64_t C, int64_t H, bool prologue, size_t element_size) {
  const size_t inv = NormInvRmsBytes(rows_per_block, C);
  if (mode == kCache) return inv + static_cast<size_t>(rows_per_block * C * H) * element_size;
  if (mode == kPrefetch) return inv + 2 * static_cast<size_t>(NormStageElements(rows_per_block, C, H, prologue)) * element_size;
  return inv;
}
// Largest S cache / prefetch stages a block takes: two blocks (and their static shared memory) fit an
// sm_90 SM (228 KB), one an sm_80 SM (164 KB). The real shape in 16-bit T: 4 rows cached (80 KB), or
// 2 rows prefetched with the prologue (2 x 50 KB); in float32 2 rows cached, never prefetched.
constexpr size_t kMaxNormCacheBytes = 104 * 1024;
// kPrefetch's rows per block, and the row count from which it runs (LaunchNormInject).
constexpr int kNormPrefetchRows = 2;
constexpr int64_t kNormPrefetchMinRows = 2048;

// cp.async of row group `group` into a kPrefetch stage: this thread's own vectors only (the ones its
// passes read), so only its own wait_group orders them.
template <typename T, int VEC, int ROWS>
__device__ __forceinline__ void PrefetchRowGroup(const NormArgs<T>& a, T* stage, int64_t group, int64_t C) {
  static_assert(VEC * sizeof(T) == 16, "kPrefetch copies 16-byte vectors");
  const int64_t width = C * a.H;
  const int64_t step = int64_t{blockDim.x} * VEC;
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    const int64_t row = std::min(group * ROWS + r, a.rows - 1);
    for (int64_t c = 0; c < C; ++c) {
      for (int64_t h = int64_t{threadIdx.x} * VEC; h < a.H; h += step) {
        ptx::CpAsync<16>(stage + (r * C + c) * a.H + h, a.streams + row * width + c * a.H + h);
      }
    }
    if (a.prev_block_output != nullptr) {
      for (int64_t h = int64_t{threadIdx.x} * VEC; h < a.H; h += step) {
        ptx::CpAsync<16>(stage + (ROWS * C + r) * a.H + h, a.prev_block_output + row * a.H + h);
      }
    }
  }
}

// ROWS consecutive rows per block (row-group-stride loop; a short last group repeats its last row,
// computed but never stored).
// Pass 1, per round of kBranchGroup branches: forms S, writes streams_out (and, MODE != kFormTwice, S
// into shared memory) and sums S^2 per thread and branch (sequential over h, j), then per branch a warp
// butterfly whose warp sums lane 0 parks in shared memory; after the round's barrier the warp sums are
// added in warp order (BlockSum's order) into 1 / rms.
// Pass 2 takes S from shared memory (streams and the prologue inputs are read once; each thread reads
// back only the elements it wrote, so no barrier guards them) or forms it again (kFormTwice), and writes
// hn; per thread and branch c, part_c[c'] = sum over its h, j of hn[k] * inject_weight[k, c']
// (sequential, from 0); inject[c'] = part_0 + part_1 + ... in branch order, then BlockSum's order;
// post_gate from the rounded inject.
// CC = C known at compile time (4: the real shape; its inject_weight rows load as 16-byte vectors),
// or 0 for any C (scalar loads, kInjectGroup columns per pass). Pass 1 loads BR1 branches of ROWS rows
// before storing any (stores may alias the loads, so the compiler cannot hoist later loads above them),
// pass 2 BR; two blocks of 256 threads stay resident per SM. ROWS, CC, BR1, BR, MODE and the grid only
// change how loads are issued and amortized: a row's operations, and so its bits, are the same for
// every ROWS, CC, MODE, grid and row count.
template <typename T, int VEC, int ROWS, int CC, int MODE>
__global__ void __launch_bounds__(kMaxNormThreads, 2) HcNormInjectKernel(NormArgs<T> a) {
  // pass 1: up to 8 S vectors in flight (all 4 branches for 1 and 2 rows a block)
  constexpr int BR1 = CC > 0 ? (ROWS * CC <= 8 ? CC : (8 / ROWS > 0 ? 8 / ROWS : 1)) : 1;
  // pass 2: two branches a step with one row a block, one otherwise (more would cost residency: <= 128 registers)
  constexpr int BR = CC > 0 && ROWS == 1 ? 2 : 1;
  static_assert(CC == 0 || (CC % BR == 0 && CC % BR1 == 0 && CC <= kBranchGroup), "BR and BR1 divide CC");
  constexpr int Q = CC > 0 ? CC : kInjectGroup;  // inject columns per pass
  __shared__ float warp_sums[ROWS * kBranchGroup * 32];
  __shared__ float inject_scratch[ROWS * Q * 32];
  extern __shared__ __align__(16) unsigned char norm_smem[];
  float* inv_rms = reinterpret_cast<float*>(norm_smem);  // [ROWS][C]
  const int64_t C = CC > 0 ? CC : a.C;
  T* const smem_t = reinterpret_cast<T*>(norm_smem + NormInvRmsBytes(ROWS, C));
  const bool prologue = a.prev_block_output != nullptr;
  const int64_t stage_elements = NormStageElements(ROWS, C, a.H, prologue);  // kPrefetch
  int stage = 0;
  const int64_t width = C * a.H;
  const int64_t step = int64_t{blockDim.x} * VEC;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int num_warps = blockDim.x >> 5;
  const int64_t groups = (a.rows + ROWS - 1) / ROWS;
  if constexpr (MODE == kPrefetch) {
    if (blockIdx.x < groups) PrefetchRowGroup<T, VEC, ROWS>(a, smem_t, blockIdx.x, C);
    ptx::CpAsyncCommit();
  }
  for (int64_t group = blockIdx.x; group < groups; group += gridDim.x, stage ^= 1) {
    // S of this group: kCache [ROWS][C][H]; kPrefetch the stage's streams, turned into S by pass 1
    T* const s_cache = MODE == kPrefetch ? smem_t + stage * stage_elements : smem_t;
    if constexpr (MODE == kPrefetch) {
      if (group + gridDim.x < groups) {
        PrefetchRowGroup<T, VEC, ROWS>(a, smem_t + (stage ^ 1) * stage_elements, group + gridDim.x, C);
        ptx::CpAsyncCommit();
        ptx::CpAsyncWait<1>();  // this group's copies landed; the next group's fly during both passes
      } else {
        ptx::CpAsyncWait<0>();
      }
    }
    int64_t row[ROWS];
    bool live[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      live[r] = group * ROWS + r < a.rows;
      row[r] = live[r] ? group * ROWS + r : a.rows - 1;
    }
    for (int64_t b0 = 0; b0 < C; b0 += kBranchGroup) {
      const int64_t branches = std::min<int64_t>(kBranchGroup, C - b0);
      for (int64_t cb = 0; cb < branches; cb += BR1) {
        float sum_sq[BR1][ROWS];
#pragma unroll
        for (int b = 0; b < BR1; ++b) {
#pragma unroll
          for (int r = 0; r < ROWS; ++r) sum_sq[b][r] = 0.0f;
        }
        for (int64_t h = int64_t{threadIdx.x} * VEC; h < a.H; h += step) {
          Vec<T, VEC> s[BR1][ROWS];
#pragma unroll
          for (int b = 0; b < BR1; ++b) {
#pragma unroll
            for (int r = 0; r < ROWS; ++r) {
              if constexpr (MODE == kPrefetch) {
                const int64_t c = b0 + cb + b;
                s[b][r] = LoadVec<T, VEC>(s_cache + (r * C + c) * a.H + h);
                if (prologue) {
                  s[b][r] = PrologueVec<T, VEC>(s[b][r], ToFloat(a.prev_post_gate[row[r] * C + c]),
                                                LoadVec<T, VEC>(s_cache + (ROWS * C + r) * a.H + h));
                }
              } else {
                s[b][r] = LoadS<T, VEC>(a, row[r], b0 + cb + b, h);
              }
            }
          }
#pragma unroll
          for (int b = 0; b < BR1; ++b) {
#pragma unroll
            for (int r = 0; r < ROWS; ++r) {
              if (a.streams_out != nullptr && live[r]) {
                StoreVec<T, VEC>(a.streams_out + row[r] * width + (b0 + cb + b) * a.H + h, s[b][r]);
              }
              if constexpr (MODE == kCache) StoreVec<T, VEC>(s_cache + (r * C + b0 + cb + b) * a.H + h, s[b][r]);
              if constexpr (MODE == kPrefetch) {
                if (prologue) StoreVec<T, VEC>(s_cache + (r * C + b0 + cb + b) * a.H + h, s[b][r]);  // S in place
              }
#pragma unroll
              for (int j = 0; j < VEC; ++j) {
                sum_sq[b][r] = MulAdd(ToFloat(s[b][r].v[j]), ToFloat(s[b][r].v[j]), sum_sq[b][r]);
              }
            }
          }
        }
#pragma unroll
        for (int b = 0; b < BR1; ++b) {
#pragma unroll
          for (int r = 0; r < ROWS; ++r) {
            const float v = WarpSum(sum_sq[b][r]);
            if (lane == 0) warp_sums[(r * kBranchGroup + cb + b) * 32 + warp] = v;
          }
        }
      }
      __syncthreads();
      if (threadIdx.x < ROWS * kBranchGroup) {
        const int r = threadIdx.x / kBranchGroup;
        const int64_t cb = threadIdx.x % kBranchGroup;
        if (cb < branches) {
          float total = 0.0f;
          for (int w = 0; w < num_warps; ++w) total += warp_sums[threadIdx.x * 32 + w];  // BlockSum's order
          inv_rms[r * C + b0 + cb] = BranchInvRms(total, a.H, a.epsilon);
        }
      }
      __syncthreads();  // inv_rms of the round written; warp_sums free for the next round
    }
    for (int64_t c0 = 0; c0 < C; c0 += Q) {
      const int cols = CC > 0 ? CC : static_cast<int>(std::min<int64_t>(Q, C - c0));
      float acc[ROWS * Q];
#pragma unroll
      for (int i = 0; i < ROWS * Q; ++i) acc[i] = 0.0f;
      for (int64_t c = 0; c < C; c += BR) {
        float part[BR][ROWS * Q];  // per branch, summed from 0 (the same whatever BR)
#pragma unroll
        for (int b = 0; b < BR; ++b) {
#pragma unroll
          for (int i = 0; i < ROWS * Q; ++i) part[b][i] = 0.0f;
        }
        for (int64_t h = int64_t{threadIdx.x} * VEC; h < a.H; h += step) {
          // the thread's VEC rows of inject_weight are VEC * CC contiguous elements, 16-byte aligned (CC > 0)
          constexpr int kChunk = 16 / static_cast<int>(sizeof(T));
          constexpr int kWeightVecs = CC > 0 ? VEC * CC / kChunk : 1;
          static_assert(CC == 0 || (VEC * CC) % kChunk == 0, "CC > 0 needs VEC * CC * sizeof(T) to be a multiple of 16");
          Vec<T, VEC> scale[BR];
          Vec<T, VEC> s[BR][ROWS];
          Vec<T, kChunk> wv[BR][kWeightVecs];
#pragma unroll
          for (int b = 0; b < BR; ++b) {  // every load of the step before any store
            scale[b] = LoadVec<T, VEC>(a.norm_scale + (c + b) * a.H + h);
#pragma unroll
            for (int r = 0; r < ROWS; ++r) {
              if constexpr (MODE != kFormTwice) {
                s[b][r] = LoadVec<T, VEC>(s_cache + (r * C + c + b) * a.H + h);  // S as pass 1 formed it
              } else {
                s[b][r] = LoadS<T, VEC>(a, row[r], c + b, h);
              }
            }
            if constexpr (CC > 0) {
              const T* w = a.inject_weight + ((c + b) * a.H + h) * C;
#pragma unroll
              for (int i = 0; i < kWeightVecs; ++i) wv[b][i] = LoadVec<T, kChunk>(w + i * kChunk);
            }
          }
#pragma unroll
          for (int b = 0; b < BR; ++b) {
            const T* w = a.inject_weight + ((c + b) * a.H + h) * C + c0;  // inject_weight[(c+b)*H + h, c0]
            Vec<T, VEC> hn[ROWS];
#pragma unroll
            for (int r = 0; r < ROWS; ++r) {
              const float inv = inv_rms[r * C + c + b];
#pragma unroll
              for (int j = 0; j < VEC; ++j) {
                // rounding point: hn
                hn[r].v[j] = FromFloat<T>(NormalizeHn(ToFloat(s[b][r].v[j]), inv, ToFloat(scale[b].v[j])));
              }
              if (c0 == 0 && live[r]) StoreVec<T, VEC>(a.hn + row[r] * width + (c + b) * a.H + h, hn[r]);
            }
            if constexpr (CC > 0) {
#pragma unroll
              for (int j = 0; j < VEC; ++j) {
#pragma unroll
                for (int q = 0; q < CC; ++q) {
                  const float wq = ToFloat(wv[b][(j * CC + q) / kChunk].v[(j * CC + q) % kChunk]);
#pragma unroll
                  for (int r = 0; r < ROWS; ++r) part[b][r * Q + q] = fmaf(ToFloat(hn[r].v[j]), wq, part[b][r * Q + q]);
                }
              }
            } else {
#pragma unroll
              for (int j = 0; j < VEC; ++j) {
#pragma unroll
                for (int q = 0; q < Q; ++q) {
                  if (q < cols) {
                    const float wq = ToFloat(w[j * C + q]);
#pragma unroll
                    for (int r = 0; r < ROWS; ++r) part[b][r * Q + q] = fmaf(ToFloat(hn[r].v[j]), wq, part[b][r * Q + q]);
                  }
                }
              }
            }
          }
        }
#pragma unroll
        for (int b = 0; b < BR; ++b) {
#pragma unroll
          for (int i = 0; i < ROWS * Q; ++i) acc[i] = __fadd_rn(acc[i], part[b][i]);  // branch order
        }
      }
      BlockSums<ROWS * Q>(acc, inject_scratch);
      if (threadIdx.x == 0) {
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
#pragma unroll
          for (int q = 0; q < Q; ++q) {
            if (q < cols && live[r]) {
              const float inject = RoundToT<T>(acc[r * Q + q]);  // rounding point: inject
              // rounding point: post_gate
              a.post_gate[row[r] * C + c0 + q] = FromFloat<T>(PostGate(inject, a.gate_div, a.gate_mul));
            }
          }
        }
      }
    }
  }
}

template <typename T>
struct SplitReduceArgs {
  const float* down_partial;  // splits slices of (rows, R), down_stride floats apart
  int64_t down_stride, splits;
  T* hidden;           // (rows, R)
  int64_t down_count;  // rows * R
  float silu_alpha;
};

// The split down product's reduction, grid-stride over groups of VEC consecutive outputs of rows*R
// (consecutive threads, consecutive groups of one slice): each output adds its slices in the fixed
// order b = 0, 1, ..., splits - 1 in fp32, whatever the row count; then down is rounded to T and becomes
// hidden = ScaledSiLU(down) (Z, SG, hidden rounded in ScaledSilu). VEC only widens the loads.
template <typename T, int VEC>
__global__ void __launch_bounds__(kElementwiseThreads) HcSplitReduceKernel(SplitReduceArgs<T> a) {
  const int64_t count = a.down_count / VEC;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < count; i += int64_t{gridDim.x} * blockDim.x) {
    const float* __restrict__ partial = a.down_partial + i * VEC;
    float acc[VEC];
#pragma unroll
    for (int j = 0; j < VEC; ++j) acc[j] = 0.0f;
#pragma unroll 8
    for (int64_t b = 0; b < a.splits; ++b) {  // unrolled: 8 slices' loads in flight
      const Vec<float, VEC> p = LoadVec<float, VEC>(partial + b * a.down_stride);
#pragma unroll
      for (int j = 0; j < VEC; ++j) acc[j] = __fadd_rn(acc[j], p.v[j]);
    }
    Vec<T, VEC> out;
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const float down = RoundToT<T>(acc[j]);  // rounding point: down
      out.v[j] = FromFloat<T>(ScaledSilu<T>(down, a.silu_alpha));
    }
    StoreVec<T, VEC>(a.hidden + i * VEC, out);
  }
}

// For a product cuBLASLt has no algorithm for (seen: 16-bit types with N = 1), sliced like HcLtGemm's
// products: with Ks = K / splits,
//   out[b * out_stride + m * N + n] = sum over k in [b*Ks, (b+1)*Ks) of act[m, k] * weight[k, n]
// in fp32, stored as Out: T for a plain product (splits = 1: the rounding point up), float for the
// partials of a split product (down, rounded by HcSplitReduceKernel). One block per
// (row, slice); each thread owns outputs n = t, t + blockDim.x, ... (weight rows read coalesced) and
// sums its slice sequentially, k in order: a fixed order that does not depend on the row count (not
// cuBLASLt's order, but whether this kernel runs depends on type, N, K, splits and alignment only).
template <typename T, typename Out>
__global__ void __launch_bounds__(kElementwiseThreads)
    HcFallbackGemmKernel(const T* act, const T* weight, Out* out, int64_t M, int64_t N, int64_t K, int64_t splits,
                         int64_t out_stride) {
  const int64_t Ks = K / splits;
  for (int64_t item = blockIdx.x; item < M * splits; item += gridDim.x) {
    const int64_t m = item / splits;
    const int64_t b = item - m * splits;
    const T* a = act + m * K + b * Ks;   // act[m, b*Ks ...]
    const T* w = weight + b * Ks * N;    // weight[b*Ks ..., 0]
    for (int64_t n = threadIdx.x; n < N; n += blockDim.x) {
      float acc = 0.0f;
      for (int64_t k = 0; k < Ks; ++k) acc = fmaf(ToFloat(a[k]), ToFloat(w[k * N + n]), acc);
      out[b * out_stride + m * N + n] = FromFloat<Out>(acc);
    }
  }
}

template <typename T>
struct EpilogueArgs {
  const T* hn;
  const T* up;  // rounded up projection (rows, C*H)
  T* pre_output;
  int64_t rows, C, H;
  float reduction_scale;
};

// pre_output[row, h] = reduction_scale * sum_c hn[row, c, h] * g[row, c, h] (c in order), with
// g = sigmoid(up) rounded. (post_gate comes from HcNormInjectKernel.) In 16-bit T a branch's VEC sigmoids
// take SigmoidInRange where all VEC up allow it: the same bits as Sigmoid, without a branch per element
// around the division's slow path (measured on an H200, real shape, bf16, ncu: 67.5 -> 56.2 us at 4096
// rows, 19.7 -> 16.7 at 1024, 8.3 -> 7.2 at 256).
template <typename T, int VEC>
__global__ void __launch_bounds__(kElementwiseThreads) HcGateEpilogueKernel(EpilogueArgs<T> a) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  const int64_t start = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  const int64_t groups_per_row = a.H / VEC;
  const int64_t width = a.C * a.H;
  for (int64_t i = start; i < a.rows * groups_per_row; i += stride) {
    const int64_t row = i / groups_per_row;
    const int64_t h = (i - row * groups_per_row) * VEC;
    float acc[VEC];
#pragma unroll
    for (int j = 0; j < VEC; ++j) acc[j] = 0.0f;
#pragma unroll 4
    for (int64_t c = 0; c < a.C; ++c) {  // unrolled: the branches' loads are issued together
      const Vec<T, VEC> hn = LoadVec<T, VEC>(a.hn + row * width + c * a.H + h);
      const Vec<T, VEC> up = LoadVec<T, VEC>(a.up + row * width + c * a.H + h);
      // then the VEC sigmoids are straight-line code (SigmoidInRange: the same bits, checked for 16-bit x)
      auto mix = [&](auto sigmoid) {
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          const float g = RoundToT<T>(sigmoid(ToFloat(up.v[j])));  // rounding point: g
          acc[j] = MulAdd(ToFloat(hn.v[j]), g, acc[j]);
        }
      };
      bool in_range = sizeof(T) == 2;
#pragma unroll
      for (int j = 0; j < VEC; ++j) in_range &= ToFloat(up.v[j]) >= kSigmoidInRangeMin;
      if (in_range) {
        mix([](float x) { return SigmoidInRange(x); });
      } else {
        mix([](float x) { return Sigmoid(x); });
      }
    }
    Vec<T, VEC> out;
#pragma unroll
    for (int j = 0; j < VEC; ++j) out.v[j] = FromFloat<T>(__fmul_rn(a.reduction_scale, acc[j]));  // rounding point: pre_output
    StoreVec<T, VEC>(a.pre_output + row * a.H + h, out);
  }
}

// Outputs a thread of HcSplitReduceKernel: 4 or 2 where they divide the count, the hidden chunk's
// alignment (in elements: partial slices start 256-byte aligned) allows it, and kMinReduceBlocks blocks
// remain (the real shape at 256 rows: 320 blocks of one output a thread, where 4 left 80 blocks and
// took 11.1 us against 7.8); only the loads widen, no bit changes.
constexpr int64_t kMinReduceBlocks = 512;
int ReduceVec(int64_t count, size_t hidden_align_elements) {
  for (int vec = 4; vec > 1; vec /= 2) {
    if (count % vec == 0 && hidden_align_elements >= static_cast<size_t>(vec) &&
        count / vec >= kMinReduceBlocks * kElementwiseThreads) {
      return vec;
    }
  }
  return 1;
}

// Widest vector (16 bytes at most) that divides H and fits the alignment of every pointer given.
template <typename T>
int PickVec(int64_t H, std::initializer_list<const void*> pointers) {
  int vec = static_cast<int>(16 / sizeof(T));
  for (const void* p : pointers) {
    if (p == nullptr) continue;
    while (vec > 1 && AlignmentOf(p) < vec * sizeof(T)) vec /= 2;
  }
  while (vec > 1 && H % vec != 0) vec /= 2;
  return vec;
}

int NormThreads(int64_t H, int vec) {
  const int64_t groups = (H + vec - 1) / vec;
  const int64_t warps = (groups + 31) / 32;
  return static_cast<int>(std::min<int64_t>(std::max<int64_t>(warps, 1) * 32, kMaxNormThreads));
}

unsigned ElementwiseBlocks(int64_t count) {
  return static_cast<unsigned>(
      std::max<int64_t>(1, std::min((count + kElementwiseThreads - 1) / kElementwiseThreads, kMaxElementwiseBlocks)));
}

// Instantiates KERNEL<T, VEC> for the VEC chosen at run time and launches it.
#define HC_DISPATCH_VEC(vec, KERNEL, T, grid, block, ...)                 \
  switch (vec) {                                                           \
    case 8: KERNEL<T, 8><<<grid, block, 0, stream>>>(__VA_ARGS__); break; \
    case 4: KERNEL<T, 4><<<grid, block, 0, stream>>>(__VA_ARGS__); break; \
    case 2: KERNEL<T, 2><<<grid, block, 0, stream>>>(__VA_ARGS__); break; \
    default: KERNEL<T, 1><<<grid, block, 0, stream>>>(__VA_ARGS__); break; \
  }

// A failed step as a status (ok when e is the success value of its kind).
HcLaunchStatus CudaFailure(const char* step, cudaError_t e) {
  return e == cudaSuccess ? HcLaunchStatus{} : HcLaunchStatus{step, e, CUBLAS_STATUS_SUCCESS};
}
HcLaunchStatus CublasFailure(const char* step, cublasStatus_t e) {
  return e == CUBLAS_STATUS_SUCCESS ? HcLaunchStatus{} : HcLaunchStatus{step, cudaSuccess, e};
}

// One plain GEMM of the general path (out rounded to T): cuBLASLt's pinned algorithm, or the fallback
// kernel where there is none.
template <typename T>
HcLaunchStatus Gemm(const char* step, HcLtGemm& gemm, const T* act, const T* weight, T* out, int64_t M, int64_t N,
                    int64_t K, int64_t plan_rows, void* workspace, cudaStream_t stream) {
  bool available = false;
  if (auto s = CublasFailure(step, gemm.Available<T>(act, weight, out, N, K, &available, plan_rows)); !s.ok()) return s;
  if (available) return CublasFailure(step, gemm.Run<T>(act, weight, out, M, N, K, workspace, stream, plan_rows));
  const unsigned blocks = static_cast<unsigned>(std::min(M, kMaxRowBlocks));
  HcFallbackGemmKernel<T, T><<<blocks, kElementwiseThreads, 0, stream>>>(act, weight, out, M, N, K, 1, 0);
  return CudaFailure("HcFallbackGemmKernel", cudaGetLastError());
}

// One split GEMM of the general path (fp32 partials, HcLtGemm::RunSplit's layout) for M rows: cuBLASLt
// where `use_lt` (AvailableSplit, asked once per launch), else the fallback kernel.
template <typename T>
HcLaunchStatus SplitGemm(const char* step, HcLtGemm& gemm, bool use_lt, const T* act, const T* weight,
                         float* partial, int64_t M, int64_t N, int64_t K, int64_t splits, int64_t plan_rows,
                         void* workspace, cudaStream_t stream) {
  if (use_lt) {
    return CublasFailure(step, gemm.RunSplit<T>(act, weight, partial, M, N, K, splits, workspace, stream, plan_rows));
  }
  const unsigned blocks = static_cast<unsigned>(std::min(M * splits, kMaxRowBlocks));
  HcFallbackGemmKernel<T, float><<<blocks, kElementwiseThreads, 0, stream>>>(act, weight, partial, M, N, K, splits,
                                                                              HcPartialStride(M, N));
  return CudaFailure("HcFallbackGemmKernel", cudaGetLastError());
}

// How the down and up products run in the row range of `rows` (see the file comment): the K split,
// the rows both pinned algorithms are planned for, and the largest row chunk of the split product.
struct RangePlan {
  const char* name = "";
  int64_t splits = 1, split_plan_rows = 0, up_plan_rows = 0, max_chunk_rows = 0;
};

RangePlan PlanRange(const HcLowRankMixParams& p) {
  const int64_t K = p.width();
  if (p.rows >= kHcPrefillMinRows) {
    return {"prefill", HcPrefillSplitCount(K), HcLtGemm::kPrefillPlanRows, HcLtGemm::kPrefillPlanRows,
            kMaxPrefillChunkRows};
  }
  if (p.rows >= kHcMidMinRows) {
    return {"mid", HcMidSplitCount(K), HcLtGemm::kMidPlanRows, HcLtGemm::kPlanRows, kMaxChunkRows};
  }
  return {"few-row", HcSplitCount(K), HcLtGemm::kSplitPlanRows, HcLtGemm::kPlanRows, kMaxChunkRows};
}

// Rows per chunk of the split product. The fp32 partials take splits * R floats per row, so the
// product runs over at most this many rows at a time and reuses one partial buffer: the largest
// multiple of kChunkRowsMultiple whose partials fit kPartialBudgetBytes, within [kChunkRowsMultiple,
// max_chunk_rows] (the real shape: 40 * 320 * 4 bytes a row -> 1024 rows, 52 MB; prefill 4 * 320 * 4
// bytes a row -> 4096 rows, 21 MB). It depends on the shape and the range, never on the row count
// inside the range, and chunking keeps rows independent: every chunk runs the same pinned algorithm
// (its hn pointer is a multiple of kChunkRowsMultiple rows, so at least 256 bytes, past the previous
// one, so the alignment HcLtGemm keys on is the same) and the same reduction.
int64_t SplitChunkRows(const HcLowRankMixParams& p, const RangePlan& range) {
  const int64_t per_row = range.splits * p.R * static_cast<int64_t>(sizeof(float));
  const int64_t fit = kPartialBudgetBytes / per_row / kChunkRowsMultiple * kChunkRowsMultiple;
  return std::min(std::max(fit, kChunkRowsMultiple), range.max_chunk_rows);
}

// The scratch: hn, up (rows, C*H); hidden (rows, R) in T; then the fp32 partials of one chunk of
// m = min(rows, SplitChunkRows) rows: splits slices of down (HcPartialStride(m, R) floats each), then
// cuBLASLt's workspace (HcLtGemm::kWorkspaceBytes). Every part starts 256-byte aligned (offsets from
// the base are multiples of kScratchAlign).
struct ScratchLayout {
  RangePlan range;
  int64_t chunk_rows = 0;  // min(rows, SplitChunkRows(p, range))
  size_t hn = 0, up = 0, hidden = 0, down_partial = 0, workspace = 0, total = 0;  // byte offsets
};

ScratchLayout MakeScratchLayout(const HcLowRankMixParams& p, size_t element_size) {
  const size_t rows = static_cast<size_t>(p.rows);
  const size_t width = static_cast<size_t>(p.width());
  ScratchLayout l;
  l.range = PlanRange(p);
  l.chunk_rows = std::min(p.rows, SplitChunkRows(p, l.range));
  l.hn = 0;
  l.up = l.hn + AlignUp(rows * width * element_size);
  l.hidden = l.up + AlignUp(rows * width * element_size);
  l.down_partial = l.hidden + AlignUp(rows * static_cast<size_t>(p.R) * element_size);
  l.workspace =
      l.down_partial + AlignUp(static_cast<size_t>(l.range.splits * HcPartialStride(l.chunk_rows, p.R)) * sizeof(float));
  l.total = l.workspace + HcLtGemm::kWorkspaceBytes;
  return l;
}

// Rows per block of HcNormInjectKernel (C = 4): more rows per block once there are blocks enough to
// fill the GPU (the choice changes no bit, see the kernel).
int NormRowsPerBlock(int64_t rows) { return rows >= 2048 ? 4 : rows >= 512 ? 2 : 1; }

// C = 4 with 16-byte loadable inject_weight rows runs the compile-time-C kernel, ROWS rows a block;
// any other C the generic kernel, one row a block (same bits either way).
template <typename T, int VEC>
bool NormInjectFixedC(const NormArgs<T>& a) {
  if constexpr ((VEC * 4 * sizeof(T)) % 16 == 0) {
    return a.C == 4 && AlignmentOf(a.inject_weight) >= 16;
  }
  return false;
}

// Launches one instantiation with `smem` bytes of dynamic shared memory (opted in above 48 KB);
// kPrefetch prefers shared memory to L1 (two blocks of its stages fit an SM only then) and runs a
// persistent grid of at most the resident blocks.
template <typename T, int VEC, int ROWS, int CC, int MODE>
cudaError_t LaunchNormInjectKernel(const NormArgs<T>& a, int threads, size_t smem, cudaStream_t stream,
                                   unsigned* blocks) {
  auto* kernel = HcNormInjectKernel<T, VEC, ROWS, CC, MODE>;
  const int64_t groups = (a.rows + ROWS - 1) / ROWS;
  *blocks = static_cast<unsigned>(std::min(groups, kMaxRowBlocks));
  if (smem > 48 * 1024) {
    if (const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                   static_cast<int>(smem));
        e != cudaSuccess) {
      return e;
    }
  }
  if constexpr (MODE == kPrefetch) {
    if (const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                                   static_cast<int>(cudaSharedmemCarveoutMaxShared));
        e != cudaSuccess) {
      return e;
    }
    int device = 0, sms = 0, per_sm = 0;
    if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
    if (const cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device); e != cudaSuccess) {
      return e;
    }
    if (const cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem);
        e != cudaSuccess) {
      return e;
    }
    *blocks = static_cast<unsigned>(std::min<int64_t>(*blocks, std::max(1, per_sm * sms)));
  }
  kernel<<<*blocks, threads, smem, stream>>>(a);
  return cudaGetLastError();
}

// Picks the instantiation (no choice changes a bit): the fixed-C kernel with rows per block by row
// count, or the generic one (one row a block); kPrefetch from kNormPrefetchMinRows rows where the vectors
// are 16 bytes (fixed C) and two stages of kNormPrefetchRows rows fit kMaxNormCacheBytes, else kCache
// where the rows fit it (fewer rows a block until they do), else kFormTwice (very wide rows).
// Measured on an H200 (real shape, bf16, ncu): 4096 rows 117.6 us prefetched (2 rows a block) against
// 137.5 cached (4 rows a block); 1024 rows 32.2 against 31.8 (2 rows a block both); 256 rows 13.5 against
// 11.8 (one row a block both): so kPrefetch only from 2048 rows, where the grid has groups to spare.
template <typename T, int VEC>
cudaError_t LaunchNormInject(const NormArgs<T>& a, int* rows_per_block, NormMode* mode, int threads,
                             cudaStream_t stream, unsigned* blocks) {
  const bool fixed_c = NormInjectFixedC<T, VEC>(a);
  const bool prologue = a.prev_block_output != nullptr;
  auto smem = [&](NormMode m, int rows) { return NormSmemBytes(m, rows, a.C, a.H, prologue, sizeof(T)); };
  if (!fixed_c) *rows_per_block = 1;
  *mode = kFormTwice;
  if (fixed_c && VEC * sizeof(T) == 16 && a.rows >= kNormPrefetchMinRows &&
      smem(kPrefetch, kNormPrefetchRows) <= kMaxNormCacheBytes) {
    *mode = kPrefetch;
    *rows_per_block = kNormPrefetchRows;
  }
  if (*mode == kFormTwice) {
    while (*rows_per_block > 1 && smem(kCache, *rows_per_block) > kMaxNormCacheBytes) *rows_per_block /= 2;
    if (smem(kCache, *rows_per_block) <= kMaxNormCacheBytes) *mode = kCache;
  }
  const size_t bytes = smem(*mode, *rows_per_block);
  if constexpr ((VEC * 4 * sizeof(T)) % 16 == 0) {
    if (fixed_c) {
      if constexpr (VEC * sizeof(T) == 16) {
        if (*mode == kPrefetch) {
          return LaunchNormInjectKernel<T, VEC, kNormPrefetchRows, 4, kPrefetch>(a, threads, bytes, stream, blocks);
        }
      }
      if (*mode == kCache) {
        switch (*rows_per_block) {
          case 4: return LaunchNormInjectKernel<T, VEC, 4, 4, kCache>(a, threads, bytes, stream, blocks);
          case 2: return LaunchNormInjectKernel<T, VEC, 2, 4, kCache>(a, threads, bytes, stream, blocks);
          default: return LaunchNormInjectKernel<T, VEC, 1, 4, kCache>(a, threads, bytes, stream, blocks);
        }
      }
      return LaunchNormInjectKernel<T, VEC, 1, 4, kFormTwice>(a, threads, bytes, stream, blocks);
    }
  }
  return *mode == kCache ? LaunchNormInjectKernel<T, VEC, 1, 0, kCache>(a, threads, bytes, stream, blocks)
                         : LaunchNormInjectKernel<T, VEC, 1, 0, kFormTwice>(a, threads, bytes, stream, blocks);
}

}  // namespace

std::string HcLaunchStatus::Message() const {
  if (ok()) return {};
  if (cuda != cudaSuccess) {
    return std::string(step) + ": " + cudaGetErrorName(cuda) + ": " + cudaGetErrorString(cuda);
  }
  return std::string(step) + ": " + cublasLtGetStatusName(cublas) + ": " + cublasLtGetStatusString(cublas);
}

size_t HcGeneralScratchBytes(const HcLowRankMixParams& p, size_t element_size) {
  return MakeScratchLayout(p, element_size).total;
}

template <typename T>
HcLaunchStatus LaunchHcGeneral(const HcLowRankMixParams& p, const HcDeviceTensors<T>& t, void* scratch,
                               HcLtGemm& gemm, cudaStream_t stream, bool debug) {
  const int64_t rows = p.rows, C = p.C, H = p.H, R = p.R, width = p.width();
  const ScratchLayout layout = MakeScratchLayout(p, sizeof(T));
  const RangePlan& range = layout.range;
  char* base = static_cast<char*>(scratch);
  T* hn = reinterpret_cast<T*>(base + layout.hn);
  T* up = reinterpret_cast<T*>(base + layout.up);
  T* hidden = reinterpret_cast<T*>(base + layout.hidden);
  float* down_partial = reinterpret_cast<float*>(base + layout.down_partial);
  void* workspace = base + layout.workspace;  // cuBLASLt's (HcLtGemm::kWorkspaceBytes)

  const NormArgs<T> norm{t.streams, t.norm_scale, t.inject_weight, t.prev_block_output, t.prev_post_gate,
                         t.streams_out, hn, t.post_gate, rows, C, H, p.epsilon, p.gate_div, p.gate_mul};
  const int norm_vec = PickVec<T>(H, {t.streams, t.norm_scale, t.prev_block_output, t.streams_out, hn});
  const int norm_threads = NormThreads(H, norm_vec);
  int norm_rows = NormRowsPerBlock(rows);  // 1 where the generic-C kernel runs
  NormMode norm_mode = kFormTwice;
  unsigned norm_blocks = 0;
  cudaError_t norm_status = cudaSuccess;
  switch (norm_vec) {
    case 8: norm_status = LaunchNormInject<T, 8>(norm, &norm_rows, &norm_mode, norm_threads, stream, &norm_blocks); break;
    case 4: norm_status = LaunchNormInject<T, 4>(norm, &norm_rows, &norm_mode, norm_threads, stream, &norm_blocks); break;
    case 2: norm_status = LaunchNormInject<T, 2>(norm, &norm_rows, &norm_mode, norm_threads, stream, &norm_blocks); break;
    default: norm_status = LaunchNormInject<T, 1>(norm, &norm_rows, &norm_mode, norm_threads, stream, &norm_blocks); break;
  }
  if (auto s = CudaFailure("HcNormInjectKernel", norm_status); !s.ok()) return s;

  // Whether cuBLASLt runs the split product: asked once, with the base pointers (every chunk's
  // pointers have the same alignment), so every chunk and every row count of the range takes the same route.
  static const char* const kDownStep = "cuBLASLt GEMM down = hn @ down_weight (split K)";
  bool down_lt = false;
  if (auto s = CublasFailure(kDownStep, gemm.AvailableSplit<T>(hn, t.down_weight, down_partial, R, width, range.splits,
                                                                &down_lt, range.split_plan_rows));
      !s.ok()) {
    return s;
  }
  unsigned reduce_blocks = 0;
  for (int64_t r0 = 0; r0 < rows; r0 += layout.chunk_rows) {
    const int64_t m = std::min(layout.chunk_rows, rows - r0);
    if (auto s = SplitGemm<T>(kDownStep, gemm, down_lt, hn + r0 * width, t.down_weight, down_partial, m, R, width,
                              range.splits, range.split_plan_rows, workspace, stream);
        !s.ok()) {
      return s;
    }
    const SplitReduceArgs<T> reduce{down_partial, HcPartialStride(m, R), range.splits, hidden + r0 * R, m * R,
                                    p.silu_alpha};
    const int reduce_vec = ReduceVec(m * R, AlignmentOf(hidden + r0 * R) / sizeof(T));
    reduce_blocks = ElementwiseBlocks(m * R / reduce_vec);
    switch (reduce_vec) {
      case 4: HcSplitReduceKernel<T, 4><<<reduce_blocks, kElementwiseThreads, 0, stream>>>(reduce); break;
      case 2: HcSplitReduceKernel<T, 2><<<reduce_blocks, kElementwiseThreads, 0, stream>>>(reduce); break;
      default: HcSplitReduceKernel<T, 1><<<reduce_blocks, kElementwiseThreads, 0, stream>>>(reduce); break;
    }
    if (auto s = CudaFailure("HcSplitReduceKernel", cudaGetLastError()); !s.ok()) return s;
  }

  if (auto s = Gemm<T>("cuBLASLt GEMM up = hidden @ up_weight", gemm, hidden, t.up_weight, up, rows, width, R,
                       range.up_plan_rows, workspace, stream);
      !s.ok()) {
    return s;
  }

  const EpilogueArgs<T> epi{hn, up, t.pre_output, rows, C, H, p.reduction_scale};
  const int epi_vec = PickVec<T>(H, {hn, up, t.pre_output});
  const unsigned epi_blocks = ElementwiseBlocks(rows * (H / epi_vec));
  HC_DISPATCH_VEC(epi_vec, HcGateEpilogueKernel, T, epi_blocks, kElementwiseThreads, epi);
  if (auto s = CudaFailure("HcGateEpilogueKernel", cudaGetLastError()); !s.ok()) return s;

  if (debug) {
    std::fprintf(stderr,
                 "hcfuse: HyperConnectionLowRankMix general path (%s range) rows=%lld C=%lld H=%lld R=%lld: "
                 "HcNormInjectKernel grid %u x %d (vec %d, %d rows per block, S %s), down split into %lld K slices of "
                 "%lld (%s, planned at %lld rows) in chunks of %lld rows, HcSplitReduceKernel grid %u x %d (last "
                 "chunk), up planned at %lld rows, HcGateEpilogueKernel grid %u x %d (vec %d)\n",
                 range.name, static_cast<long long>(rows), static_cast<long long>(C),
                 static_cast<long long>(H), static_cast<long long>(R), norm_blocks, norm_threads, norm_vec, norm_rows,
                 norm_mode == kPrefetch ? "prefetched by cp.async, kept in shared memory"
                 : norm_mode == kCache  ? "kept in shared memory"
                                        : "formed twice",
                 static_cast<long long>(range.splits), static_cast<long long>(width / range.splits),
                 down_lt ? "cuBLASLt" : "fallback kernel", static_cast<long long>(range.split_plan_rows),
                 static_cast<long long>(layout.chunk_rows), reduce_blocks, kElementwiseThreads,
                 static_cast<long long>(range.up_plan_rows), epi_blocks, kElementwiseThreads, epi_vec);
  }
  return {};
}

#define HC_INSTANTIATE_GENERAL(T)                                                                        \
  template HcLaunchStatus LaunchHcGeneral<T>(const HcLowRankMixParams&, const HcDeviceTensors<T>&, void*, \
                                             HcLtGemm&, cudaStream_t, bool);
HC_INSTANTIATE_GENERAL(float)
HC_INSTANTIATE_GENERAL(__half)
HC_INSTANTIATE_GENERAL(__nv_bfloat16)

}  // namespace cuda
}  // namespace hcfuse
