// HcNormInjectKernel and HcNormInjectResidentKernel: the general path's S (prologue), per-branch rms,
// hn (scratch), inject = hn @ inject_weight (a fixed-order fp32 dot product per row) and post_gate.
//
//   HcNormInjectResidentKernel  C = 4, 16-bit T, 16-byte vectors, H a multiple of 256 up to 2560 (the
//                      real shape): a thread owns 8 features of all four branches and keeps its
//                      inject_weight rows and norm_scale in registers for the whole kernel; a persistent
//                      grid streams row pairs through cp.async stages. Reads the weights once per block
//                      instead of once per row group, keeps two row pairs of loads in flight, and works
//                      on packed pairs of T (one conversion and one rounding instruction per pair).
//   HcNormInjectKernel  any C/H/T: a block per row group, the inject_weight rows reloaded per group; S
//                      kept in shared memory between its two passes where it fits (kCache), else formed
//                      twice (kFormTwice).
// Which kernel runs depends on the shape, T, the pointers' alignment and the device's shared memory,
// never on the row count, so a row's bits are the same at every row count. Without inject_weight (the
// quantized op's GEMM route, whose product has inject's columns) both write S, streams_out and hn only: the
// same operations and bits for those, without the inject dot products and post_gate.
#include "cuda/general/hc_norm_inject.h"

#include <algorithm>

#include "cuda/common/hc_common.cuh"
#include "cuda/common/hc_device_caps.h"
#include "cuda/common/hc_ptx.cuh"

