// Timeline probe of the fast path's real kernels in a decode chain: the library's own launcher
// (LaunchHcFast) runs a chain of blocks of the real shape (C=4, H=2560, R=320, bf16, 8 weight sets
// cycling, block k+1 fed by block k's outputs as in bench_decode.py) under CUDA graphs with programmatic
// dependent launch, for each configuration (below) and row count:
//   - us per block: slope between the 96- and 48-block graphs (best of --reps x 20 replays);
//   - whether the configurations' final outputs are bitwise equal (they must be);
//   - a timeline: thread 0 of every CTA records %globaltimer at its start, after the grid-dependency
//     wait and at its end (kernels built with HCFUSE_FAST_TIMELINE); averaged over the chain's
//     steady-state blocks: how many earlier kernels still run when a kernel's first CTA starts, how
//     long its CTAs are resident before the wait returns (time to stream weights), the boundary (end
//     of the previous kernel -> this one's wait returns) and the work after the wait, per stage.
// --sublayer puts a cuBLAS H x H MatMul (8 weight sets) between blocks, as bench_decode.py's real-model
// variant does: prev_block_output = MatMul(pre_output), a kernel that does not trigger its dependents
// early; the chain of MatMuls alone is timed too. Configurations: "default" (the library's plan),
// "ahead0" (no shared-memory padding of the real shape's kernels), "generic" (the generic kernels at the
// real shape), "nopdl" (no programmatic dependent launch), "quant" (the quantized op's kernels, LaunchHcFastQuant,
// on int4 weights of block 32 without zero points, as onnxruntime-genai quantizes: other weights, so its outputs
// are not compared); --configs picks some by name. HCFUSE_FAST_AHEAD
// and HCFUSE_FAST_STAGE2_CTAS set the tuning of every configuration, as in a HCFUSE_DEV_KNOBS library.
// --dump DIR writes every CTA's records of a few steady-state blocks (one CSV per config and row count:
// the SM, and each event in us from the first block's first start).
// Built by bench/timeline/CMakeLists.txt (the fast path's sources with HCFUSE_DEV_KNOBS and
// HCFUSE_FAST_TIMELINE); no ONNX Runtime needed.
//   hc_fast_timeline [--rows 1 2 4 8 16] [--reps 5] [--sublayer] [--configs default quant] [--dump DIR]
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "cuda/fast/hc_fast_path.h"
#include "qwen_params.h"

namespace {

using T = __nv_bfloat16;

constexpr int kC = hcfuse_bench::kQwenC, kH = hcfuse_bench::kQwenH, kR = hcfuse_bench::kQwenR, kK = kC * kH, kSets = 8;
constexpr int kCtas = 256;  // records per kernel slot (fast::kTimelineCtas)
// start, waited, end (ns), waited, end (SM cycles), 4 phases (ns), SM, a mark inside a phase (ns)
// (fast::kTimelineFields)
constexpr int kFields = 11;

#define CK(x)                                                                                 \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

// A device copy of h (never freed: the probe's buffers live as long as the process).
template <typename V>
V* Upload(const std::vector<V>& h) {
  V* d = nullptr;
  CK(cudaMalloc(&d, h.size() * sizeof(V)));
  CK(cudaMemcpy(d, h.data(), h.size() * sizeof(V), cudaMemcpyHostToDevice));
  return d;
}

T* DeviceRandom(size_t n, float lo, float hi, std::mt19937& gen) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<T> h(n);
  for (auto& v : h) v = __float2bfloat16(dist(gen));
  return Upload(h);
}

struct WeightSet {
  T *norm_scale, *down, *up, *inject;
  hcfuse::HcFastQuant<T> quant;  // the "quant" config's: [down | inject] and up as MatMulNBits bytes and scales
};

constexpr int kQuantBlock = 32;

uint8_t* DeviceRandomBytes(size_t n, std::mt19937& gen) {
  std::vector<uint8_t> h(n);
  for (auto& v : h) v = static_cast<uint8_t>(gen());
  return Upload(h);
}

// A [K, N] projection as MatMulNBits stores it at 4 bits: B [N][K / 32][16] random bytes, scales [N][K / 32] in
// [lo, hi] (weights (q - 8) * scale, no zero points).
hcfuse::HcFastQuantWeights<T> DeviceQuantized(int K, int N, float lo, float hi, std::mt19937& gen) {
  const size_t blocks = static_cast<size_t>(N) * (K / kQuantBlock);
  return {DeviceRandomBytes(blocks * kQuantBlock / 2, gen), DeviceRandom(blocks, lo, hi, gen), nullptr};
}

