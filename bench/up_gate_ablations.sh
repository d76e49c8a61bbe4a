#!/usr/bin/env bash
# The fused up/gate kernel (HcUpGateKernel) timed in parts on a GPU machine: the library built three ways
# in parallel (HCFUSE_UP_GATE_ABLATE=0: the kernel; 1: without its epilogue after up's packing; 2: without
# its products; results wrong in 1 and 2, times only), then ncu's duration of the kernel alone at ROWS (one
# real-shape block, bench/prefill_kernels.py) for each build and type, and cuBLASLt's up product + the
# epilogue kernel of the unfused route for comparison. Needs ORT_INCLUDE_DIR and CUTLASS's headers
# (HCFUSE_CUTLASS_INCLUDE, or the nvidia-cutlass wheel). EXTRA_CUDA_FLAGS go to all three builds (a candidate's
# switch). Logs under $OUT (or ./up_gate_out).
#   ORT_INCLUDE_DIR=... ROWS="256 1024 4096" [EXTRA_CUDA_FLAGS=...] bash bench/up_gate_ablations.sh
set -uo pipefail
out=${OUT:-up_gate_out}
mkdir -p "$out"
rows=${ROWS:-256 1024 4096}
. "$(dirname "$0")/build_kernels.sh"
for a in 0 1 2; do
  (build_kernels kernels "/tmp/up_gate_$a" "$out/build_$a.log" -DCMAKE_CUDA_FLAGS="-DHCFUSE_UP_GATE_ABLATE=$a ${EXTRA_CUDA_FLAGS:-}" ||
     echo "build $a failed") &
done
wait
time_kernels() {  # time_kernels BUILD DTYPE UP_GATE REGEX: one line per kernel and row count
  HCFUSE_LIBRARY=/tmp/up_gate_$1/libhcfuse_ops.so HCFUSE_UP_GATE=$3 timeout 200 ncu --clock-control none \
    -k "regex:$4" --metrics gpu__time_duration.sum --csv python3 bench/prefill_kernels.py --rows $rows --dtype "$2" \
    --runs 1 2> /dev/null | grep -E '^"' | awk -F'","' -v b="$1" -v d="$2" \
    '$0 ~ /gpu__time_duration/ {split($5, k, "("); printf "%s build %s: %s grid %s: %s %s\n", d, b, k[1], $9, $NF, $(NF-1)}' | tr -d '"'
}
for dt in bf16 fp16; do
  for a in 0 1 2; do time_kernels "$a" "$dt" 1 HcUpGate; done
  time_kernels 0 "$dt" 0 "nvjet_sm90_tst|HcGateEpilogue"
done | tee "$out/ablations.txt"