namespace hcfuse {
namespace cuda {
namespace {

constexpr int kMaxNormThreads = 256;
// Inject columns one pass of HcNormInjectKernel accumulates (one pass when C <= 8).
constexpr int kInjectGroup = 8;

// S = streams + gate * prev for VEC consecutive features, each rounded to T.
template <typename T, int VEC>
__device__ __forceinline__ Vec<T, VEC> PrologueVec(Vec<T, VEC> s, float gate, const Vec<T, VEC>& prev) {
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    // rounding point: S
    s.v[j] = FromFloat<T>(PrologueS<T>(ToFloat(s.v[j]), gate, ToFloat(prev.v[j])));
  }
  return s;
}

// S for VEC consecutive features h of branch c of one row, from global memory.
template <typename T, int VEC>
__device__ __forceinline__ Vec<T, VEC> LoadS(const NormArgs<T>& a, int64_t row, int64_t c, int64_t h) {
  const int64_t width = a.C * a.H;
  Vec<T, VEC> s = LoadVec<T, VEC>(a.streams + row * width + c * a.H + h);
  if (a.prev_block_output != nullptr) {
    s = PrologueVec<T, VEC>(s, ToFloat(a.prev_post_gate[row * a.C + c]),
                            LoadVec<T, VEC>(a.prev_block_output + row * a.H + h));
  }
  return s;
}

// N block sums at once, each exactly as BlockSum computes it (butterfly in the warp, warp sums added
// in order), with two barriers for all N. `scratch` holds N * 32 floats; every thread gets the sums.
template <int N>
__device__ __forceinline__ void BlockSums(float (&v)[N], float* scratch) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int num_warps = blockDim.x >> 5;
#pragma unroll
  for (int i = 0; i < N; ++i) v[i] = WarpSum(v[i]);
  __syncthreads();  // the previous call's readers are done with scratch
  if (lane == 0) {
#pragma unroll
    for (int i = 0; i < N; ++i) scratch[i * 32 + warp] = v[i];
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < N; ++i) {
    float total = 0.0f;
    for (int w = 0; w < num_warps; ++w) total += scratch[i * 32 + w];  // same order in every thread
    v[i] = total;
  }
}

// ---- HcNormInjectResidentKernel
constexpr int kResidentC = 4;
constexpr int kResidentVec = 8;  // features a thread owns per branch: 16 bytes of a 16-bit T, 4 words
constexpr int kResidentMaxThreads = 320;  // H <= 2560 (the real shape)
constexpr int kResidentMaxWarps = kResidentMaxThreads / 32;
// Rows a block processes together (one set of barriers, the weights unpacked once for both), and the
// cp.async stages of that many rows (two groups of loads in flight, ~100 KB a block): two rows a block
// beat one row with five stages, and both beat HcNormInjectKernel, at every prefill size.
constexpr int kResidentRows = 2;
constexpr int kResidentStages = 3;

// 16-byte vectors of one stage: streams [kResidentRows][C][H / 8], then prev_block_output [kResidentRows][H / 8].
size_t ResidentSmemBytes(int64_t H, bool prologue) {
  return static_cast<size_t>(kResidentStages * kResidentRows * (kResidentC + (prologue ? 1 : 0)) * (H / kResidentVec)) * 16;
}

// UnpackPair (hc_common.cuh) in asm volatile, which keeps the conversion where it is written: hoisted
// out of the row loop, the resident weights would take 128 registers in fp32 instead of 64 packed, and spill.
template <typename T>
__device__ __forceinline__ float2 UnpackInLoop(uint32_t w);
template <>
__device__ __forceinline__ float2 UnpackInLoop<__nv_bfloat16>(uint32_t w) {
  uint32_t lo, hi;
  asm volatile("shl.b32 %0, %2, 16;\n\tand.b32 %1, %2, 0xffff0000;" : "=r"(lo), "=r"(hi) : "r"(w));
  return make_float2(__uint_as_float(lo), __uint_as_float(hi));
}
template <>
__device__ __forceinline__ float2 UnpackInLoop<__half>(uint32_t w) {
  float lo, hi;
  asm volatile("{\n\t.reg .f16 l, h;\n\tmov.b32 {l, h}, %2;\n\tcvt.f32.f16 %0, l;\n\tcvt.f32.f16 %1, h;\n\t}"
               : "=f"(lo), "=f"(hi) : "r"(w));
  return make_float2(lo, hi);
}
__device__ __forceinline__ uint32_t& Word(uint4& v, int k) { return reinterpret_cast<uint32_t*>(&v)[k]; }

// One thread per 8 features h of all four branches (blockDim = H / 8, a multiple of 32). Its
// norm_scale (4 x 8) and inject_weight rows (4 x 8 rows of 4), packed, are loaded once and stay in
// registers. Rows go in groups of kResidentRows (a short last group repeats the last row, computed but
// never stored), a block's groups grid-strided, each group's streams and prev_block_output copied by
// cp.async STAGES - 1 groups ahead (pass 1 writes S back in place); each thread copies and reads back
// only its own vectors, so its own wait_group orders them. prev_post_gate is loaded a group ahead.
// Per row: S (prologue) and streams_out; per branch the thread's sum of squares (j sequential, MulAdd),
// a warp butterfly, the warp sums added in warp order -> 1 / rms (BranchInvRms); hn; per inject column
// q the thread's dot product (branches, then j, sequential, fmaf), a warp butterfly, the warp sums in
// warp order -> inject, rounded -> post_gate. Three barriers a group (two without INJECT: S, hn only). A row's
// operations do not depend on the row count, the grid, the row it is grouped with or its slot.
template <typename T, bool PROLOGUE, bool STREAMS_OUT, bool INJECT>
__global__ void __launch_bounds__(kResidentMaxThreads, 1) HcNormInjectResidentKernel(NormArgs<T> a) {
  ptx::WaitOnProducer();  // launched early (PDL): streams and the prologue inputs come from upstream
  constexpr int C = kResidentC, ROWS = kResidentRows, STAGES = kResidentStages;
  constexpr int kWords = kResidentVec / 2;             // words of one branch's 8 features
  constexpr int kWeightWords = kResidentVec * C / 2;   // words of one branch's 8 inject_weight rows
  __shared__ float sq_sums[ROWS * C][kResidentMaxWarps];
  __shared__ float inject_sums[INJECT ? ROWS * C : 1][kResidentMaxWarps];
  __shared__ float inv_rms[ROWS * C];
  extern __shared__ __align__(16) uint4 resident_stages[];
  const int t = threadIdx.x;
  const int lane = t & 31;
  const int warp = t >> 5;
  const int num_warps = blockDim.x >> 5;
  const int64_t vecs = blockDim.x;  // H / 8: 16-byte vectors of one branch of a row
  const int64_t stage_vectors = ROWS * (C + (PROLOGUE ? 1 : 0)) * vecs;
  const int64_t groups = (a.rows + ROWS - 1) / ROWS;
  const uint4* const streams = reinterpret_cast<const uint4*>(a.streams);
  const uint4* const prev_out = reinterpret_cast<const uint4*>(a.prev_block_output);
  uint4* const streams_out = reinterpret_cast<uint4*>(a.streams_out);
  uint4* const hn_out = reinterpret_cast<uint4*>(a.hn);
  auto row_of = [&](int64_t group, int r) { return std::min(group * ROWS + r, a.rows - 1); };
  auto prefetch = [&](int64_t group, int stage) {
    if (group >= groups) return;
    uint4* const st = resident_stages + stage * stage_vectors;
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      const int64_t row = row_of(group, r);
#pragma unroll
      for (int c = 0; c < C; ++c) ptx::CpAsync<16>(st + (r * C + c) * vecs + t, streams + (row * C + c) * vecs + t);
      if constexpr (PROLOGUE) ptx::CpAsync<16>(st + (ROWS * C + r) * vecs + t, prev_out + row * vecs + t);
    }
  };
  auto load_gates = [&](int64_t group, float (&gate)[ROWS][C]) {
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
#pragma unroll
      for (int c = 0; c < C; ++c) {
        gate[r][c] = PROLOGUE && group < groups ? ToFloat(a.prev_post_gate[row_of(group, r) * C + c]) : 0.0f;
      }
    }
  };

  // the first groups' copies fly while the weights load; one commit group per row group, empty or not
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    prefetch(blockIdx.x + int64_t{s} * gridDim.x, s);
    ptx::CpAsyncCommit();
  }
  uint4 scale[C];
  uint32_t weight[C][kWeightWords];  // inject_weight[c*H + h + j, 2p .. 2p + 1] in word [c][2j + p]
