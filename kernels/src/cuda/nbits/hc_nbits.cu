// CUDA kernels of ai.hcfuse::HyperConnectionLowRankMixNBits (launcher: hc_nbits_cuda.h). Every T, bits 4
// and 8, every block_size, zero points absent, packed or T, each projection dense or quantized, any shape
// and row count.
//
// Order of operations (docs/QUANTIZED.md, "CUDA kernel"); each is fixed by the shape alone, never by the row
// count, the chunk, the row tile or the grid, so results are deterministic and row independent:
//   norm's sum of squares: per thread strided over h (thread t: h = t, t + 1024, ...; MulAdd), a warp
//     butterfly, the warp sums added in warp order (BlockSum), as the dense general path;
//   down_inject (K = C*H): K cut into slices of kHcNBitsSliceK (the last one shorter); within a slice k
//     ascends from the slice's first k in one fmaf chain from 0; the slices' fp32 partials are added in slice
//     order from 0 by the block that stores the last of them (whichever it is, the same sum);
//   up (K = R): one fmaf chain from 0 over k = 0, ..., R-1 (HcNBitsUpMixKernel, C <= 128), or sliced as
//     down_inject (C > 128: HcNBitsProductKernel and HcNBitsUpGateKernel);
//   pre_output: branches added in order c = 0, ..., C-1 (MulAdd), then times reduction_scale.
// A quantized weight is (q - zero point) * scale in fp32, the CPU kernel's arithmetic: q and the zero point
// widened to fp32 (a zero point of T exactly), one __fsub_rn, one __fmul_rn; it enters the product as fp32.
// Every rounding point goes through RoundToT / FromFloat, the gate through PostGate, the SiLU through
// ScaledSilu (hc_common.cuh).
#include "cuda/nbits/hc_nbits_cuda.h"

#include <algorithm>
#include <type_traits>

#include "cuda/common/hc_common.cuh"
#include "cuda/common/hc_ptx.cuh"
#include "cuda/nbits/hc_nbits_weight.cuh"

