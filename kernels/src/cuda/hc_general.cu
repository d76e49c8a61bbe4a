// General CUDA path of HyperConnectionLowRankMix: any C/H/R, any row count, every T.
//
//   HcNormKernel       S (prologue), per-branch rms, hn            -> streams_out, hn (scratch)
//   per chunk of at most SplitChunkRows rows:
//     GEMM (cuBLASLt, strided-batched)  fp32 partials of down = hn @ down_weight and
//                      inject = hn @ inject_weight over HcSplitCount(C*H) fixed K slices
//                      (HcFallbackGemmKernel where cuBLASLt has no algorithm, e.g. 16-bit with C = 1)
//     HcSplitReduceKernel  down, inject = the slices' sum in order b = 0, 1, ..., rounded to T;
//                      hidden = ScaledSiLU(down)
//   GEMM (cuBLASLt)    up = hidden @ up_weight
//   HcGateEpilogueKernel  g = sigmoid(up), pre_output, post_gate
//
// Each output element is computed by a fixed sequence of operations that does not depend on the
// row count or on which block runs it (row-stride and grid-stride loops; reductions in fixed
// order; the K split depends on K only; GEMM algorithm pinned in HcLtGemm, the same for every chunk),
// so results are deterministic and row independent.
#include <algorithm>
#include <cstdio>
#include <string>

#include "cuda/hc_common.cuh"
#include "cuda/hc_gemm.h"
#include "cuda/hc_lowrank_mix_cuda.h"

namespace hcfuse {
namespace cuda {
namespace {

constexpr int kMaxNormThreads = 256;
constexpr int kElementwiseThreads = 256;
// Grid caps: the kernels loop over rows / elements, so any count fits the grid limits.
constexpr int64_t kMaxRowBlocks = int64_t{1} << 20;
constexpr int64_t kMaxElementwiseBlocks = int64_t{1} << 16;

constexpr size_t kScratchAlign = 256;
size_t AlignUp(size_t bytes) { return (bytes + kScratchAlign - 1) / kScratchAlign * kScratchAlign; }

template <typename T>
struct NormArgs {
  const T* streams;
  const T* norm_scale;
  const T* prev_block_output;  // null without prologue
  const T* prev_post_gate;
  T* streams_out;  // null when not requested
  T* hn;
  int64_t rows, C, H;
  float epsilon;
};

// S for VEC consecutive features h of branch c of one row, each rounded to T.
template <typename T, int VEC>
__device__ __forceinline__ Vec<T, VEC> LoadS(const NormArgs<T>& a, int64_t row, int64_t c, int64_t h) {
  const int64_t width = a.C * a.H;
  Vec<T, VEC> s = LoadVec<T, VEC>(a.streams + row * width + c * a.H + h);
  if (a.prev_block_output != nullptr) {
    const float gate = ToFloat(a.prev_post_gate[row * a.C + c]);
    const Vec<T, VEC> prev = LoadVec<T, VEC>(a.prev_block_output + row * a.H + h);
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      // rounding point: S
      s.v[j] = FromFloat<T>(PrologueS(ToFloat(s.v[j]), gate, ToFloat(prev.v[j])));
    }
  }
  return s;
}

// One block per row (row-stride loop). Per branch: pass 1 forms S, writes streams_out and sums S^2
// (per-thread sequential, then BlockSum's fixed order); pass 2 forms S again and writes hn.
template <typename T, int VEC>
__global__ void __launch_bounds__(kMaxNormThreads) HcNormKernel(NormArgs<T> a) {
  __shared__ float reduce_scratch[32];
  const int64_t width = a.C * a.H;
  const int64_t step = int64_t{blockDim.x} * VEC;
  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
    for (int64_t c = 0; c < a.C; ++c) {
      float sum_sq = 0.0f;
      for (int64_t h = int64_t{threadIdx.x} * VEC; h < a.H; h += step) {
        const Vec<T, VEC> s = LoadS<T, VEC>(a, row, c, h);
        if (a.streams_out != nullptr) StoreVec<T, VEC>(a.streams_out + row * width + c * a.H + h, s);
#pragma unroll
        for (int j = 0; j < VEC; ++j) sum_sq = MulAdd(ToFloat(s.v[j]), ToFloat(s.v[j]), sum_sq);
      }
      const float inv_rms = BranchInvRms(BlockSum(sum_sq, reduce_scratch), a.H, a.epsilon);
      for (int64_t h = int64_t{threadIdx.x} * VEC; h < a.H; h += step) {
        const Vec<T, VEC> s = LoadS<T, VEC>(a, row, c, h);
        const Vec<T, VEC> scale = LoadVec<T, VEC>(a.norm_scale + c * a.H + h);
        Vec<T, VEC> hn;
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          hn.v[j] = FromFloat<T>(NormalizeHn(ToFloat(s.v[j]), inv_rms, ToFloat(scale.v[j])));  // rounding point: hn
        }
        StoreVec<T, VEC>(a.hn + row * width + c * a.H + h, hn);
      }
    }
  }
}