struct Chain {
  int rows = 0;
  std::vector<WeightSet> sets;
  T* streams_in = nullptr;
  std::vector<T*> pre, gate, streams;  // per block outputs
  // --sublayer: H x H weight sets and each block's sublayer output (prev_block_output of the next)
  bool sublayer = false;
  std::vector<T*> sub_weights, sub_out;
  cublasHandle_t cublas = nullptr;
  void* scratch = nullptr;
  size_t scratch_bytes = 0;
  hcfuse::HcDeviceCaps caps;  // the device's, as the library reads them
};

// The library's plan for one block on this device (forced: any row count), PDL as the config says; the
// quantized op's with quant.
hcfuse::HcFastPlan Plan(const hcfuse::HcLowRankMixParams& p, const hcfuse::HcDeviceCaps& caps,
                        const hcfuse::HcFastTuning& tuning, bool pdl, bool quant = false) {
  hcfuse::HcFastRequest request;
  request.forced = true;
  request.quant_block_size = quant ? kQuantBlock : 0;
  hcfuse::HcFastPlan plan = hcfuse::HcFastPlanFor(p, caps, tuning, request);
  if (!plan.ok()) {
    std::fprintf(stderr, "no fast-path plan: %s\n", plan.reason.c_str());
    std::exit(1);
  }
  plan.use_pdl = pdl;
  return plan;
}

void CheckLaunch(const hcfuse::cuda::HcLaunchStatus& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "LaunchHcFast: %s: %s\n", s.step, cudaGetErrorString(s.cuda));
    std::exit(1);
  }
}

hcfuse::HcLowRankMixParams Params(int rows, bool prologue) { return hcfuse_bench::QwenParams(rows, prologue); }

// Enqueues blocks [0, n) on `stream`; slots 2b, 2b + 1 of the timeline for block b when timeline is set.
struct Config {
  const char* name;
  bool pdl = true;
  int ahead = -1;  // HcFastTuning::kernels_ahead (-1: HCFUSE_FAST_AHEAD or the default)
  bool real_shape_kernels = true;
  bool quant = false;  // the quantized op's kernels on the weight sets' int4 weights
};

void CheckCublas(cublasStatus_t s) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "cuBLAS error %d\n", static_cast<int>(s));
    std::exit(1);
  }
}

