// HcUpGateKernel: the general path's up product with the gate epilogue fused (hc_up_gate.h), for sm_90.
//
// A tile is 128 rows x 64 features h of all 4 branches: N = 256 columns n = c * 64 + h, so a thread's
// accumulators hold every branch of its (row, h) and the branch sum never leaves its registers. K = R runs
// in 64-wide steps through a 3-stage TMA ring (hidden: a 128 x 64 box; up_weight: a (64 h, 64 r, 4 c) box of
// the R x (C*H) matrix, which lands branch by branch as one MN-major operand), and the tile's hn (a (64 h,
// 128 rows, 4 c) box, 64 KB) is copied while the products run. One thread of a producer warpgroup issues the
// copies (the warpgroup hands its registers to the consumers); two consumer warpgroups (64 rows each) run
// wgmma m64n256k16 (CuTe's atoms and shared-memory descriptors, from the nvidia-cutlass package's headers)
// and then the epilogue straight from the accumulators:
//   up = RoundToT(acc)                            rounding point: up
//   g  = RoundToT(Sigmoid(up))                    rounding point: g (bfloat16: from the table of
//                                                 hc_sigmoid_table.cuh, the same bits)
//   pre_output = RoundToT(scale * sum_c hn * g)   c in order, one FMA a step: HcGateEpilogueKernel's sequence
// The grid is persistent (one CTA an SM, tiles in row-block-major order); every tile runs the same
// sequence whatever the row count, so rows are independent and results deterministic.
#include "cuda/general/hc_up_gate.h"

#include <cuda.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <type_traits>

#include <cute/arch/copy_sm90_desc.hpp>
#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>
#include <cutlass/arch/reg_reconfig.h>

#include "cuda/common/hc_common.cuh"
#include "cuda/common/hc_device_caps.h"
#include "cuda/common/hc_ptx.cuh"
#include "cuda/common/hc_sigmoid_table.cuh"