template <typename T>
struct SplitReduceArgs {
  const float* down_partial;    // splits slices of (rows, R), down_stride floats apart
  const float* inject_partial;  // splits slices of (rows, C), inject_stride floats apart
  int64_t down_stride, inject_stride, splits;
  T* hidden;  // (rows, R)
  T* inject;  // (rows, C)
  int64_t down_count, inject_count;  // rows * R, rows * C
  float silu_alpha;
};

// Both split products' reductions in one launch, grid-stride over rows*R + rows*C outputs (consecutive
// threads, consecutive outputs of one slice): each output adds its slices in the fixed order
// b = 0, 1, ..., splits - 1 in fp32, whatever the row count; then down is rounded to T and becomes
// hidden = ScaledSiLU(down) (Z, SG, hidden rounded in ScaledSilu), inject is rounded to T.
template <typename T>
__global__ void __launch_bounds__(kElementwiseThreads) HcSplitReduceKernel(SplitReduceArgs<T> a) {
  const int64_t total = a.down_count + a.inject_count;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < total; i += int64_t{gridDim.x} * blockDim.x) {
    const bool is_down = i < a.down_count;
    const int64_t j = is_down ? i : i - a.down_count;
    const float* __restrict__ partial = (is_down ? a.down_partial : a.inject_partial) + j;
    const int64_t stride = is_down ? a.down_stride : a.inject_stride;
    float acc = 0.0f;
#pragma unroll 8
    for (int64_t b = 0; b < a.splits; ++b) acc = __fadd_rn(acc, partial[b * stride]);
    if (is_down) {
      const float down = RoundToT<T>(acc);  // rounding point: down
      a.hidden[j] = FromFloat<T>(ScaledSilu<T>(down, a.silu_alpha));
    } else {
      a.inject[j] = FromFloat<T>(acc);  // rounding point: inject
    }
  }
}

// For a product cuBLASLt has no algorithm for (seen: 16-bit types with N = 1, the inject product of
// one branch), sliced like HcLtGemm's products: with Ks = K / splits,
//   out[b * out_stride + m * N + n] = sum over k in [b*Ks, (b+1)*Ks) of act[m, k] * weight[k, n]
// in fp32, stored as Out: T for a plain product (splits = 1: the rounding point up), float for the
// partials of a split product (down and inject, rounded by HcSplitReduceKernel). One block per
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
  const T* up;      // rounded up projection (rows, C*H)
  const T* inject;  // rounded inject projection (rows, C)
  T* pre_output;
  T* post_gate;
  int64_t rows, C, H;
  float reduction_scale, gate_div, gate_mul;
};

// pre_output[row, h] = reduction_scale * sum_c hn[row, c, h] * g[row, c, h] (c in order), with
// g = sigmoid(up) rounded; then post_gate from the rounded inject.
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
    for (int64_t c = 0; c < a.C; ++c) {
      const Vec<T, VEC> hn = LoadVec<T, VEC>(a.hn + row * width + c * a.H + h);
      const Vec<T, VEC> up = LoadVec<T, VEC>(a.up + row * width + c * a.H + h);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const float g = RoundToT<T>(Sigmoid(ToFloat(up.v[j])));  // rounding point: g
        acc[j] = MulAdd(ToFloat(hn.v[j]), g, acc[j]);
      }
    }
    Vec<T, VEC> out;
#pragma unroll
    for (int j = 0; j < VEC; ++j) out.v[j] = FromFloat<T>(__fmul_rn(a.reduction_scale, acc[j]));  // rounding point: pre_output
    StoreVec<T, VEC>(a.pre_output + row * a.H + h, out);
  }
  for (int64_t i = start; i < a.rows * a.C; i += stride) {
    // inject was rounded by its GEMM (rounding point: inject); rounding point: post_gate
    a.post_gate[i] = FromFloat<T>(PostGate(ToFloat(a.inject[i]), a.gate_div, a.gate_mul));
  }
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
                    int64_t K, void* workspace, cudaStream_t stream) {
  bool available = false;
  if (auto s = CublasFailure(step, gemm.Available<T>(act, weight, out, N, K, &available)); !s.ok()) return s;
  if (available) return CublasFailure(step, gemm.Run<T>(act, weight, out, M, N, K, workspace, stream));
  const unsigned blocks = static_cast<unsigned>(std::min(M, kMaxRowBlocks));
  HcFallbackGemmKernel<T, T><<<blocks, kElementwiseThreads, 0, stream>>>(act, weight, out, M, N, K, 1, 0);
  return CudaFailure("HcFallbackGemmKernel", cudaGetLastError());
}

