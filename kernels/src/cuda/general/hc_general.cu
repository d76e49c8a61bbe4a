// General CUDA path of HyperConnectionLowRankMix: any C/H/R, any row count, every T.
//
//   LaunchNormInject   S (prologue), per-branch rms, hn, inject = hn @ inject_weight (a fixed-order
//   (hc_norm_inject.cu) fp32 dot product per row) and post_gate   -> streams_out, hn (scratch), post_gate;
//                      streams and the prologue inputs are read once
//   per chunk of at most ChunkRows rows:
//     GEMM (cuBLASLt, strided-batched)  fp32 partials of down = hn @ down_weight over a fixed number
//                      of K slices (HcFallbackGemmKernel where cuBLASLt has no algorithm)
//     HcSplitReduceKernel  down = the slices' sum in order b = 0, 1, ..., rounded to T;
//                      hidden = ScaledSiLU(down)
//   GEMM (cuBLASLt)    up = hidden @ up_weight
//   HcGateEpilogueKernel  g = sigmoid(up) (bfloat16 from 4096 rows: looked up, the same bits), pre_output
//
// On sm_90 the norm, reduction and epilogue kernels launch with programmatic dependent launch: each
// starts while the kernel before it ends and waits for it (ptx::WaitOnProducer) before any read; the
// epilogue releases the next kernel once all its blocks have stored (cuBLASLt's products launch
// without it).
//
// Four row ranges (hc_gemm.h), which differ in the down and up products only:
//   few rows   rows <  kHcMidMinRows (256): HcSplitCount(C*H) slices (40 for the real shape: enough
//              CTAs at a few rows), algorithms planned at kSplitPlanRows / kPlanRows rows;
//   mid        kHcMidMinRows <= rows < kHcPrefillMinRows (1024): HcMidSplitCount(C*H) slices (16),
//              planned at kMidPlanRows;
//   prefill    kHcPrefillMinRows <= rows < kHcLongPrefillMinRows (4096): HcPrefillSplitCount(C*H) slices
//              (4: the partials' traffic is small next to the product), both algorithms planned at
//              kPrefillPlanRows rows;
//   long prefill  rows >= kHcLongPrefillMinRows: the same split, both algorithms planned at
//              kLongPrefillPlanRows (4096) rows (the 1024-row plan is faster below 4096 rows).
// Within a range each output element is computed by a fixed sequence of operations that does not
// depend on the row count or on which block runs it (row-stride and grid-stride loops; reductions in
// fixed order; the K split depends on K and the range only; GEMM algorithms pinned in HcLtGemm, the
// same for every chunk), so results are deterministic and row independent within the range. S, hn,
// inject and post_gate do not depend on the range at all (one kernel, one order, for every row count);
// pre_output does (another K split of down).
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <type_traits>

#include "cuda/common/hc_common.cuh"
#include "cuda/common/hc_device_caps.h"
#include "cuda/common/hc_lowrank_mix_cuda.h"
#include "cuda/common/hc_ptx.cuh"
#include "cuda/common/hc_sigmoid_table.cuh"
#include "cuda/general/hc_gemm.h"
#include "cuda/general/hc_general_stages.h"
#include "cuda/general/hc_norm_inject.h"
#include "cuda/general/hc_up_gate.h"

