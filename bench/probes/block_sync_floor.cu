// What one decode block's synchronization costs, with no weights and no products: the floor under any
// design of the fast path. Each block of a 96- and a 48-block chain (one CUDA graph each; us per block =
// the slope) does the fast path's data flow in miniature: every CTA writes a partial, then every CTA
// reads all partials and writes the block's output, which the next block's CTAs read first.
//
//   two-kernel        stage 1 and stage 2 as two kernels chained by programmatic dependent launch (the
//                     fast path's design today)
//   coop+grid.sync    one cooperative kernel per block, cooperative_groups' grid barrier between the two
//                     halves; with PDL between blocks, and without
//   flag barrier      one kernel per block with PDL, a barrier of its own (arrival counter and generation
//                     word in per-chain scratch), co-residency from the grid fitting one CTA per SM
//
//   nvcc -O3 -std=c++17 -arch=sm_90a -o /tmp/block_sync_floor bench/probes/block_sync_floor.cu && /tmp/block_sync_floor
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace cg = cooperative_groups;

#define CK(x)                                                                              \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                               \
      std::printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));       \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)

constexpr int kThreads = 256;
constexpr int kPartials = 8;  // floats each CTA writes (a cluster's part sums at 1 row, roughly)

__device__ __forceinline__ void PdlWait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void PdlLaunch() { asm volatile("griddepcontrol.launch_dependents;"); }

// phase 1: each CTA reads the block input (x, as a stage 1 CTA reads its rows) and writes its partials
__device__ __forceinline__ void Phase1(const float* x, float* part) {
  const float v = x[threadIdx.x % 64];
  if (threadIdx.x < kPartials) part[blockIdx.x * kPartials + threadIdx.x] = v * 0.5f + blockIdx.x;
}
// phase 2: each CTA reads every partial, reduces, and writes its share of the output
__device__ __forceinline__ void Phase2(const float* part, float* y) {
  __shared__ float red[kThreads / 32];
  float s = 0.f;
  for (int i = threadIdx.x; i < gridDim.x * kPartials; i += blockDim.x) s += part[i];
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    float t = 0.f;
    for (int w = 0; w < kThreads / 32; ++w) t += red[w];
    if (blockIdx.x < 64) y[blockIdx.x] = t * 1e-6f;
  }
}

__global__ void __launch_bounds__(kThreads) Stage1(const float* x, float* part) {
  PdlLaunch();
  PdlWait();
  Phase1(x, part);
}
__global__ void __launch_bounds__(kThreads) Stage2(const float* part, float* y) {
  PdlLaunch();
  PdlWait();
  Phase2(part, y);
}

__global__ void __launch_bounds__(kThreads) CoopBlock(const float* x, float* part, float* y, int pdl) {
  if (pdl) {
    PdlLaunch();
    PdlWait();
  }
  Phase1(x, part);
  cg::this_grid().sync();
  Phase2(part, y);
}

// barrier[0]: arrivals, barrier[1]: generation. The last CTA to arrive resets the count and bumps the
// generation; the others spin on it. Re-usable across graph replays without a reset.
__device__ __forceinline__ void FlagBarrier(unsigned* barrier) {
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned gen;
    asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(gen) : "l"(barrier + 1) : "memory");
    __threadfence();
    if (atomicAdd(barrier, 1u) == gridDim.x - 1) {
      atomicExch(barrier, 0u);
      asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(barrier + 1) : "memory");
    } else {
      unsigned now;
      do {
        asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(now) : "l"(barrier + 1) : "memory");
      } while (now == gen);
    }
  }
  __syncthreads();
}

__global__ void __launch_bounds__(kThreads) FlagBlock(const float* x, float* part, float* y, unsigned* barrier) {
  PdlLaunch();
  PdlWait();
  Phase1(x, part);
  FlagBarrier(barrier);
  Phase2(part, y);
}

