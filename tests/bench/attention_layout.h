// The attention benchmarks' synthetic workload (the paper's): `batch` sequences of `np` context
// tokens whose leading `ns` tokens are one prefix shared by the whole batch (one physical copy),
// as TPP plan arrays and as per-sequence block lists for the paged baseline. Shared by the CPU
// (attention_bench.cc) and CUDA (attention_cuda.cc) runs so both time the same layout.
// TODO(cleanup): build the plan with runtime/plan's TppPlan over a PrefixTree instead.
#ifndef CHUNKSERVE_TESTS_BENCH_ATTENTION_LAYOUT_H_
#define CHUNKSERVE_TESTS_BENCH_ATTENTION_LAYOUT_H_

#include <cstdint>
#include <vector>

#include "kernels/attention_params.h"

namespace chunkserve::bench {

struct BenchLayout : kernels::TppPlanArrays {
  int32_t num_slots = 0;
  int64_t shared_tokens = 0;   // stored once
  int64_t private_tokens = 0;  // summed over sequences
  std::vector<int32_t> block_indptr{0}, block_slot, block_len;

  kernels::TppPlanView Plan() const { return View(); }
};

// Slots are handed out in a shuffled order, as a free list does after some churn. Every sequence
// shares the prefix; a batch of one has nobody to share with, so its prefix is private.
BenchLayout BuildBenchLayout(int32_t batch, int32_t chunk, int64_t np, int64_t ns);

}  // namespace chunkserve::bench

#endif  // CHUNKSERVE_TESTS_BENCH_ATTENTION_LAYOUT_H_
