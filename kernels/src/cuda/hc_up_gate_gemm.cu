// HcUpGateGemmKernel: up = hidden @ up_weight on mma.sync tensor cores (fp32 accumulation) with the gate
// epilogue in registers: up rounded to T, g = sigmoid(up) rounded to T, pre_output = reduction_scale *
// sum_c hn * g (c in order), so `up` never goes to memory (the unfused route writes and reads it back:
// 2 x rows x C*H elements).
//
// Tiling: a block owns BM rows (32 per warp row) and kBH = 32 features h of all 4 branches: 128 columns
// of up_weight, gathered as branch blocks of 8 features so that one thread's accumulators hold the
// same (row, h) for c = 0..3 and the branch sum stays in the thread. K = R runs in chunks of BK (64 or
// 32) through a cp.async pipeline of 2 or 4 stages (rows past `rows` and k past R load as zeros). Warps:
// WARPS_M x 2, each 32 rows x 64 columns (2 x 8 m16n8k16 tiles).
// The block's hn tile (BM rows x 4 branches x 32 features, 64-byte runs) is fetched by 16-byte cp.async
// copies issued with the last K chunk, so it lands while the last chunks' products run, and the
// epilogue reads it from shared memory (measured on an H200: bulk copies of the 64-byte runs issued
// before the first chunk, 4 x BM copy-engine requests a block, took the kernel to 188 us at 4096 rows).
// pre_output is staged in shared memory and written as 16-byte vectors (a row's 32 features are 64
// contiguous bytes).
//
// Determinism and row independence: every up element is the fp32 sum of the same mma.sync
// instructions in the same k order (16 k an instruction, k ascending) whatever the row count, the tile
// height (BM) or the block that computes it; the epilogue's arithmetic is HcGateEpilogueKernel's.
#include "cuda/hc_up_gate_gemm.h"

#include <algorithm>

#include "cuda/hc_common.cuh"
#include "cuda/hc_ptx.cuh"

namespace hcfuse {
namespace cuda {
namespace {

constexpr int kBH = 32;               // features a block
constexpr int kBranches = 4;          // C
constexpr int kBN = kBranches * kBH;  // up_weight columns a block
// Shared-memory row pitches (elements; +16 bytes: ldmatrix and the epilogue's 4-byte accesses hit
// distinct banks across the 8 rows a warp instruction touches); the hidden tile's is the Tile's kALd
constexpr int kBLd = kBN + 8;    // up_weight tile
constexpr int kHnLd = kBN + 8;   // hn tile: [row][c * kBH + h]
constexpr int kOutLd = kBH + 8;  // pre_output staging: [row][h]
constexpr int kRunBytes = kBH * 2;  // one (row, branch) run of hn: 64 bytes
static_assert(kBN == 128 && kBH % 16 == 0, "two warp columns of 4 branches x 16 features");

// BM = 32 * WARPS_M rows a block, K chunks of BK through STAGES shared-memory stages.
template <int WARPS_M, int BK, int STAGES>
struct UpGateTile {
  static constexpr int kWarpsM = WARPS_M;
  static constexpr int kBM = 32 * WARPS_M;
  static constexpr int kThreads = 64 * WARPS_M;
  static constexpr int kBK = BK;
  static constexpr int kStages = STAGES;
  static constexpr int kALd = BK + 8;  // hidden tile pitch
  static constexpr int kStageElements = kBM * kALd + BK * kBLd;
  // the stages, then the hn tile
  static constexpr size_t kHnOffset = sizeof(uint16_t) * STAGES * size_t{kStageElements};
  static constexpr size_t kSmemBytes = kHnOffset + sizeof(uint16_t) * size_t{kBM} * kHnLd;
  static_assert(kBM * kOutLd <= kBM * kALd, "pre_output staging fits a hidden stage");
  static_assert(kHnOffset % 16 == 0 && BK % 16 == 0 && STAGES >= 2, "16-byte copies, whole mma k steps");
};
// The tiles by row count (hc_up_gate_gemm.cu's launcher): 128 rows, K chunks of 64 in 2 stages (104 KB:
// 2 blocks a SM); 64 and 32 rows, chunks of 32 in 4 stages (71 KB, 3 a SM; 53 KB, 4 a SM), where few
// blocks a SM leave the loads' latency to the pipeline's depth.
using TallTile = UpGateTile<4, 64, 2>;
using MidTile = UpGateTile<2, 32, 4>;
using ShortTile = UpGateTile<1, 32, 4>;
template <typename Tile>
constexpr int kMinBlocks = Tile::kWarpsM == 4 ? 2 : Tile::kWarpsM == 2 ? 3 : 4;  // registers capped to match

template <typename T>
struct UpGateArgs {
  const T* hidden;     // (rows, R)
  const T* up_weight;  // (R, 4H)
  const T* hn;         // (rows, 4H)
  T* pre_output;       // (rows, H)
  int64_t rows, H, R, row_tiles;
  float reduction_scale;
};

// 16 bytes, zero-filled where !valid (src-size 0: nothing is read).
__device__ __forceinline__ void CpAsync16Zfill(unsigned smem, const void* gmem, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem), "l"(gmem),
               "r"(valid ? 16 : 0)
               : "memory");
}

// Two n8 B fragments (16 x 16 of row-major [k][n]) through one transposing load.
__device__ __forceinline__ void LoadBFragmentPair(unsigned (&r)[4], unsigned smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem)
               : "memory");
}

