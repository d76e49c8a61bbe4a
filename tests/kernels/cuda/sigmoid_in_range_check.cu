// Every float16 and bfloat16 bit pattern x: SigmoidInRange(x) against Sigmoid(x), bitwise in fp32,
// where x >= kSigmoidInRangeMin or +inf (hc_common.cuh); and every bfloat16 x but NaN: the sigmoid table's
// lookup (hc_sigmoid_table.cuh) against RoundToT(Sigmoid(x)). Prints one line per check:
//   "<check>: <n> inputs in range, <m> mismatches" and the first mismatches; exits 1 on any mismatch.
#include <cstdio>
#include <cstring>

#include "cuda/common/hc_common.cuh"
#include "cuda/common/hc_sigmoid_table.cuh"

namespace {

template <typename T>
__global__ void Check(unsigned* in_range, unsigned* mismatches, unsigned* first) {
  const unsigned bits = blockIdx.x * blockDim.x + threadIdx.x;
  if (bits >= 65536) return;
  const unsigned short b16 = static_cast<unsigned short>(bits);
  T v;
  memcpy(&v, &b16, sizeof(v));
  const float x = hcfuse::cuda::ToFloat(v);
  if (!(x >= hcfuse::cuda::kSigmoidInRangeMin)) return;
  atomicAdd(in_range, 1u);
  if (__float_as_uint(hcfuse::cuda::SigmoidInRange(x)) != __float_as_uint(hcfuse::cuda::Sigmoid(x))) {
    const unsigned k = atomicAdd(mismatches, 1u);
    if (k < 8) first[k] = bits;
  }
}

// One block of 1024 threads fills the table, then checks 64 patterns a thread.
__global__ void CheckTable(unsigned* in_range, unsigned* mismatches, unsigned* first) {
  using hcfuse::cuda::Bf16SigmoidTable;
  __shared__ float table[Bf16SigmoidTable::kEntries];
  hcfuse::cuda::FillBf16SigmoidTable(table);
  __syncthreads();
  for (unsigned bits = threadIdx.x; bits < 65536; bits += blockDim.x) {
    if ((bits & 0x7FFFu) > Bf16SigmoidTable::kMaxNotNaN) continue;  // NaN: the epilogue computes it
    atomicAdd(in_range, 1u);
    const float x = __uint_as_float(bits << 16);
    const float expected = hcfuse::cuda::RoundToT<__nv_bfloat16>(hcfuse::cuda::Sigmoid(x));
    // each pattern in both halves of a word, next to its neighbour
    float lo, hi, lo2, hi2;
    hcfuse::cuda::Bf16SigmoidPairFromTable(table, bits | ((bits ^ 1u) << 16), lo, hi);
    hcfuse::cuda::Bf16SigmoidPairFromTable(table, (bits << 16) | (bits ^ 1u), lo2, hi2);
    if (__float_as_uint(lo) != __float_as_uint(expected) || __float_as_uint(hi2) != __float_as_uint(expected)) {
      const unsigned k = atomicAdd(mismatches, 1u);
      if (k < 8) first[k] = bits;
    }
  }
}

template <typename Kernel>
bool Run(const char* name, Kernel kernel, int blocks, int threads) {
  unsigned* d = nullptr;
  cudaMalloc(&d, 10 * sizeof(unsigned));
  cudaMemset(d, 0, 10 * sizeof(unsigned));
  kernel<<<blocks, threads>>>(d, d + 1, d + 2);
  unsigned h[10] = {};
  const cudaError_t e = cudaMemcpy(h, d, sizeof(h), cudaMemcpyDeviceToHost);
  cudaFree(d);
  if (e != cudaSuccess) {
    std::printf("%s: CUDA error %s\n", name, cudaGetErrorString(e));
    return false;
  }
  std::printf("%s: %u inputs in range, %u mismatches", name, h[0], h[1]);
  for (unsigned i = 0; i < h[1] && i < 8; ++i) std::printf(" 0x%04x", h[2 + i]);
  std::printf("\n");
  return h[1] == 0 && h[0] > 0;
}

}  // namespace

int main() {
  const bool ok = Run("float16", Check<__half>, 256, 256) & Run("bfloat16", Check<__nv_bfloat16>, 256, 256) &
                  Run("bfloat16 table", CheckTable, 1, 1024);
  return ok ? 0 : 1;
}
