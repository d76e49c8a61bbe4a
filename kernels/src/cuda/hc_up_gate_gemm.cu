// HcUpGateGemmKernel: up = hidden @ up_weight on mma.sync tensor cores (fp32 accumulation) with the gate
// epilogue in registers: up rounded to T, g = sigmoid(up) rounded to T, pre_output = reduction_scale *
// sum_c hn * g (c in order), so `up` never goes to memory (the unfused route writes and reads it back:
// 2 x rows x C*H elements).
//
// Tiling: a block owns BM rows (32 per warp row) and kBH = 32 features h of all 4 branches: 128 columns
// of up_weight, gathered as branch blocks of 16 features so that one thread's accumulators hold the
// same (row, h) for c = 0..3 and the branch sum stays in the thread. K = R runs in chunks of kBK
// through a kStages-deep cp.async pipeline (rows past `rows` and k past R load as zeros).
// Warps: WARPS_M x 2, each 32 rows x 64 columns (2 x 8 m16n8k16 tiles).
//
// Determinism and row independence: every up element is the fp32 sum of the same mma.sync
// instructions in the same k order (chunk by chunk, 16 k a step) whatever the row count, the tile
// height (BM) or the block that computes it; the epilogue's arithmetic is HcGateEpilogueKernel's.
#include "cuda/hc_up_gate_gemm.h"

#include <algorithm>

#include "cuda/hc_common.cuh"
#include "cuda/hc_cp_async.cuh"

namespace hcfuse {
namespace cuda {
namespace {

constexpr int kBK = 32;          // K elements a pipeline stage
constexpr int kStages = 3;
constexpr int kBH = 32;          // features a block
constexpr int kBranches = 4;     // C
constexpr int kBN = kBranches * kBH;  // up_weight columns a block
constexpr int kALd = kBK + 8;    // shared-memory row pitch of the hidden tile (elements; +16 B: no ldmatrix bank conflicts)
constexpr int kBLd = kBN + 8;    // ... of the up_weight tile
static_assert(kBN == 128 && kBH % 16 == 0, "two warp columns of 4 branches x 16 features");

template <int WARPS_M>
struct UpGateTile {
  static constexpr int kBM = 32 * WARPS_M;
  static constexpr int kThreads = 64 * WARPS_M;
  static constexpr size_t kSmemBytes = sizeof(uint16_t) * kStages * (size_t{kBM} * kALd + size_t{kBK} * kBLd);
};

template <typename T>
struct UpGateArgs {
  const T* hidden;     // (rows, R)
  const T* up_weight;  // (R, 4H)
  const T* hn;         // (rows, 4H)
  T* pre_output;       // (rows, H)
  int64_t rows, H, R;
  float reduction_scale;
};

__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], const void* smem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t (&r)[4], const void* smem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}

// d += a (16 x 16, row) * b (16 x 8, col), fp32 accumulators.
template <typename T>
__device__ __forceinline__ void Mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);
template <>
__device__ __forceinline__ void Mma16816<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                                        uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void Mma16816<__half>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// One pipeline stage: K chunk kc of the block's hidden rows and up_weight columns into stage `st`.
// Shared column n = wn * 64 + t * 8 + e (warp column wn, n8 tile t, element e) holds branch c = t / 2,
// feature h0 + wn * 16 + (t % 2) * 8 + e, i.e. global column c * H + that feature.
template <typename T, int WARPS_M>
__device__ __forceinline__ void LoadStage(const UpGateArgs<T>& a, T* As, T* Bs, int st, int64_t kc, int64_t m0,
                                          int64_t h0) {
  using Tile = UpGateTile<WARPS_M>;
  T* as = As + st * Tile::kBM * kALd;
  T* bs = Bs + st * kBK * kBLd;
  const int64_t k0 = kc * kBK;
  for (int i = threadIdx.x; i < Tile::kBM * (kBK / 8); i += Tile::kThreads) {
    const int r = i / (kBK / 8), q = i % (kBK / 8);
    const int64_t row = m0 + r, k = k0 + q * 8;
    const bool valid = row < a.rows && k < a.R;
    CpAsync16(as + r * kALd + q * 8, valid ? a.hidden + row * a.R + k : a.hidden, valid);
  }
  for (int i = threadIdx.x; i < kBK * (kBN / 8); i += Tile::kThreads) {
    const int kr = i / (kBN / 8), q = i % (kBN / 8);
    const int64_t k = k0 + kr;
    const int wn = q / 8, t = q % 8;
    const int64_t col = (t / 2) * a.H + h0 + wn * 16 + (t % 2) * 8;
    const bool valid = k < a.R;
    CpAsync16(bs + kr * kBLd + q * 8, valid ? a.up_weight + k * (kBranches * a.H) + col : a.up_weight, valid);
  }
}