// One split GEMM of the general path (fp32 partials, HcLtGemm::RunSplit's layout) for M rows: cuBLASLt
// where `use_lt` (AvailableSplit, asked once per launch), else the fallback kernel.
template <typename T>
HcLaunchStatus SplitGemm(const char* step, HcLtGemm& gemm, bool use_lt, const T* act, const T* weight,
                         float* partial, int64_t M, int64_t N, int64_t K, int64_t splits, void* workspace,
                         cudaStream_t stream) {
  if (use_lt) return CublasFailure(step, gemm.RunSplit<T>(act, weight, partial, M, N, K, splits, workspace, stream));
  const unsigned blocks = static_cast<unsigned>(std::min(M * splits, kMaxRowBlocks));
  HcFallbackGemmKernel<T, float><<<blocks, kElementwiseThreads, 0, stream>>>(act, weight, partial, M, N, K, splits,
                                                                              HcPartialStride(M, N));
  return CudaFailure("HcFallbackGemmKernel", cudaGetLastError());
}

// Rows per chunk of the split products. The fp32 partials take splits * (R + C) floats per row, so
// the products run over at most this many rows at a time and reuse one partial buffer: the largest
// multiple of kChunkRowsMultiple whose partials fit kPartialBudgetBytes, within [kChunkRowsMultiple,
// kMaxChunkRows] (the real shape: 40 * 324 * 4 bytes a row -> 1024 rows, 52 MB). It depends on the
// shape, never on the row count, and chunking keeps rows independent: every chunk runs the same
// pinned algorithm (its hn pointer is a multiple of kChunkRowsMultiple rows, so at least 256 bytes,
// past the previous one, so the alignment HcLtGemm keys on is the same) and the same reduction.
constexpr int64_t kChunkRowsMultiple = 128;
constexpr int64_t kMaxChunkRows = 1024;
constexpr int64_t kPartialBudgetBytes = int64_t{64} << 20;

int64_t SplitChunkRows(const HcLowRankMixParams& p) {
  const int64_t per_row = HcSplitCount(p.width()) * (p.R + p.C) * static_cast<int64_t>(sizeof(float));
  const int64_t fit = kPartialBudgetBytes / per_row / kChunkRowsMultiple * kChunkRowsMultiple;
  return std::min(std::max(fit, kChunkRowsMultiple), kMaxChunkRows);
}

// The scratch: hn, up (rows, C*H); hidden (rows, R); inject (rows, C) in T; then the fp32 partials
// of one chunk of m = min(rows, SplitChunkRows) rows: splits slices of down (HcPartialStride(m, R)
// floats each), then splits slices of inject (HcPartialStride(m, C) floats each), then cuBLASLt's
// workspace (HcLtGemm::kWorkspaceBytes). Every part starts 256-byte aligned (offsets from the base
// are multiples of kScratchAlign).
struct ScratchLayout {
  int64_t splits = 1, chunk_rows = 0;  // chunk_rows = min(rows, SplitChunkRows(p))
  size_t hn = 0, up = 0, hidden = 0, inject = 0, down_partial = 0, inject_partial = 0, workspace = 0,
         total = 0;  // byte offsets
};

