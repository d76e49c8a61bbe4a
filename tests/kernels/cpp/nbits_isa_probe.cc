// Runs the quantized op's CPU kernel (kernels/src/cpu/hc_nbits_cpu.cc, compiled with HCFUSE_CPU_ISA naming one
// instruction set) on fixed pseudo-random inputs of every form and prints a hash of each call's outputs, one
// line per case: tests/kernels/test_nbits_isa.py compares the lines of every instruction set.
// Exit 77: this CPU cannot run the instruction set the probe was built for.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include "cpu/hc_nbits_cpu.h"

namespace {

using hcfuse::BFloat16;
using hcfuse::Half;

uint64_t state = 0x9E3779B97F4A7C15ull;
uint32_t Next() {  // xorshift64*
  state ^= state >> 12;
  state ^= state << 25;
  state ^= state >> 27;
  return static_cast<uint32_t>((state * 0x2545F4914F6CDD1Dull) >> 32);
}
float Uniform(float lo, float hi) { return lo + (hi - lo) * static_cast<float>(Next() >> 8) / 16777216.0f; }

template <typename T>
T Make(float v) {
  return hcfuse::FromFloat<T>(v);
}

template <typename T>
std::vector<T> Values(size_t n, float lo, float hi) {
  std::vector<T> out(n);
  for (auto& v : out) v = Make<T>(Uniform(lo, hi));
  return out;
}

std::vector<uint8_t> Bytes(size_t n) {
  std::vector<uint8_t> out(n);
  for (auto& b : out) b = static_cast<uint8_t>(Next());
  return out;
}

uint64_t Fnv(const void* p, size_t n, uint64_t h = 1469598103934665603ull) {
  const auto* b = static_cast<const uint8_t*>(p);
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

// One projection [K, N] in the given form: zp "none", "packed" or "T"; quantized or dense.
template <typename T>
struct Projection {
  std::vector<uint8_t> q, zp;
  std::vector<T> scales, zp_t, dense;
  hcfuse::HcNBitsProjection<T> view;

  Projection(int64_t K, int64_t N, int64_t bits, int64_t block, bool quantized, const std::string& zp_form) {
    if (!quantized) {
      dense = Values<T>(static_cast<size_t>(K * N), -0.2f, 0.2f);
      view.dense = dense.data();
      return;
    }
    const int64_t kb = (K + block - 1) / block;
    q = Bytes(static_cast<size_t>(N * kb * block * bits / 8));
    scales = Values<T>(static_cast<size_t>(N * kb), 0.001f, 0.05f);
    view.q = q.data();
    view.scales = scales.data();
    if (zp_form == "packed") {
      zp = Bytes(static_cast<size_t>(N * ((kb * bits + 7) / 8)));
      view.zero_points = zp.data();
    } else if (zp_form == "T") {
      zp_t.resize(static_cast<size_t>(N * kb));
      for (auto& z : zp_t) z = Make<T>(static_cast<float>(Next() % (1u << bits)) + (Next() % 4 == 0 ? 0.25f : 0.0f));
      view.zero_points_t = zp_t.data();
    }
  }
};

template <typename T>
void Case(const char* type, int64_t C, int64_t H, int64_t R, int64_t rows, int64_t bits, int64_t block,
          const std::string& zp_form, bool down_quantized, bool up_quantized, bool prologue) {
  hcfuse::HcNBitsParams p;
  p.mix.rows = rows;
  p.mix.C = C;
  p.mix.H = H;
  p.mix.R = R;
  p.mix.has_prologue = prologue;
  p.mix.has_streams_out = true;
  p.mix.epsilon = 1e-5f;
  p.mix.reduction_scale = 0.5f;
  p.mix.silu_alpha = 0.75f;
  p.mix.gate_div = 3.0f;
  p.mix.gate_mul = 2.0f;
  p.bits = bits;
  p.block_size = block;
  const int64_t W = C * H;
  auto streams = Values<T>(static_cast<size_t>(rows * W), -2.0f, 2.0f);
  auto norm_scale = Values<T>(static_cast<size_t>(W), 0.5f, 1.5f);
  auto prev_out = Values<T>(static_cast<size_t>(rows * H), -1.0f, 1.0f);
  auto prev_gate = Values<T>(static_cast<size_t>(rows * C), 0.0f, 1.0f);
  Projection<T> di(W, R + C, bits, block, down_quantized, zp_form), up(R, W, bits, block, up_quantized, zp_form);
  std::vector<T> pre(static_cast<size_t>(rows * H)), gate(static_cast<size_t>(rows * C)), out(static_cast<size_t>(rows * W));
  hcfuse::HcNBitsTensors<T> t;
  t.streams = streams.data();
  t.norm_scale = norm_scale.data();
  t.down_inject = di.view;
  t.up = up.view;
  if (prologue) {
    t.prev_block_output = prev_out.data();
    t.prev_post_gate = prev_gate.data();
  }
  t.pre_output = pre.data();
  t.post_gate = gate.data();
  t.streams_out = out.data();
  std::vector<float> scratch(static_cast<size_t>(hcfuse::HcNBitsCpuScratchFloats(p)));
  const hcfuse::HcTaskRunner run = [](int64_t n, const std::function<void(int64_t)>& fn) {
    for (int64_t i = 0; i < n; ++i) fn(i);
  };
  hcfuse::HcNBitsCpu<T>(p, t, run, scratch.data());
  uint64_t h = Fnv(pre.data(), pre.size() * sizeof(T));
  h = Fnv(gate.data(), gate.size() * sizeof(T), h);
  h = Fnv(out.data(), out.size() * sizeof(T), h);
  std::printf("%s C=%lld H=%lld R=%lld rows=%lld bits=%lld block=%lld zp=%s down=%d up=%d prologue=%d %016llx\n", type,
              static_cast<long long>(C), static_cast<long long>(H), static_cast<long long>(R),
              static_cast<long long>(rows), static_cast<long long>(bits), static_cast<long long>(block),
              zp_form.c_str(), down_quantized, up_quantized, prologue, static_cast<unsigned long long>(h));
}

template <typename T>
void Cases(const char* type) {
  // block sizes below, at and past the 32-k chunk, K not a multiple of 32 (H = 150: K = 300; R = 40), every
  // zero-point form, each projection dense or quantized, 1 to 70 rows (row groups of 4, 2, 1; two passes)
  for (int64_t bits : {4, 8}) {
    for (int64_t block : {16, 32, 64, 256}) {
      for (const char* zp : {"none", "packed", "T"}) Case<T>(type, 2, 150, 40, 7, bits, block, zp, true, true, true);
    }
  }
  Case<T>(type, 4, 64, 16, 1, 4, 32, "none", true, false, false);
  Case<T>(type, 4, 64, 16, 3, 4, 32, "packed", false, true, true);
  Case<T>(type, 3, 40, 33, 70, 8, 16, "T", true, true, true);
  Case<T>(type, 4, 256, 64, 16, 4, 32, "none", true, true, true);
}

}  // namespace

int main() {
#if defined(__x86_64__) && defined(__GNUC__)
  const std::string isa = HCFUSE_CPU_ISA_NAME;
  if ((isa == "avx512" && !(__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                            __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))) ||
      (isa == "avx2" && !(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")))) {
    return 77;
  }
#endif
  Cases<float>("float32");
  Cases<Half>("float16");
  Cases<BFloat16>("bfloat16");
  return 0;
}
