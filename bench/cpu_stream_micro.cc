// Micro-benchmark of the CPU kernel's weight streaming, outside ONNX Runtime.
//
// Times, per phase (each call of the task runner: norm, down/inject, up/mix for 16-bit T; norm, down
// slices and inject, down epilogue, up, g/pre_output for float32 at 1-4 rows), HcLowRankMixCpu at the
// Qwen shape with weights read cold (distinct weight sets cycling over more bytes than the L3, 64-byte
// aligned as ORT's allocator gives them), on 1 thread and on 2 (a spinning worker plus the caller
// claiming tasks from an atomic counter, as ORT's pool does), next to a plain sequential read (a
// vector sum) of the same weight bytes (its phases: down, up); with a second build of the kernel
// linked in (B), A, the read and B take turns call by call. Medians per phase (a shared machine's
// preemptions land in a few calls, and in whole-call totals), and their sum.
//
//   bench/cpu_stream_micro.sh /tmp/micro [B_SRC]      builds it (B_SRC: another copy of kernels/src/cpu)
//   /tmp/micro [rows...]                               default rows 1 4; rows 0: the access patterns alone
//   environment: THREADS=1|2, DTYPE=float32|float16|bfloat16, H (default 2560), HOT=1 (one weight set:
//   with H=256 it stays in the caches, what is left is compute), REPS (calls per variant)
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cpu/hc_lowrank_mix_cpu.h"
#include "qwen_params.h"
#ifndef STRIP_F
#define STRIP_F 128  // features per strip of the up pattern (-DSTRIP_F=64: 256-byte runs)
#endif

#ifndef HCFUSE_MICRO_AB
#define HCFUSE_MICRO_AB 0
#endif
#if HCFUSE_MICRO_AB  // a second build of the kernel, its namespace renamed
#define hcfuse hcfuse_b
#include "cpu/hc_lowrank_mix_cpu_b.h"
#undef hcfuse
using BHalf = hcfuse_b::Half;
using BBFloat16 = hcfuse_b::BFloat16;
#else
using BHalf = hcfuse::Half;
using BBFloat16 = hcfuse::BFloat16;
#endif

using namespace hcfuse;
using Clock = std::chrono::steady_clock;

namespace {

double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// A second thread that claims tasks alongside the caller.
class TwoThreads {
 public:
  TwoThreads() : worker_([this] { Loop(); }) {}
  ~TwoThreads() {
    stop_ = true;
    generation_.fetch_add(1);
    worker_.join();
  }
  void Run(int64_t n, const std::function<void(int64_t)>& fn) {
    fn_ = &fn;
    n_ = n;
    next_.store(0);
    done_.store(0);
    generation_.fetch_add(1, std::memory_order_release);
    Claim();
    while (done_.load(std::memory_order_acquire) < n) {
    }
  }

