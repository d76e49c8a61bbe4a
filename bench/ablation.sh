#!/usr/bin/env bash
# Where the fast path's time goes: builds the library with each HCFUSE_FAST_ABLATE bit set
# (kernels/src/cuda/hc_fast_path.cu: 1 no weight loads, 2 nothing after the dependency wait,
# 4 no tensor-core products; results are wrong in these builds) and times the fast path of each
# with bench_decode.py. Writes $OUT/ablation/<bits>/decode.md (or ./h200_out/...).
# On a GPU machine with onnxruntime-gpu, ORT_INCLUDE_DIR set as for bench/h200_session.sh:
#   ORT_INCLUDE_DIR=/path/to/ort/include bash bench/ablation.sh [rows...]
set -uo pipefail
out=${OUT:-h200_out}/ablation
rows=${*:-1 4 16}
. "$(dirname "$0")/build_kernels.sh"
for bits in ${ABLATE_BITS:-0 1 2 3 4}; do
  build_kernels kernels /tmp/ablate$bits /dev/null -DCMAKE_CUDA_FLAGS="-DHCFUSE_FAST_ABLATE=$bits" &
done
wait
for bits in ${ABLATE_BITS:-0 1 2 3 4}; do
  HCFUSE_LIBRARY=/tmp/ablate$bits/libhcfuse_ops.so timeout 120 python3 bench/bench_decode.py \
    --out "$out/$bits" --rows $rows --dtypes bf16 --variants fast --reps 5 > /dev/null 2>&1
  echo "ablate=$bits: $(grep '^| bf16' "$out/$bits/decode.md" | awk -F'|' '{printf "%s:%s ", $3, $4}')"
done