namespace hcfuse {
namespace cuda {
namespace {

constexpr int kElementwiseThreads = 256;
// The gate epilogue with the sigmoid table (bfloat16): blocks of 512 threads, two an SM, on a grid-stride loop,
// so that each SM fills its table twice a launch; each thread issues two branches' loads together (the
// lookups leave too few instructions to cover one branch's load latency). From the long prefill range, where
// the fills are a small part of the launch (below it the fills, 4100 sigmoids a block, do not overlap the
// product before it and the table loses).
constexpr int kTableEpilogueThreads = 512;
constexpr int kTableBlocksPerSm = 2;
constexpr int kTableEpilogueBranches = 2;
constexpr int64_t kTableMinRows = kHcLongPrefillMinRows;

// Row chunks of a split product (HcSplitChunkRows).
constexpr int64_t kChunkRowsMultiple = 128;
constexpr int64_t kMaxChunkRows = 1024;
constexpr int64_t kMaxPrefillChunkRows = 4096;
constexpr int64_t kPartialBudgetBytes = int64_t{64} << 20;



template <typename T>
struct SplitReduceArgs {
  const float* down_partial;  // splits slices of (rows, R), down_stride floats apart
  int64_t down_stride, splits;
  T* hidden;           // (rows, R)
  int64_t down_count;  // rows * R
  float silu_alpha;
};

// The split down product's reduction, grid-stride over groups of VEC consecutive outputs of rows*R
// (consecutive threads, consecutive groups of one slice): each output adds its slices in the fixed
// order b = 0, 1, ..., splits - 1 in fp32, whatever the row count; then down is rounded to T and becomes
// hidden = ScaledSiLU(down) (Z, SG, hidden rounded in ScaledSilu). VEC only widens the loads.
template <typename T, int VEC>
__global__ void __launch_bounds__(kElementwiseThreads) HcSplitReduceKernel(SplitReduceArgs<T> a) {
  ptx::WaitOnProducer();  // launched early (PDL): the partials come from the product before it
  const int64_t count = a.down_count / VEC;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < count; i += int64_t{gridDim.x} * blockDim.x) {
    const float* __restrict__ partial = a.down_partial + i * VEC;
    float acc[VEC];
#pragma unroll
    for (int j = 0; j < VEC; ++j) acc[j] = 0.0f;
#pragma unroll 8
    for (int64_t b = 0; b < a.splits; ++b) {  // unrolled: 8 slices' loads in flight
      const Vec<float, VEC> p = LoadVec<float, VEC>(partial + b * a.down_stride);
#pragma unroll
      for (int j = 0; j < VEC; ++j) acc[j] = __fadd_rn(acc[j], p.v[j]);
    }
    Vec<T, VEC> out;
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const float down = RoundToT<T>(acc[j]);  // rounding point: down
      out.v[j] = FromFloat<T>(ScaledSilu<T>(down, a.silu_alpha));
    }
    StoreVec<T, VEC>(a.hidden + i * VEC, out);
  }
}

// For a product cuBLASLt has no algorithm for (seen: 16-bit types with N = 1), sliced like HcLtGemm's
// products: with Ks = K / splits,
//   out[b * out_stride + m * N + n] = sum over k in [b*Ks, (b+1)*Ks) of act[m, k] * weight[k, n]
// in fp32, stored as Out: T for a plain product (splits = 1: the rounding point up), float for the
// partials of a split product (down, rounded by HcSplitReduceKernel). One block per
// (row, slice); each thread owns outputs n = t, t + blockDim.x, ... (weight rows read coalesced) and
// sums its slice sequentially, k in order: a fixed order that does not depend on the row count (not
// cuBLASLt's order, but whether this kernel runs depends on type, N, K, splits and alignment only).
template <typename T, typename Out>
__global__ void __launch_bounds__(kElementwiseThreads)
    HcFallbackGemmKernel(const T* act, const T* weight, Out* out, int64_t M, int64_t N, int64_t K, int64_t splits,
                         int64_t out_stride) {
  const int64_t Ks = K / splits;
  for (int64_t item = blockIdx.x; item < M * splits; item += gridDim.x) {
    const int64_t m = item / splits;
    const int64_t b = item - m * splits;
    const T* a = act + m * K + b * Ks;   // act[m, b*Ks ...]
    const T* w = weight + b * Ks * N;    // weight[b*Ks ..., 0]
    for (int64_t n = threadIdx.x; n < N; n += blockDim.x) {
      float acc = 0.0f;
      for (int64_t k = 0; k < Ks; ++k) acc = fmaf(ToFloat(a[k]), ToFloat(w[k * N + n]), acc);
      out[b * out_stride + m * N + n] = FromFloat<Out>(acc);
    }
  }
}

template <typename T>
struct EpilogueArgs {
  const T* hn;
  const T* up;  // rounded up projection (rows, C*H)
  T* pre_output;
  int64_t rows, C, H;
  float reduction_scale;
};

// pre_output[row, h] = reduction_scale * sum_c hn[row, c, h] * g[row, c, h] (c in order), with
// g = sigmoid(up) rounded. (post_gate comes from the norm kernel, hc_norm_inject.cu.) In 16-bit T a branch's VEC sigmoids
// take SigmoidInRange where all VEC up allow it: the same bits as Sigmoid, without a branch per element
// around the division's slow path. With TABLE (bfloat16 only) each block first fills the
// table of rounded sigmoids (hc_sigmoid_table.cuh, before the wait: it reads nothing upstream) and looks g
// up where no up of the VEC is NaN: the same bits again, in fewer instructions (the kernel is issue-bound).
template <typename T, int VEC, bool TABLE>
__global__ void __launch_bounds__(TABLE ? kTableEpilogueThreads : kElementwiseThreads, TABLE ? kTableBlocksPerSm : 0)
    HcGateEpilogueKernel(EpilogueArgs<T> a) {
  static_assert(!TABLE || std::is_same_v<T, __nv_bfloat16>, "the sigmoid table is bfloat16's");
  __shared__ float table[TABLE ? Bf16SigmoidTable::kEntries : 1];
  if constexpr (TABLE) {
    FillBf16SigmoidTable(table);
    __syncthreads();
  }
  ptx::WaitOnProducer();  // launched early (PDL): up comes from the product before it
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  const int64_t start = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  const int64_t groups_per_row = a.H / VEC;
  const int64_t width = a.C * a.H;
  constexpr int kBranches = TABLE ? kTableEpilogueBranches : 1;
  for (int64_t i = start; i < a.rows * groups_per_row; i += stride) {
    const int64_t row = i / groups_per_row;
    const int64_t h = (i - row * groups_per_row) * VEC;
    float acc[VEC];
#pragma unroll
    for (int j = 0; j < VEC; ++j) acc[j] = 0.0f;
#pragma unroll(TABLE ? 1 : 4)
    for (int64_t c0 = 0; c0 < a.C; c0 += kBranches) {
      // with the table, two branches' loads first, so that they are in flight together (each branch's NaN
      // test in GFromTable would otherwise keep the next branch's loads behind it)
      Vec<T, VEC> hn[kBranches], up[kBranches];
#pragma unroll
      for (int b = 0; b < kBranches; ++b) {
        if (c0 + b >= a.C) break;
        hn[b] = LoadVec<T, VEC>(a.hn + row * width + (c0 + b) * a.H + h);
        up[b] = LoadVec<T, VEC>(a.up + row * width + (c0 + b) * a.H + h);
      }
#pragma unroll
      for (int b = 0; b < kBranches; ++b) {
        if (c0 + b >= a.C) break;
        // the VEC g (rounding point: g), added in branch order, are straight-line code
        auto mix = [&](auto g_of) {
#pragma unroll
          for (int j = 0; j < VEC; ++j) acc[j] = MulAdd<T>(ToFloat(hn[b].v[j]), g_of(j), acc[j]);
        };
        if constexpr (TABLE) {
          float g[VEC];
          GFromTable(table, up[b], g);
          mix([&](int j) { return g[j]; });
        } else {
          auto computed = [&](auto sigmoid) { mix([&](int j) { return RoundToT<T>(sigmoid(ToFloat(up[b].v[j]))); }); };
          bool in_range = sizeof(T) == 2;
#pragma unroll
          for (int j = 0; j < VEC; ++j) in_range &= ToFloat(up[b].v[j]) >= kSigmoidInRangeMin;
          if (in_range) {
            computed([](float x) { return SigmoidInRange(x); });
          } else {
            computed([](float x) { return Sigmoid(x); });
          }
        }
      }
    }
    Vec<T, VEC> out;
#pragma unroll
    for (int j = 0; j < VEC; ++j) out.v[j] = FromFloat<T>(__fmul_rn(a.reduction_scale, acc[j]));  // rounding point: pre_output
    StoreVec<T, VEC>(a.pre_output + row * a.H + h, out);
  }
  // The next kernel (the next block's norm kernel, under PDL) may launch once every block gets here:
  // it waits for this grid's end before it reads pre_output. Not earlier: its resident blocks would
  // take the SMs this grid's later blocks need.
  ptx::ReleaseDependents();
}

// The epilogue kernel for a vector width (PickVec's: 8, 4, 2 or 1).
template <typename T, bool TABLE>
auto* EpilogueKernel(int vec) {
  return vec == 8   ? HcGateEpilogueKernel<T, 8, TABLE>
         : vec == 4 ? HcGateEpilogueKernel<T, 4, TABLE>
         : vec == 2 ? HcGateEpilogueKernel<T, 2, TABLE>
                    : HcGateEpilogueKernel<T, 1, TABLE>;
}

// Outputs a thread of HcSplitReduceKernel: 4 or 2 where they divide the count, the hidden chunk's
// alignment (in elements: partial slices start 256-byte aligned) allows it, and kMinReduceBlocks blocks
// remain (the real shape at 256 rows: 320 blocks of one output a thread, where 4 would leave 80 blocks,
// too few to fill the GPU); only the loads widen, no bit changes.
constexpr int64_t kMinReduceBlocks = 512;
int ReduceVec(int64_t count, size_t hidden_align_elements) {
  for (int vec = 4; vec > 1; vec /= 2) {
    if (count % vec == 0 && hidden_align_elements >= static_cast<size_t>(vec) &&
        count / vec >= kMinReduceBlocks * kElementwiseThreads) {
      return vec;
    }
  }
  return 1;
}

unsigned ElementwiseBlocks(int64_t count) { return GridStrideBlocks(count, kElementwiseThreads); }

// One plain GEMM of the general path (out rounded to T): cuBLASLt's pinned algorithm, or the fallback
// kernel where there is none.
template <typename T>
HcLaunchStatus Gemm(const char* step, HcLtGemm& gemm, const T* act, const T* weight, T* out, int64_t M, int64_t N,
                    int64_t K, int64_t plan_rows, void* workspace, cudaStream_t stream) {
  bool available = false;
  if (auto s = HcCublasStatus(step, gemm.Available<T>(act, weight, out, N, K, &available, plan_rows)); !s.ok()) return s;
  if (available) return HcCublasStatus(step, gemm.Run<T>(act, weight, out, M, N, K, workspace, stream, plan_rows));
  const unsigned blocks = static_cast<unsigned>(std::min(M, kMaxRowBlocks));
  HcFallbackGemmKernel<T, T><<<blocks, kElementwiseThreads, 0, stream>>>(act, weight, out, M, N, K, 1, 0);
  return HcCudaStatus("HcFallbackGemmKernel", cudaGetLastError());
}

// The scratch: hn, up (rows, C*H; empty where the fused kernel runs the up product); hidden (rows, R) in
// T; then the fp32 partials of one chunk of m = min(rows, HcSplitChunkRows) rows: splits slices of down
// (HcPartialStride(m, R) floats each), then cuBLASLt's workspace (HcLtGemm::kWorkspaceBytes). Every part
// starts 256-byte aligned (offsets from the base are multiples of kScratchAlign).
struct ScratchLayout {
  HcRangePlan range;
  int64_t chunk_rows = 0;  // min(rows, HcSplitChunkRows(...))
  size_t hn = 0, up = 0, hidden = 0, down_partial = 0, workspace = 0, total = 0;  // byte offsets
};

ScratchLayout MakeScratchLayout(const HcLowRankMixParams& p, size_t element_size, bool fused_up_gate) {
  const size_t rows = static_cast<size_t>(p.rows);
  const size_t width = static_cast<size_t>(p.width());
  ScratchLayout l;
  l.range = HcPlanRange(p.rows, p.width());
  l.chunk_rows = std::min(p.rows, HcSplitChunkRows(l.range.splits * p.R, l.range));
  l.hn = 0;
  l.up = l.hn + AlignUp(rows * width * element_size);
  l.hidden = l.up + (fused_up_gate ? 0 : AlignUp(rows * width * element_size));
  l.down_partial = l.hidden + AlignUp(rows * static_cast<size_t>(p.R) * element_size);
  l.workspace =
      l.down_partial + AlignUp(static_cast<size_t>(l.range.splits * HcPartialStride(l.chunk_rows, p.R)) * sizeof(float));
  l.total = l.workspace + HcLtGemm::kWorkspaceBytes;
  return l;
}

// The up stage of this call (scratch pointers as given: stand-ins before allocation).
template <typename T>
HcUpStage<T> UpStage(const HcLowRankMixParams& p, const HcDeviceTensors<T>& t, const T* hidden, const T* hn, T* up) {
  return {hidden, t.up_weight, hn, t.pre_output, up, p.rows, p.C, p.H, p.R, p.reduction_scale};
}

template <typename T>
const T* AlignedStandIn() {
  return reinterpret_cast<const T*>(uintptr_t{256});
}
}  // namespace

