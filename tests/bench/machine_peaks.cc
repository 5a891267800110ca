#include "tests/bench/machine_peaks.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace chunkserve::bench {
namespace {

using Clock = std::chrono::steady_clock;

bool HasAvx2Fma() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

bool HasAvx512() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f");
#else
  return false;
#endif
}

// Runs fn(thread_index) on `threads` threads released together; returns the wall time in seconds
// from the release to the last thread's end.
template <typename F>
double RunTogether(int32_t threads, F fn) {
  std::atomic<int32_t> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> pool;
  for (int32_t t = 1; t < threads; ++t) {
    pool.emplace_back([&, t] {
      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) {
      }
      fn(t);
    });
  }
  while (ready.load() < threads - 1) {
  }
  const auto start = Clock::now();
  go.store(true, std::memory_order_release);
  fn(0);
  for (std::thread& th : pool) th.join();
  return std::chrono::duration<double>(Clock::now() - start).count();
}

#if defined(__x86_64__) || defined(__i386__)
__attribute__((target("avx2"))) float SumAvx2(const float* p, size_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  for (size_t i = 0; i + 32 <= n; i += 32) {
    s0 = _mm256_add_ps(s0, _mm256_load_ps(p + i));
    s1 = _mm256_add_ps(s1, _mm256_load_ps(p + i + 8));
    s2 = _mm256_add_ps(s2, _mm256_load_ps(p + i + 16));
    s3 = _mm256_add_ps(s3, _mm256_load_ps(p + i + 24));
  }
  float out[8];
  _mm256_storeu_ps(out, _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
  return out[0] + out[1] + out[2] + out[3] + out[4] + out[5] + out[6] + out[7];
}

__attribute__((target("avx2,fma"))) float FmaLoopAvx2(int64_t iters, float seed) {
  __m256 a[12];
  for (int i = 0; i < 12; ++i) a[i] = _mm256_set1_ps(seed + 0.001f * i);
  const __m256 b = _mm256_set1_ps(0.999999f);
  const __m256 c = _mm256_set1_ps(1e-7f);
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) a[i] = _mm256_fmadd_ps(a[i], b, c);
  }
  __m256 s = a[0];
  for (int i = 1; i < 12; ++i) s = _mm256_add_ps(s, a[i]);
  float out[8];
  _mm256_storeu_ps(out, s);
  return out[0];
}

__attribute__((target("avx512f"))) float FmaLoopAvx512(int64_t iters, float seed) {
  __m512 a[12];
  for (int i = 0; i < 12; ++i) a[i] = _mm512_set1_ps(seed + 0.001f * i);
  const __m512 b = _mm512_set1_ps(0.999999f);
  const __m512 c = _mm512_set1_ps(1e-7f);
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) a[i] = _mm512_fmadd_ps(a[i], b, c);
  }
  __m512 s = a[0];
  for (int i = 1; i < 12; ++i) s = _mm512_add_ps(s, a[i]);
  float out[16];  // (not _mm512_reduce_add_ps: GCC 12 warns inside it, bug 105593)
  _mm512_storeu_ps(out, s);
  return out[0];
}
#endif

float SumPortable(const float* p, size_t n) {
  float s[8] = {};
  for (size_t i = 0; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) s[j] += p[i + j];
  }
  return s[0] + s[1] + s[2] + s[3] + s[4] + s[5] + s[6] + s[7];
}

float MulAddLoopPortable(int64_t iters, float seed) {
  float a[12][4];
  for (int i = 0; i < 12; ++i) {
    for (int j = 0; j < 4; ++j) a[i][j] = seed + 0.001f * i;
  }
  for (int64_t it = 0; it < iters; ++it) {
    for (int i = 0; i < 12; ++i) {
      for (int j = 0; j < 4; ++j) a[i][j] = a[i][j] * 0.999999f + 1e-7f;
    }
  }
  float s = 0.0f;
  for (int i = 0; i < 12; ++i) s += a[i][0];
  return s;
}

std::atomic<float> g_sink{0.0f};

}  // namespace

size_t LastLevelCacheBytes() {
  // sysfs first: glibc's sysconf reports the L3 of the whole package on some AMD parts (10x the
  // slice a core actually uses).
  for (const char* path : {"/sys/devices/system/cpu/cpu0/cache/index3/size",
                           "/sys/devices/system/cpu/cpu0/cache/index2/size"}) {
    std::ifstream f(path);
    size_t kib = 0;
    char unit = 0;
    if (f >> kib >> unit && unit == 'K' && kib > 0) return kib << 10;
  }
  const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
  return l3 > 0 ? std::min(static_cast<size_t>(l3), size_t{256} << 20) : size_t{32} << 20;
}

void* AllocateLarge(size_t bytes) {
  constexpr size_t kHuge = size_t{2} << 20;
  const size_t rounded = (bytes + kHuge - 1) / kHuge * kHuge;
  void* p = std::aligned_alloc(kHuge, rounded);
  if (p != nullptr) madvise(p, rounded, MADV_HUGEPAGE);
  return p;
}

ReadBandwidthProbe::ReadBandwidthProbe(int32_t threads, size_t buffer_bytes)
    : threads_(threads),
      floats_per_thread_((buffer_bytes > 0 ? buffer_bytes : LastLevelCacheBytes() * 4) /
                         sizeof(float) / threads / 32 * 32),
      buf_(static_cast<float*>(AllocateLarge(floats_per_thread_ * threads * sizeof(float)))) {
  if (buf_ == nullptr) return;
  RunTogether(threads_, [&](int32_t t) {
    float* mine = buf_ + floats_per_thread_ * t;
    for (size_t i = 0; i < floats_per_thread_; ++i) mine[i] = 1.0f;
  });
}

