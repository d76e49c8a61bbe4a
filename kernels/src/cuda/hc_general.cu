// General CUDA path of HyperConnectionLowRankMix: any C/H/R, any row count, every T.
//
//   HcNormKernel       S (prologue), per-branch rms, hn            -> streams_out, hn (scratch)
//   GEMM (cuBLASLt)    down = hn @ down_weight, inject = hn @ inject_weight
//                      (HcFallbackGemmKernel where cuBLASLt has no algorithm, e.g. 16-bit with C = 1)
//   HcSiluKernel       hidden = ScaledSiLU(down), in place
//   GEMM (cuBLASLt)    up = hidden @ up_weight
//   HcGateEpilogueKernel  g = sigmoid(up), pre_output, post_gate
//
// Each output element is computed by a fixed sequence of operations that does not depend on the
// row count or on which block runs it (row-stride and grid-stride loops; reductions in fixed
// order; GEMM algorithm pinned in HcLtGemm), so results are deterministic and row independent.
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

// hidden = ScaledSiLU(down) in place over rows * R elements (Z, SG, hidden rounded in ScaledSilu).
template <typename T>
__global__ void __launch_bounds__(kElementwiseThreads) HcSiluKernel(T* down, int64_t count, float silu_alpha) {
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < count; i += int64_t{gridDim.x} * blockDim.x) {
    down[i] = FromFloat<T>(ScaledSilu<T>(ToFloat(down[i]), silu_alpha));
  }
}

// out[m, n] = sum_k act[m, k] * weight[k, n] in fp32, rounded once to T (the GEMM rounding points:
// down, inject, up), for a product cuBLASLt has no algorithm for (seen: 16-bit types with N = 1, the
// inject product of one branch). One block per row; thread t sums k = t, t + blockDim.x, ... and
// BlockSum adds the threads in order: a fixed order that does not depend on the row count.
template <typename T>
__global__ void __launch_bounds__(kElementwiseThreads)
    HcFallbackGemmKernel(const T* act, const T* weight, T* out, int64_t M, int64_t N, int64_t K) {
  __shared__ float reduce_scratch[32];
  for (int64_t m = blockIdx.x; m < M; m += gridDim.x) {
    for (int64_t n = 0; n < N; ++n) {
      float acc = 0.0f;
      for (int64_t k = threadIdx.x; k < K; k += blockDim.x) {
        acc = fmaf(ToFloat(act[m * K + k]), ToFloat(weight[k * N + n]), acc);
      }
      const float total = BlockSum(acc, reduce_scratch);
      if (threadIdx.x == 0) out[m * N + n] = FromFloat<T>(total);
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

// One GEMM of the general path: cuBLASLt's pinned algorithm, or the fallback kernel where there is none.
template <typename T>
HcLaunchStatus Gemm(const char* step, HcLtGemm& gemm, const T* act, const T* weight, T* out, int64_t M, int64_t N,
                    int64_t K, cudaStream_t stream) {
  bool available = false;
  if (auto s = CublasFailure(step, gemm.Available<T>(act, weight, out, N, K, &available)); !s.ok()) return s;
  if (available) return CublasFailure(step, gemm.Run<T>(act, weight, out, M, N, K, stream));
  const unsigned blocks = static_cast<unsigned>(std::min(M, kMaxRowBlocks));
  HcFallbackGemmKernel<T><<<blocks, kElementwiseThreads, 0, stream>>>(act, weight, out, M, N, K);
  return CudaFailure("HcFallbackGemmKernel", cudaGetLastError());
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
  const size_t rows = static_cast<size_t>(p.rows);
  const size_t width = static_cast<size_t>(p.width());
  return AlignUp(rows * width * element_size) * 2 +  // hn, up
         AlignUp(rows * static_cast<size_t>(p.R) * element_size) +  // down, then hidden in place
         AlignUp(rows * static_cast<size_t>(p.C) * element_size);   // inject
}

template <typename T>
HcLaunchStatus LaunchHcGeneral(const HcLowRankMixParams& p, const HcDeviceTensors<T>& t, void* scratch,
                               HcLtGemm& gemm, cudaStream_t stream, bool debug) {
  const int64_t rows = p.rows, C = p.C, H = p.H, R = p.R, width = p.width();
  char* base = static_cast<char*>(scratch);
  T* hn = reinterpret_cast<T*>(base);
  T* up = reinterpret_cast<T*>(base + AlignUp(rows * width * sizeof(T)));
  T* down = reinterpret_cast<T*>(base + 2 * AlignUp(rows * width * sizeof(T)));
  T* inject = reinterpret_cast<T*>(base + 2 * AlignUp(rows * width * sizeof(T)) + AlignUp(rows * R * sizeof(T)));

  const NormArgs<T> norm{t.streams, t.norm_scale, t.prev_block_output, t.prev_post_gate, t.streams_out,
                         hn, rows, C, H, p.epsilon};
  const int norm_vec = PickVec<T>(H, {t.streams, t.norm_scale, t.prev_block_output, t.streams_out, hn});
  const int norm_threads = NormThreads(H, norm_vec);
  const unsigned norm_blocks = static_cast<unsigned>(std::min(rows, kMaxRowBlocks));
  HC_DISPATCH_VEC(norm_vec, HcNormKernel, T, norm_blocks, norm_threads, norm);
  if (auto s = CudaFailure("HcNormKernel", cudaGetLastError()); !s.ok()) return s;

  if (auto s = Gemm<T>("cuBLASLt GEMM down = hn @ down_weight", gemm, hn, t.down_weight, down, rows, R, width, stream);
      !s.ok()) {
    return s;
  }
  if (auto s = Gemm<T>("cuBLASLt GEMM inject = hn @ inject_weight", gemm, hn, t.inject_weight, inject, rows, C, width,
                       stream);
      !s.ok()) {
    return s;
  }

  const unsigned silu_blocks = ElementwiseBlocks(rows * R);
  HcSiluKernel<T><<<silu_blocks, kElementwiseThreads, 0, stream>>>(down, rows * R, p.silu_alpha);
  if (auto s = CudaFailure("HcSiluKernel", cudaGetLastError()); !s.ok()) return s;

  if (auto s = Gemm<T>("cuBLASLt GEMM up = hidden @ up_weight", gemm, down, t.up_weight, up, rows, width, R, stream);
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
                 "grid %u x %d (vec %d), HcSiluKernel grid %u x %d, HcGateEpilogueKernel grid %u x %d (vec %d)\n",
                 static_cast<long long>(rows), static_cast<long long>(C), static_cast<long long>(H),
                 static_cast<long long>(R), norm_blocks, norm_threads, norm_vec, silu_blocks, kElementwiseThreads,
                 epi_blocks, kElementwiseThreads, epi_vec);
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
