// The quantized op's GEMM route (hc_nbits_gemm.cu; docs/QUANTIZED.md, "The GEMM route"): for many rows, each
// quantized projection is dequantized into per-call scratch as T matrices whose sum is its exact fp32 weight,
// and the products run on cuBLASLt through the dense general path's stages. Launcher declarations only; no
// device code and no ORT type.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "cpu/hc_nbits_cpu.h"
#include "cuda/common/hc_device_caps.h"
#include "cuda/common/hc_lowrank_mix_cuda.h"

namespace hcfuse {
namespace cuda {

class HcLtGemm;

// Rows from which a general call takes the GEMM route where it can (below, the products' per-call dequantization
// costs more than it saves).
inline constexpr int64_t kHcNBitsGemmMinRows = 64;

struct HcNBitsGemmOptions {
  bool pdl = false;  // the route's own kernels launch with programmatic dependent launch (sm_90)
  int64_t min_rows = kHcNBitsGemmMinRows;  // another value only in developer builds (HCFUSE_NBITS_GEMM_MIN_ROWS)
  // float16 only: every quantized weight is known to lie in float16's range (|scale| * (2^bits - 1) <= 65504
  // for every scale: the glue reads constant scales once). Without it a weight could round to infinity.
  bool float16_weights_in_range = false;
};

// Why the GEMM route cannot run this call; empty when it can. It takes every form but these: fewer than
// options.min_rows rows; 16-bit T with zero points of T (their weights are not a sum of two T values);
// float16 whose weights are not known to be in range.
template <typename T>
std::string HcNBitsGemmRefusal(const HcNBitsParams& params, const HcNBitsTensors<T>& tensors,
                               const HcNBitsGemmOptions& options);

// Bytes of device scratch LaunchHcNBitsGemm needs for this call (256-byte aligned parts).
template <typename T>
size_t HcNBitsGemmScratchBytes(const HcNBitsParams& params, const HcNBitsTensors<T>& tensors,
                               const HcDeviceCaps& caps);

// Runs the call (after an empty HcNBitsGemmRefusal) on `stream`; scratch holds HcNBitsGemmScratchBytes bytes.
// Never throws and never synchronizes. debug: one line to stderr on the kernels and products it ran.
template <typename T>
HcLaunchStatus LaunchHcNBitsGemm(const HcNBitsParams& params, const HcNBitsTensors<T>& tensors,
                                 const HcDeviceCaps& caps, const HcNBitsGemmOptions& options, void* scratch,
                                 HcLtGemm& gemm, cudaStream_t stream, bool debug);

}  // namespace cuda
}  // namespace hcfuse
