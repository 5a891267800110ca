// `chunkserve-bench attention --device cuda`: the same workload, flags and JSON fields as the CPU
// attention benchmark (attention_bench.cc), run with the CUDA kernels. Built only with CUDA.
#ifndef CHUNKSERVE_TESTS_BENCH_ATTENTION_CUDA_H_
#define CHUNKSERVE_TESTS_BENCH_ATTENTION_CUDA_H_

#include <cstdint>
#include <vector>

#include "kernels/attention_params.h"

namespace chunkserve::bench {

struct CudaAttentionOptions {
  int64_t np = 2048;
  int64_t ns = 2048;
  int32_t batch = 32;
  int32_t heads = 32;
  int32_t kv_heads = 32;
  int32_t head_dim = 128;
  int32_t chunk = 64;
  kernels::DType kv_dtype = kernels::DType::kF16;
  int32_t iters = 10;
  bool json = false;
  bool warm = false;
  bool grid = false;
  std::vector<int32_t> sweep_batches;
  int32_t ctas_per_sm = 4;  // TppScheduleOptions::target_ctas_per_sm
};

// Exit code 77 when the machine has no CUDA device (after printing "no CUDA device"), 2 for a
// shape the CUDA kernels do not support, 1 when a kernel fails or TPP and paged disagree.
inline constexpr int kNoCudaDeviceExitCode = 77;
int RunCudaAttentionBench(const CudaAttentionOptions& options);

}  // namespace chunkserve::bench

#endif  // CHUNKSERVE_TESTS_BENCH_ATTENTION_CUDA_H_