#pragma unroll
  for (int c = 0; c < C; ++c) {
    scale[c] = reinterpret_cast<const uint4*>(a.norm_scale)[c * vecs + t];
    if constexpr (INJECT) {
      const uint4* w = reinterpret_cast<const uint4*>(a.inject_weight) + (c * vecs + t) * (kWeightWords / 4);
#pragma unroll
      for (int i = 0; i < kWeightWords / 4; ++i) {
        const uint4 v = w[i];
        weight[c][4 * i] = v.x;
        weight[c][4 * i + 1] = v.y;
        weight[c][4 * i + 2] = v.z;
        weight[c][4 * i + 3] = v.w;
      }
    }
  }
  float gate[ROWS][C];
  load_gates(blockIdx.x, gate);

  int stage = 0;
  for (int64_t group = blockIdx.x; group < groups; group += gridDim.x) {
    // the stage freed by the previous group takes the group STAGES - 1 ahead
    prefetch(group + int64_t{STAGES - 1} * gridDim.x, (stage + STAGES - 1) % STAGES);
    ptx::CpAsyncCommit();
    ptx::CpAsyncWait<STAGES - 1>();  // this group's copies landed
    float next_gate[ROWS][C];
    load_gates(group + gridDim.x, next_gate);
    uint4* const st = resident_stages + stage * stage_vectors;

    // pass 1: S, streams_out, sums of squares
    float sum_sq[ROWS][C];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      const int64_t row = row_of(group, r);
      const bool live = group * ROWS + r < a.rows;
      float2 prev[kWords];
      if constexpr (PROLOGUE) {
        uint4 p = st[(ROWS * C + r) * vecs + t];
#pragma unroll
        for (int k = 0; k < kWords; ++k) prev[k] = UnpackPair<T>(Word(p, k));
      }
#pragma unroll
      for (int c = 0; c < C; ++c) {
        uint4 s = st[(r * C + c) * vecs + t];
        float acc = 0.0f;
#pragma unroll
        for (int k = 0; k < kWords; ++k) {
          float2 x = UnpackPair<T>(Word(s, k));
          if constexpr (PROLOGUE) {
            // rounding point: S
            Word(s, k) = PackPair<T>(PrologueS<T>(x.x, gate[r][c], prev[k].x), PrologueS<T>(x.y, gate[r][c], prev[k].y));
            x = UnpackPair<T>(Word(s, k));
          }
          acc = MulAdd<T>(x.x, x.x, acc);
          acc = MulAdd<T>(x.y, x.y, acc);
        }
        if constexpr (PROLOGUE) st[(r * C + c) * vecs + t] = s;  // S in place for pass 2
        if constexpr (STREAMS_OUT) {
          if (live) streams_out[(row * C + c) * vecs + t] = s;
        }
        sum_sq[r][c] = acc;
      }
    }
#pragma unroll
    for (int i = 0; i < ROWS * C; ++i) {
      const float v = WarpSum(sum_sq[i / C][i % C]);
      if (lane == 0) sq_sums[i][warp] = v;
    }
    __syncthreads();  // every warp's sums of squares
    if (t < ROWS * C) {
      float total = 0.0f;
      for (int w = 0; w < num_warps; ++w) total += sq_sums[t][w];  // warp order
      inv_rms[t] = BranchInvRms(total, a.H, a.epsilon);
    }
    __syncthreads();  // inv_rms of the group

    // pass 2: hn and the inject dot products
    float part[ROWS][C];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
#pragma unroll
      for (int q = 0; q < C; ++q) part[r][q] = 0.0f;
    }
#pragma unroll
    for (int c = 0; c < C; ++c) {
      uint4 s[ROWS];
      float inv[ROWS];
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        s[r] = st[(r * C + c) * vecs + t];  // S as pass 1 formed it
        inv[r] = inv_rms[r * C + c];
      }
#pragma unroll
      for (int k = 0; k < kWords; ++k) {
        const float2 sc = UnpackPair<T>(Word(scale[c], k));
        float2 hv[ROWS];
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
          const float2 x = UnpackPair<T>(Word(s[r], k));
          // rounding point: hn
          Word(s[r], k) = PackPair<T>(NormalizeHn(x.x, inv[r], sc.x), NormalizeHn(x.y, inv[r], sc.y));
          hv[r] = UnpackPair<T>(Word(s[r], k));
        }