template <typename T, int WARPS_M>
__global__ void __launch_bounds__(UpGateTile<WARPS_M>::kThreads, 2) HcUpGateGemmKernel(UpGateArgs<T> a) {
  using Tile = UpGateTile<WARPS_M>;
  extern __shared__ __align__(16) unsigned char up_gate_smem[];
  T* As = reinterpret_cast<T*>(up_gate_smem);        // [kStages][kBM][kALd]
  T* Bs = As + kStages * Tile::kBM * kALd;           // [kStages][kBK][kBLd]
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int wm = warp % WARPS_M, wn = warp / WARPS_M;
  const int64_t m0 = int64_t{blockIdx.x} * Tile::kBM;
  const int64_t h0 = int64_t{blockIdx.y} * kBH;

  float acc[2][8][4];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (int t = 0; t < 8; ++t) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][t][e] = 0.0f;
    }
  }

  const int64_t chunks = (a.R + kBK - 1) / kBK;
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < chunks) LoadStage<T, WARPS_M>(a, As, Bs, s, s, m0, h0);
    CpAsyncCommit();
  }
  for (int64_t kc = 0; kc < chunks; ++kc) {
    CpAsyncWait<kStages - 2>();
    __syncthreads();  // chunk kc landed for every thread; stage (kc - 1) % kStages is free again
    const int64_t next = kc + kStages - 1;
    if (next < chunks) LoadStage<T, WARPS_M>(a, As, Bs, static_cast<int>(next % kStages), next, m0, h0);
    CpAsyncCommit();
    const int st = static_cast<int>(kc % kStages);
    const T* as = As + st * Tile::kBM * kALd;
    const T* bs = Bs + st * kBK * kBLd;
#pragma unroll
    for (int kk = 0; kk < kBK; kk += 16) {
      uint32_t af[2][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        LdMatrixX4(af[mt], as + (wm * 32 + mt * 16 + (lane % 16)) * kALd + kk + (lane / 16) * 8);
      }
      uint32_t bf[8][2];
#pragma unroll
      for (int t = 0; t < 8; t += 2) {
        uint32_t r[4];
        LdMatrixX4Trans(r, bs + (kk + (lane % 16)) * kBLd + wn * 64 + t * 8 + (lane / 16) * 8);
        bf[t][0] = r[0];
        bf[t][1] = r[1];
        bf[t + 1][0] = r[2];
        bf[t + 1][1] = r[3];
      }
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
        for (int t = 0; t < 8; ++t) Mma16816<T>(acc[mt][t], af[mt], bf[t][0], bf[t][1]);
      }
    }
  }
  CpAsyncWait<0>();

  // Accumulator (mt, t, e) is row wm*32 + mt*16 + (e / 2) * 8 + lane / 4 of the tile and shared column
  // wn*64 + t*8 + (lane % 4) * 2 + e % 2: branch t / 2, feature h0 + wn*16 + (t % 2)*8 + (lane % 4)*2 + e % 2.
  const int64_t width = kBranches * a.H;
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int64_t row = m0 + wm * 32 + mt * 16 + half * 8 + lane / 4;
      if (row >= a.rows) continue;
#pragma unroll
      for (int t2 = 0; t2 < 2; ++t2) {
        const int64_t h = h0 + wn * 16 + t2 * 8 + (lane % 4) * 2;
        Vec<T, 2> hn[kBranches];
#pragma unroll
        for (int c = 0; c < kBranches; ++c) hn[c] = LoadVec<T, 2>(a.hn + row * width + c * a.H + h);
        float pre[2] = {0.0f, 0.0f};
#pragma unroll
        for (int c = 0; c < kBranches; ++c) {  // branch order, as HcGateEpilogueKernel
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            const float up = RoundToT<T>(acc[mt][c * 2 + t2][half * 2 + j]);  // rounding point: up
            const float g = RoundToT<T>(Sigmoid(up));                          // rounding point: g
            pre[j] = MulAdd(ToFloat(hn[c].v[j]), g, pre[j]);
          }
        }
        Vec<T, 2> out;
