#!/usr/bin/env bash
# The GPU check of the CUDA library, on a machine with a GPU, onnxruntime-gpu importable and (for step 3)
# compute-sanitizer on PATH. Steps, each cut at its cap and at what is left of BUDGET_S, so the script
# ends within the budget even when a step hangs (a step cut short leaves its partial log):
#   0. build the library into HCFUSE_BUILD_DIR (bench/build_kernels.sh; skipped with a given HCFUSE_LIBRARY,
#      which is then the library checked, or with SKIP_BUILD=1 where HCFUSE_BUILD_DIR already holds one)
#   1. a hash of every output of both paths (bench/output_bits.py: diff two runs' bits.txt to compare
#      two libraries bit for bit)                                             -> $OUT/bits.txt
#   2. the decode benchmark: fast, general and stock, bf16 and fp16, 1-64 rows, 3 repetitions
#                                                                             -> $OUT/decode.log, $OUT/decode/
#   3. every CUDA test under tests/kernels                                    -> $OUT/tests.log
#   4. compute-sanitizer memcheck, racecheck and synccheck over the fast path's kernels (fast-path tests), the
#      general path's (general-path tests) and the quantized op's (tests/kernels/test_nbits_cuda.py)
#                                                                             -> $OUT/sanitize_*.log
# A summary line per step goes to stdout and $OUT/summary.txt. OUT is relative to the repository root. The
# build alone may take most of the budget on a small machine: to compare two libraries, build both first
# (bench/build_kernels.sh) and pass each as HCFUSE_LIBRARY.
#
#   ORT_INCLUDE_DIR=/path/to/ort/include OUT=/tmp/out bash bench/gpu_check.sh
#   HCFUSE_LIBRARY=/path/libhcfuse_ops.so OUT=/tmp/out bash bench/gpu_check.sh           # a given library
#   STEPS=tests OUT=/tmp/a bash bench/gpu_check.sh; SKIP_BUILD=1 STEPS=sanitize OUT=/tmp/b bash bench/gpu_check.sh
# Environment: OUT (default ./gpu_check_out), HCFUSE_BUILD_DIR (default /tmp/hcfuse_gpu_check_build),
# STEPS (default "bits decode tests sanitize": the steps 1-4 to run, to split the check over calls),
# BUDGET_S (default 560), ORT_INCLUDE_DIR and HCFUSE_CUTLASS_INCLUDE for the build (bench/build_kernels.sh),
# BUILD_TIMEOUT (default 300).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu_check_out}
mkdir -p "$out"
build=${HCFUSE_BUILD_DIR:-/tmp/hcfuse_gpu_check_build}
budget=${BUDGET_S:-560}
t0=$SECONDS
stamp() { echo "[$((SECONDS - t0)) s] $*" | tee -a "$out/summary.txt"; }
# the step's cap: at most $1 seconds and what is left of the budget (at least 5)
cap() { local left=$((budget - (SECONDS - t0))); echo $((left < $1 ? (left > 5 ? left : 5) : $1)); }
last() { tail -1 "$1" 2>/dev/null; }
steps=" ${STEPS:-bits decode tests sanitize} "
step() { [[ $steps == *" $1 "* ]]; }
: > "$out/summary.txt"

# 0. the library
if [ -n "${HCFUSE_LIBRARY:-}" ] || { [ -n "${SKIP_BUILD:-}" ] && [ -f "$build/libhcfuse_ops.so" ]; }; then
  export HCFUSE_LIBRARY=${HCFUSE_LIBRARY:-$build/libhcfuse_ops.so}
  [ -f "$HCFUSE_LIBRARY" ] || { echo "gpu_check: no library at $HCFUSE_LIBRARY" >&2; exit 1; }
  stamp "library $HCFUSE_LIBRARY (not built here)"
else
  . bench/build_kernels.sh
  BUILD_TIMEOUT=$(cap "${BUILD_TIMEOUT:-300}") build_kernels kernels "$build" "$out/build.log" \
    || { tail -40 "$out/build.log"; stamp "build failed: $out/build.log"; exit 1; }
  export HCFUSE_LIBRARY=$build/libhcfuse_ops.so
  stamp "built $HCFUSE_LIBRARY"
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /' | tee -a "$out/summary.txt"