// One pipeline stage: K chunk kc of the block's hidden rows and up_weight columns, into the stage at
// shared address `stage`. Shared column n = wn * 64 + t * 8 + e (warp column wn, n8 tile t, element e)
// holds branch c = t / 2, feature h0 + wn * 16 + (t % 2) * 8 + e, i.e. global column c * H + that feature.
// A thread copies the same rows / columns of every chunk: `hidden_row` and `weight_col` point at its
// first ones (chunk 0), which advance by BK elements (hidden) or BK rows (up_weight) a chunk.
template <typename T, typename Tile>
struct StageCopier {
  static constexpr int kBK = Tile::kBK, kALd = Tile::kALd;
  static constexpr int kAVecs = Tile::kBM * (kBK / 8) / Tile::kThreads;  // 16-byte copies a thread
  static constexpr int kBVecs = kBK * (kBN / 8) / Tile::kThreads;
  static_assert(kAVecs * Tile::kThreads == Tile::kBM * (kBK / 8) && kBVecs * Tile::kThreads == kBK * (kBN / 8),
                "whole rounds");
  static_assert(Tile::kThreads % (kBK / 8) == 0 && Tile::kThreads % (kBN / 8) == 0, "fixed columns per thread");
  const T* hidden;  // the thread's first hidden row, at its column q * 8
  const T* weight;  // the thread's first up_weight row, at its column
  int64_t R, weight_ld;
  int a_k, b_k;  // the thread's k offset in a chunk: hidden column, up_weight row
  bool row_live[kAVecs];

  __device__ StageCopier(const UpGateArgs<T>& a, int64_t m0, int64_t h0) : R(a.R), weight_ld(kBranches * a.H) {
    const int q = threadIdx.x % (kBK / 8);
    const int r = threadIdx.x / (kBK / 8);  // first row; then every kThreads / (kBK / 8) rows
    a_k = q * 8;
    const int64_t row = std::min(m0 + r, a.rows - 1);
    hidden = a.hidden + row * a.R + a_k;
#pragma unroll
    for (int it = 0; it < kAVecs; ++it) row_live[it] = m0 + r + it * (Tile::kThreads / (kBK / 8)) < a.rows;
    const int qb = threadIdx.x % (kBN / 8);
    const int wn = qb / 8, t = qb % 8;
    b_k = threadIdx.x / (kBN / 8);
    weight = a.up_weight + b_k * weight_ld + (t / 2) * a.H + h0 + wn * 16 + (t % 2) * 8;
  }

