// What every CUDAExecutionProvider kernel of the library takes from its surroundings: device scratch from
// ORT's CUDA allocator and the HCFUSE_DEBUG switch. Only the glue includes this (plain C++; no device code).
#pragma once

#include <onnxruntime_cxx_api.h>

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>

namespace hcfuse {

// HCFUSE_DEBUG set to anything but empty or "0": the kernels print what they run to stderr (read when a
// kernel is created).
inline bool ReadDebugFlag() {
  const char* value = std::getenv("HCFUSE_DEBUG");
  return value != nullptr && *value != '\0' && std::strcmp(value, "0") != 0;
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