namespace hcfuse {
namespace cuda {
namespace {

// The norm: one block of kNormThreads per (row, branch) (the real shape's 2560 features: 3 a thread).
constexpr int kNormThreads = 1024;
constexpr int kNormBatch = 4;
constexpr int kProductThreads = 128;  // one column of the product a thread
constexpr int kEpilogueThreads = 256;
constexpr int kChunkK = 16;  // k per load of B: 8 bytes at 4 bits, 16 at 8 (block_size >= 16 divides into them)
constexpr int kSliceK = static_cast<int>(kHcNBitsSliceK);  // as a value device code can take
constexpr int kChunksPerSlice = kSliceK / kChunkK;
// k of hidden the fused up kernel stages at a time (a multiple of kSliceK; 16 KB at 8 rows)
constexpr int kUpStageK = 4 * kSliceK;
constexpr int64_t kMaxGrid = int64_t{1} << 20;  // grid cap of the grid-stride kernels

template <typename T>
struct NormArgs {
  const T* streams;            // (rows, C*H), the chunk's first row
  const T* norm_scale;         // (C*H)
  const T* prev_block_output;  // (rows, H), null without the prologue
  const T* prev_post_gate;     // (rows, C)
  T* streams_out;              // null when not requested
  T* hn;                       // (rows, C*H)
  int64_t rows, C, H;
  float epsilon;
  unsigned* counters;  // the down_inject product's, zeroed here (the product after this kernel counts in them)
  int64_t counter_count;
};

// S of feature h of one branch of one row: streams as they are, or the prologue's multiply-add rounded to T.
template <typename T, bool PROLOGUE>
__device__ __forceinline__ T FormS(const NormArgs<T>& a, int64_t row, int64_t c, int64_t h, float gate) {
  const T s = a.streams[(row * a.C + c) * a.H + h];
  if constexpr (PROLOGUE) {
    // rounding point: S
    return FromFloat<T>(PrologueS<T>(ToFloat(s), gate, ToFloat(a.prev_block_output[row * a.H + h])));
  } else {
    return s;
  }
}

// One block per (row, branch), grid-stride: the branch's sum of squares of S (thread-strided over h, BlockSum),
// 1 / rms, then S formed again (the same operations, the same bits), streams_out and hn. A thread's features
// h = t, t + kNormThreads, ... go in batches of kNormBatch whose loads are issued before any is used or stored;
// its sum of squares still adds them in ascending h.
template <typename T, bool PROLOGUE>
__global__ void __launch_bounds__(kNormThreads) HcNBitsNormKernel(NormArgs<T> a) {
  ptx::WaitOnProducer();  // launched early (PDL): streams and the prologue inputs come from upstream
  ptx::ReleaseDependents();
  if (blockIdx.x == 0) {
    for (int64_t i = threadIdx.x; i < a.counter_count; i += blockDim.x) a.counters[i] = 0;
  }
  __shared__ float warp_sums[32];
  const int64_t step = blockDim.x;
  for (int64_t item = blockIdx.x; item < a.rows * a.C; item += gridDim.x) {
    const int64_t row = item / a.C, c = item - row * a.C;
    const float gate = PROLOGUE ? ToFloat(a.prev_post_gate[row * a.C + c]) : 0.0f;
    const int64_t base = (row * a.C + c) * a.H;
    float sum_sq = 0.0f;
    for (int64_t h0 = threadIdx.x; h0 < a.H; h0 += kNormBatch * step) {
      T s[kNormBatch];
#pragma unroll
      for (int j = 0; j < kNormBatch; ++j) {
        if (h0 + j * step < a.H) s[j] = FormS<T, PROLOGUE>(a, row, c, h0 + j * step, gate);
      }
#pragma unroll
      for (int j = 0; j < kNormBatch; ++j) {
        if (h0 + j * step < a.H) sum_sq = MulAdd<T>(ToFloat(s[j]), ToFloat(s[j]), sum_sq);
      }
    }
    const float inv_rms = BranchInvRms(BlockSum(sum_sq, warp_sums), a.H, a.epsilon);
    for (int64_t h0 = threadIdx.x; h0 < a.H; h0 += kNormBatch * step) {
      T s[kNormBatch];
      float scale[kNormBatch];
#pragma unroll
      for (int j = 0; j < kNormBatch; ++j) {
        if (h0 + j * step < a.H) {
          s[j] = FormS<T, PROLOGUE>(a, row, c, h0 + j * step, gate);
          scale[j] = ToFloat(a.norm_scale[c * a.H + h0 + j * step]);
        }
      }
#pragma unroll
      for (int j = 0; j < kNormBatch; ++j) {
        const int64_t h = h0 + j * step;
        if (h >= a.H) continue;
        if (a.streams_out != nullptr) a.streams_out[base + h] = s[j];
        a.hn[base + h] = FromFloat<T>(NormalizeHn(ToFloat(s[j]), inv_rms, scale[j]));  // rounding point: hn
      }
    }
  }
}

// The sum of one output's slices in slice order from 0. The partials are loaded kSumBatch at a time before
// they are added (one load latency a batch, not one a slice), from L2 (another block wrote them).
constexpr int kSumBatch = 32;
__device__ __forceinline__ float SliceSum(const float* __restrict__ partial, int64_t slices, int64_t slice_stride) {
  float acc = 0.0f;
  for (int64_t s0 = 0; s0 < slices; s0 += kSumBatch) {
    float v[kSumBatch];
#pragma unroll
    for (int j = 0; j < kSumBatch; ++j) v[j] = s0 + j < slices ? __ldcg(partial + (s0 + j) * slice_stride) : 0.0f;
#pragma unroll
    for (int j = 0; j < kSumBatch; ++j) {
      if (s0 + j < slices) acc = __fadd_rn(acc, v[j]);
    }
  }
  return acc;
}

// down_inject's epilogue, run by the block that stores a (column group, row tile)'s last slice.
template <typename T>
struct DownInjectEpilogue {
  unsigned* counters;  // [row tiles][column groups] slices stored, zeroed by the norm; null: no epilogue
  int64_t R, C;
  T* hidden;     // (rows, R)
  T* post_gate;  // (rows, C), the chunk's first row
  float silu_alpha, gate_div, gate_mul;
};

template <typename T>
struct ProductArgs {
  const T* x;  // (rows, K) activations of the chunk
  HcNBitsProjection<T> w;
  int64_t rows, K, N, block_size;
  float* partial;      // [slices][rows][N]
  bool weights_early;  // B, scales and zero points are constant: read before the wait (PDL)
  DownInjectEpilogue<T> epilogue;
};

// One column's weights over one K slice [k0, k0 + klen) of a projection [K, N]. Load issues every load the
// slice needs (quantized: B's bytes of the column, one contiguous run read as 8-byte words, and each chunk's
// scale and zero point; dense: nothing, its T weights are read as they are used, coalesced across the columns);
// Accumulate adds x[r * ldx + k] * w[k] to acc[r] for k ascending over the slice, one fmaf a step, each weight
// made once for the RT rows (x: the rows' activations of the slice, fp32).
template <typename T, int BITS>
struct SliceWeights {
  static constexpr int kWords = BITS == 0 ? 1 : kChunkK * BITS / 64;  // 8-byte words a chunk: 1 (4 bits), 2 (8)
  uint2 raw[kChunksPerSlice][kWords];
  float scale[kChunksPerSlice], zero[kChunksPerSlice];  // of each chunk's block (a chunk never leaves it)
  const T* dense;  // the column's weight at k0 (BITS 0)
  int64_t N;