  __device__ __forceinline__ void Load(unsigned stage, int64_t kc) const {
    constexpr int kARowStep = Tile::kThreads / (kBK / 8);
    constexpr int kBRowStep = Tile::kThreads / (kBN / 8);
    const int64_t k0 = kc * kBK;
    const unsigned as = stage + 2 * ((threadIdx.x / (kBK / 8)) * kALd + a_k);
    const bool a_valid = k0 + a_k < R;
#pragma unroll
    for (int it = 0; it < kAVecs; ++it) {
      const bool valid = a_valid && row_live[it];
      CpAsync16Zfill(as + 2 * it * kARowStep * kALd, valid ? hidden + it * kARowStep * R + k0 : hidden, valid);
    }
    const unsigned bs = stage + 2 * (Tile::kBM * kALd + b_k * kBLd + (threadIdx.x % (kBN / 8)) * 8);
#pragma unroll
    for (int it = 0; it < kBVecs; ++it) {
      const int64_t k = k0 + b_k + it * kBRowStep;
      const bool valid = k < R;
      CpAsync16Zfill(bs + 2 * it * kBRowStep * kBLd, valid ? weight + (k - b_k) * weight_ld : weight, valid);
    }
  }
};

// The hn tile (BM rows x 4 runs of 64 bytes) as 16-byte cp.async copies, rows past `rows` zero-filled.
// A thread copies the same branch c and 16-byte slot v of every kThreads / 16-th row (a rolled loop: it
// runs inside the product's loop, next to the live accumulators).
template <typename T, typename Tile>
__device__ __forceinline__ void LoadHnTile(const UpGateArgs<T>& a, unsigned hn_tile, int64_t m0, int64_t h0) {
  constexpr int kRunVecs = kRunBytes / 16;
  constexpr int kRowVecs = kBranches * kRunVecs;
  static_assert(Tile::kThreads % kRowVecs == 0, "fixed (c, v) per thread");
  constexpr int kRowStep = Tile::kThreads / kRowVecs;
  const int c = threadIdx.x / kRunVecs % kBranches, v = threadIdx.x % kRunVecs;
  const int64_t width = kBranches * a.H;
  int64_t row = m0 + threadIdx.x / kRowVecs;
  const T* src = a.hn + row * width + c * a.H + h0 + v * 8;
  unsigned dst = hn_tile + 2 * ((threadIdx.x / kRowVecs) * kHnLd + c * kBH + v * 8);
#pragma unroll 1
  for (int r = threadIdx.x / kRowVecs; r < Tile::kBM; r += kRowStep) {
    CpAsync16Zfill(dst, row < a.rows ? src : a.hn, row < a.rows);
    row += kRowStep;
    src += kRowStep * width;
    dst += 2 * kRowStep * kHnLd;
  }
}

// g and pre_output of the thread's accumulators into out_tile. Accumulator (mt, t, e) is row wm*32 +
// mt*16 + (e / 2) * 8 + lane / 4 of the tile and shared column wn*64 + t*8 + (lane % 4) * 2 + e % 2:
// branch t / 2, feature wn*16 + (t % 2)*8 + (lane % 4)*2 + e % 2. IN_RANGE: every up >= kSigmoidInRangeMin.
template <typename T, int WARPS_M, bool IN_RANGE>
__device__ __forceinline__ void GateEpilogue(const float (&acc)[2][8][4], const T* hn_tile, T* out_tile,
                                             float reduction_scale) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int wm = warp % WARPS_M, wn = warp / WARPS_M;
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = wm * 32 + mt * 16 + half * 8 + lane / 4;
#pragma unroll
      for (int t2 = 0; t2 < 2; ++t2) {
        const int f = wn * 16 + t2 * 8 + (lane % 4) * 2;
        Vec<T, 2> hn[kBranches];
#pragma unroll
        for (int c = 0; c < kBranches; ++c) hn[c] = LoadVec<T, 2>(hn_tile + r * kHnLd + c * kBH + f);
        float pre[2] = {0.0f, 0.0f};
#pragma unroll
        for (int c = 0; c < kBranches; ++c) {  // branch order, as HcGateEpilogueKernel
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            const float up = RoundToT<T>(acc[mt][c * 2 + t2][half * 2 + j]);         // rounding point: up
            const float g = RoundToT<T>(IN_RANGE ? SigmoidInRange(up) : Sigmoid(up));  // rounding point: g
            pre[j] = MulAdd(ToFloat(hn[c].v[j]), g, pre[j]);
          }
        }
        Vec<T, 2> out;
