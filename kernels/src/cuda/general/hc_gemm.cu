// cuBLASLt GEMMs of the general path; see hc_gemm.h for why one algorithm is pinned per shape and
// how the split products are laid out.
#include "cuda/general/hc_gemm.h"

#include <cstdio>

#include "cuda/common/hc_common.cuh"

namespace hcfuse {
namespace cuda {
namespace {

#define HC_LT_RETURN_IF_ERROR(expr)                    \
  do {                                                 \
    const cublasStatus_t hc_status_ = (expr);          \
    if (hc_status_ != CUBLAS_STATUS_SUCCESS) return hc_status_; \
  } while (0)

template <typename T>
constexpr cudaDataType_t kCudaType = CUDA_R_32F;
template <>
constexpr cudaDataType_t kCudaType<__half> = CUDA_R_16F;
template <>
constexpr cudaDataType_t kCudaType<__nv_bfloat16> = CUDA_R_16BF;

// cuBLASLt is column-major: the row-major buffers weight[K, N], act[M, K], out[M, N] are the
// column-major matrices W' (N x K, ld N), A' (K x M, ld K), O' (N x M, ld N), and
// out = act @ weight  <=>  O' = W' * A'. Nothing is transposed or copied.
//
// Split products (splits > 1, Ks = K / splits) are one strided-batched matmul; batch b is
//   W'_b = rows [b*Ks, (b+1)*Ks) of weight:   N x Ks, ld N, at weight + b * (Ks*N)
//   A'_b = columns [b*Ks, (b+1)*Ks) of act:   Ks x M, ld K, at act + b * Ks
//   O'_b = partial[b]:                        N x M,  ld N, at partial + b * HcPartialStride(M, N)
// so O'_b(n, m) = partial[b][m][n] = sum over k in slice b of act[m, k] * weight[k, n].
// With splits == 1 no batch attribute is set (the plain product).
cublasStatus_t SetBatch(cublasLtMatrixLayout_t layout, int64_t splits, int64_t stride) {
  if (splits == 1) return CUBLAS_STATUS_SUCCESS;
  const int32_t count = static_cast<int32_t>(splits);
  HC_LT_RETURN_IF_ERROR(
      cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
  return cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                          sizeof(stride));
}

// The descriptors that do not depend on M: the operation and W'.
cublasStatus_t InitDesc(cublasLtMatmulDesc_t desc) {
  // fp32 compute and fp32 scale for every T: products accumulate in fp32, rounded once on store
  HC_LT_RETURN_IF_ERROR(cublasLtMatmulDescInit(desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t no_transpose = CUBLAS_OP_N;
  HC_LT_RETURN_IF_ERROR(
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &no_transpose, sizeof(no_transpose)));
  return cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &no_transpose, sizeof(no_transpose));
}

cublasStatus_t InitWeightLayout(cublasLtMatrixLayout_t layout, cudaDataType_t type, int64_t N, int64_t K,
                                int64_t splits) {
  const int64_t Ks = K / splits;
  HC_LT_RETURN_IF_ERROR(cublasLtMatrixLayoutInit(layout, type, N, Ks, N));
  return SetBatch(layout, splits, Ks * N);
}

// The descriptors of A' and O' for M rows (stack storage: built per call, no allocation).
struct RowLayouts {
  cublasLtMatrixLayoutOpaque_t act = {}, out = {};
};

cublasStatus_t InitRowLayouts(RowLayouts* l, cudaDataType_t ab_type, cudaDataType_t cd_type, int64_t M, int64_t N,
                              int64_t K, int64_t splits) {
  const int64_t Ks = K / splits;
  HC_LT_RETURN_IF_ERROR(cublasLtMatrixLayoutInit(&l->act, ab_type, Ks, M, K));
  HC_LT_RETURN_IF_ERROR(SetBatch(&l->act, splits, Ks));
  HC_LT_RETURN_IF_ERROR(cublasLtMatrixLayoutInit(&l->out, cd_type, N, M, N));
  return SetBatch(&l->out, splits, HcPartialStride(M, N));
}

struct Preference {
  cublasLtMatmulPreference_t p = nullptr;
  ~Preference() {
    if (p) cublasLtMatmulPreferenceDestroy(p);
  }
  template <typename V>
  cublasStatus_t Set(cublasLtMatmulPreferenceAttributes_t attr, V value) {
    return cublasLtMatmulPreferenceSetAttribute(p, attr, &value, sizeof(value));
  }
};

// Row counts every pinned algorithm is checked against before it is taken (cuBLASLt accepts some
// algorithms for one M and rejects them for another, e.g. a one-row output in 16-bit types): small,
// odd, tile-boundary and large M, so no row count reaches an algorithm that would refuse it.
// (Split products run at most one row chunk of hc_general.cu at a time, but are checked for all.)
constexpr int64_t kProbeRows[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 15, 16, 17, 31, 33, 64, 127, 128, 129, 255, 257, 1000, 4099};

template <typename V>
V AlgoConfig(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attr, V fallback) {
  V value = fallback;
  size_t written = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &value, sizeof(value), &written) != CUBLAS_STATUS_SUCCESS) {
    return fallback;
  }
  return value;
}

}  // namespace

