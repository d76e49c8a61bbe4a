#!/usr/bin/env bash
# One device session: build the custom-op library, run the CUDA tests, then bench_decode.py.
# Everything is logged under $OUT (the device tool's result folder) or ./h200_out.
#   source .device/env.sh; bash bench/h200_session.sh [tests|notests] [bench_decode.py args...]
set -uo pipefail
out=${OUT:-h200_out}
mkdir -p "$out"
build=${HCFUSE_BUILD_DIR:-/tmp/b}
cmake -S kernels -B "$build" -G Ninja -DHCFUSE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DORT_INCLUDE_DIR="${ORT_INCLUDE_DIR:?source .device/env.sh first}" > "$out/cmake.log" 2>&1 &&
  ninja -C "$build" > "$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
export HCFUSE_LIBRARY=$build/libhcfuse_ops.so
mode=${1:-tests}; shift || true
if [ "$mode" = tests ]; then
  timeout 300 python3 -m pytest -q -rs tests/test_kernels_cuda.py tests/test_fast_path_cuda.py \
    > "$out/tests.log" 2>&1
  grep -E "passed|failed|Error|error" "$out/tests.log" | tail -15
fi
HCFUSE_DEBUG=1 python3 - <<'PY' 2>&1 | grep -E "fast path|general path|GEMM" | sort -u | head -30
import numpy as np, onnxruntime as ort, ml_dtypes, hcfuse
from hcfuse.models.hc_block import make_fused_node_model, random_weights, random_activations
from tests._compare import run_bound
from hcfuse._op import QWEN_ATTRIBUTES as A, QWEN_SHAPE as S
rng = np.random.default_rng(0)
m = make_fused_node_model(**S, dtype=ml_dtypes.bfloat16, prologue=True, streams_out=True, weights_as_inputs=False,
                          weights=random_weights(S["C"], S["H"], S["R"], ml_dtypes.bfloat16, rng), **A)
so = ort.SessionOptions(); so.register_custom_ops_library(hcfuse.get_library_path())
s = ort.InferenceSession(m.SerializeToString(), so, providers=["CUDAExecutionProvider"])
for rows in (1, 4, 16, 64):
    run_bound(s, random_activations((rows,), S["C"], S["H"], ml_dtypes.bfloat16, rng, prologue=True), device="cuda")
PY
if [ $# -gt 0 ]; then
  timeout 400 python3 bench/bench_decode.py --out "$out/bench" "$@" 2>&1 | tail -25
fi
