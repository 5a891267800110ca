#include "kernels/cpu/cpu_isa.h"

#include <cstdlib>
#include <cstring>

namespace chunkserve::kernels::cpu {
namespace {

CpuIsa EnvironmentIsa() {
  static const CpuIsa isa = ParseCpuIsa(std::getenv("CHUNKSERVE_CPU_ISA"));
  return isa;
}

}  // namespace

const char* KernelStatusName(KernelStatus status) {
  switch (status) {
    case KernelStatus::kOk:
      return "ok";
    case KernelStatus::kInvalidArgument:
      return "invalid argument";
    case KernelStatus::kUnsupported:
      return "unsupported";
    case KernelStatus::kResourceExhausted:
      return "resource exhausted";
  }
  return "unknown";
}

CpuIsa DetectCpuIsa() {
  static const CpuIsa isa = [] {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
        __builtin_cpu_supports("f16c")) {
      if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
        return CpuIsa::kAvx512;
      }
      return CpuIsa::kAvx2;
    }
#endif
    return CpuIsa::kScalar;
  }();
  return isa;
}

bool CpuSupports(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAvx512:
      return DetectCpuIsa() == CpuIsa::kAvx512;
    case CpuIsa::kAvx2:
      return DetectCpuIsa() == CpuIsa::kAvx2 || DetectCpuIsa() == CpuIsa::kAvx512;
    default:
      return true;
  }
}

CpuIsa ParseCpuIsa(const char* text, bool* ok) {
  if (ok != nullptr) *ok = true;
  if (text == nullptr || *text == '\0' || std::strcmp(text, "auto") == 0) return CpuIsa::kAuto;
  if (std::strcmp(text, "scalar") == 0) return CpuIsa::kScalar;
  if (std::strcmp(text, "avx2") == 0) return CpuIsa::kAvx2;
  if (std::strcmp(text, "avx512") == 0) return CpuIsa::kAvx512;
  if (ok != nullptr) *ok = false;
  return CpuIsa::kAuto;
}

const char* CpuIsaName(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAuto:
      return "auto";
    case CpuIsa::kScalar:
      return "scalar";
    case CpuIsa::kAvx2:
      return "avx2";
    case CpuIsa::kAvx512:
      return "avx512";
  }
  return "unknown";
}

CpuIsa ResolveCpuIsa(CpuIsa requested, KernelStatus* status) {
  CpuIsa isa = requested;
  if (isa == CpuIsa::kAuto) isa = EnvironmentIsa();
  if (isa == CpuIsa::kAuto) isa = DetectCpuIsa();
  if (!CpuSupports(isa)) {
    *status = KernelStatus::kUnsupported;
    return CpuIsa::kScalar;
  }
  *status = KernelStatus::kOk;
  return isa;
}

}  // namespace chunkserve::kernels::cpu