#pragma unroll
        for (int jj = 0; jj < (INJECT ? 2 : 0); ++jj) {  // feature j = 2k + jj
          const int j = 2 * k + jj;
          const float2 w01 = UnpackInLoop<T>(weight[c][2 * j]);
          const float2 w23 = UnpackInLoop<T>(weight[c][2 * j + 1]);
#pragma unroll
          for (int r = 0; r < ROWS; ++r) {
            const float x = jj == 0 ? hv[r].x : hv[r].y;
            part[r][0] = fmaf(x, w01.x, part[r][0]);
            part[r][1] = fmaf(x, w01.y, part[r][1]);
            part[r][2] = fmaf(x, w23.x, part[r][2]);
            part[r][3] = fmaf(x, w23.y, part[r][3]);
          }
        }
      }
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        if (group * ROWS + r < a.rows) hn_out[(row_of(group, r) * C + c) * vecs + t] = s[r];  // s[r] holds hn now
      }
    }
    if constexpr (INJECT) {
#pragma unroll
      for (int i = 0; i < ROWS * C; ++i) {
        const float v = WarpSum(part[i / C][i % C]);
        if (lane == 0) inject_sums[i][warp] = v;
      }
      __syncthreads();  // every warp's inject partials
      if (t < ROWS * C) {
        const int r = t / C, q = t % C;
        float total = 0.0f;
        for (int w = 0; w < num_warps; ++w) total += inject_sums[t][w];  // warp order
        if (group * ROWS + r < a.rows) {
          const float inject = RoundToT<T>(total);  // rounding point: inject
          // rounding points: gate logit, its sigmoid, post_gate
          a.post_gate[row_of(group, r) * C + q] = FromFloat<T>(PostGate<T>(inject, a.gate_div, a.gate_mul));
        }
      }
    }
    // sq_sums is written again only after the next group's loads (its readers are past the second barrier);
    // inject_sums and inv_rms only after its first barrier, which these readers reach after reading
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
#pragma unroll
      for (int c = 0; c < C; ++c) gate[r][c] = next_gate[r][c];
    }
    stage = (stage + 1) % STAGES;
  }
}

// ---- HcNormInjectKernel

// Branches of one pass-1 round of HcNormInjectKernel: one barrier per round.
constexpr int kBranchGroup = 8;

// Where HcNormInjectKernel's pass 2 gets S (the choice changes no bit: S is formed by the same
// operations from the same inputs either way): kFormTwice forms it again from global memory (rows too
// wide for shared memory), kCache has pass 1 keep it in shared memory.
enum NormMode : int { kFormTwice = 0, kCache = 1 };

