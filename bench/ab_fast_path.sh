#!/usr/bin/env bash
# A/B of a fast-path change in one device session: builds the kernels of BASE (a folder holding another
# checkout's kernels/, e.g. `git archive HEAD~1 kernels | tar -x -C base`) and of this checkout side by
# side, then runs each build's timeline probe (bf16, the default tuning) and
# bench_decode.py (fast path, bf16 and fp16) back to back, and the fast-path tests on this checkout's
# build. Needs onnxruntime-gpu importable and ORT_INCLUDE_DIR. Logs under $OUT (or ./ab_out).
#   BASE=/path/with/kernels ORT_INCLUDE_DIR=... bash bench/ab_fast_path.sh [bench_decode.py args]
set -uo pipefail
out=${OUT:-ab_out}
mkdir -p "$out"
base=${BASE:?set BASE to a folder holding the baseline kernels/}
t0=$SECONDS
stamp() { echo "[$((SECONDS - t0)) s] $*"; }
. "$(dirname "$0")/build_kernels.sh"
build() { build_kernels "$1" "$2" "$3" -DHCFUSE_FAST_TIMELINE=ON; }  # build SRC DIR LOG
build "$base/kernels" /tmp/ab_base "$out/build_base.log" & pid=$!
build kernels /tmp/ab_cand "$out/build_cand.log" || { tail -30 "$out/build_cand.log"; exit 1; }
wait $pid || { tail -30 "$out/build_base.log"; exit 1; }
stamp built
bench_args=${*:---rows 1 2 4 8 16 --dtypes bf16 fp16 --variants fast --reps 3}
for which in base cand; do
  timeout 120 /tmp/ab_$which/hc_fast_timeline --rows ${TIMELINE_ROWS:-1 4} --reps 5 ${TIMELINE_ARGS:-} > "$out/timeline_$which.log" 2>&1
  stamp "timeline $which"; grep -E "^\|" "$out/timeline_$which.log" | head -30
  HCFUSE_LIBRARY=/tmp/ab_$which/libhcfuse_ops.so timeout 200 python3 bench/bench_decode.py --out "$out/bench_$which" \
    $bench_args > "$out/bench_$which.log" 2>&1
  stamp "bench $which"; grep -E "^\|" "$out/bench_$which.log" | head -30
done
HCFUSE_LIBRARY=/tmp/ab_cand/libhcfuse_ops.so timeout "${TESTS_TIMEOUT:-150}" python3 -m pytest -q -x \
  tests/kernels/test_fast_path_cuda.py tests/kernels/test_kernels_cuda.py -k "fast" > "$out/tests_cand.log" 2>&1
stamp "tests (candidate): $(tail -1 "$out/tests_cand.log")"
grep -E "^FAILED|^ERROR|Error" "$out/tests_cand.log" | head -10
