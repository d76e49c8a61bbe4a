// Row-major GEMMs of the general path through cuBLASLt: out[M, N] = act[M, K] @ weight[K, N],
// weights used in place, fp32 compute and accumulation for every T, result rounded once to T.
//
// Row independence: cuBLASLt's heuristic picks a different kernel (tile, split-K) per M, and a
// different kernel may sum in a different order. HcLtGemm therefore picks ONE algorithm per
// (type, N, K, alignments) - with M fixed to kPlanRows - with split-K and every other reduction
// scheme excluded and no workspace, and runs it for every M. A row's dot products then always go
// through the same kernel and the same K order, whatever the batch. The algorithm must pass
// cublasLtMatmulAlgoCheck for a spread of row counts; where none does, Available() says so and the
// caller runs its fallback kernel for every M. One instance per ORT kernel;
// no process-wide state. Host-only (no device code), never throws, never synchronizes.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <tuple>

namespace hcfuse {
namespace cuda {

class HcLtGemm {
 public:
  // The M the one algorithm is chosen for (any M runs with it).
  static constexpr int64_t kPlanRows = 256;

  // debug: print each planned algorithm to stderr (HCFUSE_DEBUG=1).
  explicit HcLtGemm(bool debug) : debug_(debug) {}
  ~HcLtGemm();
  HcLtGemm(const HcLtGemm&) = delete;
  HcLtGemm& operator=(const HcLtGemm&) = delete;

  // Whether cuBLASLt has an algorithm for this product (plans it on first use). Depends on the type,
  // N, K and the pointers' alignments, never on M, so a caller that falls back when it has none still
  // treats every row count alike.
  template <typename T>
  cublasStatus_t Available(const T* act, const T* weight, const T* out, int64_t N, int64_t K, bool* available);

  // T is float, __half or __nv_bfloat16. `stream` is the caller's (ORT's compute) stream.
  template <typename T>
  cublasStatus_t Run(const T* act, const T* weight, T* out, int64_t M, int64_t N, int64_t K, cudaStream_t stream);

 private:
  // (cuda data type, N, K, alignment of act, weight, out)
  using Key = std::tuple<int, int64_t, int64_t, unsigned, unsigned, unsigned>;
  cublasStatus_t EnsureHandle();
  template <typename T>
  static Key MakeKey(const T* act, const T* weight, const T* out, int64_t N, int64_t K);
  cublasStatus_t Plan(const Key& key, std::optional<cublasLtMatmulAlgo_t>* algo);  // nullopt: none
  // cublasLtMatmulAlgoCheck passes for every row count of kProbeRows (hc_gemm.cu).
  bool ValidForAllRows(cudaDataType_t type, int64_t N, int64_t K, const cublasLtMatmulAlgo_t& algo);

  const bool debug_;
  std::mutex mu_;
  cublasLtHandle_t handle_ = nullptr;
  std::map<Key, std::optional<cublasLtMatmulAlgo_t>> algos_;
};

}  // namespace cuda
}  // namespace hcfuse
