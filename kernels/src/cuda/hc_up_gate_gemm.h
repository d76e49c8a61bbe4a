// The general path's up product with the gate epilogue fused in (hc_up_gate_gemm.cu):
//   pre_output[m, h] = reduction_scale * sum_c hn[m, c*H + h] * g[m, c, h],
//   g = sigmoid(up) rounded to T, up = hidden @ up_weight (fp32 accumulation, rounded to T),
// with `up` kept in registers (never written to memory). 16-bit T, C = 4, on mma.sync tensor cores.
// Host-only declarations; never throws, never synchronizes.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace hcfuse {
namespace cuda {

// Whether the fused kernel runs this shape: T is __half or __nv_bfloat16, C == 4, H a multiple of 32,
// R a multiple of 8, hidden/up_weight/hn/pre_output 16-byte aligned. Depends on the shape, type and
// alignments only, never on the row count, so every row count of a shape takes the same route.
template <typename T>
bool HcUpGateGemmEligible(int64_t C, int64_t H, int64_t R, const T* hidden, const T* up_weight, const T* hn,
                          const T* pre_output);

// Launches the fused kernel for `rows` rows on `stream` (rows may be 0: nothing launched).
// hidden (rows, R), up_weight (R, 4*H), hn (rows, 4*H), pre_output (rows, H). Eligible shapes only.
// blocks / rows_per_block: the grid and tile height chosen (for the debug line).
template <typename T>
cudaError_t LaunchHcUpGateGemm(const T* hidden, const T* up_weight, const T* hn, T* pre_output, int64_t rows,
                               int64_t H, int64_t R, float reduction_scale, cudaStream_t stream, unsigned* blocks,
                               int* rows_per_block);

}  // namespace cuda
}  // namespace hcfuse