# 1. the outputs' bits
if step bits; then
  timeout "$(cap 60)" python3 bench/output_bits.py > "$out/bits.txt" 2> "$out/bits.log"
  stamp "bits: exit $? $(wc -l < "$out/bits.txt") lines"
fi

# 2. the decode benchmark
if step decode; then
  timeout "$(cap 90)" python3 bench/bench_decode.py --out "$out/decode" --rows 1 2 4 8 16 32 64 --dtypes bf16 fp16 \
    --variants fast general stock --reps 3 > "$out/decode.log" 2>&1
  stamp "decode: exit $?"
  grep -E "^\| (bf16|fp16)" "$out/decode.log" | sort -u -t'|' -k2,2 -k3,3n | tee -a "$out/summary.txt"
fi

# 3. every CUDA test (and the rest of tests/kernels, which takes seconds)
if step tests; then
  timeout "$(cap 400)" python3 -m pytest -q -rs -p no:cacheprovider tests/kernels > "$out/tests.log" 2>&1
  stamp "tests: exit $? $(last "$out/tests.log")"
  grep -hE "^FAILED|^ERROR" "$out/tests.log" | head -20
fi

# 4. compute-sanitizer. The fast path: the generic kernels (small shapes, 7 rows, both prologue settings) and
# the real shape's (3 rows); the general path: every row range, both norm kernels (HcNormInjectKernel: H = 129
# and 96; HcNormInjectResidentKernel: H = 768 and the four variants of H = 512), both up/gate routes.
fast_tests=${SANITIZE_FAST:-(small_shapes and 7-4 and bf16) or (real_shape_matches_reference and prologue-3-bf16)}
general_tests=${SANITIZE_GENERAL:-awkward and bf16 and (4-129-512 or 4-96-16 or 4-768-40) or variants and bf16}
# the quantized op's general kernels (HcNBits*, and the dense norm kernel HcNormInject* its GEMM route runs): every
# zero-point form and bits, a block past the slice, C = 9, two chunks of rows (300) with the prologue and
# streams_out, the real shape; the GEMM route's forms and its largest block
nbits_tests=${SANITIZE_NBITS:-(test_forms and both and bfloat16) or (test_forms and both-T-4-float32) or (block_sizes and packed-8-256-bfloat16) or (odd_shapes and 9-16-8-bfloat16) or (prologue_outputs and (17-3-out-prologue-bfloat16 or 3x100-3-out-prologue-float16)) or (test_real_shape and bfloat16-3) or (gemm_route_forms and both and bfloat16) or (gemm_route_block_sizes and 4-1024-float16)}
# sanitize NAME CAP KERNELS TEST_FILE TESTS: the three tools over the tests' kernels whose names start with KERNELS.
# racecheck runs without a kernel filter where RACE_UNFILTERED is set: with one (even one no kernel matches) it
# fails on the general path's tests with "Internal Sanitizer Error: failed to handle a hardware exception" (H200,
# compute-sanitizer of CUDA 13); unfiltered it runs and reports, cuBLASLt's kernels included
sanitize() {
  local name=$1 limit=$2 kernels=$3 file=$4 tests=$5 tool filter
  for tool in memcheck racecheck synccheck; do
    filter=(--kernel-name "kns=$kernels")
    [ "$tool" = racecheck ] && [ -n "${RACE_UNFILTERED:-}" ] && filter=()
    timeout "$(cap "$limit")" compute-sanitizer --tool "$tool" "${filter[@]}" --error-exitcode 9 \
      python3 -m pytest -q -x -p no:cacheprovider "$file" -k "$tests" > "$out/sanitize_${name}_$tool.log" 2>&1
    stamp "$tool $name: exit $? $(grep -hE "ERROR SUMMARY|RACECHECK SUMMARY" "$out/sanitize_${name}_$tool.log" | tail -1) $(last "$out/sanitize_${name}_$tool.log")"
  done
}
if step sanitize; then
  sanitize fast 40 HcFast tests/kernels/test_fast_path_cuda.py "$fast_tests"
  RACE_UNFILTERED=1 sanitize general 60 Hc tests/kernels/test_prefill_cuda.py "$general_tests"
  RACE_UNFILTERED=1 sanitize nbits 90 HcN tests/kernels/test_nbits_cuda.py "$nbits_tests"
fi
stamp done