namespace hcfuse {
namespace cuda {
namespace {

constexpr int kTileM = 128;                  // rows a tile: two consumer warpgroups of 64
constexpr int kTileH = 64;                   // features of each branch a tile
constexpr int kBranches = 4;                 // C
constexpr int kTileN = kBranches * kTileH;   // 256 accumulator columns
constexpr int kTileK = 64;                   // one 128-byte swizzled row of a 16-bit T
constexpr int kStages = 3;
constexpr int kConsumerWarps = 8;
constexpr int kThreads = (kConsumerWarps + 4) * 32;  // + the producer warpgroup (one thread issues the copies)
// Registers a thread after the producer warpgroup hands its share to the consumers (setmaxnreg; 128 x 40 +
// 256 x 232 <= 64 K): the 128 accumulators and the epilogue's packed up (64) live side by side
constexpr int kProducerRegisters = 40;
constexpr int kConsumerRegisters = 232;
constexpr unsigned kStageBytes = (kTileM + kTileN) * kTileK * 2;
constexpr unsigned kHnBytes = kTileM * kTileN * 2;
// HCFUSE_UP_GATE_ABLATE=<bits> in a build with HCFUSE_DEV_KNOBS (timing only; results wrong): 1 skips the
// epilogue after up's packing, 2 the products. Other builds ignore the macro.
#if defined(HCFUSE_DEV_KNOBS) && defined(HCFUSE_UP_GATE_ABLATE)
constexpr int kAblate = HCFUSE_UP_GATE_ABLATE;
#else
constexpr int kAblate = 0;
#endif
constexpr bool kAblateEpilogue = (kAblate & 1) != 0;
constexpr bool kAblateProducts = (kAblate & 2) != 0;

template <typename T>
struct MmaOf;
template <>
struct MmaOf<__nv_bfloat16> {
  using Element = cute::bfloat16_t;
  using Atom = cute::SM90_64x256x16_F32BF16BF16_SS<cute::GMMA::Major::K, cute::GMMA::Major::MN>;
  static constexpr CUtensorMapDataType kTmaType = CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
};
template <>
struct MmaOf<__half> {
  using Element = cute::half_t;
  using Atom = cute::SM90_64x256x16_F32F16F16_SS<cute::GMMA::Major::K, cute::GMMA::Major::MN>;
  static constexpr CUtensorMapDataType kTmaType = CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
};

// The operands' shared-memory layouts, as the TMA boxes land (128-byte swizzle): A row by row (K-major),
// B as 4 branch blocks of 64 r-rows of 64 h (MN-major: K varies first, then the branch).
template <typename E>
using SmemLayoutA = decltype(cute::tile_to_shape(cute::GMMA::Layout_K_SW128_Atom<E>{},
                                                 cute::Shape<cute::Int<kTileM>, cute::Int<kTileK>, cute::Int<kStages>>{}));
template <typename E>
using SmemLayoutB = decltype(cute::tile_to_shape(cute::GMMA::Layout_MN_SW128_Atom<E>{},
                                                 cute::Shape<cute::Int<kTileN>, cute::Int<kTileK>, cute::Int<kStages>>{},
                                                 cute::Step<cute::_2, cute::_1, cute::_3>{}));

template <bool TABLE>
struct alignas(1024) UpGateSmem {
  uint16_t a[kStages][kTileM * kTileK];
  uint16_t b[kStages][kTileN * kTileK];
  uint16_t hn[kBranches * kTileM * kTileH];  // [c][row][h], rows of 128 bytes, swizzled
  float table[TABLE ? Bf16SigmoidTable::kEntries : 1];
  unsigned long long full[kStages], empty[kStages], hn_full, hn_empty;
};
template <bool TABLE>
constexpr size_t kSmemBytes = sizeof(UpGateSmem<TABLE>) + 1024;  // + the base's alignment to 1024

struct TileGrid {
  int rows, H, k_tiles, h_tiles, tiles;
  float reduction_scale;
};

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
constexpr uint64_t kCacheNormal = static_cast<uint64_t>(cute::TMA::CacheHintSm90::EVICT_NORMAL);

// The producer warpgroup's first thread: every tile's K steps into the ring, and the tile's hn once the ring is full
// (its buffer is free only after the last tile's epilogue, which the ring's next refill waits for anyway).
template <bool TABLE>
__device__ void ProduceTiles(UpGateSmem<TABLE>& s, const CUtensorMap* hidden, const CUtensorMap* up,
                             const CUtensorMap* hn, const TileGrid& g) {
  int stage = 0;
  unsigned phase = 0, hn_phase = 0;
  for (int t = blockIdx.x; t < g.tiles; t += gridDim.x) {
    const int m0 = (t / g.h_tiles) * kTileM, h0 = (t % g.h_tiles) * kTileH;
    for (int kt = 0; kt < g.k_tiles; ++kt) {
      ptx::MbarrierWait(&s.empty[stage], phase ^ 1);
      ptx::MbarrierExpectBytes(&s.full[stage], kStageBytes);
      auto* full = reinterpret_cast<uint64_t*>(&s.full[stage]);
      cute::SM90_TMA_LOAD_2D::copy(hidden, full, kCacheNormal, s.a[stage], kt * kTileK, m0);
      cute::SM90_TMA_LOAD_3D::copy(up, full, kCacheNormal, s.b[stage], h0, kt * kTileK, 0);
      if (++stage == kStages) {
        stage = 0;
        phase ^= 1;
      }
      if (kt == min(kStages, g.k_tiles) - 1) {
        ptx::MbarrierWait(&s.hn_empty, hn_phase ^ 1);
        ptx::MbarrierExpectBytes(&s.hn_full, kHnBytes);
        cute::SM90_TMA_LOAD_3D::copy(hn, reinterpret_cast<uint64_t*>(&s.hn_full), kCacheNormal, s.hn, h0, m0, 0);
        hn_phase ^= 1;
      }
    }
  }
}

// g = RoundToT(Sigmoid(up)) of the two values of a packed pair of up (low half first). The fast form where
// FastGates allowed it for all of a thread's pairs (one test a tile instead of one a pair, so the epilogue
// is straight-line code): bfloat16 from the table, float16 with SigmoidInRange; else Sigmoid (NaN, or a
// float16 below kSigmoidInRangeMin). Both give the same bits where both apply.
template <typename T, bool TABLE, int N>
__device__ __forceinline__ bool FastGates(const uint32_t (&up)[N]) {
  if constexpr (TABLE) {
    unsigned largest = 0;  // per half
    CUTE_UNROLL
    for (int k = 0; k < N; ++k) largest = Bf16MagnitudesMax(largest, up[k]);
    return max(largest & 0xFFFFu, largest >> 16) <= Bf16SigmoidTable::kMaxNotNaN;
  } else {
    // The lowest value and a separate NaN pass, not one pass of comparisons: the one-pass test (the same
    // answer) was slower in the chain at 256 and 1024 rows.
    float lowest = INFINITY;
    CUTE_UNROLL
    for (int k = 0; k < N; ++k) {
      const float2 u = UnpackPair<T>(up[k]);
      lowest = fminf(lowest, fminf(u.x, u.y));  // fminf drops a NaN: checked below
    }
    bool nan = false;
    CUTE_UNROLL
    for (int k = 0; k < N; ++k) {
      const float2 u = UnpackPair<T>(up[k]);
      nan |= u.x != u.x || u.y != u.y;
    }
    return !nan && lowest >= kSigmoidInRangeMin;
  }
}

template <typename T, bool TABLE, bool FAST>
__device__ __forceinline__ void GatePair(const float* table, uint32_t up, float& g0, float& g1) {
  if constexpr (FAST && TABLE) {
    Bf16SigmoidPairFromTable(table, up, g0, g1);
  } else {
    const float2 u = UnpackPair<T>(up);
    if constexpr (FAST) {
      g0 = RoundToT<T>(SigmoidInRange(u.x));
      g1 = RoundToT<T>(SigmoidInRange(u.y));
    } else {
      g0 = RoundToT<T>(Sigmoid(u.x));
      g1 = RoundToT<T>(Sigmoid(u.y));
    }
  }
}
#endif

template <typename T, bool TABLE>
__global__ void __launch_bounds__(kThreads, 1)
    HcUpGateKernel(const __grid_constant__ CUtensorMap hidden_map, const __grid_constant__ CUtensorMap up_map,
                   const __grid_constant__ CUtensorMap hn_map, T* __restrict__ pre_output, TileGrid grid) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace cute;
  using E = typename MmaOf<T>::Element;
  extern __shared__ unsigned char smem_raw[];
  // aligned by an offset from the array itself (not through an integer), so that its loads stay LDS
  const unsigned misalignment = ptx::SharedAddress(smem_raw) & 1023u;
  auto& s = *reinterpret_cast<UpGateSmem<TABLE>*>(smem_raw + ((1024u - misalignment) & 1023u));
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;

