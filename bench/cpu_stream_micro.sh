#!/usr/bin/env bash
# Builds bench/cpu_stream_micro.cc against the working tree's CPU kernel (A) and, optionally, another
# copy of kernels/src/cpu (B: a folder holding cpu/hc_lowrank_mix_cpu.{h,cc} and the .inc), compiled
# into the namespace hcfuse_b, so that one process times both, call by call, on the same machine load.
#
#   bench/cpu_stream_micro.sh OUT [B_SRC]      B_SRC: see the last lines of this comment
#   THREADS=1 DTYPE=float32 OUT 1 4            rows 1 and 4; H=256 HOT=1: weights that stay in the caches
#   OUT 0                                      the access-pattern reads only (no kernel)
#   EXTRA_FLAGS='-DNAME=1' bench/cpu_stream_micro.sh OUT B_SRC   compiler flags for both builds (A/B of a
#                                              macro-guarded variant)
#
# A B folder from another commit:  mkdir -p /tmp/b/cpu && for f in hc_lowrank_mix_cpu.h hc_lowrank_mix_cpu.cc
#   hc_lowrank_mix_cpu_gemm.inc; do git show REV:kernels/src/cpu/$f > /tmp/b/cpu/$f; done
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:?usage: cpu_stream_micro.sh OUT [B_SRC]}
b_src=${2:-}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
flags=(${EXTRA_FLAGS:-} -O3 -DNDEBUG -std=c++17 -ffp-contract=off)
g++ "${flags[@]}" -I"$root/kernels/include" -I"$root/kernels/src" -c "$root/kernels/src/cpu/hc_lowrank_mix_cpu.cc" \
  -o "$tmp/a.o"
objs=("$tmp/a.o")
ab=0
if [[ -n "$b_src" ]]; then
  # the B header without its include guard, renamed, so that it declares hcfuse_b:: beside hcfuse::
  mkdir -p "$tmp/inc/cpu" "$tmp/inc/hcfuse"
  sed '/pragma once/d; s|hcfuse/hc_params.h|hcfuse/hc_params_b.h|' "$b_src/cpu/hc_lowrank_mix_cpu.h" \
    > "$tmp/inc/cpu/hc_lowrank_mix_cpu_b.h"
  sed '/pragma once/d' "$root/kernels/include/hcfuse/hc_params.h" > "$tmp/inc/hcfuse/hc_params_b.h"
  g++ "${flags[@]}" -Dhcfuse=hcfuse_b -I"$root/kernels/include" -I"$b_src" -c "$b_src/cpu/hc_lowrank_mix_cpu.cc" \
    -o "$tmp/b.o"
  objs+=("$tmp/b.o")
  ab=1
fi
g++ "${flags[@]}" -mavx2 -mfma -mf16c -DHCFUSE_MICRO_AB=$ab -pthread -I"$root/kernels/include" -I"$root/kernels/src" \
  -I"$tmp/inc" "$root/bench/cpu_stream_micro.cc" "${objs[@]}" -o "$out"