HcLaunchStatus HcCudaStatus(const char* step, cudaError_t e) {
  return e == cudaSuccess ? HcLaunchStatus{} : HcLaunchStatus{step, e, CUBLAS_STATUS_SUCCESS};
}
HcLaunchStatus HcCublasStatus(const char* step, cublasStatus_t e) {
  return e == CUBLAS_STATUS_SUCCESS ? HcLaunchStatus{} : HcLaunchStatus{step, cudaSuccess, e};
}

HcRangePlan HcPlanRange(int64_t rows, int64_t K) {
  if (rows >= kHcLongPrefillMinRows) {
    return {"long prefill", HcPrefillSplitCount(K), HcLtGemm::kLongPrefillPlanRows, HcLtGemm::kLongPrefillPlanRows,
            kMaxPrefillChunkRows};
  }
  if (rows >= kHcPrefillMinRows) {
    return {"prefill", HcPrefillSplitCount(K), HcLtGemm::kPrefillPlanRows, HcLtGemm::kPrefillPlanRows,
            kMaxPrefillChunkRows};
  }
  if (rows >= kHcMidMinRows) {
    return {"mid", HcMidSplitCount(K), HcLtGemm::kMidPlanRows, HcLtGemm::kPlanRows, kMaxChunkRows};
  }
  return {"few-row", HcSplitCount(K), HcLtGemm::kSplitPlanRows, HcLtGemm::kPlanRows, kMaxChunkRows};
}

