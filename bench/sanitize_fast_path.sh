#!/usr/bin/env bash
# compute-sanitizer memcheck, racecheck and synccheck over the fast path's kernels, run by a few fast
# path tests (small shapes, both designs; the real shape at 33 rows: several row passes, every work
# split; the real shape at 3 rows in both designs).
# On a GPU machine with onnxruntime-gpu and compute-sanitizer, with a CUDA build of the library:
#   HCFUSE_LIBRARY=/tmp/b/libhcfuse_ops.so bash bench/sanitize_fast_path.sh
set -uo pipefail
tests=${SANITIZE_TESTS:-small_shapes or (work_split and 33) or (same_bits and qwen-3 and bf16)}
for tool in memcheck racecheck synccheck; do
  echo "== $tool"
  timeout "${SANITIZE_TIMEOUT:-75}" compute-sanitizer --tool "$tool" --kernel-name kns=HcFast --error-exitcode 9 \
    python3 -m pytest -q -x tests/kernels/test_fast_path_cuda.py -k "$tests" 2>&1 | grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed|failed|Error" | tail -4
  echo "exit ${PIPESTATUS[0]}"
done