// Dynamic shared memory of HcNormInjectKernel: inv_rms [ROWS][C] floats (16-byte aligned), then in
// kCache S [ROWS][C][H] in T.
__host__ __device__ inline size_t NormInvRmsBytes(int rows_per_block, int64_t C) {
  return (static_cast<size_t>(rows_per_block * C) * sizeof(float) + 15) / 16 * 16;
}
size_t NormSmemBytes(NormMode mode, int rows_per_block, int64_t C, int64_t H, size_t element_size) {
  const size_t inv = NormInvRmsBytes(rows_per_block, C);
  return mode == kCache ? inv + static_cast<size_t>(rows_per_block * C * H) * element_size : inv;
}
// Largest S cache a block takes: two blocks (and their static shared memory) fit an sm_90 SM (228 KB),
// one an sm_80 SM (164 KB). The real shape: 4 rows cached in 16-bit T (80 KB), 2 in float32.
constexpr size_t kMaxNormCacheBytes = 104 * 1024;
// ROWS consecutive rows per block (row-group-stride loop; a short last group repeats its last row,
// computed but never stored).
// Pass 1, per round of kBranchGroup branches: forms S, writes streams_out (and, MODE != kFormTwice, S
// into shared memory) and sums S^2 per thread and branch (sequential over h, j), then per branch a warp
// butterfly whose warp sums lane 0 parks in shared memory; after the round's barrier the warp sums are
// added in warp order (BlockSum's order) into 1 / rms.
// Pass 2 takes S from shared memory (streams and the prologue inputs are read once; each thread reads
// back only the elements it wrote, so no barrier guards them) or forms it again (kFormTwice), and writes
// hn; per thread and branch c, part_c[c'] = sum over its h, j of hn[k] * inject_weight[k, c']
// (sequential, from 0); inject[c'] = part_0 + part_1 + ... in branch order, then BlockSum's order;
// post_gate from the rounded inject.
// CC = C known at compile time (4: the real shape; its inject_weight rows load as 16-byte vectors),
// or 0 for any C (scalar loads, kInjectGroup columns per pass). Pass 1 loads BR1 branches of ROWS rows
// before storing any (stores may alias the loads, so the compiler cannot hoist later loads above them),
// pass 2 BR; two blocks of 256 threads stay resident per SM. ROWS, CC, BR1, BR, MODE and the grid only
// change how loads are issued and amortized: a row's operations, and so its bits, are the same for
// every ROWS, CC, MODE, grid and row count. Without INJECT pass 2 writes hn only (one pass, no inject).
template <typename T, int VEC, int ROWS, int CC, int MODE, bool INJECT>
__global__ void __launch_bounds__(kMaxNormThreads, 2) HcNormInjectKernel(NormArgs<T> a) {
  ptx::WaitOnProducer();  // launched early (PDL): streams and the prologue inputs come from upstream
  // pass 1: up to 8 S vectors in flight (all 4 branches for 1 and 2 rows a block)
  constexpr int BR1 = CC > 0 ? (ROWS * CC <= 8 ? CC : (8 / ROWS > 0 ? 8 / ROWS : 1)) : 1;
  // pass 2: two branches a step with one row a block, one otherwise (more would cost residency: <= 128 registers)
  constexpr int BR = CC > 0 && ROWS == 1 ? 2 : 1;
  static_assert(CC == 0 || (CC % BR == 0 && CC % BR1 == 0 && CC <= kBranchGroup), "BR and BR1 divide CC");
  constexpr int Q = CC > 0 ? CC : kInjectGroup;  // inject columns per pass
  __shared__ float warp_sums[ROWS * kBranchGroup * 32];
  __shared__ float inject_scratch[ROWS * Q * 32];
  extern __shared__ __align__(16) unsigned char norm_smem[];
  float* inv_rms = reinterpret_cast<float*>(norm_smem);  // [ROWS][C]
  const int64_t C = CC > 0 ? CC : a.C;
  T* const smem_t = reinterpret_cast<T*>(norm_smem + NormInvRmsBytes(ROWS, C));
  const int64_t width = C * a.H;
  const int64_t step = int64_t{blockDim.x} * VEC;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int num_warps = blockDim.x >> 5;
  const int64_t groups = (a.rows + ROWS - 1) / ROWS;
  for (int64_t group = blockIdx.x; group < groups; group += gridDim.x) {
    T* const s_cache = smem_t;  // kCache: S [ROWS][C][H]
    int64_t row[ROWS];
    bool live[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      live[r] = group * ROWS + r < a.rows;
      row[r] = live[r] ? group * ROWS + r : a.rows - 1;
    }
    for (int64_t b0 = 0; b0 < C; b0 += kBranchGroup) {
      const int64_t branches = std::min<int64_t>(kBranchGroup, C - b0);
      for (int64_t cb = 0; cb < branches; cb += BR1) {
        float sum_sq[BR1][ROWS];
#pragma unroll
        for (int b = 0; b < BR1; ++b) {
#pragma unroll
          for (int r = 0; r < ROWS; ++r) sum_sq[b][r] = 0.0f;
        }
        for (int64_t h = int64_t{threadIdx.x} * VEC; h < a.H; h += step) {
          Vec<T, VEC> s[BR1][ROWS];
#pragma unroll
          for (int b = 0; b < BR1; ++b) {
#pragma unroll
            for (int r = 0; r < ROWS; ++r) {
              s[b][r] = LoadS<T, VEC>(a, row[r], b0 + cb + b, h);
            }
          }
#pragma unroll
          for (int b = 0; b < BR1; ++b) {
#pragma unroll
            for (int r = 0; r < ROWS; ++r) {
              if (a.streams_out != nullptr && live[r]) {
                StoreVec<T, VEC>(a.streams_out + row[r] * width + (b0 + cb + b) * a.H + h, s[b][r]);
              }
              if constexpr (MODE == kCache) StoreVec<T, VEC>(s_cache + (r * C + b0 + cb + b) * a.H + h, s[b][r]);
#pragma unroll
              for (int j = 0; j < VEC; ++j) {
                sum_sq[b][r] = MulAdd<T>(ToFloat(s[b][r].v[j]), ToFloat(s[b][r].v[j]), sum_sq[b][r]);
              }
            }
          }
        }
#pragma unroll
        for (int b = 0; b < BR1; ++b) {
#pragma unroll
          for (int r = 0; r < ROWS; ++r) {
            const float v = WarpSum(sum_sq[b][r]);
            if (lane == 0) warp_sums[(r * kBranchGroup + cb + b) * 32 + warp] = v;
          }
        }
      }
      __syncthreads();
      if (threadIdx.x < ROWS * kBranchGroup) {
        const int r = threadIdx.x / kBranchGroup;
        const int64_t cb = threadIdx.x % kBranchGroup;
        if (cb < branches) {
          float total = 0.0f;
          for (int w = 0; w < num_warps; ++w) total += warp_sums[threadIdx.x * 32 + w];  // BlockSum's order
          inv_rms[r * C + b0 + cb] = BranchInvRms(total, a.H, a.epsilon);
        }
      }
      __syncthreads();  // inv_rms of the round written; warp_sums free for the next round
    }
    for (int64_t c0 = 0; c0 < (INJECT ? C : 1); c0 += Q) {  // hn is written in the first pass
      const int cols = CC > 0 ? CC : static_cast<int>(std::min<int64_t>(Q, C - c0));
      float acc[ROWS * Q];
#pragma unroll
      for (int i = 0; i < ROWS * Q; ++i) acc[i] = 0.0f;
      for (int64_t c = 0; c < C; c += BR) {
        float part[BR][ROWS * Q];  // per branch, summed from 0 (the same whatever BR)
#pragma unroll
        for (int b = 0; b < BR; ++b) {
#pragma unroll
          for (int i = 0; i < ROWS * Q; ++i) part[b][i] = 0.0f;
        }
        for (int64_t h = int64_t{threadIdx.x} * VEC; h < a.H; h += step) {
          // the thread's VEC rows of inject_weight are VEC * CC contiguous elements, 16-byte aligned (CC > 0)
          constexpr int kChunk = 16 / static_cast<int>(sizeof(T));
          constexpr int kWeightVecs = CC > 0 ? VEC * CC / kChunk : 1;
          static_assert(CC == 0 || (VEC * CC) % kChunk == 0, "CC > 0 needs VEC * CC * sizeof(T) to be a multiple of 16");
          Vec<T, VEC> scale[BR];
          Vec<T, VEC> s[BR][ROWS];
          Vec<T, kChunk> wv[BR][kWeightVecs];
#pragma unroll
          for (int b = 0; b < BR; ++b) {  // every load of the step before any store
            scale[b] = LoadVec<T, VEC>(a.norm_scale + (c + b) * a.H + h);
#pragma unroll
            for (int r = 0; r < ROWS; ++r) {
              if constexpr (MODE == kCache) {
                s[b][r] = LoadVec<T, VEC>(s_cache + (r * C + c + b) * a.H + h);  // S as pass 1 formed it
              } else {
                s[b][r] = LoadS<T, VEC>(a, row[r], c + b, h);
              }
            }
            if constexpr (CC > 0 && INJECT) {
              const T* w = a.inject_weight + ((c + b) * a.H + h) * C;
#pragma unroll
              for (int i = 0; i < kWeightVecs; ++i) wv[b][i] = LoadVec<T, kChunk>(w + i * kChunk);
            }
          }
#pragma unroll
          for (int b = 0; b < BR; ++b) {
            Vec<T, VEC> hn[ROWS];
#pragma unroll
            for (int r = 0; r < ROWS; ++r) {
              const float inv = inv_rms[r * C + c + b];
#pragma unroll
              for (int j = 0; j < VEC; ++j) {
                // rounding point: hn
                hn[r].v[j] = FromFloat<T>(NormalizeHn(ToFloat(s[b][r].v[j]), inv, ToFloat(scale[b].v[j])));
              }
              if (c0 == 0 && live[r]) StoreVec<T, VEC>(a.hn + row[r] * width + (c + b) * a.H + h, hn[r]);
            }
            if constexpr (!INJECT) {
              // hn only
            } else if constexpr (CC > 0) {
#pragma unroll
              for (int j = 0; j < VEC; ++j) {
#pragma unroll
                for (int q = 0; q < CC; ++q) {
                  const float wq = ToFloat(wv[b][(j * CC + q) / kChunk].v[(j * CC + q) % kChunk]);
#pragma unroll
                  for (int r = 0; r < ROWS; ++r) part[b][r * Q + q] = fmaf(ToFloat(hn[r].v[j]), wq, part[b][r * Q + q]);
                }
              }
            } else {
              const T* w = a.inject_weight + ((c + b) * a.H + h) * C + c0;  // inject_weight[(c+b)*H + h, c0]
#pragma unroll
              for (int j = 0; j < VEC; ++j) {
#pragma unroll
                for (int q = 0; q < Q; ++q) {
                  if (q < cols) {
                    const float wq = ToFloat(w[j * C + q]);
#pragma unroll
                    for (int r = 0; r < ROWS; ++r) part[b][r * Q + q] = fmaf(ToFloat(hn[r].v[j]), wq, part[b][r * Q + q]);
                  }
                }
              }
            }
          }
        }
#pragma unroll
        for (int b = 0; b < BR; ++b) {
#pragma unroll
          for (int i = 0; i < ROWS * Q; ++i) acc[i] = __fadd_rn(acc[i], part[b][i]);  // branch order
        }
      }
      if constexpr (!INJECT) continue;  // one pass: hn
      BlockSums<ROWS * Q>(acc, inject_scratch);
      if (threadIdx.x == 0) {
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
#pragma unroll
          for (int q = 0; q < Q; ++q) {
            if (q < cols && live[r]) {
              const float inject = RoundToT<T>(acc[r * Q + q]);  // rounding point: inject
              // rounding points: gate logit, its sigmoid, post_gate
              a.post_gate[row[r] * C + c0 + q] = FromFloat<T>(PostGate<T>(inject, a.gate_div, a.gate_mul));
            }
          }
        }
      }
    }
  }
}
// ---- Launch