// The split product runs over at most this many rows at a time and reuses one partial buffer: the largest
// multiple of kChunkRowsMultiple whose partials fit kPartialBudgetBytes, within [kChunkRowsMultiple,
// max_chunk_rows] (the real shape: 40 * 320 * 4 bytes a row -> 1024 rows, 52 MB; prefill 4 * 320 * 4
// bytes a row -> 4096 rows, 21 MB). It depends on the shape and the range, never on the row count
// inside the range, and chunking keeps rows independent: every chunk runs the same pinned algorithm
// (its act pointer is a multiple of kChunkRowsMultiple rows, so at least 256 bytes, past the previous
// one, so the alignment HcLtGemm keys on is the same) and the same reduction.
int64_t HcSplitChunkRows(int64_t partial_floats_per_row, const HcRangePlan& range) {
  const int64_t per_row = partial_floats_per_row * static_cast<int64_t>(sizeof(float));
  const int64_t fit = kPartialBudgetBytes / per_row / kChunkRowsMultiple * kChunkRowsMultiple;
  return std::min(std::max(fit, kChunkRowsMultiple), range.max_chunk_rows);
}

template <typename T>
HcLaunchStatus HcSplitGemm(const char* step, HcLtGemm& gemm, bool use_lt, const T* act, const T* weight,
                           float* partial, int64_t M, int64_t N, int64_t K, int64_t splits, int64_t plan_rows,
                           void* workspace, cudaStream_t stream) {
  if (use_lt) {
    return HcCublasStatus(step, gemm.RunSplit<T>(act, weight, partial, M, N, K, splits, workspace, stream, plan_rows));
  }
  const unsigned blocks = static_cast<unsigned>(std::min(M * splits, kMaxRowBlocks));
  HcFallbackGemmKernel<T, float><<<blocks, kElementwiseThreads, 0, stream>>>(act, weight, partial, M, N, K, splits,
                                                                              HcPartialStride(M, N));
  return HcCudaStatus("HcFallbackGemmKernel", cudaGetLastError());
}