  __device__ __forceinline__ void Load(const HcNBitsProjection<T>& w, int64_t n, int64_t K, int64_t N_, int64_t k0,
                                       int klen, int64_t block_size) {
    if constexpr (BITS == 0) {
      dense = w.dense + k0 * N_ + n;
      N = N_;
    } else {
      const int64_t k_blocks = CeilDiv(K, block_size);
      const int chunks = (klen + kChunkK - 1) / kChunkK;
      const uint8_t* column = w.q + n * (k_blocks * block_size * BITS / 8) + k0 * BITS / 8;
#pragma unroll
      for (int c = 0; c < kChunksPerSlice; ++c) {
        if (c < chunks) {
#pragma unroll
          for (int u = 0; u < kWords; ++u) {
            raw[c][u] = __ldg(reinterpret_cast<const uint2*>(column + c * (kChunkK * BITS / 8)) + u);
          }
          const int64_t b = (k0 + c * kChunkK) / block_size;
          scale[c] = ToFloat(w.scales[n * k_blocks + b]);
          zero[c] = ZeroPoint<T, BITS>(w, n, b, k_blocks);
        }
      }
    }
  }

  template <int RT>
  __device__ __forceinline__ void Accumulate(const float* x, int ldx, int klen, float (&acc)[RT]) const {
    if constexpr (BITS == 0) {
      for (int k = 0; k < klen; ++k) {
        const float wk = ToFloat(dense[k * N]);
#pragma unroll
        for (int r = 0; r < RT; ++r) acc[r] = fmaf(x[r * ldx + k], wk, acc[r]);
      }
    } else {
      const int chunks = (klen + kChunkK - 1) / kChunkK;
#pragma unroll
      for (int c = 0; c < kChunksPerSlice; ++c) {
        if (c >= chunks) break;
        const int valid = klen - c * kChunkK;  // padding k >= K of the last block is never added
#pragma unroll
        for (int t = 0; t < kChunkK; ++t) {
          if (t >= valid) break;
          uint32_t q;
          if constexpr (BITS == 4) {
            const uint32_t word = t < 8 ? raw[c][0].x : raw[c][0].y;
            q = (word >> (4 * (t % 8))) & 15u;
          } else {
            const uint2 pair = raw[c][t / 8];
            q = ((t % 8 < 4 ? pair.x : pair.y) >> (8 * (t % 4))) & 255u;
          }
          const float wk = QuantizedWeight(q, zero[c], scale[c]);
#pragma unroll
          for (int r = 0; r < RT; ++r) acc[r] = fmaf(x[r * ldx + c * kChunkK + t], wk, acc[r]);
        }
      }
    }
  }
};

// Partial sums of one K slice for kProductThreads columns and RT rows: block = (slice, column group, row
// tile). A thread owns column n: its slice's weights are loaded (SliceWeights), then the tile's activations
// of the slice staged in shared memory as fp32, then accumulated from 0. With an epilogue (down_inject), the
// block that completes a (column group, row tile) adds its slices in order: down -> Z, SG, hidden (scratch) or
// inject -> post_gate. RT changes how many rows share a weight, not any row's operations.
template <typename T, int BITS, int RT>
__global__ void __launch_bounds__(kProductThreads) HcNBitsProductKernel(ProductArgs<T> a) {
  // launched early (PDL): the activations come from the kernel before it, and so may the weights unless constant
  if (!a.weights_early) ptx::WaitOnProducer();
  ptx::ReleaseDependents();
  __shared__ float xs[RT][kSliceK];
  __shared__ bool last_block;
  const int64_t column_groups = CeilDiv(a.N, kProductThreads);
  const int64_t slices = CeilDiv(a.K, kSliceK);
  const int64_t row_tiles = CeilDiv(a.rows, RT);
  const int64_t n_items = slices * column_groups * row_tiles;
  for (int64_t item = blockIdx.x; item < n_items; item += gridDim.x) {
    const int64_t tile = item / (slices * column_groups);
    const int64_t rest = item - tile * slices * column_groups;
    const int64_t slice = rest / column_groups, group = rest - slice * column_groups;
    const int64_t k0 = slice * kSliceK, row0 = tile * RT;
    const int klen = static_cast<int>(std::min<int64_t>(int64_t{kSliceK}, a.K - k0));
    const int64_t n = group * kProductThreads + threadIdx.x;
    const bool active = n < a.N;
    SliceWeights<T, BITS> w;
    if (active) w.Load(a.w, n, a.K, a.N, k0, klen, a.block_size);  // overlaps the staging below
    ptx::WaitOnProducer();  // (returns at once after the first time)
    __syncthreads();        // the previous item's readers are done with xs
    for (int i = threadIdx.x; i < RT * kSliceK; i += blockDim.x) {
      const int r = i / kSliceK, k = i % kSliceK;
      xs[r][k] = row0 + r < a.rows && k < klen ? ToFloat(a.x[(row0 + r) * a.K + k0 + k]) : 0.0f;
    }
    __syncthreads();
    if (active) {
      float acc[RT];
#pragma unroll
      for (int r = 0; r < RT; ++r) acc[r] = 0.0f;
      w.template Accumulate<RT>(&xs[0][0], kSliceK, klen, acc);
#pragma unroll
      for (int r = 0; r < RT; ++r) {
        if (row0 + r < a.rows) a.partial[(slice * a.rows + row0 + r) * a.N + n] = acc[r];
      }
    }
    const DownInjectEpilogue<T>& e = a.epilogue;
    if (e.counters == nullptr) continue;
    // the block that stores the last of a (column group, row tile)'s slices adds them up (whichever block that
    // is, in slice order) and applies down_inject's epilogue
    __threadfence();  // this block's partials are visible to every block before its count is
    __syncthreads();
    if (threadIdx.x == 0) {
      last_block = atomicAdd(e.counters + tile * column_groups + group, 1u) == static_cast<unsigned>(slices - 1);
    }
    __syncthreads();
    if (!last_block || !active) continue;
    __threadfence();
#pragma unroll
    for (int r = 0; r < RT; ++r) {
      const int64_t row = row0 + r;
      if (row >= a.rows) continue;
      // rounding point: down / inject
      const float sum = RoundToT<T>(SliceSum(a.partial + row * a.N + n, slices, a.rows * a.N));
      if (n < e.R) {
        e.hidden[row * e.R + n] = FromFloat<T>(ScaledSilu<T>(sum, e.silu_alpha));  // Z, SG, hidden
      } else {
        // rounding points: gate logit, its sigmoid, post_gate
        e.post_gate[row * e.C + (n - e.R)] = FromFloat<T>(PostGate<T>(sum, e.gate_div, e.gate_mul));
      }
    }
  }
}

// Asks L2 for column n's bytes of B past its first slice (up to kUpPrefetchBytes), which the fused up kernel
// reads a slice at a time: each slice's load then finds them in L2 instead of waiting on memory.
constexpr int64_t kUpPrefetchBytes = 1024;
template <int BITS>
__device__ __forceinline__ void PrefetchColumnTail(const uint8_t* q, int64_t n, int64_t K, int64_t block_size) {
  const int64_t row_bytes = CeilDiv(K, block_size) * block_size * BITS / 8;
  const uint8_t* column = q + n * row_bytes;
  const int64_t end = std::min<int64_t>(row_bytes, int64_t{kSliceK} * BITS / 8 + kUpPrefetchBytes);
  for (int64_t at = int64_t{kSliceK} * BITS / 8; at < end; at += 32) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(__cvta_generic_to_global(column + at)));
  }
}

template <typename T>
struct UpMixArgs {
  const T* hidden;  // (rows, R) of the chunk
  const T* hn;      // (rows, C*H)
  HcNBitsProjection<T> w;  // up: K = R, N = C*H
  int64_t rows, C, H, R, block_size;
  T* pre_output;  // (rows, H), the chunk's first row
  float reduction_scale;
  bool weights_early;  // B, scales and zero points are constant: read before the wait (PDL)
};

// The up product with g and pre_output, for C <= kProductThreads: block = (group of F = kProductThreads / C
// features, row tile). Thread j owns column c*H + h (c = j / F, h = h0 + j % F) and sums up over all of
// K = R in one fmaf chain from 0, k ascending (the reference's order), slice by slice: the column's later
// bytes are prefetched to L2 at the start and the next slice's weights load while this one is added; the
// tile's hidden is staged kUpStageK at a time. Then up (rounded)
// -> g (rounded) to shared memory with the thread's hn, and thread (r, f) adds the branches in order
// c = 0, ..., C-1 -> pre_output. RT changes how many rows share a weight, not any row's operations.
template <typename T, int BITS, int RT>
__global__ void __launch_bounds__(kProductThreads) HcNBitsUpMixKernel(UpMixArgs<T> a) {
  if (!a.weights_early) ptx::WaitOnProducer();  // launched early (PDL), as HcNBitsProductKernel
  ptx::ReleaseDependents();  // the next node's kernels wait for this one's end before touching anything
  __shared__ float xs[RT][kUpStageK];
  __shared__ float gs[RT][kProductThreads], hns[RT][kProductThreads];
  const int64_t W = a.C * a.H;
  const int F = kProductThreads / static_cast<int>(a.C);
  const int64_t feature_groups = CeilDiv(a.H, F);
  const int64_t row_tiles = CeilDiv(a.rows, RT);
  const int64_t slices = CeilDiv(a.R, kSliceK);
  const int j = threadIdx.x;
  for (int64_t item = blockIdx.x; item < feature_groups * row_tiles; item += gridDim.x) {
    const int64_t tile = item / feature_groups, h0 = (item - tile * feature_groups) * F, row0 = tile * RT;
    const int64_t c = j / F, h = h0 + j % F;
    const bool active = c < a.C && h < a.H;
    const int64_t n = c * a.H + h;
    SliceWeights<T, BITS> w;
    if (active) {
      w.Load(a.w, n, a.R, W, 0, static_cast<int>(std::min<int64_t>(kSliceK, a.R)), a.block_size);
      if constexpr (BITS != 0) PrefetchColumnTail<BITS>(a.w.q, n, a.R, a.block_size);
    }
    ptx::WaitOnProducer();  // (returns at once after the first time)
    float hn[RT];
#pragma unroll
    for (int r = 0; r < RT; ++r) hn[r] = active && row0 + r < a.rows ? ToFloat(a.hn[(row0 + r) * W + n]) : 0.0f;
    float acc[RT];
#pragma unroll
    for (int r = 0; r < RT; ++r) acc[r] = 0.0f;
    for (int64_t s = 0; s < slices; ++s) {
      const int64_t k0 = s * kSliceK;
      const int klen = static_cast<int>(std::min<int64_t>(int64_t{kSliceK}, a.R - k0));
      const int64_t stage0 = k0 / kUpStageK * kUpStageK;
      if (k0 == stage0) {  // the tile's hidden [stage0, stage0 + kUpStageK)
        __syncthreads();   // the previous readers are done with xs
        const int len = static_cast<int>(std::min<int64_t>(kUpStageK, a.R - stage0));
        for (int i = j; i < RT * kUpStageK; i += blockDim.x) {
          const int r = i / kUpStageK, k = i % kUpStageK;
          xs[r][k] = row0 + r < a.rows && k < len ? ToFloat(a.hidden[(row0 + r) * a.R + stage0 + k]) : 0.0f;
        }
        __syncthreads();
      }
      SliceWeights<T, BITS> next;
      if (active && s + 1 < slices) {
        next.Load(a.w, n, a.R, W, k0 + kSliceK, static_cast<int>(std::min<int64_t>(kSliceK, a.R - k0 - kSliceK)),
                  a.block_size);
      }
      if (active) w.template Accumulate<RT>(&xs[0][k0 - stage0], kUpStageK, klen, acc);
      if (s + 1 < slices) w = next;
    }
    __syncthreads();  // the previous item's readers are done with gs and hns
    if (active) {
#pragma unroll
      for (int r = 0; r < RT; ++r) {
        const float up = RoundToT<T>(acc[r]);     // rounding point: up
        gs[r][j] = RoundToT<T>(Sigmoid(up));       // rounding point: g
        hns[r][j] = hn[r];
      }
    }
    __syncthreads();
    for (int i = j; i < RT * F; i += blockDim.x) {
      const int r = i / F, f = i % F;
      if (row0 + r >= a.rows || h0 + f >= a.H) continue;
      float mix = 0.0f;
      for (int64_t cc = 0; cc < a.C; ++cc) mix = MulAdd<T>(hns[r][cc * F + f], gs[r][cc * F + f], mix);
      // rounding point: pre_output
      a.pre_output[(row0 + r) * a.H + h0 + f] = FromFloat<T>(__fmul_rn(a.reduction_scale, mix));
    }
  }
}

template <typename T>
struct UpGateArgs {
  const float* partial;  // [slices][rows][C*H]
  const T* hn;           // (rows, C*H)
  int64_t slices, rows, C, H;
  T* pre_output;  // (rows, H), the chunk's first row
  float reduction_scale;
};

// Per (row, feature h): for c = 0, ..., C-1 the slices' sum of up column c*H + h -> up (rounded) ->
// g = sigmoid(up) (rounded) -> mix += hn * g; pre_output = reduction_scale * mix.
template <typename T>
__global__ void __launch_bounds__(kEpilogueThreads) HcNBitsUpGateKernel(UpGateArgs<T> a) {
  ptx::WaitOnProducer();  // launched early (PDL): the partials come from the product before it
  ptx::ReleaseDependents();
  const int64_t W = a.C * a.H;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < a.rows * a.H;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = i / a.H, h = i - row * a.H;
    float mix = 0.0f;
#pragma unroll 4
    for (int64_t c = 0; c < a.C; ++c) {
      const int64_t at = row * W + c * a.H + h;
      const float up = RoundToT<T>(SliceSum(a.partial + at, a.slices, a.rows * W));  // rounding point: up
      const float g = RoundToT<T>(Sigmoid(up));                                      // rounding point: g
      mix = MulAdd<T>(ToFloat(a.hn[at]), g, mix);
    }
    a.pre_output[i] = FromFloat<T>(__fmul_rn(a.reduction_scale, mix));  // rounding point: pre_output
  }
}