int NormThreads(int64_t H, int vec) {
  const int64_t groups = (H + vec - 1) / vec;
  const int64_t warps = (groups + 31) / 32;
  return static_cast<int>(std::min<int64_t>(std::max<int64_t>(warps, 1) * 32, kMaxNormThreads));
}

// Rows per block of HcNormInjectKernel (C = 4): more rows per block once there are blocks enough to
// fill the GPU (the choice changes no bit, see the kernel).
int NormRowsPerBlock(int64_t rows) { return rows >= 2048 ? 4 : rows >= 512 ? 2 : 1; }

// Whether HcNormInjectResidentKernel runs: C = 4, 16-byte vectors of 8 elements (PickVec's 8, so
// 16-bit T) and a 16-byte aligned inject_weight, H a multiple of 256 (whole warps of 8 features a thread) up to
// 8 * kResidentMaxThreads, its stages within the device's shared memory per block (static arrays: ~1 KB).
template <typename T>
bool ResidentFits(const NormArgs<T>& a, int vec, const HcDeviceCaps& caps) {
  const size_t smem = ResidentSmemBytes(a.H, a.prev_block_output != nullptr) + 1024;
  return a.C == kResidentC && vec == kResidentVec && a.H % (32 * kResidentVec) == 0 &&
         a.H <= int64_t{kResidentVec} * kResidentMaxThreads && AlignmentOf(a.inject_weight) >= 16 &&
         caps.sm_count > 0 && static_cast<int64_t>(smem) <= caps.max_shared_memory_per_block;
}

