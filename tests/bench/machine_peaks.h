// This machine's limits, measured by the benchmarks themselves in the same run: the floors that
// benchmark efficiencies are computed against.
//
//  * Read bandwidth: every thread streams its slice of a buffer much larger than the last-level
//    cache (AVX2 loads where available); best of several passes, so the floor is optimistic.
//  * FMA peak: every thread runs a loop of independent register-resident FMAs (12 accumulators of
//    16 fp32 lanes with AVX-512, 8 with AVX2+FMA, 4-lane multiply-add portably), for every ISA the
//    CPU has; FLOPs count 2 per lane per FMA. The floor is the best ISA's: on a Zen 5 AVX-512
//    doubles it, on a Zen 4 (512-bit ops in two halves) it does not.
#ifndef CHUNKSERVE_TESTS_BENCH_MACHINE_PEAKS_H_
#define CHUNKSERVE_TESTS_BENCH_MACHINE_PEAKS_H_

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/thread_pool.h"

namespace chunkserve::bench {

enum class FmaIsa : int32_t { kPortable = 0, kAvx2 = 1, kAvx512 = 2 };
const char* FmaIsaName(FmaIsa isa);  // "portable", "avx2", "avx512"

struct MachinePeaks {
  int32_t threads = 1;
  double read_gbs = 0.0;               // GB/s (1e9 bytes): the best measured so far
  double fma_gflops = 0.0;             // GFLOP/s, fp32: the best measured so far, over every ISA
  FmaIsa fma_isa = FmaIsa::kPortable;  // the ISA that reached fma_gflops
  double fma_gflops_by_isa[3] = {};    // by FmaIsa; 0 for an ISA the CPU lacks
  double read_gbs_low = 0.0;           // the worst bandwidth measured so far (shared machines vary)
  size_t buffer_bytes = 0;
};

// Measures both with `threads` threads over a buffer of `buffer_bytes` (0: 16x the L3 size or
// 512 MiB, whichever is larger).
MachinePeaks MeasureMachinePeaks(int32_t threads, size_t buffer_bytes = 0);

// Measures again (fewer passes) and keeps the best values: on a shared or virtualized machine the
// bandwidth available changes over minutes, and a floor must use what the machine can do.
void RemeasureMachinePeaks(MachinePeaks* peaks);

double MeasureReadBandwidth(int32_t threads, size_t buffer_bytes, int32_t passes);

// The read-bandwidth measurement above with its buffer kept between passes, for sampling the
// bandwidth the machine gives right now (beside timed iterations: a shared host's changes from
// second to second). Pass() streams the buffer once with `threads` threads and returns GB/s (0
// when the buffer could not be allocated); the default buffer is 4x the last-level cache, about 4
// ms at 30 GB/s.
class ReadBandwidthProbe {
 public:
  explicit ReadBandwidthProbe(int32_t threads, size_t buffer_bytes = 0);
  ~ReadBandwidthProbe();
  ReadBandwidthProbe(const ReadBandwidthProbe&) = delete;
  ReadBandwidthProbe& operator=(const ReadBandwidthProbe&) = delete;

  double Pass();

 private:
  int32_t threads_;
  size_t floats_per_thread_;
  float* buf_;
};
double MeasureFmaPeak(int32_t threads, FmaIsa isa);  // 0 when the CPU lacks `isa`

// Evicts the caches by streaming a buffer of several times the last-level cache (reads and writes,
// a few ms); benchmarks call it between timed iterations to measure cold-cache kernels. The
// pool's threads stream the buffer together: every core's private caches are evicted, and the
// pool's threads are awake when the timed call starts, as they are between the layers of a decode
// step (flushed from one thread, the pool's other threads had gone to sleep, and waking them cost
// 50-80 us of a 3 ms attention call).
void FlushCaches(kernels::cpu::ThreadPool& pool);

// Last-level cache size in bytes from sysconf, or 32 MiB when unknown.
size_t LastLevelCacheBytes();

// Allocates `bytes` aligned to 2 MiB and asks for transparent huge pages (benchmarks use it for
// big buffers, such as the KV arena, so page walks do not distort streaming). Free with std::free.
void* AllocateLarge(size_t bytes);

}  // namespace chunkserve::bench

#endif  // CHUNKSERVE_TESTS_BENCH_MACHINE_PEAKS_H_