  // Before the wait: nothing here reads what the kernels before this one write.
  if constexpr (TABLE) FillBf16SigmoidTable(s.table);
  if (tid == 0) {
    for (int st = 0; st < kStages; ++st) {
      ptx::MbarrierInit(&s.full[st], 1);
      ptx::MbarrierInit(&s.empty[st], kConsumerWarps);
    }
    ptx::MbarrierInit(&s.hn_full, 1);
    ptx::MbarrierInit(&s.hn_empty, kConsumerWarps);
  }
  __syncthreads();
  ptx::WaitOnProducer();  // hidden, hn (and pre_output's last readers) come from the kernels before

  if (warp >= kConsumerWarps) {
    cutlass::arch::warpgroup_reg_dealloc<kProducerRegisters>();
    if (warp == kConsumerWarps && lane == 0) ProduceTiles(s, &hidden_map, &up_map, &hn_map, grid);
    return;
  }
  cutlass::arch::warpgroup_reg_alloc<kConsumerRegisters>();

  TiledMMA tiled_mma = make_tiled_mma(typename MmaOf<T>::Atom{}, Layout<Shape<_2, _1, _1>>{});
  ThrMMA thr_mma = tiled_mma.get_thread_slice(tid);
  Tensor sA = make_tensor(make_smem_ptr(reinterpret_cast<E*>(&s.a[0][0])), SmemLayoutA<E>{});  // (M, K, stage)
  Tensor sB = make_tensor(make_smem_ptr(reinterpret_cast<E*>(&s.b[0][0])), SmemLayoutB<E>{});  // (N, K, stage)
  Tensor tCrA = thr_mma.make_fragment_A(thr_mma.partition_A(sA));
  Tensor tCrB = thr_mma.make_fragment_B(thr_mma.partition_B(sB));
  Tensor acc = partition_fragment_C(tiled_mma, Shape<Int<kTileM>, Int<kTileN>>{});
  // A thread's accumulators: (column pair, row half, 8-column group j) of m64n256 (CuTe's CLayout_64x256):
  // row 16 * warp + lane / 4 + 8 * half of its warpgroup's 64, column 8 j + 2 (lane % 4) + pair; j / 8 is
  // the branch.
  static_assert(decltype(size(acc))::value == 128, "m64n256: 128 fp32 accumulators a thread");