// One block per SM (its stages take most of the SM's shared memory), at most one per row group.
template <typename T, bool PROLOGUE, bool STREAMS_OUT, bool INJECT>
cudaError_t LaunchResidentKernel(const NormArgs<T>& a, const HcDeviceCaps& caps, cudaStream_t stream,
                                 NormLaunch* info) {
  const size_t smem = ResidentSmemBytes(a.H, PROLOGUE);
  const int64_t groups = (a.rows + kResidentRows - 1) / kResidentRows;
  info->kernel = "HcNormInjectResidentKernel (weights in registers, S cp.async-prefetched)";
  info->blocks = static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(groups, caps.sm_count)));
  info->threads = static_cast<int>(a.H / kResidentVec);
  info->rows_per_block = kResidentRows;
  // PDL where the kernel's wait is compiled in (sm_90): it launches while the previous kernel ends
  return Launch(HcNormInjectResidentKernel<T, PROLOGUE, STREAMS_OUT, INJECT>, info->blocks, info->threads, smem, 1,
                HcRunsSm90Code(caps.sm_major), stream, a);
}

template <typename T, bool INJECT>
cudaError_t LaunchResident(const NormArgs<T>& a, const HcDeviceCaps& caps, cudaStream_t stream, NormLaunch* info) {
  const bool prologue = a.prev_block_output != nullptr, streams_out = a.streams_out != nullptr;
  if (prologue) {
    return streams_out ? LaunchResidentKernel<T, true, true, INJECT>(a, caps, stream, info)
                       : LaunchResidentKernel<T, true, false, INJECT>(a, caps, stream, info);
  }
  return streams_out ? LaunchResidentKernel<T, false, true, INJECT>(a, caps, stream, info)
                     : LaunchResidentKernel<T, false, false, INJECT>(a, caps, stream, info);
}

// C = 4 with 16-byte loadable inject_weight rows runs the compile-time-C kernel, ROWS rows a block;
// any other C the generic kernel, one row a block (same bits either way).
template <typename T, int VEC>
bool NormInjectFixedC(const NormArgs<T>& a) {
  if constexpr ((VEC * 4 * sizeof(T)) % 16 == 0) {
    return a.C == 4 && AlignmentOf(a.inject_weight) >= 16;
  }
  return false;
}