bool HcLtGemm::ValidForAllRows(const Key& key, Plan& plan, const cublasLtMatmulAlgo_t& algo) {
  const auto [ab_type, cd_type, N, K, splits, plan_rows, align_act, align_weight, align_out] = key;
  for (int64_t M : kProbeRows) {
    RowLayouts rows;
    cublasLtMatmulHeuristicResult_t check = {};
    const cublasStatus_t layout = InitRowLayouts(&rows, static_cast<cudaDataType_t>(ab_type),
                                                 static_cast<cudaDataType_t>(cd_type), M, N, K, splits);
    const cublasStatus_t status =
        layout != CUBLAS_STATUS_SUCCESS
            ? layout
            : cublasLtMatmulAlgoCheck(handle_, &plan.desc, &plan.weight, &rows.act, &rows.out, &rows.out, &algo, &check);
    if (status != CUBLAS_STATUS_SUCCESS || check.workspaceSize > kWorkspaceBytes) {
      if (debug_) {
        std::fprintf(stderr, "hcfuse: general path GEMM N=%lld K=%lld: M=%lld: %s, workspace %zu\n",
                     static_cast<long long>(N), static_cast<long long>(K), static_cast<long long>(M),
                     cublasLtGetStatusName(status), check.workspaceSize);
      }
      return false;
    }
  }
  return true;
}

HcLtGemm::~HcLtGemm() {
  if (handle_) cublasLtDestroy(handle_);
}

cublasStatus_t HcLtGemm::EnsureHandle() {
  if (handle_) return CUBLAS_STATUS_SUCCESS;
  return cublasLtCreate(&handle_);
}

