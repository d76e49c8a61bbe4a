// What every CUDAExecutionProvider kernel of the library takes from its surroundings: the kernels' element
// types, device scratch from ORT's CUDA allocator, CUDA errors as exceptions, which inputs are constant, and the
// HCFUSE_DEBUG switch. Only the glue includes this (plain C++; no device code).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <onnxruntime_cxx_api.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace hcfuse {

// The kernels' element type of an ORT element type (same bits), and its ONNX name for messages.
template <typename T>
struct CudaTypeOf;
template <>
struct CudaTypeOf<float> {
  using type = float;
  static constexpr const char* name = "float";
};
template <>
struct CudaTypeOf<Ort::Float16_t> {
  using type = __half;
  static constexpr const char* name = "float16";
};
template <>
struct CudaTypeOf<Ort::BFloat16_t> {
  using type = __nv_bfloat16;
  static constexpr const char* name = "bfloat16";
};

// Throws an Ort::Exception "<op_name> (CUDA): <what>: <error name>: <description>" unless e is cudaSuccess.
inline void ThrowIfCudaFailed(cudaError_t e, const char* what, const char* op_name) {
  if (e != cudaSuccess) {
    throw Ort::Exception(std::string(op_name) + " (CUDA): " + what + ": " + cudaGetErrorName(e) + ": " +
                             cudaGetErrorString(e),
                         ORT_RUNTIME_EXCEPTION);
  }
}

// Whether every input of the node in [first, end) that is given is a constant initializer (absent optional
// inputs, whose names are empty, are skipped): only then may a kernel read it before waiting on the kernel
// before it (programmatic dependent launch).
inline bool InputsAreConstant(const OrtApi& api, const OrtKernelInfo* info, size_t first, size_t end) {
  auto ok = [&](OrtStatus* st) {
    if (st == nullptr) return true;
    api.ReleaseStatus(st);
    return false;
  };
  size_t count = 0;
  if (!ok(api.KernelInfo_GetInputCount(info, &count))) return false;
  for (size_t i = first; i < end && i < count; ++i) {
    size_t name_size = 0;  // counts the terminating NUL: 1 for an absent optional input (an empty name)
    if (!ok(api.KernelInfo_GetInputName(info, i, nullptr, &name_size))) return false;
    if (name_size <= 1) continue;
    int is_constant = 0;
    const OrtValue* value = nullptr;
    if (!ok(api.KernelInfoGetConstantInput_tensor(info, i, &is_constant, &value)) || !is_constant) return false;
  }
  return true;
}

// Whether the float16 input `index` (a projection's scales) is a constant initializer whose every value s has
// |s| * (2^bits - 1) <= 65504, so that no weight (q - zero point) * s of the projection leaves float16's range.
// Read once, when the kernel is created (copied to the host where the value lies on the device).
inline bool Float16ScalesInRange(const OrtKernelInfo* info, size_t index, int64_t bits) {
  int is_constant = 0;
  const Ort::ConstValue value = Ort::ConstKernelInfo(info).GetTensorConstantInput(index, &is_constant);
  if (!is_constant || value == nullptr) return false;
  const size_t count = value.GetTensorTypeAndShapeInfo().GetElementCount();
  std::vector<uint16_t> bits16(count);
  const void* data = value.GetTensorRawData();
  if (value.GetTensorMemoryInfo().GetDeviceType() == OrtMemoryInfoDeviceType_GPU) {
    if (cudaMemcpy(bits16.data(), data, count * sizeof(uint16_t), cudaMemcpyDeviceToHost) != cudaSuccess) return false;
  } else {
    std::memcpy(bits16.data(), data, count * sizeof(uint16_t));
  }
  const double limit = 65504.0 / static_cast<double>((int64_t{1} << bits) - 1);
  for (uint16_t b : bits16) {
    const float s = Ort::Float16_t::FromBits(b).ToFloat();
    if (!(std::fabs(s) <= limit)) return false;  // NaN too
  }
  return true;
}

#if defined(HCFUSE_DEV_KNOBS)
// A developer build's integer switch `name`: empty where it is unset or empty, else its value, an Ort::Exception
// naming op_name and the switch for anything but an integer >= min.
inline std::optional<long long> ReadIntegerSwitch(const char* name, long long min, const char* op_name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  char* end = nullptr;
  const long long parsed = std::strtoll(value, &end, 10);
  if (*end != '\0' || parsed < min) {
    throw Ort::Exception(std::string(op_name) + ": " + name + " must be an integer >= " + std::to_string(min) +
                             "; got '" + value + "'",
                         ORT_INVALID_ARGUMENT);
  }
  return parsed;
}
#endif

// HCFUSE_DEBUG set to anything but empty or "0": the kernels print what they run to stderr (read when a
// kernel is created).
inline bool ReadDebugFlag() {
  const char* value = std::getenv("HCFUSE_DEBUG");
  return value != nullptr && *value != '\0' && std::strcmp(value, "0") != 0;
}

enum class PathChoice { kAuto, kGeneral, kFast };

// HCFUSE_FORCE_PATH=general|fast pins the path of both ops (each path meets the numerics contract); unset or
// empty lets the glue choose. With HCFUSE_DEBUG, the only variables the library reads (builds with
// HCFUSE_DEV_KNOBS read benchmark switches too).
inline PathChoice ReadForcedPath(const char* op_name) {
  const char* value = std::getenv("HCFUSE_FORCE_PATH");
  if (value == nullptr || *value == '\0') return PathChoice::kAuto;
  if (std::strcmp(value, "general") == 0) return PathChoice::kGeneral;
  if (std::strcmp(value, "fast") == 0) return PathChoice::kFast;
  throw Ort::Exception(std::string(op_name) + ": HCFUSE_FORCE_PATH must be 'general' or 'fast' (or unset); got '" +
                           value + "'",
                       ORT_INVALID_ARGUMENT);
}

// Scratch returned to ORT's allocator when the call ends. Reuse by later kernels is ordered behind ours on
// the same compute stream, as for ORT's own scratch buffers.
using CudaScratch = std::unique_ptr<void, std::function<void(void*)>>;

// `bytes` of device scratch on `device` (none for 0); throws an Ort::Exception naming op_name when the
// allocator has none.
inline CudaScratch AllocateCudaScratch(OrtKernelContext* ctx, int device, size_t bytes, const char* op_name) {
  if (bytes == 0) return CudaScratch(nullptr, [](void*) {});
  const Ort::MemoryInfo info("Cuda", OrtDeviceAllocator, device, OrtMemTypeDefault);
  // KernelContext_GetAllocator hands out a new wrapper object on every call, which the caller
  // releases (ReleaseAllocator): here once the scratch has gone back to it.
  const std::shared_ptr<OrtAllocator> allocator(
      Ort::KernelContext(ctx).GetAllocator(*static_cast<const OrtMemoryInfo*>(info)),
      [](OrtAllocator* a) { Ort::GetApi().ReleaseAllocator(a); });
  void* p = allocator->Alloc(allocator.get(), bytes);
  if (p == nullptr) {
    throw Ort::Exception(std::string(op_name) + " (CUDA): ORT's allocator returned no memory for " +
                             std::to_string(bytes) + " bytes of scratch",
                         ORT_RUNTIME_EXCEPTION);
  }
  return CudaScratch(p, [allocator](void* q) { allocator->Free(allocator.get(), q); });
}

}  // namespace hcfuse