// ---- launch

struct ScratchLayout {
  size_t hn = 0, hidden = 0, partial = 0, counters = 0, total = 0;
  int64_t counter_count = 0;
};

// Whether HcNBitsUpMixKernel runs the up product and its epilogue (a block holds every branch of a feature),
// else HcNBitsProductKernel and HcNBitsUpGateKernel.
bool FusedUpMix(const HcLowRankMixParams& m) { return m.C <= kProductThreads; }

template <typename T>
ScratchLayout MakeLayout(const HcNBitsParams& p) {
  const HcLowRankMixParams& m = p.mix;
  const auto rows = static_cast<size_t>(std::min(m.rows, kHcNBitsChunkRows));
  const auto width = static_cast<size_t>(m.width());
  const size_t di_floats = static_cast<size_t>(CeilDiv(width, kHcNBitsSliceK) * (m.R + m.C));
  const size_t up_floats = FusedUpMix(m) ? 0 : static_cast<size_t>(CeilDiv(m.R, kHcNBitsSliceK)) * width;
  ScratchLayout l;
  l.hidden = AlignUp(rows * width * sizeof(T));
  l.partial = l.hidden + AlignUp(rows * static_cast<size_t>(m.R) * sizeof(T));
  l.counters = l.partial + AlignUp(rows * std::max(di_floats, up_floats) * sizeof(float));
  // one a (column group, row tile) of the down_inject product, tiles of 1 row at most
  l.counter_count = CeilDiv(m.R + m.C, kProductThreads) * static_cast<int64_t>(rows);
  l.total = l.counters + AlignUp(static_cast<size_t>(l.counter_count) * sizeof(unsigned));
  return l;
}

