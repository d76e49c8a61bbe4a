// The quantized op's GEMM route (hc_nbits_gemm.h). Per call, on one stream:
//   HcNBitsDequantKernel   each quantized projection's weight w = (q - z) * s (fp32, the CPU kernel's bits) into
//                          scratch as row-major [K, N] matrices of T ("terms") whose sum is w exactly: in 16-bit
//                          T w_hi = RN_T(w) and w_lo = w - w_hi, in float32 w itself; a dense projection is
//                          used in place. down_inject's terms lie side by side, [K, 2 N], up's stacked, [2 R, N]
//   the norm kernel        S, streams_out, hn: the dense general path's (hc_norm_inject.h), without its inject
//   per chunk of rows:     one split product hn @ [w_hi | w_lo] (cuBLASLt, the dense general path's K slices, fp32
//                          partials), then HcNBitsGemmReduceKernel: per output its terms' slices added in order
//                          -> down -> Z, SG, hidden (stored once per term of up) or inject -> post_gate
//   the up stage           the dense general path's (hc_general_stages.h) over K = terms * R:
//                          [hidden, hidden] @ [w_hi; w_lo] -> up -> g -> pre_output
// Each product of an activation and a term is exact in fp32 and the terms' products are summed in fp32, so the
// products are those of the exact weight summed in another fixed order: the general path's bound
// (docs/QUANTIZED.md). Within a row range (hc_gemm.h) every output takes one fixed sequence of operations
// whatever the row count: deterministic and row independent there. Nothing synchronizes the host; the
// dequantized weights live in per-call scratch from ORT's allocator, never past the call.
#include "cuda/nbits/hc_nbits_gemm.h"

#include <algorithm>
#include <cstdio>
#include <type_traits>

#include "cuda/common/hc_common.cuh"
#include "cuda/common/hc_ptx.cuh"
#include "cuda/general/hc_gemm.h"
#include "cuda/general/hc_general_stages.h"
#include "cuda/general/hc_norm_inject.h"
#include "cuda/nbits/hc_nbits_weight.cuh"