ReadBandwidthProbe::~ReadBandwidthProbe() { std::free(buf_); }

double ReadBandwidthProbe::Pass() {
  if (buf_ == nullptr || floats_per_thread_ == 0) return 0.0;
  const bool avx2 = HasAvx2Fma();
  const double seconds = RunTogether(threads_, [&](int32_t t) {
    const float* mine = buf_ + floats_per_thread_ * t;
#if defined(__x86_64__) || defined(__i386__)
    const float s =
        avx2 ? SumAvx2(mine, floats_per_thread_) : SumPortable(mine, floats_per_thread_);
#else
    const float s = SumPortable(mine, floats_per_thread_);
#endif
    g_sink.store(s, std::memory_order_relaxed);
  });
  return static_cast<double>(floats_per_thread_ * threads_ * sizeof(float)) / seconds / 1e9;
}

double MeasureReadBandwidth(int32_t threads, size_t buffer_bytes, int32_t passes) {
  ReadBandwidthProbe probe(threads, buffer_bytes);
  double best = 0.0;
  for (int32_t pass = 0; pass < passes; ++pass) best = std::max(best, probe.Pass());
  return best;
}

double MeasureFmaPeak(int32_t threads, FmaIsa isa) {
#if defined(__x86_64__) || defined(__i386__)
  if ((isa == FmaIsa::kAvx2 && !HasAvx2Fma()) || (isa == FmaIsa::kAvx512 && !HasAvx512())) {
    return 0.0;
  }
#else
  if (isa != FmaIsa::kPortable) return 0.0;
#endif
  constexpr int64_t kIters = 20'000'000;
  double best = 0.0;
  for (int pass = 0; pass < 3; ++pass) {
    const double seconds = RunTogether(threads, [&](int32_t t) {
      float s = 0.0f;
#if defined(__x86_64__) || defined(__i386__)
      if (isa == FmaIsa::kAvx512) s = FmaLoopAvx512(kIters, 0.5f + t);
      if (isa == FmaIsa::kAvx2) s = FmaLoopAvx2(kIters, 0.5f + t);
#endif
      if (isa == FmaIsa::kPortable) s = MulAddLoopPortable(kIters, 0.5f + t);
      g_sink.store(s, std::memory_order_relaxed);
    });
    const double lanes = isa == FmaIsa::kAvx512 ? 16.0 * 12.0
                         : isa == FmaIsa::kAvx2 ? 8.0 * 12.0
                                                : 4.0 * 12.0;
    best = std::max(best, 2.0 * lanes * static_cast<double>(kIters) * threads / seconds / 1e9);
  }
  return best;
}

const char* FmaIsaName(FmaIsa isa) {
  return isa == FmaIsa::kAvx512 ? "avx512" : isa == FmaIsa::kAvx2 ? "avx2" : "portable";
}

namespace {

// Every ISA's peak into `peaks`, keeping the best of this and earlier measurements; the floor is
// the best ISA's.
void MeasureFmaPeaks(MachinePeaks* peaks) {
  for (const FmaIsa isa : {FmaIsa::kPortable, FmaIsa::kAvx2, FmaIsa::kAvx512}) {
    double& slot = peaks->fma_gflops_by_isa[static_cast<int>(isa)];
    slot = std::max(slot, MeasureFmaPeak(peaks->threads, isa));
    if (slot > peaks->fma_gflops) {
      peaks->fma_gflops = slot;
      peaks->fma_isa = isa;
    }
  }
}

}  // namespace

MachinePeaks MeasureMachinePeaks(int32_t threads, size_t buffer_bytes) {
  MachinePeaks peaks;
  peaks.threads = std::max<int32_t>(1, threads);
  peaks.buffer_bytes =
      buffer_bytes > 0 ? buffer_bytes : std::max(LastLevelCacheBytes() * 16, size_t{512} << 20);
  peaks.read_gbs = MeasureReadBandwidth(peaks.threads, peaks.buffer_bytes, 5);
  peaks.read_gbs_low = peaks.read_gbs;
  MeasureFmaPeaks(&peaks);
  return peaks;
}

void RemeasureMachinePeaks(MachinePeaks* peaks) {
  const double bw = MeasureReadBandwidth(peaks->threads, peaks->buffer_bytes, 2);
  peaks->read_gbs = std::max(peaks->read_gbs, bw);
  peaks->read_gbs_low = std::min(peaks->read_gbs_low, bw);
  MeasureFmaPeaks(peaks);
}

void FlushCaches(kernels::cpu::ThreadPool& pool) {
  static const size_t bytes = LastLevelCacheBytes() * 3;
  static unsigned char* buf = static_cast<unsigned char*>(AllocateLarge(bytes));
  if (buf == nullptr) return;
  static unsigned char round = 0;
  ++round;
  // Many more parts than threads: the pool hands them out as its threads wake, so each takes some.
  constexpr int64_t kParts = 64;
  std::atomic<unsigned> sum{0};
  auto part = [&](int64_t begin, int64_t end, int32_t) {
    for (int64_t k = begin; k < end; ++k) {
      const size_t lo = bytes * static_cast<size_t>(k) / kParts / 64 * 64;
      const size_t hi = bytes * static_cast<size_t>(k + 1) / kParts / 64 * 64;
      std::memset(buf + lo, round, hi - lo);
      unsigned s = 0;
      for (size_t i = lo; i < hi; i += 64) s += buf[i];
      sum.fetch_add(s, std::memory_order_relaxed);
    }
  };
  pool.ParallelFor(kParts, 1, 0, part);
  g_sink.store(static_cast<float>(sum.load()), std::memory_order_relaxed);
}

}  // namespace chunkserve::bench
