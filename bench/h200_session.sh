#!/usr/bin/env bash
# One session on a GPU machine: build the custom-op library (and the fast path's timeline probe), run
# the CUDA tests (TESTS: pytest files, default both CUDA files), the timeline probe (TIMELINE_ROWS, e.g.
# "1 2 4"; unset: skipped), then bench_decode.py. Needs onnxruntime-gpu importable and ORT_INCLUDE_DIR (a
# folder holding onnxruntime_c_api.h; README, "Running the CUDA tests on a GPU machine"). Everything is
# logged under $OUT, or ./h200_out.
#   ORT_INCLUDE_DIR=/path/to/ort/include bash bench/h200_session.sh [tests|notests] [bench_decode.py args...]
set -uo pipefail
out=${OUT:-h200_out}
mkdir -p "$out"
build=${HCFUSE_BUILD_DIR:-/tmp/b}
. "$(dirname "$0")/build_kernels.sh"
build_kernels kernels "$build" "$out/build.log" -DHCFUSE_FAST_TIMELINE=ON || { tail -40 "$out/build.log"; exit 1; }
export HCFUSE_LIBRARY=$build/libhcfuse_ops.so
mode=${1:-tests}; shift || true
if [ -n "${TIMELINE_ROWS:-}" ]; then
  timeout 120 "$build/hc_fast_timeline" --rows $TIMELINE_ROWS --reps 5 > "$out/timeline.log" 2>&1
  grep -E "^\||^timeline|phases|differ|error" "$out/timeline.log"
fi
if [ "$mode" = tests ]; then
  timeout "${TESTS_TIMEOUT:-300}" python3 -m pytest -q -rs ${TESTS:-tests/kernels/test_kernels_cuda.py tests/kernels/test_fast_path_cuda.py} \
    > "$out/tests.log" 2>&1
  grep -E "passed|failed|Error|error" "$out/tests.log" | tail -15
fi
HCFUSE_DEBUG=1 python3 - <<'PY' 2>&1 | grep -E "fast path|general path|GEMM" | sort -u | head -30
import numpy as np, ml_dtypes
from hcfuse.models.hc_block import make_fused_node_model, random_weights, random_activations
from hcfuse.checking._ort_io import run_bound
from hcfuse.checking._session import CUDA, inference_session
from hcfuse._op import QWEN_ATTRIBUTES as A, QWEN_SHAPE as S
rng = np.random.default_rng(0)
m = make_fused_node_model(**S, dtype=ml_dtypes.bfloat16, prologue=True, streams_out=True, weights_as_inputs=False,
                          weights=random_weights(S["C"], S["H"], S["R"], ml_dtypes.bfloat16, rng), **A)
s = inference_session(m, [CUDA], optimize=True)
for rows in (1, 4, 16, 64):
    run_bound(s, random_activations((rows,), S["C"], S["H"], ml_dtypes.bfloat16, rng, prologue=True), device="cuda")
PY
if [ $# -gt 0 ]; then
  timeout 400 python3 bench/bench_decode.py --out "$out/bench" "$@" 2>&1 | tail -25
fi
