// The library's one exported entry point: ONNX Runtime calls RegisterCustomOps when a session's
// options register this library. It adds com.microsoft::HyperConnectionLowRankMix for every
// provider built in, and ai.hcfuse::HyperConnectionLowRankMixNBits likewise. The ORT API comes from the pointer ORT passes (ORT_API_MANUAL_INIT:
// no link against libonnxruntime), and no exception crosses this C boundary.
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ort/hc_lowrank_mix_nbits_op.h"
#include "ort/hc_lowrank_mix_nbits_op_cpu.h"
#include "ort/hc_lowrank_mix_op.h"
#ifdef HCFUSE_WITH_CUDA
#include "ort/hc_lowrank_mix_nbits_op_cuda.h"
#include "ort/hc_lowrank_mix_op_cuda.h"
#endif

namespace {

constexpr const char* kDomain = "com.microsoft";

// ORT keeps raw pointers to the domain: it lives as long as the process.
void KeepDomainAlive(Ort::CustomOpDomain&& domain) {
  static std::mutex mu;
  static std::vector<Ort::CustomOpDomain> domains;
  std::lock_guard<std::mutex> lock(mu);
  domains.push_back(std::move(domain));
}

}  // namespace

extern "C" __attribute__((visibility("default"))) OrtStatus* ORT_API_CALL
RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* api_base) {
  const OrtApi* api = api_base->GetApi(ORT_API_VERSION);
  if (api == nullptr) {
    // An ORT older than our headers. CreateStatus is the first entry of every version of OrtApi, so
    // version 1 can still say why instead of registering nothing in silence.
    const OrtApi* v1 = api_base->GetApi(1);
    if (v1 == nullptr) return nullptr;
    char message[256];
    std::snprintf(message, sizeof message,
                  "hcfuse RegisterCustomOps: this library needs ONNX Runtime C API version %d or newer; the loaded "
                  "ONNX Runtime is %s",
                  ORT_API_VERSION, api_base->GetVersionString());
    return v1->CreateStatus(ORT_FAIL, message);
  }
  Ort::InitApi(api);
  try {
    Ort::CustomOpDomain domain{kDomain};
    hcfuse::RegisterCpuOps(domain);
    Ort::CustomOpDomain nbits_domain{hcfuse::kNBitsDomain};
    hcfuse::RegisterNBitsCpuOps(nbits_domain);
#ifdef HCFUSE_WITH_CUDA
    hcfuse::RegisterCudaOps(domain);
    hcfuse::RegisterNBitsCudaOps(nbits_domain);
#endif
    Ort::UnownedSessionOptions session_options(options);
    session_options.Add(domain);
    session_options.Add(nbits_domain);
    KeepDomainAlive(std::move(domain));
    KeepDomainAlive(std::move(nbits_domain));
    return nullptr;
  } catch (const Ort::Exception& e) {
    return api->CreateStatus(e.GetOrtErrorCode(), e.what());
  } catch (const std::exception& e) {
    return api->CreateStatus(ORT_RUNTIME_EXCEPTION, (std::string("hcfuse RegisterCustomOps: ") + e.what()).c_str());
  } catch (...) {
    return api->CreateStatus(ORT_RUNTIME_EXCEPTION, "hcfuse RegisterCustomOps: unknown exception");
  }
}