ScratchLayout MakeScratchLayout(const HcLowRankMixParams& p, size_t element_size) {
  const size_t rows = static_cast<size_t>(p.rows);
  const size_t width = static_cast<size_t>(p.width());
  ScratchLayout l;
  l.splits = HcSplitCount(p.width());
  l.chunk_rows = std::min(p.rows, SplitChunkRows(p));
  l.hn = 0;
  l.up = l.hn + AlignUp(rows * width * element_size);
  l.hidden = l.up + AlignUp(rows * width * element_size);
  l.inject = l.hidden + AlignUp(rows * static_cast<size_t>(p.R) * element_size);
  l.down_partial = l.inject + AlignUp(rows * static_cast<size_t>(p.C) * element_size);
  l.inject_partial =
      l.down_partial + static_cast<size_t>(l.splits * HcPartialStride(l.chunk_rows, p.R)) * sizeof(float);
  l.workspace =
      l.inject_partial + static_cast<size_t>(l.splits * HcPartialStride(l.chunk_rows, p.C)) * sizeof(float);
  l.total = l.workspace + HcLtGemm::kWorkspaceBytes;
  return l;
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
  char* base = static_cast<char*>(scratch);
  T* hn = reinterpret_cast<T*>(base + layout.hn);
  T* up = reinterpret_cast<T*>(base + layout.up);
  T* hidden = reinterpret_cast<T*>(base + layout.hidden);
  T* inject = reinterpret_cast<T*>(base + layout.inject);
  float* down_partial = reinterpret_cast<float*>(base + layout.down_partial);
  float* inject_partial = reinterpret_cast<float*>(base + layout.inject_partial);
  void* workspace = base + layout.workspace;  // cuBLASLt's (HcLtGemm::kWorkspaceBytes)
  const int64_t splits = layout.splits;

  const NormArgs<T> norm{t.streams, t.norm_scale, t.prev_block_output, t.prev_post_gate, t.streams_out,
                         hn, rows, C, H, p.epsilon};
  const int norm_vec = PickVec<T>(H, {t.streams, t.norm_scale, t.prev_block_output, t.streams_out, hn});
  const int norm_threads = NormThreads(H, norm_vec);
  const unsigned norm_blocks = static_cast<unsigned>(std::min(rows, kMaxRowBlocks));
  HC_DISPATCH_VEC(norm_vec, HcNormKernel, T, norm_blocks, norm_threads, norm);
  if (auto s = CudaFailure("HcNormKernel", cudaGetLastError()); !s.ok()) return s;

  // Whether cuBLASLt runs the split products: asked once, with the base pointers (every chunk's
  // pointers have the same alignment), so every chunk and every row count takes the same route.
  static const char* const kDownStep = "cuBLASLt GEMM down = hn @ down_weight (split K)";
  static const char* const kInjectStep = "cuBLASLt GEMM inject = hn @ inject_weight (split K)";
  bool down_lt = false, inject_lt = false;
  if (auto s = CublasFailure(kDownStep, gemm.AvailableSplit<T>(hn, t.down_weight, down_partial, R, width, splits,
                                                                &down_lt));
      !s.ok()) {
    return s;
  }
  if (auto s = CublasFailure(kInjectStep, gemm.AvailableSplit<T>(hn, t.inject_weight, inject_partial, C, width, splits,
                                                                  &inject_lt));
      !s.ok()) {
    return s;
  }
  unsigned reduce_blocks = 0;
  for (int64_t r0 = 0; r0 < rows; r0 += layout.chunk_rows) {
    const int64_t m = std::min(layout.chunk_rows, rows - r0);
    const T* act = hn + r0 * width;
    if (auto s = SplitGemm<T>(kDownStep, gemm, down_lt, act, t.down_weight, down_partial, m, R, width, splits, workspace, stream);
        !s.ok()) {
      return s;
    }
    if (auto s = SplitGemm<T>(kInjectStep, gemm, inject_lt, act, t.inject_weight, inject_partial, m, C, width, splits,
                              workspace, stream);
        !s.ok()) {
      return s;
    }
    const SplitReduceArgs<T> reduce{down_partial, inject_partial, HcPartialStride(m, R), HcPartialStride(m, C), splits,
                                    hidden + r0 * R, inject + r0 * C, m * R, m * C, p.silu_alpha};
    reduce_blocks = ElementwiseBlocks(m * (R + C));
    HcSplitReduceKernel<T><<<reduce_blocks, kElementwiseThreads, 0, stream>>>(reduce);
    if (auto s = CudaFailure("HcSplitReduceKernel", cudaGetLastError()); !s.ok()) return s;
  }

  if (auto s = Gemm<T>("cuBLASLt GEMM up = hidden @ up_weight", gemm, hidden, t.up_weight, up, rows, width, R, workspace, stream);
      !s.ok()) {
    return s;
  }

  const EpilogueArgs<T> epi{hn, up, inject, t.pre_output, t.post_gate, rows, C, H,
                            p.reduction_scale, p.gate_div, p.gate_mul};
  const int epi_vec = PickVec<T>(H, {hn, up, t.pre_output});
  const unsigned epi_blocks = ElementwiseBlocks(std::max(rows * (H / epi_vec), rows * C));
  HC_DISPATCH_VEC(epi_vec, HcGateEpilogueKernel, T, epi_blocks, kElementwiseThreads, epi);
  if (auto s = CudaFailure("HcGateEpilogueKernel", cudaGetLastError()); !s.ok()) return s;

  if (debug) {
    std::fprintf(stderr,
                 "hcfuse: HyperConnectionLowRankMix general path rows=%lld C=%lld H=%lld R=%lld: HcNormKernel "
                 "grid %u x %d (vec %d), down/inject split into %lld K slices of %lld (%s/%s) in chunks of %lld "
                 "rows, HcSplitReduceKernel grid %u x %d (last chunk), HcGateEpilogueKernel grid %u x %d (vec %d)\n",
                 static_cast<long long>(rows), static_cast<long long>(C), static_cast<long long>(H),
                 static_cast<long long>(R), norm_blocks, norm_threads, norm_vec, static_cast<long long>(splits),
                 static_cast<long long>(width / splits), down_lt ? "cuBLASLt" : "fallback kernel",
                 inject_lt ? "cuBLASLt" : "fallback kernel", static_cast<long long>(layout.chunk_rows),
                 reduce_blocks, kElementwiseThreads, epi_blocks, kElementwiseThreads, epi_vec);
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