cublasStatus_t HcLtGemm::BuildPlan(const Key& key, Plan& plan) {
  const auto [ab_type, cd_type, N, K, splits, plan_rows, align_act, align_weight, align_out] = key;
  HC_LT_RETURN_IF_ERROR(InitDesc(&plan.desc));
  HC_LT_RETURN_IF_ERROR(InitWeightLayout(&plan.weight, static_cast<cudaDataType_t>(ab_type), N, K, splits));
  RowLayouts rows;
  HC_LT_RETURN_IF_ERROR(InitRowLayouts(&rows, static_cast<cudaDataType_t>(ab_type),
                                       static_cast<cudaDataType_t>(cd_type), plan_rows, N, K, splits));
  Preference pref;
  HC_LT_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&pref.p));
  // A small workspace only (the caller's, from ORT's allocator): enough for the few bytes some
  // algorithms ask for, never for a split-K reduction (excluded below anyway).
  HC_LT_RETURN_IF_ERROR(pref.Set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, uint64_t{kWorkspaceBytes}));
  // One sequential dot product per output (per slice): no cuBLASLt split-K, no partial sums reduced
  // in T or elsewhere; the only K split is ours, with its fixed-order reduction.
  HC_LT_RETURN_IF_ERROR(pref.Set(CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                 static_cast<uint32_t>(CUBLASLT_REDUCTION_SCHEME_NONE)));
  // Never a reduced-precision accumulator (fp16 HMMA accumulation) nor the complex 3m trick.
  HC_LT_RETURN_IF_ERROR(pref.Set(CUBLASLT_MATMUL_PREF_IMPL_MASK, ~(CUBLASLT_NUMERICAL_IMPL_FLAGS_ACCUMULATOR_16F |
                                                                   CUBLASLT_NUMERICAL_IMPL_FLAGS_GAUSSIAN)));
  HC_LT_RETURN_IF_ERROR(pref.Set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, uint32_t{align_weight}));
  HC_LT_RETURN_IF_ERROR(pref.Set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, uint32_t{align_act}));
  HC_LT_RETURN_IF_ERROR(pref.Set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, uint32_t{align_out}));
  HC_LT_RETURN_IF_ERROR(pref.Set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, uint32_t{align_out}));

  constexpr int kCandidates = 8;
  cublasLtMatmulHeuristicResult_t results[kCandidates] = {};
  int returned = 0;
  HC_LT_RETURN_IF_ERROR(cublasLtMatmulAlgoGetHeuristic(handle_, &plan.desc, &plan.weight, &rows.act, &rows.out,
                                                       &rows.out, pref.p, kCandidates, results, &returned));
  for (int i = 0; i < returned; ++i) {
    const auto& r = results[i];
    const uint32_t split_k = AlgoConfig<uint32_t>(r.algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, 1);
    const uint32_t reduction = AlgoConfig<uint32_t>(r.algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, 0);
    const char* rejected = r.state != CUBLAS_STATUS_SUCCESS                 ? "state"
                           : r.workspaceSize > kWorkspaceBytes             ? "needs more workspace"
                           : split_k > 1                                   ? "split-K"
                           : reduction != CUBLASLT_REDUCTION_SCHEME_NONE ? "reduction scheme"
                           : !ValidForAllRows(key, plan, r.algo)          ? "invalid for some row count"
                                                                           : nullptr;
    if (rejected != nullptr) {
      if (debug_) {
        std::fprintf(stderr, "hcfuse: general path GEMM N=%lld K=%lld splits=%lld: candidate %d of %d rejected (%s)\n",
                     static_cast<long long>(N), static_cast<long long>(K), static_cast<long long>(splits), i, returned,
                     rejected);
      }
      continue;
    }
    if (debug_) {
      std::fprintf(stderr,
                   "hcfuse: HyperConnectionLowRankMix general path GEMM N=%lld K=%lld splits=%lld plan M=%lld type=%d "
                   "out type=%d: cuBLASLt algo id %u tile %u stages %u split-k %u (pinned for every row count)\n",
                   static_cast<long long>(N), static_cast<long long>(K), static_cast<long long>(splits),
                   static_cast<long long>(plan_rows), ab_type, cd_type, AlgoConfig<uint32_t>(r.algo, CUBLASLT_ALGO_CONFIG_ID, 0),
                   AlgoConfig<uint32_t>(r.algo, CUBLASLT_ALGO_CONFIG_TILE_ID, 0),
                   AlgoConfig<uint32_t>(r.algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, 0), split_k);
    }
    plan.has_algo = true;
    plan.algo = r.algo;
    return CUBLAS_STATUS_SUCCESS;
  }
  if (debug_) {
    std::fprintf(stderr,
                 "hcfuse: HyperConnectionLowRankMix general path GEMM N=%lld K=%lld splits=%lld type=%d out "
                 "type=%d: cuBLASLt offers no algorithm without split-K valid for every row count; "
                 "the fallback kernel runs it\n",
                 static_cast<long long>(N), static_cast<long long>(K), static_cast<long long>(splits), ab_type,
                 cd_type);
  }
  return CUBLAS_STATUS_SUCCESS;  // planned: no algorithm
}

cublasStatus_t HcLtGemm::GetPlan(const Key& key, const Plan** out) {
  auto found = plans_.find(key);
  if (found != plans_.end()) {
    *out = &found->second;
    return CUBLAS_STATUS_SUCCESS;
  }
  // Built in its final place (opaque descriptors are not copied); dropped again on error so the next
  // call retries.
  Plan& plan = plans_[key];
  if (const cublasStatus_t status = BuildPlan(key, plan); status != CUBLAS_STATUS_SUCCESS) {
    plans_.erase(key);
    return status;
  }
  *out = &plan;
  return CUBLAS_STATUS_SUCCESS;
}

template <typename T, typename Out>
HcLtGemm::Key HcLtGemm::MakeKey(const T* act, const T* weight, const Out* out, int64_t N, int64_t K, int64_t splits,
                                int64_t plan_rows) {
  return Key{static_cast<int>(kCudaType<T>), static_cast<int>(kCudaType<Out>), N, K, splits, plan_rows,
             AlignmentOf(act), AlignmentOf(weight), AlignmentOf(out)};
}