HcLaunchStatus Failure(const char* step, cudaError_t e) {
  return e == cudaSuccess ? HcLaunchStatus{} : HcLaunchStatus{step, e, CUBLAS_STATUS_SUCCESS};
}

int GridFor(int64_t items) { return static_cast<int>(std::max<int64_t>(1, std::min(items, kMaxGrid))); }

// fn(std::integral_constant<int, RT>) for the rows a weight is made for: up to 8 (a tile's rows never
// change a row's operations).
template <typename Fn>
cudaError_t ForRowTile(int64_t rows, Fn&& fn) {
  if (rows >= 8) return fn(std::integral_constant<int, 8>{});
  if (rows >= 4) return fn(std::integral_constant<int, 4>{});
  if (rows >= 2) return fn(std::integral_constant<int, 2>{});
  return fn(std::integral_constant<int, 1>{});
}

// fn(std::integral_constant<int, BITS>): 0 for a dense projection, else the node's bits.
template <typename T, typename Fn>
cudaError_t ForBits(const HcNBitsProjection<T>& w, int64_t bits, Fn&& fn) {
  if (w.q == nullptr) return fn(std::integral_constant<int, 0>{});
  return bits == 8 ? fn(std::integral_constant<int, 8>{}) : fn(std::integral_constant<int, 4>{});
}