  const int quad = lane & 3;
  const int warp_row = 64 * (warp / 4) + 16 * (warp % 4) + (lane >> 2);
  int stage = 0;
  unsigned phase = 0, hn_phase = 0;
  for (int t = blockIdx.x; t < grid.tiles; t += gridDim.x) {
    const int m0 = (t / grid.h_tiles) * kTileM, h0 = (t % grid.h_tiles) * kTileH;
    // zeroed here, not only by the first MMA's scale-out: the wgmma operands read the accumulators, which would
    // otherwise stay live through the last tile's epilogue. (Issuing the next tile's first K step before this
    // tile's epilogue, to run it under the epilogue, was slower.)
    clear(acc);
    tiled_mma.accumulate_ = GMMA::ScaleOut::Zero;
    for (int kt = 0; kt < grid.k_tiles; ++kt) {
      ptx::MbarrierWait(&s.full[stage], phase);
      warpgroup_fence_operand(acc);
      warpgroup_arrive();
      if constexpr (!kAblateProducts) {
        CUTE_UNROLL
        for (int kb = 0; kb < size<2>(tCrA); ++kb) {
          cute::gemm(tiled_mma, tCrA(_, _, kb, stage), tCrB(_, _, kb, stage), acc);
          tiled_mma.accumulate_ = GMMA::ScaleOut::One;
        }
      }
      warpgroup_commit_batch();
      warpgroup_wait<0>();
      warpgroup_fence_operand(acc);
      __syncwarp();
      if (lane == 0) ptx::MbarrierArrive(&s.empty[stage]);
      if (++stage == kStages) {
        stage = 0;
        phase ^= 1;
      }
    }

    // up rounded and packed first (rounding point: up): the 128 accumulators die here, which leaves the
    // registers for the epilogue's independent pairs
    uint32_t up[64];  // [half][jj][c]: row half, 8-column group jj of a branch's 64, branch c
    CUTE_UNROLL
    for (int half = 0; half < 2; ++half) {
      CUTE_UNROLL
      for (int j = 0; j < kTileN / 8; ++j) {
        up[half * 32 + (j % 8) * 4 + j / 8] =
            PackPair<T>(acc(make_coord(0, half, j), 0, 0), acc(make_coord(1, half, j), 0, 0));
      }
    }
    ptx::MbarrierWait(&s.hn_full, hn_phase);
    hn_phase ^= 1;
    // pre_output of the thread's 2 rows x 8 column pairs, each summed over the 4 branches in order
    auto epilogue = [&](auto fast) {
      constexpr bool kFast = decltype(fast)::value;
      const unsigned char* hn_tile = reinterpret_cast<const unsigned char*>(s.hn);
      CUTE_UNROLL
      for (int half = 0; half < 2; ++half) {
        const int r = warp_row + 8 * half;  // the tile's row
        const unsigned char* hn_row = hn_tile + r * (kTileH * 2) + quad * 4;
        CUTE_UNROLL
        for (int jj = 0; jj < kTileH / 8; ++jj) {
          float sum0 = 0.0f, sum1 = 0.0f;
          CUTE_UNROLL
          for (int c = 0; c < kBranches; ++c) {
            float g0, g1;
            GatePair<T, TABLE, kFast>(s.table, up[half * 32 + jj * 4 + c], g0, g1);
            // the 128-byte swizzle: 16-byte chunk jj of row r sits at chunk jj ^ (r % 8)
            const float2 h = UnpackPair<T>(
                *reinterpret_cast<const uint32_t*>(hn_row + c * (kTileM * kTileH * 2) + ((jj ^ (r & 7)) << 4)));
            sum0 = MulAdd<T>(h.x, g0, sum0);
            sum1 = MulAdd<T>(h.y, g1, sum1);
          }
          const int row = m0 + r;
          if (row < grid.rows) {
            const uint32_t out =
                PackPair<T>(__fmul_rn(grid.reduction_scale, sum0), __fmul_rn(grid.reduction_scale, sum1));
            *reinterpret_cast<uint32_t*>(pre_output + static_cast<size_t>(row) * grid.H + h0 + 8 * jj + 2 * quad) = out;
          }
        }
      }
    };
    if constexpr (kAblateEpilogue) {
      if (up[0] == 0x7FC07FC0u && m0 < 0) pre_output[0] = T{};  // keeps up alive; never true
    } else if (FastGates<T, TABLE>(up)) {
      epilogue(cute::true_type{});
    } else {
      epilogue(cute::false_type{});
    }
    __syncwarp();
    if (lane == 0) ptx::MbarrierArrive(&s.hn_empty);
  }
#else
  __trap();  // launched only on sm_90 (HcUpGateRefusal)
#endif
}

// The driver's cuTensorMapEncodeTiled (through the runtime: no link to libcuda); null where it is missing.
PFN_cuTensorMapEncodeTiled_v12000 TensorMapEncoder() {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found) !=
          cudaSuccess ||
      found != cudaDriverEntryPointSuccess) {
    return nullptr;
  }
  return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
}

