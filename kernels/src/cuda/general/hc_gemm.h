// Row-major GEMMs of the general path through cuBLASLt: out[M, N] = act[M, K] @ weight[K, N],
// weights used in place, fp32 compute and accumulation for every T.
//
// Two kinds of product:
// - plain (Available/Run): the fp32 result rounded once to T by cuBLASLt (the up GEMM).
// - split (AvailableSplit/RunSplit): K cut into `splits` equal slices, chosen from K alone
//   (HcSplitCount); ONE strided-batched matmul writes the fp32 partial sum of every slice,
//   partial[b][m][n] = sum over k in slice b of act[m, k] * weight[k, n], and the caller adds the
//   partials in the fixed order b = 0, 1, ... and rounds (the down GEMM). Few rows times
//   a long K run on few CTAs as one product; the slices give the GPU `splits` times more CTAs, and
//   the split depends on K only, so a row's summation order is the same at every row count.
//
// Row independence: cuBLASLt's heuristic picks a different kernel (tile, split-K) per M, and a
// different kernel may sum in a different order. HcLtGemm therefore picks ONE algorithm per
// (types, N, K, splits, plan rows, alignments) - with M fixed to the plan rows - with cuBLASLt's own split-K and
// every other reduction scheme excluded, and runs it for every M. cuBLASLt 13 asks even those
// algorithms for a few bytes of workspace at some M (4 bytes were seen): the caller passes a
// kWorkspaceBytes buffer from its scratch (ORT's allocator). A row's dot
// products then always go through the same kernel and the same K order, whatever the batch. The
// algorithm must pass cublasLtMatmulAlgoCheck for a spread of row counts; where none does,
// Available()/AvailableSplit() say so and the caller runs its fallback kernel for every M.
// One instance per ORT kernel; no process-wide state. Host-only (no device code), never throws,
// never synchronizes.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>

namespace hcfuse {
namespace cuda {

// ---- The fixed K split of the down product.
// Slices are at least kHcSplitMinSliceK long (shorter slices would make the partials cost more
// traffic than the product), a multiple of kHcSplitSliceMultiple elements (each batch's act and weight
// pointer then keeps the base pointer's 16-byte alignment in every T), and there are at most
// `max_slices` of them (bounds the partials per row: splits * N floats).
inline constexpr int64_t kHcSplitMinSliceK = 256;
inline constexpr int64_t kHcSplitSliceMultiple = 8;
inline constexpr int64_t kHcSplitMaxSlices = 64;

// Rule: the largest s <= max_slices that divides K into slices K / s that are >= 256 and a multiple
// of 8; 1 (no split) when there is none (K < 512, or no such divisor). Depends on K alone, never on M.
constexpr int64_t HcSplitCountUpTo(int64_t K, int64_t max_slices) {
  for (int64_t s = max_slices; s > 1; --s) {
    if (K % s == 0 && K / s >= kHcSplitMinSliceK && (K / s) % kHcSplitSliceMultiple == 0) return s;
  }
  return 1;
}
// The split of the few-row range (rows < kHcMidMinRows): many CTAs for few rows.
// K = 10240 (C*H of the real shape): 40 slices of 256.
constexpr int64_t HcSplitCount(int64_t K) { return HcSplitCountUpTo(K, kHcSplitMaxSlices); }
static_assert(HcSplitCount(10240) == 40, "the real shape's K = C*H = 10240 splits into 40 slices of 256");
static_assert(HcSplitCount(320) == 1 && HcSplitCount(16) == 1, "short K is not split");

// ---- The mid range (kHcMidMinRows <= rows < kHcPrefillMinRows): at most kHcMidMaxSlices slices,
// planned at 256 rows (fewer, larger slices than the few-row range: the partials' traffic grows with
// the rows). K = 10240: 16 slices of 640.
inline constexpr int64_t kHcMidMinRows = 256;
inline constexpr int64_t kHcMidMaxSlices = 16;
constexpr int64_t HcMidSplitCount(int64_t K) { return HcSplitCountUpTo(K, kHcMidMaxSlices); }
static_assert(HcMidSplitCount(10240) == 16, "the real shape's K = 10240 splits into 16 slices of 640 in the mid range");

// ---- The prefill range (rows >= kHcPrefillMinRows): enough rows that a few slices fill the GPU
// (the real shape at 1024 rows: 8 x 3 tiles of 128 x 128 per slice), and each slice costs
// rows * N * 8 bytes of fp32 partials (written, read back): at most kHcPrefillMaxSlices slices.
// K = 10240: 4 slices of 2560.
inline constexpr int64_t kHcPrefillMinRows = 1024;
inline constexpr int64_t kHcPrefillMaxSlices = 4;
constexpr int64_t HcPrefillSplitCount(int64_t K) { return HcSplitCountUpTo(K, kHcPrefillMaxSlices); }
static_assert(HcPrefillSplitCount(10240) == 4, "the real shape's K = 10240 splits into 4 slices of 2560 for prefill");

// ---- The long prefill range (rows >= kHcLongPrefillMinRows): the prefill range's split, both products
// planned at HcLtGemm::kLongPrefillPlanRows: cuBLASLt's plan for 4096 rows (larger tiles) is faster
// there but slower at 1024 rows, so 1024-4095 rows keep the 1024-row plan. The up product's plan is the
// same tile either way.
inline constexpr int64_t kHcLongPrefillMinRows = 4096;

// Floats from partial[b] to partial[b + 1] for an M x N product: M*N rounded up to 64 floats, so
// every batch's matrix starts 256-byte aligned like the first one, whatever M.
constexpr int64_t HcPartialStride(int64_t M, int64_t N) { return (M * N + 63) / 64 * 64; }

class HcLtGemm {
 public:
  // The M the one algorithm is chosen for (any M runs with it): the few-row range's plain (up) and
  // split (down) products, the mid range's split product, and both products of the prefill and the long
  // prefill ranges (hc_general.cu picks by range).
  // The plan rows are part of a plan's key: each range has its own pinned algorithm.
  static constexpr int64_t kPlanRows = 256;
  static constexpr int64_t kSplitPlanRows = 64;
  static constexpr int64_t kMidPlanRows = 256;
  static constexpr int64_t kPrefillPlanRows = 1024;
  static constexpr int64_t kLongPrefillPlanRows = 4096;
  // Workspace every Run/RunSplit call gets (256-byte aligned); algorithms needing more are not taken.
  static constexpr size_t kWorkspaceBytes = 64 * 1024;

