# Sourced by bench/gpu_check.sh (not run by itself), or by hand, to build the custom-op library:
#   . bench/build_kernels.sh && build_kernels SRC BUILD_DIR LOG [cmake options...]
# configures SRC (a kernels/ folder) for sm_90a with the CUDA kernels on, builds it with ninja (at most
# BUILD_TIMEOUT seconds, 300 by default) and writes cmake's and ninja's output to LOG. Needs ORT_INCLUDE_DIR
# (a folder holding onnxruntime_c_api.h); CUTLASS's headers come from HCFUSE_CUTLASS_INCLUDE or the
# nvidia-cutlass wheel (kernels/CMakeLists.txt). With -DHCFUSE_DEV_KNOBS=ON the library reads the benchmark switches
# (HCFUSE_FAST_*, HCFUSE_UP_GATE) that bench_decode.py's PATH/CHOICE variants set.
build_kernels() {
  local src=$1 dir=$2 log=$3
  shift 3
  # HCFUSE_CUTLASS_INCLUDE passed on too: a baseline checkout's CMakeLists may predate reading it from the environment
  cmake -S "$src" -B "$dir" -G Ninja -DHCFUSE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
    ${HCFUSE_CUTLASS_INCLUDE:+-DHCFUSE_CUTLASS_INCLUDE=$HCFUSE_CUTLASS_INCLUDE} -DORT_INCLUDE_DIR="${ORT_INCLUDE_DIR:?set ORT_INCLUDE_DIR to a folder holding onnxruntime_c_api.h}" "$@" > "$log" 2>&1 &&
    timeout "${BUILD_TIMEOUT:-300}" ninja -C "$dir" >> "$log" 2>&1
}