#pragma unroll
        for (int j = 0; j < 2; ++j) out.v[j] = FromFloat<T>(__fmul_rn(reduction_scale, pre[j]));  // rounding point: pre_output
        StoreVec<T, 2>(out_tile + r * kOutLd + f, out);
      }
    }
  }
}

template <typename T, typename Tile>
__global__ void __launch_bounds__(Tile::kThreads, kMinBlocks<Tile>) HcUpGateGemmKernel(UpGateArgs<T> a) {
  constexpr int WARPS_M = Tile::kWarpsM, kBK = Tile::kBK, kALd = Tile::kALd, kStages = Tile::kStages;
  extern __shared__ __align__(16) unsigned char up_gate_smem[];
  T* const stages = reinterpret_cast<T*>(up_gate_smem);  // [kStages][kStageElements]
  T* const hn_tile = reinterpret_cast<T*>(up_gate_smem + Tile::kHnOffset);
  T* const out_tile = stages;  // pre_output staging, after the product
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int wm = warp % WARPS_M, wn = warp / WARPS_M;
  const int64_t h0 = int64_t{blockIdx.x} * kBH;
  const int64_t chunks = (a.R + kBK - 1) / kBK;
  // shared addresses: the stages, and this lane's ldmatrix rows in stage 0 (kk = 0, mt = 0, t = 0)
  constexpr unsigned kStageBytes = 2 * Tile::kStageElements;
  const unsigned stage_base = ptx::SharedAddress(stages);
  const unsigned a_lane = stage_base + 2 * ((wm * 32 + (lane % 16)) * kALd + (lane / 16) * 8);
  const unsigned b_lane = stage_base + 2 * (Tile::kBM * kALd + (lane % 16) * kBLd + wn * 64 + (lane / 16) * 8);
  const unsigned hn_base = ptx::SharedAddress(hn_tile);

  for (int64_t tile = blockIdx.y; tile < a.row_tiles; tile += gridDim.y) {
    const int64_t m0 = tile * Tile::kBM;
    __syncthreads();  // the previous tile's epilogue is done with hn_tile and the stages
    // cp.async groups, oldest first: one a chunk slot (empty past the last chunk), and the hn tile's
    // right after the last chunk's (it lands while the last kStages - 1 chunks are multiplied); a chunk's
    // wait lets the newer groups fly
    const StageCopier<T, Tile> copier(a, m0, h0);
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < chunks) copier.Load(stage_base + s * kStageBytes, s);
      ptx::CpAsyncCommit();
      if (s == chunks - 1) {
        LoadHnTile<T, Tile>(a, hn_base, m0, h0);
        ptx::CpAsyncCommit();
      }
    }

    float acc[2][8][4];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
      for (int t = 0; t < 8; ++t) {
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[mt][t][e] = 0.0f;
      }
    }
    for (int64_t kc = 0; kc < chunks; ++kc) {
      if (kc + kStages > chunks) {
        ptx::CpAsyncWait<kStages - 1>();  // the hn tile's group is among the newer ones
      } else {
        ptx::CpAsyncWait<kStages - 2>();
      }
      __syncthreads();  // chunk kc landed for every thread; the stage of chunk kc - 1 is free again
      const int64_t next = kc + kStages - 1;
      if (next < chunks) copier.Load(stage_base + static_cast<unsigned>(next % kStages) * kStageBytes, next);
      ptx::CpAsyncCommit();
      if (next == chunks - 1) {
        LoadHnTile<T, Tile>(a, hn_base, m0, h0);
        ptx::CpAsyncCommit();
      }
      const unsigned stage = static_cast<unsigned>(kc % kStages) * kStageBytes;
#pragma unroll 2  // fully unrolled (BK = 64), the fragments of later steps are hoisted: 128+ registers
      for (int kk = 0; kk < kBK; kk += 16) {
        unsigned af[2][4];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) ptx::LoadAFragment(af[mt], a_lane + stage + 2 * (mt * 16 * kALd + kk));
        unsigned bf[8][2];
#pragma unroll
        for (int t = 0; t < 8; t += 2) {
          unsigned r[4];
          LoadBFragmentPair(r, b_lane + stage + 2 * (kk * kBLd + t * 8));
          bf[t][0] = r[0];
          bf[t][1] = r[1];
          bf[t + 1][0] = r[2];
          bf[t + 1][1] = r[3];
        }
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
          for (int t = 0; t < 8; ++t) ptx::Mma<T>(acc[mt][t], af[mt], bf[t]);
        }
      }
    }
    ptx::CpAsyncWait<0>();
    __syncthreads();  // the hn tile landed for every thread, every warp is done with the stages (out_tile)

    // Sigmoid's division without its slow-path branch where every up of the thread allows it (the same
    // bits; a thread with any up below kSigmoidInRangeMin, or NaN, takes Sigmoid for all of them).
    bool in_range = true;
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
      for (int t = 0; t < 8; ++t) {
#pragma unroll
        for (int e = 0; e < 4; ++e) in_range &= acc[mt][t][e] >= kSigmoidInRangeMin;
      }
    }
    if (in_range) {
      GateEpilogue<T, WARPS_M, true>(acc, hn_tile, out_tile, a.reduction_scale);
    } else {
      GateEpilogue<T, WARPS_M, false>(acc, hn_tile, out_tile, a.reduction_scale);
    }
    __syncthreads();
    constexpr int kOutVecs = kBH * sizeof(T) / 16;  // 16-byte vectors a row
    for (int i = threadIdx.x; i < Tile::kBM * kOutVecs; i += Tile::kThreads) {
      const int r = i / kOutVecs, v = i % kOutVecs;
      if (m0 + r < a.rows) {
        StoreVec<T, 8>(a.pre_output + (m0 + r) * a.H + h0 + v * 8, LoadVec<T, 8>(out_tile + r * kOutLd + v * 8));
      }
    }
  }
}