template <typename T>
cudaError_t LaunchProduct(const ProductArgs<T>& a, int64_t bits, bool pdl, cudaStream_t stream) {
  return ForBits(a.w, bits, [&](auto b) {
    return ForRowTile(a.rows, [&](auto rt) {
      constexpr int BITS = decltype(b)::value, RT = decltype(rt)::value;
      const int64_t items = CeilDiv(a.K, kHcNBitsSliceK) * CeilDiv(a.N, kProductThreads) * CeilDiv(a.rows, RT);
      return Launch(HcNBitsProductKernel<T, BITS, RT>, GridFor(items), kProductThreads, 0, 1, pdl, stream, a);
    });
  });
}

template <typename T>
cudaError_t LaunchUpMix(const UpMixArgs<T>& a, int64_t bits, bool pdl, cudaStream_t stream) {
  return ForBits(a.w, bits, [&](auto b) {
    return ForRowTile(a.rows, [&](auto rt) {
      constexpr int BITS = decltype(b)::value, RT = decltype(rt)::value;
      const int64_t items = CeilDiv(a.H, kProductThreads / a.C) * CeilDiv(a.rows, RT);
      return Launch(HcNBitsUpMixKernel<T, BITS, RT>, GridFor(items), kProductThreads, 0, 1, pdl, stream, a);
    });
  });
}

