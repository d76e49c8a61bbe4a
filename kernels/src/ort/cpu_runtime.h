// What every CPUExecutionProvider kernel of the library takes from ONNX Runtime: the CPU math's storage
// type of an ORT element type, a task runner over the session's intra-op thread pool, and fp32
// scratch from the session's CPU allocator.
#pragma once

#include <onnxruntime_cxx_api.h>

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>

#include "cpu/hc_lowrank_mix_cpu.h"

namespace hcfuse {

// The CPU math's storage type for an ORT element type (same bits).
template <typename T>
using CpuType = std::conditional_t<std::is_same_v<T, Ort::Float16_t>, Half,
                                   std::conditional_t<std::is_same_v<T, Ort::BFloat16_t>, BFloat16, float>>;
static_assert(sizeof(Ort::Float16_t) == sizeof(Half) && sizeof(Ort::BFloat16_t) == sizeof(BFloat16));

// Runs the tasks on the session's intra-op thread pool; serially when it cannot. No exception
// leaves a task into ORT's pool (a worker thread has nothing to catch it): the first one is kept
// and rethrown here, on the calling thread, once every task has finished.
inline HcTaskRunner OrtTaskRunner(OrtKernelContext* ctx) {
  return [ctx](int64_t num_tasks, const std::function<void(int64_t)>& fn) {
    if (num_tasks > 1) {
      struct Job {
        const std::function<void(int64_t)>* fn;
        std::mutex mu;
        std::exception_ptr error;
      } job{&fn, {}, nullptr};
      auto trampoline = [](void* data, size_t task) {
        Job* j = static_cast<Job*>(data);
        try {
          (*j->fn)(static_cast<int64_t>(task));
        } catch (...) {
          std::lock_guard<std::mutex> lock(j->mu);
          if (!j->error) j->error = std::current_exception();
        }
      };
      OrtStatus* st = Ort::GetApi().KernelContext_ParallelFor(ctx, trampoline, static_cast<size_t>(num_tasks), 0, &job);
      if (job.error) {
        if (st != nullptr) Ort::GetApi().ReleaseStatus(st);
        std::rethrow_exception(job.error);
      }
      if (st == nullptr) return;
      Ort::GetApi().ReleaseStatus(st);  // no thread pool offered: fall through (no task has run then)
    }
    for (int64_t t = 0; t < num_tasks; ++t) fn(t);
  };
}

// fp32 scratch from the session's CPU allocator, returned to it when the call ends.
using CpuScratch = std::unique_ptr<float, std::function<void(float*)>>;

// `floats` floats of scratch; throws an Ort::Exception naming op_name when the allocator has none.
inline CpuScratch AllocateCpuScratch(OrtKernelContext* ctx, int64_t floats, const char* op_name) {
  const Ort::MemoryInfo info = Ort::MemoryInfo::CreateCpu(OrtDeviceAllocator, OrtMemTypeDefault);
  // KernelContext_GetAllocator hands out a new wrapper object on every call, which the caller
  // releases (ReleaseAllocator): here once the scratch has gone back to it.
  const std::shared_ptr<OrtAllocator> allocator(Ort::KernelContext(ctx).GetAllocator(*info),
                                                [](OrtAllocator* a) { Ort::GetApi().ReleaseAllocator(a); });
  const size_t bytes = static_cast<size_t>(floats) * sizeof(float);
  void* p = allocator->Alloc(allocator.get(), bytes);
  if (p == nullptr) {
    throw Ort::Exception(std::string(op_name) + ": ORT's CPU allocator returned no memory for " +
                             std::to_string(bytes) + " bytes of scratch",
                         ORT_RUNTIME_EXCEPTION);
  }
  return CpuScratch(static_cast<float*>(p), [allocator](float* q) { allocator->Free(allocator.get(), q); });
}

}  // namespace hcfuse