// Launches one instantiation with `smem` bytes of dynamic shared memory, with PDL where `pdl`.
template <typename T, int VEC, int ROWS, int CC, int MODE, bool INJECT>
cudaError_t LaunchNormInjectKernel(const NormArgs<T>& a, size_t smem, bool pdl, cudaStream_t stream, NormLaunch* info) {
  const int64_t groups = (a.rows + ROWS - 1) / ROWS;
  info->kernel = MODE == kCache ? "HcNormInjectKernel (S kept in shared memory)" : "HcNormInjectKernel (S formed twice)";
  info->blocks = static_cast<unsigned>(std::max<int64_t>(1, std::min(groups, kMaxRowBlocks)));
  info->rows_per_block = ROWS;
  return Launch(HcNormInjectKernel<T, VEC, ROWS, CC, MODE, INJECT>, info->blocks, info->threads, smem, 1, pdl, stream,
                a);
}

// HcNormInjectKernel's instantiation (no choice changes a bit): the fixed-C kernel with rows per block
// by row count, or the generic one (one row a block); kCache where the rows fit kMaxNormCacheBytes
// (fewer rows a block until they do), else kFormTwice (very wide rows).
template <typename T, int VEC, bool INJECT>
cudaError_t LaunchNormInjectVec(const NormArgs<T>& a, bool pdl, cudaStream_t stream, NormLaunch* info) {
  const bool fixed_c = NormInjectFixedC<T, VEC>(a);
  int rows = fixed_c ? NormRowsPerBlock(a.rows) : 1;
  auto smem = [&](NormMode m, int r) { return NormSmemBytes(m, r, a.C, a.H, sizeof(T)); };
  while (rows > 1 && smem(kCache, rows) > kMaxNormCacheBytes) rows /= 2;
  const NormMode mode = smem(kCache, rows) <= kMaxNormCacheBytes ? kCache : kFormTwice;
  const size_t bytes = smem(mode, rows);
  if constexpr ((VEC * 4 * sizeof(T)) % 16 == 0) {
    if (fixed_c) {
      if (mode == kCache) {
        switch (rows) {
          case 4: return LaunchNormInjectKernel<T, VEC, 4, 4, kCache, INJECT>(a, bytes, pdl, stream, info);
          case 2: return LaunchNormInjectKernel<T, VEC, 2, 4, kCache, INJECT>(a, bytes, pdl, stream, info);
          default: return LaunchNormInjectKernel<T, VEC, 1, 4, kCache, INJECT>(a, bytes, pdl, stream, info);
        }
      }
      return LaunchNormInjectKernel<T, VEC, 1, 4, kFormTwice, INJECT>(a, bytes, pdl, stream, info);
    }
  }
  return mode == kCache ? LaunchNormInjectKernel<T, VEC, 1, 0, kCache, INJECT>(a, bytes, pdl, stream, info)
                        : LaunchNormInjectKernel<T, VEC, 1, 0, kFormTwice, INJECT>(a, bytes, pdl, stream, info);
}

template <typename T, bool INJECT>
cudaError_t LaunchNorm(const NormArgs<T>& a, const HcDeviceCaps& caps, cudaStream_t stream, NormLaunch* info) {
  info->vec = PickVec<T>(a.H, {a.streams, a.norm_scale, a.prev_block_output, a.streams_out, a.hn});
  if constexpr (sizeof(T) == 2) {
    if (ResidentFits(a, info->vec, caps)) return LaunchResident<T, INJECT>(a, caps, stream, info);
  }
  info->threads = NormThreads(a.H, info->vec);
  const bool pdl = HcRunsSm90Code(caps.sm_major);  // the kernels' PDL wait is compiled for sm_90 only
  switch (info->vec) {
    case 8: return LaunchNormInjectVec<T, 8, INJECT>(a, pdl, stream, info);
    case 4: return LaunchNormInjectVec<T, 4, INJECT>(a, pdl, stream, info);
    case 2: return LaunchNormInjectVec<T, 2, INJECT>(a, pdl, stream, info);
    default: return LaunchNormInjectVec<T, 1, INJECT>(a, pdl, stream, info);
  }
}

}  // namespace

template <typename T>
cudaError_t LaunchNormInject(const NormArgs<T>& a, const HcDeviceCaps& caps, cudaStream_t stream, NormLaunch* info) {
  return a.inject_weight != nullptr ? LaunchNorm<T, true>(a, caps, stream, info)
                                    : LaunchNorm<T, false>(a, caps, stream, info);
}

#define HC_INSTANTIATE_NORM(T) \
  template cudaError_t LaunchNormInject<T>(const NormArgs<T>&, const HcDeviceCaps&, cudaStream_t, NormLaunch*);
HC_INSTANTIATE_NORM(float)
HC_INSTANTIATE_NORM(__half)
HC_INSTANTIATE_NORM(__nv_bfloat16)

}  // namespace cuda
}  // namespace hcfuse