namespace hcfuse {
namespace cuda {
namespace {

constexpr int kDequantThreads = 256;
constexpr int kDequantK = 32;  // k of one column a thread dequantizes: 16 bytes at 4 bits, 32 at 8
constexpr int kReduceThreads = 256;

// The terms of a quantized projection: 2 in 16-bit T, 1 in float32; a dense one is 1 (used in place).
template <typename T>
constexpr int kQuantizedTerms = std::is_same_v<T, float> ? 1 : 2;
template <typename T>
int Terms(const HcNBitsProjection<T>& w) {
  return w.q != nullptr ? kQuantizedTerms<T> : 1;
}

template <typename T>
struct DequantArgs {
  HcNBitsProjection<T> w;  // quantized
  int64_t K, N, block_size;
  T* out;  // weight [k, n] of term t at out[t * term_stride + k * ldo + n]; columns N .. ld-1 get zeros
  int64_t ld, ldo, term_stride;  // elements
};

// A warp takes 32 consecutive columns n over one chunk of kDequantK k: each thread loads its column's bytes of the
// chunk (8-byte words inside the column's run of B, so never past it) and the chunk's scales and zero points
// (two blocks at block_size 16), then stores its column's weights k by k, the warp's 32 stores of a row of the
// output contiguous; columns N .. ld-1 (padding) get zeros. Waits first: the scratch it writes may still be read
// by the kernel before (PDL), and B, scales and zero points may come from upstream.
template <typename T, int BITS, int TERMS>
__global__ void __launch_bounds__(kDequantThreads) HcNBitsDequantKernel(DequantArgs<T> a) {
  ptx::WaitOnProducer();
  constexpr int kWords = kDequantK * BITS / 64;
  constexpr uint32_t kMask = (1u << BITS) - 1;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t k_blocks = CeilDiv(a.K, a.block_size);
  const int64_t row_bytes = k_blocks * a.block_size * BITS / 8;
  const int64_t groups = CeilDiv(a.ld, 32), chunks = CeilDiv(a.K, kDequantK);
  const int64_t warps = int64_t{gridDim.x} * (kDequantThreads / 32);
  for (int64_t item = int64_t{blockIdx.x} * (kDequantThreads / 32) + threadIdx.x / 32; item < groups * chunks;
       item += warps) {
    const int64_t chunk = item / groups;
    const int64_t n = (item - chunk * groups) * 32 + lane;
    if (n >= a.ld) continue;
    const int64_t k0 = chunk * kDequantK, byte0 = k0 * BITS / 8;
    const int valid = static_cast<int>(std::min<int64_t>(kDequantK, a.K - k0));
    T* out = a.out + k0 * a.ldo + n;
    if (n >= a.N) {
      for (int j = 0; j < valid; ++j) {
#pragma unroll
        for (int t = 0; t < TERMS; ++t) out[t * a.term_stride + j * a.ldo] = FromFloat<T>(0.0f);
      }
      continue;
    }
    const auto* words = reinterpret_cast<const unsigned long long*>(a.w.q + n * row_bytes + byte0);
    unsigned long long word[kWords];
#pragma unroll
    for (int u = 0; u < kWords; ++u) word[u] = byte0 + 8 * u < row_bytes ? __ldg(words + u) : 0ull;
    float scale[2], zero[2];  // of the chunk's first and second 16 k (one block from block_size 32)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t b = std::min((k0 + 16 * h) / a.block_size, k_blocks - 1);
      scale[h] = ToFloat(a.w.scales[n * k_blocks + b]);
      zero[h] = ZeroPoint<T, BITS>(a.w, n, b, k_blocks);
    }
#pragma unroll
    for (int j = 0; j < kDequantK; ++j) {
      if (j >= valid) break;
      const uint32_t q = static_cast<uint32_t>(word[j * BITS / 64] >> (j * BITS % 64)) & kMask;
      const float w = QuantizedWeight(q, zero[j / 16], scale[j / 16]);
      const T hi = FromFloat<T>(w);
      out[j * a.ldo] = hi;
      if constexpr (TERMS == 2) out[a.term_stride + j * a.ldo] = FromFloat<T>(__fsub_rn(w, ToFloat(hi)));  // exact
    }
  }
  ptx::ReleaseDependents();
}

template <typename T>
cudaError_t LaunchDequant(const DequantArgs<T>& a, int64_t bits, bool pdl, cudaStream_t stream) {
  const int64_t warps = CeilDiv(a.ld, 32) * CeilDiv(a.K, kDequantK);
  const unsigned grid = GridStrideBlocks(warps, kDequantThreads / 32);
  constexpr int kTerms = kQuantizedTerms<T>;
  return bits == 8 ? Launch(HcNBitsDequantKernel<T, 8, kTerms>, grid, kDequantThreads, 0, 1, pdl, stream, a)
                   : Launch(HcNBitsDequantKernel<T, 4, kTerms>, grid, kDequantThreads, 0, 1, pdl, stream, a);
}

template <typename T>
struct ReduceArgs {
  const float* partial;  // `slices` slices of (rows, ld), `stride` floats apart
  int64_t stride, slices, ld, rows, R, C;
  int64_t terms, term_offset;  // output n of term t in column t * term_offset + n
  T* hidden;      // (rows, up_terms * R): hidden stored up_terms times a row
  int64_t up_terms;
  T* post_gate;   // (rows, C)
  float silu_alpha, gate_div, gate_mul;
};

// down_inject's outputs from the split products' partials, grid-stride over (row, n): the slices added in order
// from 0 (term by term, each term's K slices in order), rounded (rounding point: down / inject), then down -> Z, SG,
// hidden or inject -> gate logit, its sigmoid, post_gate, through the dense kernels' helpers.
template <typename T>
__global__ void __launch_bounds__(kReduceThreads) HcNBitsGemmReduceKernel(ReduceArgs<T> a) {
  ptx::WaitOnProducer();  // the partials come from the products before it
  const int64_t N = a.R + a.C;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < a.rows * N;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = i / N, n = i - row * N;
    float acc = 0.0f;
    for (int64_t t = 0; t < a.terms; ++t) {
      const float* partial = a.partial + row * a.ld + t * a.term_offset + n;
#pragma unroll 8
      for (int64_t b = 0; b < a.slices; ++b) acc = __fadd_rn(acc, partial[b * a.stride]);  // 8 slices' loads in flight
    }
    const float sum = RoundToT<T>(acc);
    if (n < a.R) {
      const T hidden = FromFloat<T>(ScaledSilu<T>(sum, a.silu_alpha));
      for (int64_t t = 0; t < a.up_terms; ++t) a.hidden[(row * a.up_terms + t) * a.R + n] = hidden;
    } else {
      a.post_gate[row * a.C + (n - a.R)] = FromFloat<T>(PostGate<T>(sum, a.gate_div, a.gate_mul));
    }
  }
  ptx::ReleaseDependents();
}

// The scratch, every part 256-byte aligned: the dequantized terms of down_inject (one [C*H, terms * di_ld]
// matrix: its product's N runs over the terms) and of up (one [terms * R, C*H] matrix: up's K runs over the
// terms); hn (rows, C*H); hidden (rows, up_terms * R); up (rows, C*H, where the fused up/gate kernel does not
// run); the fp32 partials of one chunk of rows; cuBLASLt's workspace.
struct Layout {
  HcRangePlan range;
  int64_t chunk_rows = 0, di_terms = 1, up_terms = 1;
  int64_t di_ld = 0;  // columns of a term of down_inject: R + C, padded to a multiple of 8 when dequantized
  int64_t di_n = 0;   // columns of down_inject's product: its terms side by side, di_terms * di_ld
  bool fused_up = false;
  size_t di_weight = 0, up_weight = 0, hn = 0, hidden = 0, up = 0, partial = 0, workspace = 0, total = 0;
};

template <typename T>
HcUpStage<T> UpStage(const HcNBitsParams& p, const HcNBitsTensors<T>& t, const Layout& l, const T* up_weight,
                     const T* hidden, const T* hn, T* up) {
  const HcLowRankMixParams& m = p.mix;
  return {hidden, up_weight, hn, t.pre_output, up, m.rows, m.C, m.H, l.up_terms * m.R, m.reduction_scale};
}

template <typename T>
Layout MakeLayout(const HcNBitsParams& p, const HcNBitsTensors<T>& t, const HcDeviceCaps& caps) {
  const HcLowRankMixParams& m = p.mix;
  const auto rows = static_cast<size_t>(m.rows), W = static_cast<size_t>(m.width());
  const auto R = static_cast<size_t>(m.R);
  Layout l;
  l.di_terms = Terms(t.down_inject);
  l.up_terms = Terms(t.up);
  l.range = HcPlanRange(m.rows, m.width());
  // padded, a dequantized down_inject's rows keep 16-byte alignment (cuBLASLt's tensor-core kernels want it)
  l.di_ld = t.down_inject.q != nullptr ? CeilDiv(m.R + m.C, 8) * 8 : m.R + m.C;
  l.di_n = l.di_terms * l.di_ld;
  l.chunk_rows = std::min(m.rows, HcSplitChunkRows(l.range.splits * l.di_n, l.range));
  l.up_weight = t.down_inject.q != nullptr ? AlignUp(W * static_cast<size_t>(l.di_n) * sizeof(T)) : 0;
  l.hn = l.up_weight + (t.up.q != nullptr ? AlignUp(static_cast<size_t>(l.up_terms) * R * W * sizeof(T)) : 0);
  l.hidden = l.hn + AlignUp(rows * W * sizeof(T));
  l.up = l.hidden + AlignUp(rows * static_cast<size_t>(l.up_terms) * R * sizeof(T));
  const T* stand_in = reinterpret_cast<const T*>(uintptr_t{kScratchAlign});
  l.fused_up = HcUpStageFused(UpStage<T>(p, t, l, t.up.q != nullptr ? stand_in : t.up.dense, stand_in, stand_in,
                                         nullptr),
                              caps, HcGeneralOptions{});
  l.partial = l.up + (l.fused_up ? 0 : AlignUp(rows * W * sizeof(T)));
  const auto partial_floats = static_cast<size_t>(l.range.splits * HcPartialStride(l.chunk_rows, l.di_n));
  l.workspace = l.partial + AlignUp(partial_floats * sizeof(float));
  l.total = l.workspace + HcLtGemm::kWorkspaceBytes;
  return l;
}

}  // namespace

