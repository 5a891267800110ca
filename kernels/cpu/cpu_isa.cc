#include "kernels/cpu/cpu_isa.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace chunkserve::kernels::cpu {
namespace {

CpuIsa EnvironmentIsa() {
  static const CpuIsa isa = ParseCpuIsa(std::getenv("CHUNKSERVE_CPU_ISA"));
  return isa;
}

#if defined(__x86_64__) || defined(__i386__)
// kChains independent FMA chains (more than latency x pipes on any core we know) over `iters`
// steps; returns seconds. The result is summed and passed to an empty asm so nothing is dropped.
constexpr int kChains = 12;

__attribute__((target("avx2,fma"))) double YmmFmaSeconds(int64_t iters) {
  __m256 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm256_set1_ps(static_cast<float>(i));
  const __m256 a = _mm256_set1_ps(0.999999f);
  const __m256 b = _mm256_set1_ps(1e-7f);
  const auto start = std::chrono::steady_clock::now();
  for (int64_t n = 0; n < iters; ++n) {
    for (int i = 0; i < kChains; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  }
  const auto stop = std::chrono::steady_clock::now();
  __m256 sum = acc[0];
  for (int i = 1; i < kChains; ++i) sum = _mm256_add_ps(sum, acc[i]);
  float out[8];
  _mm256_storeu_ps(out, sum);
  asm volatile("" : : "r"(out[0]));
  return std::chrono::duration<double>(stop - start).count();
}

__attribute__((target("avx512f,avx2,fma"))) double ZmmFmaSeconds(int64_t iters) {
  __m512 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  const __m512 a = _mm512_set1_ps(0.999999f);
  const __m512 b = _mm512_set1_ps(1e-7f);
  const auto start = std::chrono::steady_clock::now();
  for (int64_t n = 0; n < iters; ++n) {
    for (int i = 0; i < kChains; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  }
  const auto stop = std::chrono::steady_clock::now();
  __m512 sum = acc[0];
  for (int i = 1; i < kChains; ++i) sum = _mm512_add_ps(sum, acc[i]);
  float out[16];
  _mm512_storeu_ps(out, sum);
  asm volatile("" : : "r"(out[0]));
  return std::chrono::duration<double>(stop - start).count();
}
#endif

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

double WideFmaSpeedup() {
  static const double speedup = [] {
#if defined(__x86_64__) || defined(__i386__)
    if (DetectCpuIsa() != CpuIsa::kAvx512) return 0.0;
    // Interleaved passes, the best time of each width: a pass the scheduler or an interrupt cut
    // into only loses. The first passes also bring the core out of any low-power state.
    constexpr int64_t kIters = 4000;  // 48k FMAs per pass, ~10 us on a 4 GHz core
    double ymm = 1e9;
    double zmm = 1e9;
    for (int pass = 0; pass < 10; ++pass) {
      ymm = std::min(ymm, YmmFmaSeconds(kIters));
      zmm = std::min(zmm, ZmmFmaSeconds(kIters));
    }
    if (ymm <= 0.0 || zmm <= 0.0) return 0.0;  // a clock too coarse to tell: stay on AVX2
    return 2.0 * ymm / zmm;                    // twice the lanes per instruction
#else
    return 0.0;
#endif
  }();
  return speedup;
}

CpuIsa ResolveAttentionIsa(CpuIsa requested, KernelStatus* status) {
  const CpuIsa isa = ResolveCpuIsa(requested, status);
  if (requested == CpuIsa::kAuto && EnvironmentIsa() == CpuIsa::kAuto && isa == CpuIsa::kAvx512 &&
      WideFmaSpeedup() < kWideFmaPays) {
    return CpuIsa::kAvx2;
  }
  return isa;
}

}  // namespace chunkserve::kernels::cpu