template <typename T, bool PROLOGUE>
cudaError_t LaunchNorm(const NormArgs<T>& a, bool pdl, cudaStream_t stream) {
  return Launch(HcNBitsNormKernel<T, PROLOGUE>, GridFor(a.rows * a.C), kNormThreads, 0, 1, pdl, stream, a);
}

bool Aligned8(const void* p) { return p == nullptr || reinterpret_cast<uintptr_t>(p) % 8 == 0; }

}  // namespace

template <typename T>
size_t HcNBitsScratchBytes(const HcNBitsParams& params) {
  return MakeLayout<T>(params).total;
}

template <typename T>
HcLaunchStatus LaunchHcNBits(const HcNBitsParams& p, const HcNBitsTensors<T>& t, void* scratch,
                             const HcNBitsLaunchOptions& options, cudaStream_t stream) {
  const HcLowRankMixParams& m = p.mix;
  const bool pdl = options.pdl;
  if (!Aligned8(t.down_inject.q) || !Aligned8(t.up.q)) {
    return Failure("B (down_inject_weight or up_weight) is not 8-byte aligned", cudaErrorMisalignedAddress);
  }
  const int64_t C = m.C, H = m.H, R = m.R, W = m.width();
  const ScratchLayout layout = MakeLayout<T>(p);
  char* base = static_cast<char*>(scratch);
  T* hn = reinterpret_cast<T*>(base + layout.hn);
  T* hidden = reinterpret_cast<T*>(base + layout.hidden);
  float* partial = reinterpret_cast<float*>(base + layout.partial);
  auto* counters = reinterpret_cast<unsigned*>(base + layout.counters);
  for (int64_t row0 = 0; row0 < m.rows; row0 += kHcNBitsChunkRows) {
    const int64_t rows = std::min(kHcNBitsChunkRows, m.rows - row0);

    NormArgs<T> norm{t.streams + row0 * W, t.norm_scale, nullptr, nullptr,
                     t.streams_out != nullptr ? t.streams_out + row0 * W : nullptr, hn, rows, C, H, m.epsilon,
                     counters, layout.counter_count};
    if (m.has_prologue) {
      norm.prev_block_output = t.prev_block_output + row0 * H;
      norm.prev_post_gate = t.prev_post_gate + row0 * C;
    }
    HcLaunchStatus s = Failure("HcNBitsNormKernel", m.has_prologue ? LaunchNorm<T, true>(norm, pdl, stream)
                                                                     : LaunchNorm<T, false>(norm, pdl, stream));
    if (!s.ok()) return s;

    const DownInjectEpilogue<T> epilogue{counters, R, C, hidden, t.post_gate + row0 * C, m.silu_alpha, m.gate_div,
                                         m.gate_mul};
    const ProductArgs<T> down{hn, t.down_inject, rows, W, R + C, p.block_size, partial,
                              pdl && options.down_inject_constant, epilogue};
    s = Failure("HcNBitsProductKernel (down_inject)", LaunchProduct(down, p.bits, pdl, stream));
    if (!s.ok()) return s;

    const bool up_early = pdl && options.up_constant;
    if (FusedUpMix(m)) {
      const UpMixArgs<T> um{hidden, hn, t.up, rows, C, H, R, p.block_size, t.pre_output + row0 * H,
                            m.reduction_scale, up_early};
      s = Failure("HcNBitsUpMixKernel", LaunchUpMix(um, p.bits, pdl, stream));
      if (!s.ok()) return s;
      continue;
    }
    const ProductArgs<T> up{hidden, t.up, rows, R, W, p.block_size, partial, up_early, {}};
    s = Failure("HcNBitsProductKernel (up)", LaunchProduct(up, p.bits, pdl, stream));
    if (!s.ok()) return s;
    const UpGateArgs<T> ug{partial, hn, CeilDiv(R, kHcNBitsSliceK), rows, C, H, t.pre_output + row0 * H,
                           m.reduction_scale};
    const int ug_grid = GridFor(CeilDiv(rows * H, kEpilogueThreads));
    s = Failure("HcNBitsUpGateKernel",
                Launch(HcNBitsUpGateKernel<T>, ug_grid, kEpilogueThreads, 0, 1, pdl, stream, ug));
    if (!s.ok()) return s;
  }
  return {};
}

#define HC_INSTANTIATE_NBITS(T)                                                                           \
  template size_t HcNBitsScratchBytes<T>(const HcNBitsParams&);                                          \
  template HcLaunchStatus LaunchHcNBits<T>(const HcNBitsParams&, const HcNBitsTensors<T>&, void*, \
                                           const HcNBitsLaunchOptions&, cudaStream_t);
HC_INSTANTIATE_NBITS(float)
HC_INSTANTIATE_NBITS(__half)
HC_INSTANTIATE_NBITS(__nv_bfloat16)

}  // namespace cuda
}  // namespace hcfuse