template <typename T, typename Out>
cublasStatus_t HcLtGemm::Availability(const T* act, const T* weight, const Out* out, int64_t N, int64_t K,
                                      int64_t splits, int64_t plan_rows, bool* available) {
  std::lock_guard<std::mutex> lock(mu_);
  HC_LT_RETURN_IF_ERROR(EnsureHandle());
  const Plan* plan = nullptr;
  HC_LT_RETURN_IF_ERROR(GetPlan(MakeKey(act, weight, out, N, K, splits, plan_rows), &plan));
  *available = plan->has_algo;
  return CUBLAS_STATUS_SUCCESS;
}

template <typename T, typename Out>
cublasStatus_t HcLtGemm::Matmul(const T* act, const T* weight, Out* out, int64_t M, int64_t N, int64_t K,
                                int64_t splits, int64_t plan_rows, void* workspace, cudaStream_t stream) {
  if (splits < 1 || K % splits != 0) return CUBLAS_STATUS_INVALID_VALUE;
  std::lock_guard<std::mutex> lock(mu_);  // held through cublasLtMatmul: it reads the plan's descriptors
  HC_LT_RETURN_IF_ERROR(EnsureHandle());
  const Plan* plan = nullptr;
  HC_LT_RETURN_IF_ERROR(GetPlan(MakeKey(act, weight, out, N, K, splits, plan_rows), &plan));
  if (!plan->has_algo) return CUBLAS_STATUS_NOT_SUPPORTED;  // callers ask Available() first
  RowLayouts rows;
  HC_LT_RETURN_IF_ERROR(InitRowLayouts(&rows, kCudaType<T>, kCudaType<Out>, M, N, K, splits));
  const float alpha = 1.0f, beta = 0.0f;
  // cuBLASLt takes non-const descriptor handles; it only reads them.
  auto* desc = const_cast<cublasLtMatmulDescOpaque_t*>(&plan->desc);
  auto* weight_layout = const_cast<cublasLtMatrixLayoutOpaque_t*>(&plan->weight);
  return cublasLtMatmul(handle_, desc, &alpha, weight, weight_layout, act, &rows.act, &beta, out, &rows.out, out,
                        &rows.out, &plan->algo, workspace, kWorkspaceBytes, stream);
}

template <typename T>
cublasStatus_t HcLtGemm::Available(const T* act, const T* weight, const T* out, int64_t N, int64_t K,
                                   bool* available, int64_t plan_rows) {
  return Availability<T, T>(act, weight, out, N, K, 1, plan_rows, available);
}

template <typename T>
cublasStatus_t HcLtGemm::AvailableSplit(const T* act, const T* weight, const float* partial, int64_t N, int64_t K,
                                        int64_t splits, bool* available, int64_t plan_rows) {
  return Availability<T, float>(act, weight, partial, N, K, splits, plan_rows, available);
}

template <typename T>
cublasStatus_t HcLtGemm::Run(const T* act, const T* weight, T* out, int64_t M, int64_t N, int64_t K,
                             void* workspace, cudaStream_t stream, int64_t plan_rows) {
  return Matmul<T, T>(act, weight, out, M, N, K, 1, plan_rows, workspace, stream);
}

template <typename T>
cublasStatus_t HcLtGemm::RunSplit(const T* act, const T* weight, float* partial, int64_t M, int64_t N, int64_t K,
                                  int64_t splits, void* workspace, cudaStream_t stream, int64_t plan_rows) {
  return Matmul<T, float>(act, weight, partial, M, N, K, splits, plan_rows, workspace, stream);
}

#define HC_INSTANTIATE_LT_GEMM(T)                                                                                   \
  template cublasStatus_t HcLtGemm::Run<T>(const T*, const T*, T*, int64_t, int64_t, int64_t, void*, cudaStream_t, \
                                           int64_t);                                                               \
  template cublasStatus_t HcLtGemm::Available<T>(const T*, const T*, const T*, int64_t, int64_t, bool*, int64_t);  \
  template cublasStatus_t HcLtGemm::RunSplit<T>(const T*, const T*, float*, int64_t, int64_t, int64_t, int64_t,   \
                                                void*, cudaStream_t, int64_t);                                     \
  template cublasStatus_t HcLtGemm::AvailableSplit<T>(const T*, const T*, const float*, int64_t, int64_t, int64_t, \
                                                      bool*, int64_t);
HC_INSTANTIATE_LT_GEMM(float)
HC_INSTANTIATE_LT_GEMM(__half)
HC_INSTANTIATE_LT_GEMM(__nv_bfloat16)

}  // namespace cuda
}  // namespace hcfuse