#pragma unroll
        for (int j = 0; j < 2; ++j) out.v[j] = FromFloat<T>(__fmul_rn(a.reduction_scale, pre[j]));  // rounding point: pre_output
        StoreVec<T, 2>(a.pre_output + row * a.H + h, out);
      }
    }
  }
}

template <typename T, int WARPS_M>
cudaError_t LaunchTile(const UpGateArgs<T>& a, cudaStream_t stream, unsigned* blocks) {
  using Tile = UpGateTile<WARPS_M>;
  auto* kernel = HcUpGateGemmKernel<T, WARPS_M>;
  if (const cudaError_t e =
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(Tile::kSmemBytes));
      e != cudaSuccess) {
    return e;
  }
  const dim3 grid(static_cast<unsigned>((a.rows + Tile::kBM - 1) / Tile::kBM), static_cast<unsigned>(a.H / kBH));
  *blocks = grid.x * grid.y;
  kernel<<<grid, Tile::kThreads, Tile::kSmemBytes, stream>>>(a);
  return cudaGetLastError();
}

// Row tiles of 128 from this many rows (enough blocks for the real shape: 8 x 80), 64 below (changes no bit).
constexpr int64_t kTallTileMinRows = 1024;
// Grid limits: x holds the row tiles, y the feature tiles.
constexpr int64_t kMaxRowTiles = (int64_t{1} << 31) - 1;
constexpr int64_t kMaxFeatureTiles = 65535;

}  // namespace

template <typename T>
bool HcUpGateGemmEligible(int64_t C, int64_t H, int64_t R, const T* hidden, const T* up_weight, const T* hn,
                          const T* pre_output) {
  if constexpr (sizeof(T) != 2) {
    return false;
  } else {
    return C == kBranches && H % kBH == 0 && H / kBH <= kMaxFeatureTiles && R % 8 == 0 && R > 0 &&
           AlignmentOf(hidden) >= 16 && AlignmentOf(up_weight) >= 16 && AlignmentOf(hn) >= 16 &&
           AlignmentOf(pre_output) >= 4;
  }
}

template <typename T>
cudaError_t LaunchHcUpGateGemm(const T* hidden, const T* up_weight, const T* hn, T* pre_output, int64_t rows,
                               int64_t H, int64_t R, float reduction_scale, cudaStream_t stream, unsigned* blocks,
                               int* rows_per_block) {
  *blocks = 0;
  *rows_per_block = 0;
  if (rows == 0) return cudaSuccess;
  if constexpr (sizeof(T) != 2) {
    return cudaErrorNotSupported;
  } else {
    const UpGateArgs<T> a{hidden, up_weight, hn, pre_output, rows, H, R, reduction_scale};
    if ((rows + 63) / 64 > kMaxRowTiles) return cudaErrorInvalidConfiguration;
    if (rows >= kTallTileMinRows) {
      *rows_per_block = UpGateTile<4>::kBM;
      return LaunchTile<T, 4>(a, stream, blocks);
    }
    *rows_per_block = UpGateTile<2>::kBM;
    return LaunchTile<T, 2>(a, stream, blocks);
  }
}

#define HC_INSTANTIATE_UP_GATE(T)                                                                             \
  template bool HcUpGateGemmEligible<T>(int64_t, int64_t, int64_t, const T*, const T*, const T*, const T*);  \
  template cudaError_t LaunchHcUpGateGemm<T>(const T*, const T*, const T*, T*, int64_t, int64_t, int64_t, float, \
                                             cudaStream_t, unsigned*, int*);
HC_INSTANTIATE_UP_GATE(float)
HC_INSTANTIATE_UP_GATE(__half)
HC_INSTANTIATE_UP_GATE(__nv_bfloat16)

}  // namespace cuda
}  // namespace hcfuse