  // debug: print each planned algorithm to stderr (HCFUSE_DEBUG=1).
  explicit HcLtGemm(bool debug) : debug_(debug) {}
  ~HcLtGemm();
  HcLtGemm(const HcLtGemm&) = delete;
  HcLtGemm& operator=(const HcLtGemm&) = delete;

  // Whether cuBLASLt has an algorithm for this product (plans it on first use). Depends on the type,
  // N, K, splits and the pointers' alignments, never on M, so a caller that falls back when it has
  // none still treats every row count alike.
  template <typename T>
  cublasStatus_t Available(const T* act, const T* weight, const T* out, int64_t N, int64_t K, bool* available,
                           int64_t plan_rows = kPlanRows);
  template <typename T>
  cublasStatus_t AvailableSplit(const T* act, const T* weight, const float* partial, int64_t N, int64_t K,
                                int64_t splits, bool* available, int64_t plan_rows = kSplitPlanRows);

  // Plain: out[M, N] = act @ weight rounded to T. T is float, __half or __nv_bfloat16. `stream` is the
  // caller's (ORT's compute) stream.
  template <typename T>
  cublasStatus_t Run(const T* act, const T* weight, T* out, int64_t M, int64_t N, int64_t K, void* workspace,
                     cudaStream_t stream, int64_t plan_rows = kPlanRows);
  // Split: partial[b * HcPartialStride(M, N) + m * N + n] = fp32 sum over k in [b*K/splits, (b+1)*K/splits)
  // of act[m, k] * weight[k, n], for b < splits (K divisible by splits). partial holds
  // splits * HcPartialStride(M, N) floats.
  template <typename T>
  cublasStatus_t RunSplit(const T* act, const T* weight, float* partial, int64_t M, int64_t N, int64_t K,
                          int64_t splits, void* workspace, cudaStream_t stream, int64_t plan_rows = kSplitPlanRows);

 private:
  // (A/B data type, C/D data type, N, K, splits, plan rows, alignment of act, weight, out)
  using Key = std::tuple<int, int, int64_t, int64_t, int64_t, int64_t, unsigned, unsigned, unsigned>;
  // A planned product: the pinned algorithm and the descriptors that do not depend on M, built once
  // in place (opaque descriptors, never copied or moved: std::map nodes stay put).
  struct Plan {
    bool has_algo = false;
    cublasLtMatmulAlgo_t algo = {};
    cublasLtMatmulDescOpaque_t desc = {};
    cublasLtMatrixLayoutOpaque_t weight = {};
  };
  cublasStatus_t EnsureHandle();
  template <typename T, typename Out>
  static Key MakeKey(const T* act, const T* weight, const Out* out, int64_t N, int64_t K, int64_t splits,
                     int64_t plan_rows);
  // The plan of `key`, planned on first use (mu_ held). Pointers into plans_ stay valid.
  cublasStatus_t GetPlan(const Key& key, const Plan** plan);
  // Fills a fresh plan in place: descriptors, then the first heuristic candidate that passes (has_algo
  // stays false when none does).
  cublasStatus_t BuildPlan(const Key& key, Plan& plan);
  // cublasLtMatmulAlgoCheck passes for every row count of kProbeRows (hc_gemm.cu).
  bool ValidForAllRows(const Key& key, Plan& plan, const cublasLtMatmulAlgo_t& algo);
  template <typename T, typename Out>
  cublasStatus_t Availability(const T* act, const T* weight, const Out* out, int64_t N, int64_t K, int64_t splits,
                              int64_t plan_rows, bool* available);
  template <typename T, typename Out>
  cublasStatus_t Matmul(const T* act, const T* weight, Out* out, int64_t M, int64_t N, int64_t K, int64_t splits,
                        int64_t plan_rows, void* workspace, cudaStream_t stream);

  const bool debug_;
  // Guards handle_ creation, plans_, and each cublasLtMatmul call that reads a plan's descriptors
  // (Compute may run concurrently on one kernel instance; the call only enqueues work).
  std::mutex mu_;
  cublasLtHandle_t handle_ = nullptr;
  std::map<Key, Plan> plans_;
};

}  // namespace cuda
}  // namespace hcfuse