 private:
  void Claim() {
    for (int64_t t; (t = next_.fetch_add(1)) < n_;) {
      (*fn_)(t);
      done_.fetch_add(1, std::memory_order_release);
    }
  }
  void Loop() {
    uint64_t seen = 0;
    while (true) {
      uint64_t g;
      while ((g = generation_.load(std::memory_order_acquire)) == seen) {
      }
      seen = g;
      if (stop_) return;
      Claim();
    }
  }
  const std::function<void(int64_t)>* fn_ = nullptr;
  int64_t n_ = 0;
  std::atomic<int64_t> next_{0}, done_{0};
  std::atomic<uint64_t> generation_{0};
  std::atomic<bool> stop_{false};
  std::thread worker_;
};

template <typename T>
T Random(uint32_t& s, float scale) {
  s = s * 1664525u + 1013904223u;
  return FromFloat<T>(scale * (static_cast<float>(s >> 8) / 16777216.0f - 0.5f));
}

// 64-byte aligned bytes, as ONNX Runtime's CPU allocator hands out initializers.
struct Buffer {
  std::vector<char> raw;
  char* p = nullptr;
  size_t n = 0;
  void resize(size_t bytes) {
    raw.resize(bytes + 64);
    p = raw.data() + (64 - reinterpret_cast<uintptr_t>(raw.data()) % 64) % 64;
    n = bytes;
  }
  char* data() { return p; }
  const char* data() const { return p; }
  size_t size() const { return n; }
};
struct WeightSet {
  Buffer norm, down, up, inject;
};

// Per-call medians of phases of the kernel build(s) linked in (B: the same source compiled with
// -Dhcfuse=hcfuse_b, see bench/cpu_stream_micro.sh), taking turns call by call, and of a plain
// sequential sum of the same weight bytes.
template <typename T, typename TB>
void Bench(const char* name, int64_t rows, int threads, TwoThreads* pool) {
  // H=256: weights in the caches (HOT=1)
  const HcLowRankMixParams p =
      hcfuse_bench::QwenParams(rows, true, std::getenv("H") ? std::atoll(std::getenv("H")) : hcfuse_bench::kQwenH);
  const int64_t W = p.width();
  const int64_t weight_bytes = (2 * W * p.R + W * p.C + W) * static_cast<int64_t>(sizeof(T));
  const int64_t sets = std::getenv("HOT") ? 1 : std::max<int64_t>(1, 320000000 / weight_bytes);
  uint32_t seed = 1;
  std::vector<WeightSet> ws(sets);
  for (auto& w : ws) {
    auto fill = [&](Buffer& v, int64_t n, float scale) {
      v.resize(n * sizeof(T));
      T* t = reinterpret_cast<T*>(v.data());
      for (int64_t i = 0; i < n; ++i) t[i] = Random<T>(seed, scale);
    };
    fill(w.norm, W, 2);
    fill(w.down, W * p.R, 0.04f);
    fill(w.up, p.R * W, 0.1f);
    fill(w.inject, W * p.C, 0.04f);
  }
  std::vector<T> streams(rows * W), pbo(rows * p.H), ppg(rows * p.C), pre(rows * p.H), gate(rows * p.C),
      sout(rows * W), pre_b(rows * p.H);
  for (auto& v : streams) v = Random<T>(seed, 2);
  for (auto& v : pbo) v = Random<T>(seed, 2);
  for (auto& v : ppg) v = Random<T>(seed, 2);
  std::vector<float> scratch(HcLowRankMixCpuScratchFloats(p));
  auto args_for = [&](const WeightSet& w, T* pre_output) {
    HcLowRankMixCpuArgs<T> a;
    a.streams = streams.data();
    a.norm_scale = reinterpret_cast<const T*>(w.norm.data());
    a.down_weight = reinterpret_cast<const T*>(w.down.data());
    a.up_weight = reinterpret_cast<const T*>(w.up.data());
    a.inject_weight = reinterpret_cast<const T*>(w.inject.data());
    a.prev_block_output = pbo.data();
    a.prev_post_gate = ppg.data();
    a.pre_output = pre_output;
    a.post_gate = gate.data();
    a.streams_out = sout.data();
    return a;
  };
  // B's build of the kernel on the same arguments (its types are hcfuse_b's, bit for bit the same)
  auto run_b = [&](const HcLowRankMixCpuArgs<T>& a, const HcTaskRunner& runner) {
#if HCFUSE_MICRO_AB
    hcfuse_b::HcLowRankMixCpuArgs<TB> b;
    std::memcpy(static_cast<void*>(&b), &a, sizeof a);
    hcfuse_b::HcLowRankMixParams pb;
    pb.rows = p.rows;
    pb.C = p.C;
    pb.H = p.H;
    pb.R = p.R;
    pb.has_prologue = p.has_prologue;
    pb.has_streams_out = p.has_streams_out;
    pb.epsilon = p.epsilon;
    pb.reduction_scale = p.reduction_scale;
    pb.silu_alpha = p.silu_alpha;
    pb.gate_div = p.gate_div;
    pb.gate_mul = p.gate_mul;
    hcfuse_b::HcLowRankMixCpu<TB>(pb, b, runner, scratch.data());
#else
    (void)a;
    (void)runner;
#endif
  };
  constexpr int kVariants = HCFUSE_MICRO_AB ? 3 : 2;  // A, sum, B
  // per variant, per call: the time of each task-runner phase (3 for 16-bit T, 5 for float32: norm,
  // down/inject slices, down epilogue, up slices, mix; the plain read: down, up)
  std::vector<std::vector<double>> calls[kVariants];
  std::vector<double> phase;
  HcTaskRunner run = [&](int64_t n, const std::function<void(int64_t)>& fn) {
    const auto t0 = Clock::now();
    if (threads == 1) {
      for (int64_t t = 0; t < n; ++t) fn(t);
    } else {
      pool->Run(n, fn);
    }
    phase.push_back(Seconds(t0, Clock::now()));
  };
  const int reps = std::getenv("REPS") ? std::atoi(std::getenv("REPS")) : static_cast<int>(std::max<int64_t>(6 * sets, 60));
  volatile float sink = 0;
  int64_t i_set = 0;
  for (int rep = -2; rep < reps; ++rep) {
    for (int variant = 0; variant < kVariants; ++variant) {
      const WeightSet& w = ws[i_set++ % sets];
      const HcLowRankMixCpuArgs<T> a = args_for(w, variant == 2 ? pre_b.data() : pre.data());
      phase.clear();
      if (variant == 0) {
        HcLowRankMixCpu<T>(p, a, run, scratch.data());
      } else if (variant == 1) {  // sums of down and of up, split over the threads in halves
        for (const Buffer* m : {&w.down, &w.up}) {
          const int64_t part = m->size() / threads;
          run(threads, [&](int64_t t) {
            typedef float V8 __attribute__((vector_size(32)));
            V8 acc[4] = {};
            const char* b = m->data() + t * part;
            for (int64_t i = 0; i + 128 <= part; i += 128)
              for (int j = 0; j < 4; ++j) {
                V8 v;
                std::memcpy(&v, b + i + 32 * j, 32);
                acc[j] += v;
              }
            sink = sink + acc[0][0] + acc[1][1] + acc[2][2] + acc[3][3];
          });
        }
      } else {
        run_b(a, run);
      }
      if (rep >= 0) calls[variant].push_back(phase);
    }
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const char* labels[] = {"A", "sum", "B"};
  for (int variant = 0; variant < kVariants; ++variant) {
    std::vector<double> totals;
    for (const auto& c : calls[variant]) {
      double t = 0;
      for (double x : c) t += x;
      totals.push_back(t);
    }
    // medians per phase, and their sum (robust against preemption on a shared machine)
    std::string per_phase;
    double total = 0;
    for (size_t j = 0; j < calls[variant][0].size(); ++j) {
      std::vector<double> v;
      for (const auto& c : calls[variant]) v.push_back(c[j]);
      const double m = median(v);
      total += m;
      char buf[32];
      std::snprintf(buf, sizeof buf, " %.3f", m * 1e3);
      per_phase += buf;
    }
    std::printf("%-8s rows=%-3lld thr=%d %-3s total %.3f ms, phases %.3f ms (%4.1f GB/s):%s\n", name,
                static_cast<long long>(rows), threads, labels[variant], median(totals) * 1e3, total * 1e3,
                weight_bytes / total / 1e9, per_phase.c_str());
  }
  if (HCFUSE_MICRO_AB) {  // A and B on the same weights
    HcLowRankMixCpu<T>(p, args_for(ws[0], pre.data()), run, scratch.data());
    run_b(args_for(ws[0], pre_b.data()), run);
  }
  if (HCFUSE_MICRO_AB && std::memcmp(pre.data(), pre_b.data(), pre.size() * sizeof(T)) != 0)
    std::printf("  A and B differ in pre_output\n");
}

// Reads (vector sums) of one 26 MB block of fp32 weights in the access patterns of the kernel, on
// 1 thread, each rep on another block of 320 MB (cold), the patterns taking turns; median per pattern.
typedef float V8 __attribute__((vector_size(32)));
inline V8 Load8(const char* p) {
  V8 v;
  std::memcpy(&v, p, 32);
  return v;
}
// bytes [0, run) of every stride-th byte run, rows of them: the columns [n0, n1) of a [rows, N] matrix.
inline V8 SumStrips(const char* b, int64_t rows, int64_t stride, int64_t run, V8 acc) {
  V8 a[4] = {acc};
  for (int64_t k = 0; k < rows; ++k)
    for (int64_t i = 0; i < run; i += 128)
      for (int j = 0; j < 4; ++j) a[j] += Load8(b + k * stride + i + 32 * j);
  return a[0] + a[1] + a[2] + a[3];
}

void Patterns() {
  const int64_t W = 10240, R = 320, half = W * R * 4, block = 2 * half, n_blocks = 320000000 / block;
  std::vector<char> src(block * n_blocks, 1);
  const char* names[] = {"sequential 26 MB", "down: column halves in turn (640 of 1280 B per row)",
                         "down: 32-row tiles x 160 cols", "up: 128-feature strips (512 B per 40 KB row, x4 branches)",
                         "up: k-outer, 4 rows at a time, whole rows", "up: k-outer, 4 rows, 2 feature halves in turn"};
  constexpr int kPatterns = 6;
  std::vector<double> t[kPatterns];
  volatile float sink = 0;
  const int reps = 4 * static_cast<int>(n_blocks);
  for (int rep = 0; rep < reps; ++rep) {
    for (int pat0 = 0; pat0 < kPatterns; ++pat0) {
      const int pat = (pat0 + rep) % kPatterns;
      const char* b = src.data() + ((rep * kPatterns + pat) % n_blocks) * block;
      const char* down = b;
      const char* up = b + half;
      V8 acc = {};
      const auto t0 = Clock::now();
      switch (pat) {
        case 0: acc = SumStrips(b, 1, 0, block, acc); break;
        case 1:
          for (int h = 0; h < 2; ++h) acc = SumStrips(down + h * 640, W, 1280, 640, acc);
          for (int h = 0; h < 2; ++h) acc = SumStrips(up + h * W * 2, R, W * 4, W * 2, acc);
          break;
        case 2:
          for (int h = 0; h < 2; ++h)
            for (int64_t k = 0; k < W; k += 32) acc = SumStrips(down + k * 1280 + h * 640, 32, 1280, 640, acc);
          acc = SumStrips(up, 1, 0, half, acc);
          break;
        case 3:
          acc = SumStrips(down, 1, 0, half, acc);
          for (int64_t f = 0; f < 2560; f += STRIP_F)
            for (int c = 0; c < 4; ++c) acc = SumStrips(up + (c * 2560 + f) * 4, R, W * 4, STRIP_F * 4, acc);
          break;
        case 4:
          acc = SumStrips(down, 1, 0, half, acc);
          for (int64_t k = 0; k < R; k += 4)
            for (int64_t i = 0; i < W * 4; i += 32)
              for (int kk = 0; kk < 4; ++kk) acc += Load8(up + (k + kk) * W * 4 + i);
          break;
        case 5:
          acc = SumStrips(down, 1, 0, half, acc);
          for (int hf = 0; hf < 2; ++hf)
            for (int64_t k = 0; k < R; k += 4)
              for (int c = 0; c < 4; ++c)
                for (int64_t i = 0; i < 1280 * 4; i += 32)
                  for (int kk = 0; kk < 4; ++kk) acc += Load8(up + (k + kk) * W * 4 + (c * 2560 + hf * 1280) * 4 + i);
          break;
      }
      t[pat].push_back(Seconds(t0, Clock::now()));
      sink = sink + acc[0];
    }
  }
  for (int pat = 0; pat < kPatterns; ++pat) {
    std::sort(t[pat].begin(), t[pat].end());
    const double s = t[pat][t[pat].size() / 2];
    std::printf("pattern %-60s %.3f ms (%.1f GB/s)\n", names[pat], s * 1e3, block / s / 1e9);
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> rows;
  for (int i = 1; i < argc; ++i) rows.push_back(std::atoll(argv[i]));
  if (rows.empty()) rows = {1, 4};
  const char* thr = std::getenv("THREADS");
  if (rows.size() == 1 && rows[0] == 0) {
    Patterns();
    return 0;
  }
  for (int threads : {1, 2}) {
    if (thr && std::atoi(thr) != threads) continue;
    TwoThreads* pool = threads == 2 ? new TwoThreads : nullptr;  // spins: only while 2-thread runs last
    for (int64_t r : rows) {
      const char* only = std::getenv("DTYPE");
      if (!only || !std::strcmp(only, "float32")) Bench<float, float>("float32", r, threads, pool);
      if (!only || !std::strcmp(only, "float16")) Bench<Half, BHalf>("float16", r, threads, pool);
      if (!only || !std::strcmp(only, "bfloat16")) Bench<BFloat16, BBFloat16>("bfloat16", r, threads, pool);
    }
    delete pool;
  }
  return 0;
}
