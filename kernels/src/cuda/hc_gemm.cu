// cuBLASLt GEMMs of the general path; see hc_gemm.h for why one algorithm is pinned per shape.
#include "cuda/hc_gemm.h"

#include <cstdio>

#include "cuda/hc_common.cuh"

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

// Owners of the cuBLASLt descriptors of one problem.
struct Problem {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t weight = nullptr, act = nullptr, out = nullptr;
  ~Problem() {
    if (out) cublasLtMatrixLayoutDestroy(out);
    if (act) cublasLtMatrixLayoutDestroy(act);
    if (weight) cublasLtMatrixLayoutDestroy(weight);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

// cuBLASLt is column-major: the row-major buffers weight[K, N], act[M, K], out[M, N] are the
// column-major matrices W' (N x K, ld N), A' (K x M, ld K), O' (N x M, ld N), and
// out = act @ weight  <=>  O' = W' * A'. Nothing is transposed or copied.
cublasStatus_t MakeProblem(cudaDataType_t type, int64_t M, int64_t N, int64_t K, Problem* p) {
  // fp32 compute and fp32 scale for every T: products accumulate in fp32, rounded to T once on store
  HC_LT_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t no_transpose = CUBLAS_OP_N;
  HC_LT_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &no_transpose,
                                                       sizeof(no_transpose)));
  HC_LT_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &no_transpose,
                                                       sizeof(no_transpose)));
  HC_LT_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&p->weight, type, N, K, N));
  HC_LT_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&p->act, type, K, M, K));
  HC_LT_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&p->out, type, N, M, N));
  return CUBLAS_STATUS_SUCCESS;
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

bool HcLtGemm::ValidForAllRows(cudaDataType_t type, int64_t N, int64_t K, const cublasLtMatmulAlgo_t& algo) {
  for (int64_t M : kProbeRows) {
    Problem problem;
    cublasLtMatmulHeuristicResult_t check = {};
    if (MakeProblem(type, M, N, K, &problem) != CUBLAS_STATUS_SUCCESS ||
        cublasLtMatmulAlgoCheck(handle_, problem.desc, problem.weight, problem.act, problem.out, problem.out, &algo,
                                &check) != CUBLAS_STATUS_SUCCESS ||
        check.workspaceSize != 0) {
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

cublasStatus_t HcLtGemm::Plan(const Key& key, std::optional<cublasLtMatmulAlgo_t>* algo) {
  auto found = algos_.find(key);
  if (found != algos_.end()) {
    *algo = found->second;
    return CUBLAS_STATUS_SUCCESS;
  }
  const auto [type, N, K, align_act, align_weight, align_out] = key;
  Problem problem;
  HC_LT_RETURN_IF_ERROR(MakeProblem(static_cast<cudaDataType_t>(type), kPlanRows, N, K, &problem));
  Preference pref;
  HC_LT_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&pref.p));
  // No workspace: scratch comes only from ORT's allocator, and split-K needs one anyway.
  HC_LT_RETURN_IF_ERROR(pref.Set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, uint64_t{0}));
  // One sequential dot product per output: no split-K, no partial sums reduced in T or elsewhere.
  HC_LT_RETURN_IF_ERROR(pref.Set(CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                 static_cast<uint32_t>(CUBLASLT_REDUCTION_SCHEME_NONE)));
  // Never a reduced-precision accumulator (fp16 HMMA accumulation) nor the complex 3m trick.
  HC_LT_RETURN_IF_ERROR(pref.Set(CUBLASLT_MATMUL_PREF_IMPL_MASK,
                                 ~(CUBLASLT_NUMERICAL_IMPL_FLAGS_ACCUMULATOR_16F | CUBLASLT_NUMERICAL_IMPL_FLAGS_GAUSSIAN)));
  HC_LT_RETURN_IF_ERROR(pref.Set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, uint32_t{align_weight}));
  HC_LT_RETURN_IF_ERROR(pref.Set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, uint32_t{align_act}));
  HC_LT_RETURN_IF_ERROR(pref.Set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, uint32_t{align_out}));
  HC_LT_RETURN_IF_ERROR(pref.Set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, uint32_t{align_out}));

  constexpr int kCandidates = 8;
  cublasLtMatmulHeuristicResult_t results[kCandidates] = {};
  int returned = 0;
  HC_LT_RETURN_IF_ERROR(cublasLtMatmulAlgoGetHeuristic(handle_, problem.desc, problem.weight, problem.act,
                                                       problem.out, problem.out, pref.p, kCandidates, results,
                                                       &returned));
  for (int i = 0; i < returned; ++i) {
    const auto& r = results[i];
    const uint32_t split_k = AlgoConfig<uint32_t>(r.algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, 1);
    const uint32_t reduction = AlgoConfig<uint32_t>(r.algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, 0);
    if (r.state != CUBLAS_STATUS_SUCCESS || r.workspaceSize != 0 || split_k > 1 ||
        reduction != CUBLASLT_REDUCTION_SCHEME_NONE || !ValidForAllRows(static_cast<cudaDataType_t>(type), N, K, r.algo)) {
      continue;
    }
    if (debug_) {
      std::fprintf(stderr,
                   "hcfuse: HyperConnectionLowRankMix general path GEMM N=%lld K=%lld type=%d: cuBLASLt algo id %u "
                   "tile %u stages %u split-k %u (pinned for every row count)\n",
                   static_cast<long long>(N), static_cast<long long>(K), type,
                   AlgoConfig<uint32_t>(r.algo, CUBLASLT_ALGO_CONFIG_ID, 0),
                   AlgoConfig<uint32_t>(r.algo, CUBLASLT_ALGO_CONFIG_TILE_ID, 0),
                   AlgoConfig<uint32_t>(r.algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, 0), split_k);
    }
    algos_.emplace(key, r.algo);
    *algo = r.algo;
    return CUBLAS_STATUS_SUCCESS;
  }
  if (debug_) {
    std::fprintf(stderr,
                 "hcfuse: HyperConnectionLowRankMix general path GEMM N=%lld K=%lld type=%d: cuBLASLt offers no "
                 "algorithm without split-K and workspace valid for every row count; the fallback kernel runs it\n",
                 static_cast<long long>(N), static_cast<long long>(K), type);
  }
  algos_.emplace(key, std::nullopt);
  *algo = std::nullopt;
  return CUBLAS_STATUS_SUCCESS;
}

