// Every float16 and bfloat16 bit pattern x: SigmoidInRange(x) against Sigmoid(x), bitwise in fp32,
// where x >= kSigmoidInRangeMin or +inf (hc_common.cuh). Prints one line per type:
//   "<type>: <n> inputs in range, <m> mismatches" and the first mismatches; exits 1 on any mismatch.
#include <cstdio>
#include <cstring>

#include "cuda/hc_common.cuh"

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

template <typename T>
bool Run(const char* name) {
  unsigned* d = nullptr;
  cudaMalloc(&d, 10 * sizeof(unsigned));
  cudaMemset(d, 0, 10 * sizeof(unsigned));
  Check<T><<<256, 256>>>(d, d + 1, d + 2);
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
  const bool ok = Run<__half>("float16") & Run<__nv_bfloat16>("bfloat16");
  return ok ? 0 : 1;
}
