// Device helpers shared by the general and the fast CUDA paths of HyperConnectionLowRankMix:
// conversions, the contract's one rounding step, the accurate sigmoid, fixed-order warp/block
// sums and vector load types. Everything here is deterministic and independent of the row count.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>

namespace hcfuse {
namespace cuda {

// Grid cap of the kernels that loop over rows or row groups: any row count fits the grid's limits.
constexpr int64_t kMaxRowBlocks = int64_t{1} << 20;

// Every part of a launcher's device scratch starts this many bytes past the base (a multiple).
inline constexpr size_t kScratchAlign = 256;
inline size_t AlignUp(size_t bytes) { return (bytes + kScratchAlign - 1) / kScratchAlign * kScratchAlign; }
__host__ __device__ inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Grid cap of the kernels that loop over elements (grid-stride; rows: kMaxRowBlocks).
constexpr int64_t kMaxGridStrideBlocks = int64_t{1} << 16;
// Blocks of a grid-stride kernel over `items`, `per_block` of them a block a pass: at least 1, at most the cap.
inline unsigned GridStrideBlocks(int64_t items, int64_t per_block) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min(CeilDiv(items, per_block), kMaxGridStrideBlocks)));
}

// One kernel launch with its cluster size (1: none) and programmatic stream serialization (use_pdl:
// the kernel may start before the previous one on the stream ends, so it calls ptx::WaitOnProducer
// before it reads anything that kernel, or any before it, writes; sm_90 only).
template <typename Kernel, typename... Args>
cudaError_t Launch(Kernel kernel, int grid, int threads, size_t smem, int cluster, bool use_pdl, cudaStream_t stream,
                   Args... args) {
  if (smem > 48 * 1024) {  // only above 48 KB must a kernel opt in to its dynamic shared memory
    const cudaError_t err =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (err != cudaSuccess) return err;
  }
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

// ---- T <-> fp32. FromFloat rounds to nearest even and keeps NaN a NaN (the cuda_fp16/bf16 intrinsics).
template <typename T>
__device__ __forceinline__ float ToFloat(T v);
template <>
__device__ __forceinline__ float ToFloat<float>(float v) { return v; }
template <>
__device__ __forceinline__ float ToFloat<__half>(__half v) { return __half2float(v); }
template <>
__device__ __forceinline__ float ToFloat<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T FromFloat(float v);
template <>
__device__ __forceinline__ float FromFloat<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half FromFloat<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// The contract's rounding step: an fp32 value rounded once to T, carried on in fp32.
// Every rounding point of docs/NUMERICS.md goes through this function (or FromFloat when stored).
template <typename T>
__device__ __forceinline__ float RoundToT(float v) { return ToFloat<T>(FromFloat<T>(v)); }

// Two values of a 16-bit T packed in a 32-bit word (the element order of memory) <-> fp32, one
// instruction a pair where the element-wise forms take one an element. PackPair is FromFloat for two
// values at once (round to nearest even, the same bits): the packed form of the contract's rounding step.
template <typename T>
__device__ __forceinline__ float2 UnpackPair(uint32_t w);
template <typename T>
__device__ __forceinline__ uint32_t PackPair(float lo, float hi);
template <>
__device__ __forceinline__ float2 UnpackPair<__nv_bfloat16>(uint32_t w) {
  return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
}
template <>
__device__ __forceinline__ uint32_t PackPair<__nv_bfloat16>(float lo, float hi) {
  const __nv_bfloat162 p = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&p);
}
template <>
__device__ __forceinline__ float2 UnpackPair<__half>(uint32_t w) {
  return __half22float2(*reinterpret_cast<const __half2*>(&w));
}
template <>
__device__ __forceinline__ uint32_t PackPair<__half>(float lo, float hi) {
  const __half2 p = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&p);
}

// Accurate fp32 sigmoid (expf, IEEE division; never build with --use_fast_math).
// Written without contraction so it gives the same fp32 value as 1 / (1 + exp(-x)) in NumPy
// whenever expf and NumPy's exp agree.
__device__ __forceinline__ float Sigmoid(float x) { return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-x))); }

// Sigmoid(x), the same bits, for x >= kSigmoidInRangeMin (+inf included; not NaN) without the IEEE
// division's branch to its slow path: d = 1 + expf(-x) lies in [1, 2^126), where __fdiv_rn(1, d) is its
// fast path, rcp.approx and the Newton steps written here (the instructions nvcc emits for it). Straight-
// line code, so a thread's sigmoids interleave. Checked bitwise against Sigmoid for every float16 and
// bfloat16 x in range (tests/test_sigmoid_cuda.py).
constexpr float kSigmoidInRangeMin = -87.0f;
__device__ __forceinline__ float SigmoidInRange(float x) {
  const float d = __fadd_rn(1.0f, expf(-x));
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(d));
  r = __fmaf_rn(r, __fmaf_rn(-d, r, 1.0f), r);
  return __fmaf_rn(r, __fmaf_rn(-d, r, 1.0f), r);
}