template <typename T>
HcLtGemm::Key HcLtGemm::MakeKey(const T* act, const T* weight, const T* out, int64_t N, int64_t K) {
  return Key{static_cast<int>(kCudaType<T>), N, K, AlignmentOf(act), AlignmentOf(weight), AlignmentOf(out)};
}

template <typename T>
cublasStatus_t HcLtGemm::Available(const T* act, const T* weight, const T* out, int64_t N, int64_t K,
                                   bool* available) {
  std::optional<cublasLtMatmulAlgo_t> algo;
  std::lock_guard<std::mutex> lock(mu_);  // Compute may run concurrently on one kernel instance
  HC_LT_RETURN_IF_ERROR(EnsureHandle());
  HC_LT_RETURN_IF_ERROR(Plan(MakeKey(act, weight, out, N, K), &algo));
  *available = algo.has_value();
  return CUBLAS_STATUS_SUCCESS;
}

template <typename T>
cublasStatus_t HcLtGemm::Run(const T* act, const T* weight, T* out, int64_t M, int64_t N, int64_t K,
                             cudaStream_t stream) {
  std::optional<cublasLtMatmulAlgo_t> algo;
  {
    std::lock_guard<std::mutex> lock(mu_);
    HC_LT_RETURN_IF_ERROR(EnsureHandle());
    HC_LT_RETURN_IF_ERROR(Plan(MakeKey(act, weight, out, N, K), &algo));
  }
  if (!algo) return CUBLAS_STATUS_NOT_SUPPORTED;  // callers ask Available() first
  Problem problem;
  HC_LT_RETURN_IF_ERROR(MakeProblem(kCudaType<T>, M, N, K, &problem));
  const float alpha = 1.0f, beta = 0.0f;
  return cublasLtMatmul(handle_, problem.desc, &alpha, weight, problem.weight, act, problem.act, &beta, out,
                        problem.out, out, problem.out, &*algo, /*workspace=*/nullptr, 0, stream);
}

#define HC_INSTANTIATE_LT_GEMM(T)                                                                              \
  template cublasStatus_t HcLtGemm::Run<T>(const T*, const T*, T*, int64_t, int64_t, int64_t, cudaStream_t); \
  template cublasStatus_t HcLtGemm::Available<T>(const T*, const T*, const T*, int64_t, int64_t, bool*);
HC_INSTANTIATE_LT_GEMM(float)
HC_INSTANTIATE_LT_GEMM(__half)
HC_INSTANTIATE_LT_GEMM(__nv_bfloat16)

}  // namespace cuda
}  // namespace hcfuse