// The fused kernel where it is wanted (options.up_gate; kAuto: bfloat16 at every row count, float16 from the
// mid range) and can run (its refusal checks the pointers' alignment too).
template <typename T>
bool HcUpStageFused(const HcUpStage<T>& s, const HcDeviceCaps& caps, const HcGeneralOptions& options) {
  const bool wanted = options.up_gate == HcUpGateRoute::kFused ||
                      (options.up_gate == HcUpGateRoute::kAuto &&
                       (std::is_same_v<T, __nv_bfloat16> || s.rows >= kHcMidMinRows));
  const HcUpGateArgs<T> args{s.hidden, s.up_weight, s.hn, s.pre_output, s.rows, s.C, s.H, s.R, s.reduction_scale};
  return wanted && HcUpGateRefusal(args, caps).empty();
}

template <typename T>
HcLaunchStatus LaunchHcUpStage(const HcUpStage<T>& s, int64_t plan_rows, const HcDeviceCaps& caps,
                               const HcGeneralOptions& options, HcLtGemm& gemm, void* workspace, bool pdl,
                               cudaStream_t stream, char* route, size_t route_size) {
  if (HcUpStageFused(s, caps, options)) {
    const HcUpGateArgs<T> args{s.hidden, s.up_weight, s.hn, s.pre_output, s.rows, s.C, s.H, s.R, s.reduction_scale};
    if (auto st = HcCudaStatus("HcUpGateKernel", LaunchHcUpGate<T>(args, caps, pdl, stream)); !st.ok()) return st;
    if (route != nullptr) std::snprintf(route, route_size, "up and gate epilogue fused (HcUpGateKernel)");
    return {};
  }
  const int64_t width = s.C * s.H;
  if (auto st = Gemm<T>("cuBLASLt GEMM up = hidden @ up_weight", gemm, s.hidden, s.up_weight, s.up, s.rows, width,
                        s.R, plan_rows, workspace, stream);
      !st.ok()) {
    return st;
  }
  const EpilogueArgs<T> epi{s.hn, s.up, s.pre_output, s.rows, s.C, s.H, s.reduction_scale};
  const int epi_vec = PickVec<T>(s.H, {s.hn, s.up, s.pre_output});
  const int64_t epi_count = s.rows * (s.H / epi_vec);
  constexpr bool kBf16 = std::is_same_v<T, __nv_bfloat16>;
  const bool epi_table = kBf16 && s.rows >= kTableMinRows && caps.sm_count > 0;
  const int epi_threads = epi_table ? kTableEpilogueThreads : kElementwiseThreads;
  const unsigned epi_blocks =
      epi_table ? static_cast<unsigned>(std::min<int64_t>((epi_count + epi_threads - 1) / epi_threads,
                                                          int64_t{kTableBlocksPerSm} * caps.sm_count))
                : ElementwiseBlocks(epi_count);
  auto* epi_kernel = epi_table ? EpilogueKernel<T, kBf16>(epi_vec) : EpilogueKernel<T, false>(epi_vec);
  if (auto st = HcCudaStatus("HcGateEpilogueKernel",
                             Launch(epi_kernel, epi_blocks, epi_threads, 0, 1, pdl, stream, epi));
      !st.ok()) {
    return st;
  }
  if (route != nullptr) {
    std::snprintf(route, route_size, "up planned at %lld rows, HcGateEpilogueKernel grid %u x %d (vec %d%s)",
                  static_cast<long long>(plan_rows), epi_blocks, epi_threads, epi_vec,
                  epi_table ? ", sigmoid table" : "");
  }
  return {};
}