// A tiled view of a row-major 16-bit tensor for the kernel's copies: dims and box innermost first, strides
// (bytes) of dims 1.. ; 128-byte swizzle, out-of-range elements read as zero.
template <typename T, int RANK>
CUresult EncodeMap(PFN_cuTensorMapEncodeTiled_v12000 encode, CUtensorMap* map, const T* base,
                   const cuuint64_t (&dims)[RANK], const cuuint64_t (&strides)[RANK - 1],
                   const cuuint32_t (&box)[RANK]) {
  cuuint32_t element_strides[RANK];
  std::fill(element_strides, element_strides + RANK, 1u);
  return encode(map, MmaOf<T>::kTmaType, RANK, const_cast<T*>(base), dims, strides, box, element_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

}  // namespace

template <typename T>
std::string HcUpGateRefusal(const HcUpGateArgs<T>& a, const HcDeviceCaps& caps) {
  if constexpr (!std::is_same_v<T, __half> && !std::is_same_v<T, __nv_bfloat16>) {
    return "float32 runs cuBLASLt's up product and the epilogue kernel";
  } else {
    if (!HcRunsSm90Code(caps.sm_major)) return "the fused up/gate kernel runs on sm_90 only";
    if (a.C != kBranches) return "the fused up/gate kernel takes C = 4 only";
    if (a.H % kTileH != 0) return "the fused up/gate kernel needs H a multiple of 64";
    if (a.R % 8 != 0) return "the fused up/gate kernel needs R a multiple of 8 (16-byte rows of hidden)";
    if (a.rows > (int64_t{1} << 30)) return "too many rows for the fused up/gate kernel's 32-bit coordinates";
    if (AlignmentOf(a.hidden) < 16 || AlignmentOf(a.up_weight) < 16 || AlignmentOf(a.hn) < 16 ||
        AlignmentOf(a.pre_output) < 4) {
      return "the fused up/gate kernel's tensors are not 16-byte aligned";
    }
    if (caps.max_shared_memory_per_block < static_cast<int64_t>(kSmemBytes<std::is_same_v<T, __nv_bfloat16>>)) {
      return "too little shared memory for the fused up/gate kernel";
    }
    return {};
  }
}

template <typename T>
cudaError_t LaunchHcUpGate(const HcUpGateArgs<T>& a, const HcDeviceCaps& caps, bool use_pdl, cudaStream_t stream) {
  if constexpr (!std::is_same_v<T, __half> && !std::is_same_v<T, __nv_bfloat16>) {
    return cudaErrorNotSupported;
  } else {
    const cuuint64_t width = static_cast<cuuint64_t>(a.C * a.H), H = a.H, R = a.R, rows = a.rows, C = a.C;
    const PFN_cuTensorMapEncodeTiled_v12000 encode = TensorMapEncoder();
    if (encode == nullptr) return cudaErrorNotSupported;
    CUtensorMap hidden_map, up_map, hn_map;
    if (EncodeMap<T, 2>(encode, &hidden_map, a.hidden, {R, rows}, {R * 2}, {kTileK, kTileM}) != CUDA_SUCCESS ||
        EncodeMap<T, 3>(encode, &up_map, a.up_weight, {H, R, C}, {width * 2, H * 2}, {kTileH, kTileK, kBranches}) !=
            CUDA_SUCCESS ||
        EncodeMap<T, 3>(encode, &hn_map, a.hn, {H, rows, C}, {width * 2, H * 2}, {kTileH, kTileM, kBranches}) !=
            CUDA_SUCCESS) {
      return cudaErrorInvalidValue;
    }
    TileGrid grid{};
    grid.rows = static_cast<int>(a.rows);
    grid.H = static_cast<int>(a.H);
    grid.k_tiles = static_cast<int>((a.R + kTileK - 1) / kTileK);
    grid.h_tiles = static_cast<int>(a.H / kTileH);
    grid.tiles = static_cast<int>((a.rows + kTileM - 1) / kTileM) * grid.h_tiles;
    grid.reduction_scale = a.reduction_scale;
    constexpr bool kTable = std::is_same_v<T, __nv_bfloat16>;
    const int ctas = std::max(1, std::min(grid.tiles, caps.sm_count));
    return Launch(HcUpGateKernel<T, kTable>, ctas, kThreads, kSmemBytes<kTable>, 1, use_pdl, stream, hidden_map,
                  up_map, hn_map, a.pre_output, grid);
  }
}

#define HC_INSTANTIATE_UP_GATE(T)                                                                   \
  template std::string HcUpGateRefusal<T>(const HcUpGateArgs<T>&, const HcDeviceCaps&);          \
  template cudaError_t LaunchHcUpGate<T>(const HcUpGateArgs<T>&, const HcDeviceCaps&, bool, cudaStream_t);
HC_INSTANTIATE_UP_GATE(float)
HC_INSTANTIATE_UP_GATE(__half)
HC_INSTANTIATE_UP_GATE(__nv_bfloat16)

}  // namespace cuda
}  // namespace hcfuse
