#!/usr/bin/env bash
# Issue 14's prefill device session: per-kernel times of one block on the general path (ncu, where it
# exists; BASE_LIBRARY too when set: the before/after table), the general-path CUDA tests, the
# prefill benchmark and compute-sanitizer (memcheck, racecheck, synccheck) over the general path's
# kernels. Logs under $OUT (or ./prefill_out). Steps run in the order of STEPS (default
# "profile tests bench sanitize"), each capped by what is left of BUDGET_S seconds (default 220).
#   HCFUSE_LIBRARY=/path/libhcfuse_ops.so bash bench/prefill_session.sh   (built here when unset or unloadable;
#   ORT_INCLUDE_DIR then names a folder holding onnxruntime_c_api.h; onnxruntime-gpu importable)
# BENCH_ARGS overrides the benchmark's arguments, SANITIZE_TESTS the -k expression of the tests the
# sanitizers run (tests/kernels/test_prefill_cuda.py; default: bfloat16, three awkward shapes at 303 and 2100 rows (both
# norm kernels, fixed and generic C), the resident norm kernel's variants and the wide rows).
set -uo pipefail
out=${OUT:-prefill_out}
mkdir -p "$out"
budget=${BUDGET_S:-220}
t0=$SECONDS
stamp() { echo "[$((SECONDS - t0)) s] $*"; }
cap() { local left=$((budget - (SECONDS - t0))); echo $((left < $1 ? (left > 5 ? left : 5) : $1)); }
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}

lib=${HCFUSE_LIBRARY:-}
if [ -z "$lib" ] || ! python3 -c "import ctypes, sys; ctypes.CDLL(sys.argv[1])" "$lib" > "$out/load.log" 2>&1; then
  build=${HCFUSE_BUILD_DIR:-/tmp/hc_prefill_build}
  . "$(dirname "$0")/build_kernels.sh"
  BUILD_TIMEOUT=${BUILD_TIMEOUT:-200} build_kernels kernels "$build" "$out/build.log" || { tail -30 "$out/build.log"; exit 1; }
  lib=$build/libhcfuse_ops.so
  stamp "built $lib"
fi
export HCFUSE_LIBRARY=$lib

for step in ${STEPS:-profile tests bench sanitize}; do
  case $step in
  profile)
    if command -v ncu > /dev/null; then
      for which in ${BASE_LIBRARY:+base} new; do
        l=$lib; [ "$which" = base ] && l=$BASE_LIBRARY
        HCFUSE_LIBRARY=$l timeout "$(cap 60)" ncu --clock-control none --csv --print-units base --log-file "$out/ncu_$which.csv" \
          --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
          python3 bench/prefill_kernels.py --rows 256 1024 4096 > "$out/ncu_$which.log" 2>&1
        python3 bench/prefill_kernels.py --summarize "$out/ncu_$which.csv" --rows 256 1024 4096 \
          > "$out/kernels_$which.txt" 2>&1
        stamp "kernels ($which library):"
        cat "$out/kernels_$which.txt"
      done
    else
      stamp "no ncu: per-kernel times skipped"
    fi
    ;;
  tests)
    HCFUSE_CUDA_TEST_REPORT=$out/cuda_test_report.json timeout "$(cap 110)" python3 -m pytest -q -rs \
      -p no:cacheprovider tests/kernels/test_prefill_cuda.py tests/kernels/test_kernels_cuda.py -k "general or prefill or boundary or wide \
      or awkward or branches or automatic" > "$out/tests.log" 2>&1
    stamp "tests: $(tail -1 "$out/tests.log")"
    grep -hE "^FAILED|^ERROR|Error" "$out/tests.log" | head -20
    ;;
  bench)
    # shellcheck disable=SC2086
    timeout "$(cap 240)" python3 bench/bench_decode.py --out "$out/bench" \
      ${BENCH_ARGS:---dtypes bf16 fp16 --variants auto stock --rows 256 1024 4096 --reps 3 --rep-ms 100} \
      > "$out/bench.log" 2>&1
    stamp bench
    tail -22 "$out/bench.log"
    ;;
  sanitize)
    # the general path's kernels only (kns=Hc: the norm kernels, HcSplitReduceKernel, HcGateEpilogueKernel,
    # HcFallbackGemmKernel; cuBLASLt's are not ours); every test here forces the general path. racecheck runs
    # unfiltered: with a kernel filter it fails on these tests with "Internal Sanitizer Error: failed to handle
    # a hardware exception" (H200, compute-sanitizer of CUDA 13)
    for tool in memcheck racecheck synccheck; do
      filter=(--kernel-name kns=Hc)
      [ "$tool" = racecheck ] && filter=()
      timeout "$(cap 60)" compute-sanitizer --tool "$tool" "${filter[@]}" --error-exitcode 9 \
        python3 -m pytest -q -x -p no:cacheprovider tests/kernels/test_prefill_cuda.py \
        -k "${SANITIZE_TESTS:-awkward and bf16 and (mid or long) and (4-640 or 4-768 or 3-100) or variants and bf16 or wide and bf16}" > "$out/sanitize_$tool.log" 2>&1
      stamp "$tool: exit $? $(grep -hE "ERROR SUMMARY|RACECHECK SUMMARY" "$out/sanitize_$tool.log" | tail -1) $(tail -1 "$out/sanitize_$tool.log")"
    done
    ;;
  esac
done
stamp done