std::string HcLaunchStatus::Message() const {
  if (ok()) return {};
  if (cuda != cudaSuccess) {
    return std::string(step) + ": " + cudaGetErrorName(cuda) + ": " + cudaGetErrorString(cuda);
  }
  return std::string(step) + ": " + cublasLtGetStatusName(cublas) + ": " + cublasLtGetStatusString(cublas);
}

template <typename T>
size_t HcGeneralScratchBytes(const HcLowRankMixParams& p, const HcDeviceTensors<T>& t, const HcDeviceCaps& caps,
                             const HcGeneralOptions& options) {
  const T* stand_in = AlignedStandIn<T>();
  return MakeScratchLayout(p, sizeof(T), HcUpStageFused(UpStage<T>(p, t, stand_in, stand_in, nullptr), caps, options))
      .total;
}

template <typename T>
HcLaunchStatus LaunchHcGeneral(const HcLowRankMixParams& p, const HcDeviceTensors<T>& t, const HcDeviceCaps& caps,
                               const HcGeneralOptions& options, void* scratch, HcLtGemm& gemm, cudaStream_t stream,
                               bool debug) {
  const int64_t rows = p.rows, C = p.C, H = p.H, R = p.R, width = p.width();
  const T* stand_in = AlignedStandIn<T>();
  const bool fused = HcUpStageFused(UpStage<T>(p, t, stand_in, stand_in, nullptr), caps, options);
  const ScratchLayout layout = MakeScratchLayout(p, sizeof(T), fused);
  const HcRangePlan& range = layout.range;
  char* base = static_cast<char*>(scratch);
  T* hn = reinterpret_cast<T*>(base + layout.hn);
  T* up = reinterpret_cast<T*>(base + layout.up);
  T* hidden = reinterpret_cast<T*>(base + layout.hidden);
  float* down_partial = reinterpret_cast<float*>(base + layout.down_partial);
  void* workspace = base + layout.workspace;  // cuBLASLt's (HcLtGemm::kWorkspaceBytes)

  // The reduction and epilogue kernels launch with PDL where their wait is compiled in (sm_90), as
  // LaunchNormInject does the norm kernel: each starts while the kernel before it ends and waits for it
  // before reading its outputs.
  const bool pdl = HcRunsSm90Code(caps.sm_major);
  const NormArgs<T> norm{t.streams, t.norm_scale, t.inject_weight, t.prev_block_output, t.prev_post_gate,
                         t.streams_out, hn, t.post_gate, rows, C, H, p.epsilon, p.gate_div, p.gate_mul};
  NormLaunch norm_launch;
  if (auto s = HcCudaStatus("norm and inject kernel", LaunchNormInject<T>(norm, caps, stream, &norm_launch)); !s.ok()) {
    return s;
  }

  // Whether cuBLASLt runs the split product: asked once, with the base pointers (every chunk's
  // pointers have the same alignment), so every chunk and every row count of the range takes the same route.
  static const char* const kDownStep = "cuBLASLt GEMM down = hn @ down_weight (split K)";
  bool down_lt = false;
  if (auto s = HcCublasStatus(kDownStep, gemm.AvailableSplit<T>(hn, t.down_weight, down_partial, R, width,
                                                                 range.splits, &down_lt, range.split_plan_rows));
      !s.ok()) {
    return s;
  }
  unsigned reduce_blocks = 0;
  for (int64_t r0 = 0; r0 < rows; r0 += layout.chunk_rows) {
    const int64_t m = std::min(layout.chunk_rows, rows - r0);
    if (auto s = HcSplitGemm<T>(kDownStep, gemm, down_lt, hn + r0 * width, t.down_weight, down_partial, m, R, width,
                                range.splits, range.split_plan_rows, workspace, stream);
        !s.ok()) {
      return s;
    }
    const SplitReduceArgs<T> reduce{down_partial, HcPartialStride(m, R), range.splits, hidden + r0 * R, m * R,
                                    p.silu_alpha};
    const int reduce_vec = ReduceVec(m * R, AlignmentOf(hidden + r0 * R) / sizeof(T));
    reduce_blocks = ElementwiseBlocks(m * R / reduce_vec);
    auto* reduce_kernel = reduce_vec == 4   ? HcSplitReduceKernel<T, 4>
                          : reduce_vec == 2 ? HcSplitReduceKernel<T, 2>
                                            : HcSplitReduceKernel<T, 1>;
    if (auto s = HcCudaStatus("HcSplitReduceKernel",
                              Launch(reduce_kernel, reduce_blocks, kElementwiseThreads, 0, 1, pdl, stream, reduce));
        !s.ok()) {
      return s;
    }
  }

  char up_route[160] = "";  // for the debug line only
  if (auto s = LaunchHcUpStage<T>(UpStage<T>(p, t, hidden, hn, up), range.up_plan_rows, caps, options, gemm,
                                  workspace, pdl, stream, up_route, sizeof(up_route));
      !s.ok()) {
    return s;
  }

  if (debug) {
    std::fprintf(stderr,
                 "hcfuse: HyperConnectionLowRankMix general path (%s range) rows=%lld C=%lld H=%lld R=%lld: "
                 "%s grid %u x %d (vec %d, %d rows per block), down split into %lld K slices of "
                 "%lld (%s, planned at %lld rows) in chunks of %lld rows, HcSplitReduceKernel grid %u x %d (last "
                 "chunk), %s\n",
                 range.name, static_cast<long long>(rows), static_cast<long long>(C),
                 static_cast<long long>(H), static_cast<long long>(R), norm_launch.kernel, norm_launch.blocks,
                 norm_launch.threads, norm_launch.vec, norm_launch.rows_per_block,
                 static_cast<long long>(range.splits), static_cast<long long>(width / range.splits),
                 down_lt ? "cuBLASLt" : "fallback kernel", static_cast<long long>(range.split_plan_rows),
                 static_cast<long long>(layout.chunk_rows), reduce_blocks, kElementwiseThreads, up_route);
  }
  return {};
}

