// The general path's first kernel (hc_norm_inject.cu): S (prologue), per-branch rms, hn and
// inject = hn @ inject_weight with post_gate, for any C/H, row count and T.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/hc_device_caps.h"

namespace hcfuse {
namespace cuda {

template <typename T>
struct NormArgs {
  const T* streams;
  const T* norm_scale;
  const T* inject_weight;      // (C*H, C); null: no inject (post_gate not written; the quantized op's GEMM route)
  const T* prev_block_output;  // null without prologue
  const T* prev_post_gate;
  T* streams_out;  // null when not requested
  T* hn;
  T* post_gate;
  int64_t rows, C, H;
  float epsilon, gate_div, gate_mul;
};

// How LaunchNormInject ran the kernel (for HCFUSE_DEBUG's line).
struct NormLaunch {
  const char* kernel = "";   // which kernel and where S is kept
  unsigned blocks = 0;
  int threads = 0, vec = 0, rows_per_block = 0;
};

// Writes streams_out (when not null), hn (rows x C*H) and post_gate (not without inject_weight) on `stream`;
// rows > 0. S, hn, inject and post_gate of a row are the same bits at every row count (one kernel and one order
// of operations per shape, type and pointer alignment). Never synchronizes.
template <typename T>
cudaError_t LaunchNormInject(const NormArgs<T>& a, const HcDeviceCaps& caps, cudaStream_t stream, NormLaunch* info);

}  // namespace cuda
}  // namespace hcfuse
