// Prints the CUDA fast path's plan (kernels/src/cuda/fast/hc_fast_plan.h) for one call as one JSON
// object, for tests/kernels/test_fast_plan.py: built with the host compiler alone (no CUDA), so the path
// choice and the tiling are checked on any machine.
//   fast_plan_probe KEY=VALUE...   shape: rows C H R prologue; device: sm (e.g. 90) smem (opt-in bytes
//   per block) smem_sm smem_reserved; call: elem (bytes) aligned forced quant (the quantized op's
//   block_size, 0: dense); tuning: ss_local hidden_local ahead real_shape stage2.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "cuda/fast/hc_fast_plan.h"

namespace {

long long Int(const char* arg, const char* value) {
  char* end = nullptr;
  const long long v = std::strtoll(value, &end, 10);
  if (*value == '\0' || *end != '\0') {
    std::fprintf(stderr, "fast_plan_probe: %s: not an integer\n", arg);
    std::exit(2);
  }
  return v;
}

std::string Quoted(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

}  // namespace

int main(int argc, char** argv) {
  hcfuse::HcLowRankMixParams p;
  p.rows = 1;
  p.C = 4;
  p.H = 2560;
  p.R = 320;
  hcfuse::HcDeviceCaps caps;
  caps.sm_major = 9;
  caps.max_shared_memory_per_block = 227 * 1024;  // an H100/H200's opt-in maximum
  hcfuse::HcFastTuning tuning;
  hcfuse::HcFastRequest request;
  for (int i = 1; i < argc; ++i) {
    const char* eq = std::strchr(argv[i], '=');
    if (eq == nullptr) {
      std::fprintf(stderr, "fast_plan_probe: %s: expected KEY=VALUE\n", argv[i]);
      return 2;
    }
    const std::string key(argv[i], static_cast<size_t>(eq - argv[i]));
    const char* value = eq + 1;
    const long long v = Int(argv[i], value);
    if (key == "rows") p.rows = v;
    else if (key == "C") p.C = v;
    else if (key == "H") p.H = v;
    else if (key == "R") p.R = v;
    else if (key == "prologue") p.has_prologue = v != 0;
    else if (key == "sm") caps.sm_major = static_cast<int>(v / 10), caps.sm_minor = static_cast<int>(v % 10);
    else if (key == "smem") caps.max_shared_memory_per_block = v;
    else if (key == "smem_sm") caps.shared_memory_per_sm = v;
    else if (key == "smem_reserved") caps.reserved_shared_memory_per_block = v;
    else if (key == "ahead") tuning.kernels_ahead = v;
    else if (key == "stage2") tuning.stage2_max_ctas = v;
    else if (key == "real_shape") tuning.real_shape_kernels = v != 0;
    else if (key == "elem") request.element_bytes = static_cast<int>(v);
    else if (key == "aligned") request.pointers_aligned = v != 0;
    else if (key == "forced") request.forced = v != 0;
    else if (key == "quant") request.quant_block_size = v;
    else if (key == "ss_local") tuning.ss_local_max_rows = v;
    else if (key == "hidden_local") tuning.hidden_local_max_rows = v;
    else {
      std::fprintf(stderr, "fast_plan_probe: unknown key %s\n", key.c_str());
      return 2;
    }
  }
  p.leading_dims = {p.rows};

  const hcfuse::HcFastPlan plan = hcfuse::HcFastPlanFor(p, caps, tuning, request);
  std::printf("{\"ok\": %s, \"reason\": %s", plan.ok() ? "true" : "false", Quoted(plan.reason).c_str());
  if (plan.ok()) {
    std::printf(", \"cluster\": %d, \"use_pdl\": %s, \"stage1_ctas\": %d, \"stage2_ctas\": %d"
                ", \"stage1_shared_bytes\": %zu, \"stage2_shared_bytes\": %zu, \"shared_memory_bytes\": %zu"
                ", \"real_shape_kernels\": %s, \"scratch\": {\"partials\": %zu, \"hn\": %zu, \"total\": %zu}",
                plan.cluster, plan.use_pdl ? "true" : "false", plan.stage1_ctas, plan.stage2_ctas,
                plan.stage1_shared_bytes, plan.stage2_shared_bytes, plan.shared_memory_bytes(),
                plan.real_shape_kernels ? "true" : "false", plan.scratch.partials, plan.scratch.hn,
                plan.scratch.total);
    const hcfuse::HcFastClusterDims& d = plan.cluster_dims;
    std::printf(", \"dims\": {\"rows\": %d, \"rt\": %d, \"cpb\": %d, \"ks\": %d, \"groups\": %d, \"g4\": %d"
                ", \"hs\": %d, \"piece\": %d, \"per1\": %d, \"per2\": %d, \"ss_parts\": %d, \"ss_local\": %s"
                ", \"hidden_local\": %s, \"has_prologue\": %s, \"block_size\": %d, \"n2\": %d}",
                d.rows, d.rt, d.cpb, d.ks, d.groups, d.g4, d.hs, d.piece, d.per1, d.per2, d.ss_parts,
                d.ss_local ? "true" : "false", d.hidden_local ? "true" : "false", d.has_prologue ? "true" : "false",
                d.block_size, d.n2);
  }
  std::printf("}\n");
  return 0;
}
