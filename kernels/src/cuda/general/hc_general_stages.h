// Stages of the general path (hc_general.cu) that the quantized op's GEMM route (cuda/nbits/hc_nbits_gemm.cu)
// runs too: the row ranges' plan of the split product, the split product itself, and the up product with
// the gate epilogue. Host-only declarations; no device code.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda/common/hc_device_caps.h"
#include "cuda/common/hc_lowrank_mix_cuda.h"
#include "cuda/general/hc_gemm.h"

namespace hcfuse {
namespace cuda {

// How the split (down) product and the up product run at a row count (the row ranges of hc_gemm.h): the K
// split, the rows both pinned algorithms are planned for, and the largest row chunk of the split product.
struct HcRangePlan {
  const char* name = "";
  int64_t splits = 1, split_plan_rows = 0, up_plan_rows = 0, max_chunk_rows = 0;
};

// The plan of `rows` rows of a split product over K (depends on the range of rows and on K only).
HcRangePlan HcPlanRange(int64_t rows, int64_t K);

// Rows per chunk of a split product whose fp32 partials take `partial_floats_per_row` floats a row (hc_general.cu).
int64_t HcSplitChunkRows(int64_t partial_floats_per_row, const HcRangePlan& range);

// A failed step as a status (ok when e is the success value of its kind).
HcLaunchStatus HcCudaStatus(const char* step, cudaError_t e);
HcLaunchStatus HcCublasStatus(const char* step, cublasStatus_t e);

// One split product (fp32 partials in HcLtGemm::RunSplit's layout) of M rows: cuBLASLt where `use_lt`
// (HcLtGemm::AvailableSplit, asked once per call), else the general path's fallback kernel.
template <typename T>
HcLaunchStatus HcSplitGemm(const char* step, HcLtGemm& gemm, bool use_lt, const T* act, const T* weight,
                           float* partial, int64_t M, int64_t N, int64_t K, int64_t splits, int64_t plan_rows,
                           void* workspace, cudaStream_t stream);

// The up product and the gate epilogue: up = hidden @ up_weight (K = R) rounded to T, g = sigmoid(up) rounded,
// pre_output = reduction_scale * sum_c hn * g, branches in order.
template <typename T>
struct HcUpStage {
  const T* hidden = nullptr;     // (rows, R)
  const T* up_weight = nullptr;  // (R, C*H)
  const T* hn = nullptr;         // (rows, C*H)
  T* pre_output = nullptr;       // (rows, H)
  T* up = nullptr;               // (rows, C*H) scratch for up; unused where the fused kernel runs
  int64_t rows = 0, C = 0, H = 0, R = 0;
  float reduction_scale = 1.0f;
};

// Whether the fused up/gate kernel (hc_up_gate.h) runs the stage (then `up` is not needed). Scratch pointers
// not yet allocated may be given as any 256-byte aligned stand-in: the answer depends on their alignment only.
template <typename T>
bool HcUpStageFused(const HcUpStage<T>& stage, const HcDeviceCaps& caps, const HcGeneralOptions& options);

// Launches the stage on `stream`: the fused kernel, or cuBLASLt's product (planned at plan_rows) and
// HcGateEpilogueKernel. route (route_size bytes, may be null) gets the debug line's words on the route taken.
template <typename T>
HcLaunchStatus LaunchHcUpStage(const HcUpStage<T>& stage, int64_t plan_rows, const HcDeviceCaps& caps,
                               const HcGeneralOptions& options, HcLtGemm& gemm, void* workspace, bool pdl,
                               cudaStream_t stream, char* route, size_t route_size);

}  // namespace cuda
}  // namespace hcfuse