// The per-element formulas of docs/NUMERICS.md in fp32, written without contraction (the __f*_rn
// intrinsics) so both CUDA paths compute what hcfuse.reference computes in NumPy fp32.
//
// One step of a sum of squares or dot product as the reference writes it: product rounded, then added.
// Where T is 16-bit, a and b are T values, whose product is exact in fp32 (at most 22 significant
// bits): rounding it before the add changes nothing, so one FMA gives the same bits in one instruction
// instead of two. (bfloat16 products under 2^-133, which fp32 holds only rounded, are the exception:
// there the FMA adds the exact product.)
template <typename T>
__device__ __forceinline__ float MulAdd(float a, float b, float acc) {
  if constexpr (sizeof(T) == 2) {
    return __fmaf_rn(a, b, acc);
  } else {
    return __fadd_rn(acc, __fmul_rn(a, b));
  }
}

// Prologue: S = streams + prev_post_gate[c] * prev_block_output[h], rounded once by the caller.
template <typename T>
__device__ __forceinline__ float PrologueS(float streams, float prev_gate, float prev_out) {
  return MulAdd<T>(prev_gate, prev_out, streams);
}

// 1 / rms of one branch from its fp32 sum of squares: 1 / sqrt(mean_h(S^2) + epsilon).
__device__ __forceinline__ float BranchInvRms(float sum_sq, int64_t H, float epsilon) {
  return __fdiv_rn(1.0f, sqrtf(__fadd_rn(__fdiv_rn(sum_sq, static_cast<float>(H)), epsilon)));
}

// hn = (S * inv_rms) * norm_scale, rounded once by the caller.
__device__ __forceinline__ float NormalizeHn(float s, float inv_rms, float scale) {
  return __fmul_rn(__fmul_rn(s, inv_rms), scale);
}

// ScaledSiLU's three rounding points (Z, SG, hidden) from the rounded down projection.
template <typename T>
__device__ __forceinline__ float ScaledSilu(float down, float alpha) {
  const float z = RoundToT<T>(__fmul_rn(alpha, down));  // rounding point: Z = silu_alpha * down
  const float sg = RoundToT<T>(Sigmoid(z));              // rounding point: SG = sigmoid(Z)
  return RoundToT<T>(__fmul_rn(z, sg));                  // rounding point: hidden = Z * SG
}

// post_gate from the rounded inject, rounded where the stock Div, Sigmoid and Mul round (the gate logit
// and its sigmoid here, post_gate by the caller).
template <typename T>
__device__ __forceinline__ float PostGate(float inject, float gate_div, float gate_mul) {
  const float logit = RoundToT<T>(__fdiv_rn(inject, gate_div));  // rounding point: gate logit
  const float sg = RoundToT<T>(Sigmoid(logit));                  // rounding point: sigmoid of the gate logit
  return __fmul_rn(sg, gate_mul);
}

// ---- Fixed-order reductions: a butterfly inside the warp, then warp 0 adds the warp sums in order.
__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Sum over the whole block (blockDim.x a multiple of 32, at most 1024). `scratch` holds 32 floats;
// every thread gets the result. Safe to call repeatedly with the same scratch.
__device__ __forceinline__ float BlockSum(float v, float* scratch) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int num_warps = blockDim.x >> 5;
  v = WarpSum(v);
  __syncthreads();  // the previous call's readers are done with scratch
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < num_warps; ++w) total += scratch[w];  // same order in every thread
  return total;
}

// ---- Vector access: VEC elements of T in one aligned load/store.
template <typename T, int VEC>
struct alignas(sizeof(T) * VEC) Vec {
  T v[VEC];
};

template <typename T, int VEC>
__device__ __forceinline__ Vec<T, VEC> LoadVec(const T* p) {
  return *reinterpret_cast<const Vec<T, VEC>*>(p);
}

template <typename T, int VEC>
__device__ __forceinline__ void StoreVec(T* p, const Vec<T, VEC>& v) {
  *reinterpret_cast<Vec<T, VEC>*>(p) = v;
}

// Largest power-of-two alignment (in bytes, capped at 256) of an address.
__host__ __device__ inline unsigned AlignmentOf(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  unsigned align = 256;
  while (align > 1 && (a % align) != 0) align >>= 1;
  return align;
}

// Widest vector (elements of T, 16 bytes at most) every non-null pointer is aligned to and H divides.
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

}  // namespace cuda
}  // namespace hcfuse