#define HC_INSTANTIATE_GENERAL(T)                                                                                \
  template size_t HcGeneralScratchBytes<T>(const HcLowRankMixParams&, const HcDeviceTensors<T>&,              \
                                           const HcDeviceCaps&, const HcGeneralOptions&);                     \
  template HcLaunchStatus LaunchHcGeneral<T>(const HcLowRankMixParams&, const HcDeviceTensors<T>&,           \
                                             const HcDeviceCaps&, const HcGeneralOptions&, void*, HcLtGemm&,     \
                                             cudaStream_t, bool);                                                \
  template HcLaunchStatus HcSplitGemm<T>(const char*, HcLtGemm&, bool, const T*, const T*, float*, int64_t,    \
                                         int64_t, int64_t, int64_t, int64_t, void*, cudaStream_t);              \
  template bool HcUpStageFused<T>(const HcUpStage<T>&, const HcDeviceCaps&, const HcGeneralOptions&);          \
  template HcLaunchStatus LaunchHcUpStage<T>(const HcUpStage<T>&, int64_t, const HcDeviceCaps&,                 \
                                             const HcGeneralOptions&, HcLtGemm&, void*, bool, cudaStream_t, char*, \
                                             size_t);
HC_INSTANTIATE_GENERAL(float)
HC_INSTANTIATE_GENERAL(__half)
HC_INSTANTIATE_GENERAL(__nv_bfloat16)

}  // namespace cuda
}  // namespace hcfuse