template <typename T, typename Tile>
cudaError_t LaunchTile(UpGateArgs<T> a, cudaStream_t stream, unsigned* blocks, int* rows_per_block) {
  *rows_per_block = Tile::kBM;
  auto* kernel = HcUpGateGemmKernel<T, Tile>;
  if (const cudaError_t e =
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(Tile::kSmemBytes));
      e != cudaSuccess) {
    return e;
  }
  if (const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                                 static_cast<int>(cudaSharedmemCarveoutMaxShared));
      e != cudaSuccess) {
    return e;
  }
  a.row_tiles = (a.rows + Tile::kBM - 1) / Tile::kBM;
  constexpr int64_t kMaxGridY = 65535;  // more row tiles: the blocks loop over them
  const dim3 grid(static_cast<unsigned>(a.H / kBH), static_cast<unsigned>(std::min(a.row_tiles, kMaxGridY)));
  *blocks = grid.x * grid.y;
  kernel<<<grid, Tile::kThreads, Tile::kSmemBytes, stream>>>(a);
  return cudaGetLastError();
}

// Tile by row count (changes no bit): ShortTile below 256 rows (the real shape at 64 rows: 2 x 80
// blocks), MidTile up to 1023 (256 rows: 320 blocks, one wave at 3 a SM), TallTile from 1024 rows.
constexpr int64_t kMidTileMinRows = 256;
constexpr int64_t kTallTileMinRows = 1024;
constexpr int64_t kMaxFeatureTiles = (int64_t{1} << 31) - 1;

}  // namespace

template <typename T>
bool HcUpGateGemmEligible(int64_t C, int64_t H, int64_t R, const T* hidden, const T* up_weight, const T* hn,
                          const T* pre_output) {
  if constexpr (sizeof(T) != 2) {
    return false;
  } else {
    return C == kBranches && H % kBH == 0 && H / kBH <= kMaxFeatureTiles && R % 8 == 0 && R > 0 &&
           AlignmentOf(hidden) >= 16 && AlignmentOf(up_weight) >= 16 && AlignmentOf(hn) >= 16 &&
           AlignmentOf(pre_output) >= 16;
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
    const UpGateArgs<T> a{hidden, up_weight, hn, pre_output, rows, H, R, 0, reduction_scale};
    if (rows >= kTallTileMinRows) return LaunchTile<T, TallTile>(a, stream, blocks, rows_per_block);
    if (rows >= kMidTileMinRows) return LaunchTile<T, MidTile>(a, stream, blocks, rows_per_block);
    return LaunchTile<T, ShortTile>(a, stream, blocks, rows_per_block);
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