// The sublayer of block b: sub_out[b] = x @ sub_weights[b % kSets] (row-major, fp32 compute); x is
// pre[b] in the blocks' chain, sub_out[b - 1] in the MatMuls' own.
void EnqueueSublayer(Chain& c, int b, const T* x, cudaStream_t stream) {
  const float alpha = 1.0f, beta = 0.0f;
  CheckCublas(cublasSetStream(c.cublas, stream));
  // column-major view: sub_out^T (H x rows) = W^T (H x H) @ x^T (H x rows)
  CheckCublas(cublasGemmEx(c.cublas, CUBLAS_OP_N, CUBLAS_OP_N, kH, c.rows, kH, &alpha, c.sub_weights[b % kSets],
                           CUDA_R_16BF, kH, x, CUDA_R_16BF, kH, &beta, c.sub_out[b], CUDA_R_16BF, kH,
                           CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void Enqueue(Chain& c, int n, const Config& cfg, unsigned long long* timeline, cudaStream_t stream) {
  for (int b = 0; b < n; ++b) {
    const WeightSet& w = c.sets[b % kSets];
    hcfuse::HcFastArgs<T> a;
    a.streams = b == 0 ? c.streams_in : c.streams[b - 1];
    a.norm_scale = w.norm_scale;
    a.down_weight = w.down;
    a.up_weight = w.up;
    a.inject_weight = w.inject;
    a.prev_block_output = b == 0 ? nullptr : (c.sublayer ? c.sub_out[b - 1] : c.pre[b - 1]);
    a.prev_post_gate = b == 0 ? nullptr : c.gate[b - 1];
    a.pre_output = c.pre[b];
    a.post_gate = c.gate[b];
    a.streams_out = c.streams[b];
    hcfuse::HcFastTuning tuning;
    tuning.real_shape_kernels = cfg.real_shape_kernels;
    if (const char* ahead = std::getenv("HCFUSE_FAST_AHEAD")) tuning.kernels_ahead = std::atoi(ahead);
    if (cfg.ahead >= 0) tuning.kernels_ahead = cfg.ahead;
    if (const char* ctas = std::getenv("HCFUSE_FAST_STAGE2_CTAS")) tuning.stage2_max_ctas = std::atoi(ctas);
    tuning.timeline = timeline;
    tuning.timeline_slot = 2 * b;
    const hcfuse::HcLowRankMixParams p = Params(c.rows, b > 0);
    const hcfuse::HcFastPlan plan = Plan(p, c.caps, tuning, cfg.pdl, cfg.quant);
    if (cfg.quant) {
      a.down_weight = a.up_weight = a.inject_weight = nullptr;
      CheckLaunch(hcfuse::cuda::LaunchHcFastQuant<T>(p, a, w.quant, c.scratch, plan, stream, true));
    } else {
      CheckLaunch(hcfuse::cuda::LaunchHcFast<T>(p, a, c.scratch, plan, stream, true));
    }
    if (c.sublayer && b + 1 < n) EnqueueSublayer(c, b, c.pre[b], stream);
  }
}

// The sublayers alone, chained: sub_out[b] = sub_out[b - 1] @ W (the --sublayer chain's MatMuls).
cudaGraphExec_t CaptureSublayers(Chain& c, int n, cudaStream_t stream) {
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  for (int b = 0; b + 1 < n; ++b) EnqueueSublayer(c, b, b == 0 ? c.pre[0] : c.sub_out[b - 1], stream);
  CK(cudaStreamEndCapture(stream, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  CK(cudaGraphDestroy(g));
  return ge;
}

// Every CTA's record of blocks [first, first + count) as CSV: slot, stage, block, cta, sm, then the
// events in us from t0 (empty where not recorded).
void DumpRecords(const std::vector<unsigned long long>& rec, int first, int count, const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    return;
  }
  unsigned long long t0 = ~0ull;
  for (int k = 2 * first; k < 2 * (first + count); ++k) {
    for (int cta = 0; cta < kCtas; ++cta) {
      const unsigned long long s = rec[(static_cast<size_t>(k) * kCtas + cta) * kFields];
      if (s != 0) t0 = std::min(t0, s);
    }
  }
  std::fprintf(f, "block,stage,cta,sm,start,waited,end,phase1,phase2,phase3,phase4,phase5\n");
  const int events[] = {0, 1, 2, 5, 6, 7, 8, 10};
  for (int k = 2 * first; k < 2 * (first + count); ++k) {
    for (int cta = 0; cta < kCtas; ++cta) {
      const unsigned long long* r = &rec[(static_cast<size_t>(k) * kCtas + cta) * kFields];
      if (r[0] == 0) continue;
      std::fprintf(f, "%d,%d,%d,%llu", k / 2, k % 2 + 1, cta, r[9]);
      for (int e : events) {
        if (r[e] != 0) {
          std::fprintf(f, ",%.3f", (static_cast<double>(r[e]) - static_cast<double>(t0)) / 1e3);
        } else {
          std::fprintf(f, ",");
        }
      }
      std::fprintf(f, "\n");
    }
  }
  std::fclose(f);
}

cudaGraphExec_t Capture(Chain& c, int n, const Config& cfg, unsigned long long* timeline, cudaStream_t stream) {
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  Enqueue(c, n, cfg, timeline, stream);
  CK(cudaStreamEndCapture(stream, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  CK(cudaGraphDestroy(g));
  return ge;
}

double ReplayMs(cudaGraphExec_t ge, cudaStream_t stream, int reps) {
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (int i = 0; i < 3; ++i) CK(cudaGraphLaunch(ge, stream));
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    CK(cudaEventRecord(e0, stream));
    for (int i = 0; i < 20; ++i) CK(cudaGraphLaunch(ge, stream));
    CK(cudaEventRecord(e1, stream));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    best = std::min(best, static_cast<double>(ms) / 20);
  }
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  return best;
}

std::vector<unsigned short> Download(const T* p, size_t n) {
  std::vector<unsigned short> h(n);
  CK(cudaMemcpy(h.data(), p, n * 2, cudaMemcpyDeviceToHost));
  return h;
}

struct KernelSpan {
  double start_min = 1e300, start_max = 0, wait_min = 1e300, wait_max = 0, end_max = 0;
  double cycles = 0, ns = 0;  // summed over CTAs, wait -> end: the SM clock
  double phase[5] = {0, 0, 0, 0, 0};  // mean over CTAs of phase end - wait return (us); [4]: kPhase5
  int phased = 0, marked = 0;       // CTAs with phase records, with a kPhase5 record
};

// Per-kernel spans (us from the first start) of slots [0, kernels), CTAs with a record.
std::vector<KernelSpan> Spans(const std::vector<unsigned long long>& rec, int kernels) {
  unsigned long long t0 = ~0ull;
  for (int k = 0; k < kernels; ++k) {
    for (int cta = 0; cta < kCtas; ++cta) {
      const unsigned long long s = rec[(static_cast<size_t>(k) * kCtas + cta) * kFields];
      if (s != 0) t0 = std::min(t0, s);
    }
  }
  std::vector<KernelSpan> spans(kernels);
  for (int k = 0; k < kernels; ++k) {
    for (int cta = 0; cta < kCtas; ++cta) {
      const unsigned long long* r = &rec[(static_cast<size_t>(k) * kCtas + cta) * kFields];
      if (r[0] == 0) continue;
      const double s = (r[0] - t0) / 1e3, w = (r[1] - t0) / 1e3, e = (r[2] - t0) / 1e3;
      KernelSpan& sp = spans[k];
      sp.start_min = std::min(sp.start_min, s);
      sp.start_max = std::max(sp.start_max, s);
      sp.wait_min = std::min(sp.wait_min, w);
      sp.wait_max = std::max(sp.wait_max, w);
      sp.end_max = std::max(sp.end_max, e);
      if (r[5] != 0) {
        for (int q = 0; q < 4; ++q) sp.phase[q] += (static_cast<double>(r[5 + q]) - static_cast<double>(r[1])) / 1e3;
        ++sp.phased;
      }
      if (r[10] != 0) {
        sp.phase[4] += (static_cast<double>(r[10]) - static_cast<double>(r[1])) / 1e3;
        ++sp.marked;
      }
      if (r[2] > r[1]) {
        sp.cycles += static_cast<double>(r[4] - r[3]);
        sp.ns += static_cast<double>(r[2] - r[1]);
      }
    }
  }
  return spans;
}

void PrintTimeline(const std::vector<KernelSpan>& sp, const char* config, int rows) {
  const int blocks = static_cast<int>(sp.size()) / 2;
  const int first = blocks / 3, last = 2 * blocks / 3;  // steady state
  double ahead[2] = {0, 0}, resident[2] = {0, 0}, boundary[2] = {0, 0}, work[2] = {0, 0}, spread[2] = {0, 0};
  double period = 0, cycles = 0, ns = 0;
  int n = 0;
  for (int b = first; b < last; ++b) {
    for (int s = 0; s < 2; ++s) {
      const int k = 2 * b + s;
      int running = 0;
      for (int j = 0; j < k; ++j) running += sp[j].end_max > sp[k].start_min;
      ahead[s] += running;
      resident[s] += sp[k].wait_min - sp[k].start_max;
      boundary[s] += sp[k].wait_min - sp[k - 1].end_max;
      work[s] += sp[k].end_max - sp[k].wait_min;
      spread[s] += sp[k].wait_max - sp[k].wait_min;
    }
    period += sp[2 * b + 2].wait_min - sp[2 * b].wait_min;
    cycles += sp[2 * b].cycles + sp[2 * b + 1].cycles;
    ns += sp[2 * b].ns + sp[2 * b + 1].ns;
    ++n;
  }
  std::printf("timeline %-16s rows %2d (blocks %d-%d, us): period %.2f | stage 1: ahead %.1f, resident before wait "
              "%.2f, boundary %.2f, wait spread %.2f, work %.2f | stage 2: ahead %.1f, resident %.2f, boundary %.2f, "
              "wait spread %.2f, work %.2f | SM clock during work %.2f GHz\n",
              config, rows, first, last - 1, period / n, ahead[0] / n, resident[0] / n, boundary[0] / n, spread[0] / n,
              work[0] / n, ahead[1] / n, resident[1] / n, boundary[1] / n, spread[1] / n, work[1] / n,
              ns > 0 ? cycles / ns : 0.0);
  double ph[2][5] = {};
  for (int b = first; b < last; ++b) {
    for (int s = 0; s < 2; ++s) {
      const KernelSpan& k = sp[2 * b + s];
      for (int q = 0; q < 4 && k.phased > 0; ++q) ph[s][q] += k.phase[q] / k.phased / n;
      if (k.marked > 0) ph[s][4] += k.phase[4] / k.marked / n;
    }
  }
  if (ph[0][3] > 0) {
    std::printf("  phase marks after the wait (us, mean CTA; the kernels' kPhase1-4 comments say what each is): "
                "stage 1 %.2f %.2f %.2f %.2f; stage 2 %.2f %.2f %.2f %.2f\n",
                ph[0][0], ph[0][1], ph[0][2], ph[0][3], ph[1][0], ph[1][1], ph[1][2], ph[1][3]);
  }
  if (ph[0][4] > 0) {
    std::printf("  stage 1 kPhase5 (inside its products phase: warp 0's first tiles multiplied, before their "
                "scatter): %.2f us after the wait\n", ph[0][4]);
  }
  std::printf("  kernel: first start / last start / first wait return / last wait return / last end (us)\n");
  for (int k = 2 * first; k < 2 * first + 6; ++k) {
    std::printf("  block %d stage %d: %8.2f %8.2f %8.2f %8.2f %8.2f\n", k / 2, k % 2 + 1, sp[k].start_min,
                sp[k].start_max, sp[k].wait_min, sp[k].wait_max, sp[k].end_max);
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> rows_list;
  std::vector<std::string> names;
  std::string dump_dir;
  int reps = 5;
  bool sublayer = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--rows") == 0) {
      while (i + 1 < argc && argv[i + 1][0] != '-') rows_list.push_back(std::atoi(argv[++i]));
    } else if (std::strcmp(argv[i], "--configs") == 0) {
      while (i + 1 < argc && argv[i + 1][0] != '-') names.emplace_back(argv[++i]);
    } else if (std::strcmp(argv[i], "--dump") == 0 && i + 1 < argc) {
      dump_dir = argv[++i];
    } else if (std::strcmp(argv[i], "--sublayer") == 0) {
      sublayer = true;
    } else {
      std::fprintf(stderr, "unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  if (rows_list.empty()) rows_list = {1, 2, 4, 8, 16};
  if (!dump_dir.empty()) {  // the folder the records go to, made if missing
    std::error_code error;
    std::filesystem::create_directories(dump_dir, error);
    if (error) {
      std::fprintf(stderr, "cannot create %s: %s\n", dump_dir.c_str(), error.message().c_str());
      return 2;
    }
  }
  const int long_n = 96, short_n = 48;
  std::mt19937 gen(15);
  cudaStream_t stream;
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  Chain c;
  int device = 0;
  CK(cudaGetDevice(&device));
  CK(hcfuse::cuda::QueryHcDeviceCaps(device, &c.caps));
  for (int s = 0; s < kSets; ++s) {
    c.sets.push_back({DeviceRandom(kK, 0.5f, 1.5f, gen), DeviceRandom(static_cast<size_t>(kK) * kR, -0.02f, 0.02f, gen),
                      DeviceRandom(static_cast<size_t>(kR) * kK, -0.05f, 0.05f, gen),
                      DeviceRandom(static_cast<size_t>(kK) * kC, -0.02f, 0.02f, gen),
                      {DeviceQuantized(kK, kR + kC, 0.0005f, 0.0025f, gen), DeviceQuantized(kR, kK, 0.002f, 0.006f, gen)}});
  }
  const int max_rows = *std::max_element(rows_list.begin(), rows_list.end());
  c.streams_in = DeviceRandom(static_cast<size_t>(max_rows) * kK, -1.0f, 1.0f, gen);
  for (int b = 0; b < long_n; ++b) {
    T *pre, *gate, *st;
    CK(cudaMalloc(&pre, static_cast<size_t>(max_rows) * kH * 2));
    CK(cudaMalloc(&gate, static_cast<size_t>(max_rows) * 16));
    CK(cudaMalloc(&st, static_cast<size_t>(max_rows) * kK * 2));
    c.pre.push_back(pre);
    c.gate.push_back(gate);
    c.streams.push_back(st);
  }
  c.sublayer = sublayer;
  if (sublayer) {
    CheckCublas(cublasCreate(&c.cublas));
    void* workspace = nullptr;  // cuBLAS under stream capture: a fixed workspace of its own
    const size_t workspace_bytes = size_t{32} << 20;
    CK(cudaMalloc(&workspace, workspace_bytes));
    CheckCublas(cublasSetWorkspace(c.cublas, workspace, workspace_bytes));
    for (int s = 0; s < kSets; ++s) c.sub_weights.push_back(DeviceRandom(static_cast<size_t>(kH) * kH, -0.02f, 0.02f, gen));
    for (int b = 0; b < long_n; ++b) {
      T* y = nullptr;
      CK(cudaMalloc(&y, static_cast<size_t>(max_rows) * kH * 2));
      c.sub_out.push_back(y);
    }
  }
  c.scratch_bytes = std::max(Plan(Params(max_rows, true), c.caps, hcfuse::HcFastTuning{}, true).scratch.total,
                             Plan(Params(max_rows, true), c.caps, hcfuse::HcFastTuning{}, true, true).scratch.total);
  CK(cudaMalloc(&c.scratch, c.scratch_bytes));
  unsigned long long* timeline = nullptr;
  const size_t records = static_cast<size_t>(2 * short_n) * kCtas * kFields;
  CK(cudaMalloc(&timeline, records * 8));

  std::printf("| config | rows | us per block (slope 96 vs 48 blocks) |\n|---|---|---|\n");
  std::vector<std::string> timelines;
  for (int rows : rows_list) {
    c.rows = rows;
    const Config all_configs[] = {{"default"},           {"ahead0", true, 0}, {"generic", true, -1, false},
                                  {"nopdl", false},      {"quant", true, -1, true, true}};
    std::vector<Config> configs;
    for (const Config& cfg : all_configs) {
      if (names.empty() || std::find(names.begin(), names.end(), cfg.name) != names.end()) configs.push_back(cfg);
    }
    const int kConfigs = static_cast<int>(configs.size());
    if (sublayer) {
      cudaGraphExec_t g96 = CaptureSublayers(c, long_n, stream);
      cudaGraphExec_t g48 = CaptureSublayers(c, short_n, stream);
      const double t96 = ReplayMs(g96, stream, reps), t48 = ReplayMs(g48, stream, reps);
      std::printf("| matmul alone | %d | %.2f |\n", rows, (t96 - t48) * 1e3 / (long_n - short_n));
      CK(cudaGraphExecDestroy(g96));
      CK(cudaGraphExecDestroy(g48));
    }
    std::vector<std::vector<unsigned short>> outs(kConfigs);
    for (int di = 0; di < kConfigs; ++di) {
      const Config& cfg = configs[di];
      cudaGraphExec_t g96 = Capture(c, long_n, cfg, nullptr, stream);
      cudaGraphExec_t g48 = Capture(c, short_n, cfg, nullptr, stream);
      const double t96 = ReplayMs(g96, stream, reps), t48 = ReplayMs(g48, stream, reps);
      std::printf("| %s | %d | %.2f |\n", cfg.name, rows, (t96 - t48) * 1e3 / (long_n - short_n));
      CK(cudaGraphExecDestroy(g96));
      CK(cudaGraphExecDestroy(g48));
      // final outputs of the 48-block chain (eager), for the bitwise comparison of the configurations
      Enqueue(c, short_n, cfg, nullptr, stream);
      CK(cudaStreamSynchronize(stream));
      auto pre = Download(c.pre[short_n - 1], static_cast<size_t>(rows) * kH);
      auto gate = Download(c.gate[short_n - 1], static_cast<size_t>(rows) * kC);
      auto st = Download(c.streams[short_n - 1], static_cast<size_t>(rows) * kK);
      outs[di] = pre;
      outs[di].insert(outs[di].end(), gate.begin(), gate.end());
      outs[di].insert(outs[di].end(), st.begin(), st.end());
      // the timeline of one replay of the 48-block chain
      cudaGraphExec_t gt = Capture(c, short_n, cfg, timeline, stream);
      CK(cudaGraphLaunch(gt, stream));
      CK(cudaMemsetAsync(timeline, 0, records * 8, stream));
      CK(cudaGraphLaunch(gt, stream));
      CK(cudaStreamSynchronize(stream));
      std::vector<unsigned long long> rec(records);
      CK(cudaMemcpy(rec.data(), timeline, records * 8, cudaMemcpyDeviceToHost));
      CK(cudaGraphExecDestroy(gt));
      PrintTimeline(Spans(rec, 2 * short_n), cfg.name, rows);
      if (!dump_dir.empty()) {
        DumpRecords(rec, short_n / 3, 4, dump_dir + "/" + cfg.name + "_rows" + std::to_string(rows) + ".csv");
      }
    }
    for (int di = 1; di < kConfigs; ++di) {
      if (configs[di].quant != configs[0].quant) continue;  // other weights
      size_t differ = 0;
      for (size_t i = 0; i < outs[0].size(); ++i) differ += outs[0][i] != outs[di][i];
      std::printf("rows %d: %s vs %s outputs after %d blocks: %zu of %zu values differ\n", rows, configs[di].name,
                  configs[0].name, short_n, differ, outs[0].size());
    }
  }
  CK(cudaGetLastError());
  return 0;
}