enum Variant { kTwoKernel, kCoopPdl, kCoopPlain, kFlag };
const char* kNames[] = {"two-kernel (PDL)", "coop + grid.sync, PDL", "coop + grid.sync, no PDL", "flag barrier, PDL"};

template <typename... Args>
cudaError_t Launch(void (*kernel)(Args...), int grid, bool pdl, bool coop, cudaStream_t s, Args... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = kThreads;
  cfg.stream = s;
  cudaLaunchAttribute a[2];
  int n = 0;
  if (pdl) {
    a[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    a[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (coop) {
    a[n].id = cudaLaunchAttributeCooperative;
    a[n++].val.cooperative = 1;
  }
  cfg.attrs = a;
  cfg.numAttrs = n;
  return cudaLaunchKernelEx(&cfg, kernel, args...);
}

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s, %d SMs\n", prop.name, sms);
  const int grids[] = {64, 128, sms};
  float *x, *part, *y;
  unsigned* barrier;
  CK(cudaMalloc(&x, 64 * sizeof(float)));
  CK(cudaMalloc(&part, 1024 * kPartials * sizeof(float)));
  CK(cudaMalloc(&y, 64 * sizeof(float)));
  CK(cudaMalloc(&barrier, 2 * sizeof(unsigned)));
  CK(cudaMemset(x, 0, 64 * sizeof(float)));
  CK(cudaMemset(barrier, 0, 2 * sizeof(unsigned)));
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (int grid : grids) {
    for (int v = kTwoKernel; v <= kFlag; ++v) {
      float per[2];
      const int counts[2] = {96, 48};
      bool failed = false;
      for (int ci = 0; ci < 2 && !failed; ++ci) {
        cudaGraph_t g;
        cudaGraphExec_t ge;
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
        cudaError_t err = cudaSuccess;
        for (int b = 0; b < counts[ci] && err == cudaSuccess; ++b) {
          // x -> y -> x: each block reads what the one before wrote
          float* in = b % 2 ? y : x;
          float* out = b % 2 ? x : y;
          switch (v) {
            case kTwoKernel:
              err = Launch(Stage1, grid, true, false, st, (const float*)in, part);
              if (err == cudaSuccess) err = Launch(Stage2, grid, true, false, st, (const float*)part, out);
              break;
            case kCoopPdl:
            case kCoopPlain:
              err = Launch(CoopBlock, grid, v == kCoopPdl, true, st, (const float*)in, part, out, int(v == kCoopPdl));
              break;
            case kFlag:
              err = Launch(FlagBlock, grid, true, false, st, (const float*)in, part, out, barrier);
              break;
          }
        }
        cudaError_t end = cudaStreamEndCapture(st, &g);
        if (err != cudaSuccess || end != cudaSuccess) {
          std::printf("grid %4d  %-28s capture failed: %s / %s\n", grid, kNames[v], cudaGetErrorString(err),
                      cudaGetErrorString(end));
          cudaGetLastError();
          failed = true;
          break;
        }
        CK(cudaGraphInstantiate(&ge, g, 0));
        for (int i = 0; i < 5; ++i) CK(cudaGraphLaunch(ge, st));
        CK(cudaStreamSynchronize(st));
        float best = 1e9f;
        for (int rep = 0; rep < 10; ++rep) {
          CK(cudaEventRecord(e0, st));
          for (int i = 0; i < 20; ++i) CK(cudaGraphLaunch(ge, st));
          CK(cudaEventRecord(e1, st));
          CK(cudaEventSynchronize(e1));
          float ms;
          CK(cudaEventElapsedTime(&ms, e0, e1));
          best = std::min(best, ms / 20);
        }
        per[ci] = best;
        CK(cudaGraphExecDestroy(ge));
        CK(cudaGraphDestroy(g));
      }
      if (!failed) {
        std::printf("grid %4d  %-28s %6.2f us/block (96-block graph %.3f ms)\n", grid, kNames[v],
                    (per[0] - per[1]) / 48 * 1000, per[0]);
      }
    }
  }
  return 0;
}
