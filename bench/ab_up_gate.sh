#!/usr/bin/env bash
# A/B of a general-path kernel change in one device session: builds the kernels of BASE (a folder holding
# another checkout's kernels/, e.g. `git archive main kernels | tar -x -C base`) and of this checkout side by
# side, runs this checkout's up/gate and prefill tests, compares both builds' outputs bit for bit
# (general_path_bits.py), times HcUpGateKernel alone with ncu (bench/prefill_kernels.py) and then the chain
# (bench_decode.py, the fused route pinned) for each build in turn, ROUNDS times (2). TESTS: the test files
# (empty: none). Needs onnxruntime-gpu importable,
# ORT_INCLUDE_DIR and CUTLASS's headers (HCFUSE_CUTLASS_INCLUDE, or the nvidia-cutlass wheel). Logs under $OUT
# (or ./ab_out).
#   BASE=/path/with/kernels ORT_INCLUDE_DIR=... bash bench/ab_up_gate.sh
set -uo pipefail
out=${OUT:-ab_out}
mkdir -p "$out"
base=${BASE:?set BASE to a folder holding the baseline kernels/}
rows=${ROWS:-256 1024 4096}
t0=$SECONDS
stamp() { echo "[$((SECONDS - t0)) s] $*"; }
. "$(dirname "$0")/build_kernels.sh"
build_kernels "$base/kernels" /tmp/ab_base "$out/build_base.log" & pid=$!
build_kernels kernels /tmp/ab_cand "$out/build_cand.log" || { tail -30 "$out/build_cand.log"; exit 1; }
wait $pid || { tail -30 "$out/build_base.log"; exit 1; }
stamp built
tests=${TESTS-tests/kernels/test_up_gate_cuda.py tests/kernels/test_prefill_cuda.py}  # empty: none
if [ -n "$tests" ]; then
  HCFUSE_LIBRARY=/tmp/ab_cand/libhcfuse_ops.so timeout "${TESTS_TIMEOUT:-150}" python3 -m pytest -q -p no:cacheprovider \
    $tests > "$out/tests_cand.log" 2>&1
  stamp "tests (candidate): $(tail -1 "$out/tests_cand.log")"
  grep -E "^FAILED|^ERROR" "$out/tests_cand.log" | head -10
fi
for which in base cand; do
  HCFUSE_LIBRARY=/tmp/ab_$which/libhcfuse_ops.so timeout 60 python3 bench/general_path_bits.py > "$out/bits_$which.txt" 2>&1
done
if cmp -s "$out/bits_base.txt" "$out/bits_cand.txt"; then stamp "bits: the same"; else stamp "bits: DIFFER"; diff "$out/bits_base.txt" "$out/bits_cand.txt" | head; fi
for which in base cand; do
  for dt in bf16 fp16; do
    HCFUSE_LIBRARY=/tmp/ab_$which/libhcfuse_ops.so HCFUSE_UP_GATE=1 timeout 60 ncu --clock-control none -k regex:HcUpGate \
      --metrics gpu__time_duration.sum --csv python3 bench/prefill_kernels.py --rows $rows --dtype $dt --runs 1 2> /dev/null |
      grep gpu__time_duration | awk -F'","' -v w=$which -v d=$dt '{printf "ncu %s %s grid %s: %s\n", w, d, $9, $NF}' | tr -d '"'
  done
done | tee "$out/ncu.txt"
for round in $(seq "${ROUNDS:-2}"); do
  for which in base cand; do
    HCFUSE_LIBRARY=/tmp/ab_$which/libhcfuse_ops.so timeout 120 python3 bench/bench_decode.py --out "$out/chain_${which}_$round" \
      --rows $rows --dtypes bf16 fp16 --variants auto/fused-up --reps 3 --rep-ms 100 > "$out/chain_${which}_$round.log" 2>&1
    stamp "chain $which $round"; grep -E "^\| (bf16|fp16)" "$out/chain_${which}_$round.log"
  done
done