template <typename T>
std::string HcNBitsGemmRefusal(const HcNBitsParams& p, const HcNBitsTensors<T>& t, const HcNBitsGemmOptions& options) {
  if (p.mix.rows < options.min_rows) return "fewer than " + std::to_string(options.min_rows) + " rows";
  if constexpr (!std::is_same_v<T, float>) {
    if (t.down_inject.zero_points_t != nullptr || t.up.zero_points_t != nullptr) {
      return "zero points of T (such a weight is not the sum of two T values)";
    }
  }
  if constexpr (std::is_same_v<T, __half>) {
    const bool quantized = t.down_inject.q != nullptr || t.up.q != nullptr;
    if (quantized && !options.float16_weights_in_range) {
      return "float16 weights not known to lie in float16's range (scales that are not constant initializers, or "
             "|scale| * (2^bits - 1) > 65504)";
    }
  }
  return {};
}

template <typename T>
size_t HcNBitsGemmScratchBytes(const HcNBitsParams& p, const HcNBitsTensors<T>& t, const HcDeviceCaps& caps) {
  return MakeLayout<T>(p, t, caps).total;
}

template <typename T>
HcLaunchStatus LaunchHcNBitsGemm(const HcNBitsParams& p, const HcNBitsTensors<T>& t, const HcDeviceCaps& caps,
                                 const HcNBitsGemmOptions& options, void* scratch, HcLtGemm& gemm,
                                 cudaStream_t stream, bool debug) {
  const HcLowRankMixParams& m = p.mix;
  const auto aligned8 = [](const void* q) { return reinterpret_cast<uintptr_t>(q) % 8 == 0; };
  if (!aligned8(t.down_inject.q) || !aligned8(t.up.q)) {  // the dequant kernel reads B as 8-byte words
    return HcCudaStatus("B (down_inject_weight or up_weight) is not 8-byte aligned", cudaErrorMisalignedAddress);
  }
  const int64_t rows = m.rows, R = m.R, C = m.C, W = m.width(), N = R + C;
  const Layout l = MakeLayout<T>(p, t, caps);
  const HcRangePlan& range = l.range;
  const bool pdl = options.pdl;
  char* base = static_cast<char*>(scratch);
  T* di_weight = reinterpret_cast<T*>(base + l.di_weight);
  T* up_weight = reinterpret_cast<T*>(base + l.up_weight);
  T* hn = reinterpret_cast<T*>(base + l.hn);
  T* hidden = reinterpret_cast<T*>(base + l.hidden);
  T* up = reinterpret_cast<T*>(base + l.up);
  float* partial = reinterpret_cast<float*>(base + l.partial);
  void* workspace = base + l.workspace;

  if (t.down_inject.q != nullptr) {
    const DequantArgs<T> a{t.down_inject, W, N, p.block_size, di_weight, l.di_ld, l.di_n, l.di_ld};
    if (auto s = HcCudaStatus("HcNBitsDequantKernel (down_inject)", LaunchDequant(a, p.bits, pdl, stream)); !s.ok()) {
      return s;
    }
  }
  if (t.up.q != nullptr) {
    const DequantArgs<T> a{t.up, R, W, p.block_size, up_weight, W, W, R * W};
    if (auto s = HcCudaStatus("HcNBitsDequantKernel (up)", LaunchDequant(a, p.bits, pdl, stream)); !s.ok()) return s;
  }
  // the dense general path's norm kernel without its inject (down_inject's product has inject's columns)
  const NormArgs<T> norm{t.streams, t.norm_scale, nullptr, t.prev_block_output, t.prev_post_gate, t.streams_out, hn,
                         nullptr, rows, C, m.H, m.epsilon, m.gate_div, m.gate_mul};
  NormLaunch norm_launch;
  if (auto s = HcCudaStatus("norm kernel", LaunchNormInject<T>(norm, caps, stream, &norm_launch)); !s.ok()) return s;

  // down_inject's product: [hn] @ [w_hi | w_lo], or the dense weight
  const T* di_matrix = t.down_inject.q != nullptr ? di_weight : t.down_inject.dense;
  static const char* const kDownStep = "cuBLASLt GEMM hn @ down_inject (split K)";
  bool down_lt = false;  // asked once with the base pointers: every chunk takes the same route
  if (auto s = HcCublasStatus(kDownStep, gemm.AvailableSplit<T>(hn, di_matrix, partial, l.di_n, W, range.splits,
                                                                 &down_lt, range.split_plan_rows));
      !s.ok()) {
    return s;
  }
  unsigned reduce_grid = 0;
  for (int64_t r0 = 0; r0 < rows; r0 += l.chunk_rows) {
    const int64_t rc = std::min(l.chunk_rows, rows - r0);
    if (auto s = HcSplitGemm<T>(kDownStep, gemm, down_lt, hn + r0 * W, di_matrix, partial, rc, l.di_n, W,
                                range.splits, range.split_plan_rows, workspace, stream);
        !s.ok()) {
      return s;
    }
    const ReduceArgs<T> reduce{partial, HcPartialStride(rc, l.di_n), range.splits, l.di_n, rc, R, C, l.di_terms,
                               l.di_ld, hidden + r0 * l.up_terms * R, l.up_terms, t.post_gate + r0 * C,
                               m.silu_alpha, m.gate_div, m.gate_mul};
    reduce_grid = GridStrideBlocks(rc * N, kReduceThreads);
    if (auto s = HcCudaStatus("HcNBitsGemmReduceKernel", Launch(HcNBitsGemmReduceKernel<T>, reduce_grid, kReduceThreads,
                                                                 0, 1, pdl, stream, reduce));
        !s.ok()) {
      return s;
    }
  }

  char up_route[160] = "";
  const T* up_matrix = t.up.q != nullptr ? up_weight : t.up.dense;
  if (auto s = LaunchHcUpStage<T>(UpStage<T>(p, t, l, up_matrix, hidden, hn, up), range.up_plan_rows, caps,
                                  HcGeneralOptions{}, gemm, workspace, pdl, stream, up_route, sizeof(up_route));
      !s.ok()) {
    return s;
  }
  if (debug) {
    const auto ll = [](int64_t v) { return static_cast<long long>(v); };
    std::fprintf(stderr,
                 "hcfuse: HyperConnectionLowRankMixNBits GEMM route (%s range) rows=%lld: %s grid %u x %d; "
                 "down_inject %s (%lld term%s), split into %lld K slices (%s, planned at %lld rows) in chunks of "
                 "%lld rows, HcNBitsGemmReduceKernel grid %u x %d (last chunk); up %s (%lld term%s, K = %lld), %s\n",
                 range.name, ll(rows), norm_launch.kernel, norm_launch.blocks, norm_launch.threads,
                 t.down_inject.q != nullptr ? "dequantized" : "dense", ll(l.di_terms),
                 l.di_terms > 1 ? "s" : "", ll(range.splits), down_lt ? "cuBLASLt" : "fallback kernel",
                 ll(range.split_plan_rows), ll(l.chunk_rows), reduce_grid, kReduceThreads,
                 t.up.q != nullptr ? "dequantized" : "dense", ll(l.up_terms), l.up_terms > 1 ? "s" : "",
                 ll(l.up_terms * R), up_route);
  }
  return {};
}

#define HC_INSTANTIATE_NBITS_GEMM(T)                                                                             \
  template std::string HcNBitsGemmRefusal<T>(const HcNBitsParams&, const HcNBitsTensors<T>&,                    \
                                             const HcNBitsGemmOptions&);                                         \
  template size_t HcNBitsGemmScratchBytes<T>(const HcNBitsParams&, const HcNBitsTensors<T>&, const HcDeviceCaps&); \
  template HcLaunchStatus LaunchHcNBitsGemm<T>(const HcNBitsParams&, const HcNBitsTensors<T>&,                  \
                                               const HcDeviceCaps&, const HcNBitsGemmOptions&, void*, HcLtGemm&, \
                                               cudaStream_t, bool);
HC_INSTANTIATE_NBITS_GEMM(float)
HC_INSTANTIATE_NBITS_GEMM(__half)
HC_INSTANTIATE_NBITS_GEMM(__nv_bfloat16)

}  // namespace cuda
}  // namespace hcfuse
