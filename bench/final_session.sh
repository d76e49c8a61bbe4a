#!/usr/bin/env bash
# Issue 15's final device session for the batched stage 1 candidate (HCFUSE_FAST_BATCH=1; bench/README.md,
# issue 15 notes): build, CUDA tests with the default and with the candidate forced, the decode
# benchmark (fast, fast/batched, stock; bf16 and fp16; 1-16 rows) and, where ncu exists, the stall
# reasons of stage 1 (one row, default and candidate). Logs under $OUT (or ./final_out).
#   ORT_INCLUDE_DIR=/path/to/ort/include bash bench/final_session.sh   (onnxruntime-gpu importable)
# Runtime estimate (H200, 16 cores): build ~2 min, same-bits tests ~40 s, benchmark ~1.5-2 min, CUDA
# tests ~2 min, ncu ~1 min: ~7 min. Hard cap: every step after the build gets at most what is left of
# BUDGET_S (default 420 s from the start), in the order of importance above, so the whole script ends
# by ~7.5 min even when a step hangs; a step cut short leaves its partial log.
set -uo pipefail
out=${OUT:-final_out}
mkdir -p "$out"
build=${HCFUSE_BUILD_DIR:-/tmp/b}
budget=${BUDGET_S:-420}
t0=$SECONDS
stamp() { echo "[$((SECONDS - t0)) s] $*"; }
cap() { local left=$((budget - (SECONDS - t0))); echo $((left < $1 ? (left > 5 ? left : 5) : $1)); }
cmake -S kernels -B "$build" -G Ninja -DHCFUSE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DORT_INCLUDE_DIR="${ORT_INCLUDE_DIR:?set ORT_INCLUDE_DIR to a folder holding onnxruntime_c_api.h}" > "$out/cmake.log" 2>&1 &&
  timeout 240 ninja -C "$build" > "$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
export HCFUSE_LIBRARY=$build/libhcfuse_ops.so
stamp built

# 1. the candidate's bits against the default's (and the designs' against each other)
timeout "$(cap 90)" python3 -m pytest -q -rs tests/test_fast_path_cuda.py -k same_bits > "$out/tests_same_bits.log" 2>&1
stamp "same-bits tests: $(tail -1 "$out/tests_same_bits.log")"

# 2. the benchmark (per-variant replay times are printed as they come; tables written after each dtype)
timeout "$(cap 200)" python3 bench/bench_decode.py --out "$out/bench" --rows 1 2 4 8 16 --dtypes bf16 fp16 \
  --variants fast fast/batched stock --reps 3 > "$out/bench.log" 2>&1
stamp bench
tail -25 "$out/bench.log"

# 3. both CUDA test files with the default, then with the candidate forced
timeout "$(cap 150)" python3 -m pytest -q -rs tests/test_kernels_cuda.py tests/test_fast_path_cuda.py \
  -k "not same_bits" > "$out/tests_default.log" 2>&1
stamp "tests (default): $(tail -1 "$out/tests_default.log")"
HCFUSE_FAST_BATCH=1 timeout "$(cap 120)" python3 -m pytest -q -rs tests/test_fast_path_cuda.py tests/test_kernels_cuda.py \
  -k "not same_bits" > "$out/tests_batched.log" 2>&1
stamp "tests (HCFUSE_FAST_BATCH=1): $(tail -1 "$out/tests_batched.log")"
grep -hE "^FAILED|^ERROR" "$out"/tests_*.log | head -20

# 4. stall reasons of stage 1 alone (ncu serializes kernels: no PDL overlap), default and candidate
if command -v ncu > /dev/null; then
  cat > "$out/one_block.py" <<'PY'
import numpy as np, ml_dtypes, onnxruntime as ort, hcfuse
from hcfuse.models.hc_block import make_fused_node_model, random_weights, random_activations
from tests._compare import run_bound
from hcfuse._op import QWEN_ATTRIBUTES as A, QWEN_SHAPE as S
rng = np.random.default_rng(0)
m = make_fused_node_model(**S, dtype=ml_dtypes.bfloat16, prologue=True, streams_out=True, weights_as_inputs=False,
                          weights=random_weights(S["C"], S["H"], S["R"], ml_dtypes.bfloat16, rng), **A)
so = ort.SessionOptions(); so.register_custom_ops_library(hcfuse.get_library_path())
s = ort.InferenceSession(m.SerializeToString(), so, providers=["CUDAExecutionProvider"])
feeds = random_activations((1,), S["C"], S["H"], ml_dtypes.bfloat16, rng, prologue=True)
for _ in range(6):
    run_bound(s, feeds, device="cuda")
PY
  for batch in 0 1; do
    HCFUSE_FORCE_PATH=fast HCFUSE_FAST_BATCH=$batch PYTHONPATH=$PWD timeout "$(cap 45)" ncu --clock-control none \
      --kernel-name regex:HcFastStage1 --launch-skip 3 --launch-count 1 --section WarpStateStats \
      --section SchedulerStats --section LaunchStats --section InstructionStats \
      python3 "$out/one_block.py" > "$out/ncu_batch$batch.txt" 2>&1
    stamp "ncu HCFUSE_FAST_BATCH=$batch"
    grep -E "Stall|Warp Cycles|Issued Ipc|Duration|No Eligible|Executed Instructions " "$out/ncu_batch$batch.txt" | head -16
  done
fi
stamp done
