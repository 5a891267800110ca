// Synthetic multi-tenant workloads and a runner that replays them against an Engine.
//
// A workload is a list of requests with arrival times: each request belongs to a tenant whose
// system prompt it starts with (tenants picked with Zipf popularity), followed by a private user
// suffix; arrivals are a Poisson process. This is the setting ChunkAttention targets: many
// requests share a few long system prompts (the paper's Table 2 lengths: 879 to 4257 tokens).
//
// RunWorkload submits each request at its arrival time (relative to the run's start), drains
// every stream on its own, and measures per request: time to first token (TTFT), time per output
// token after the first (TPOT), end to end latency; and overall: generated tokens per second,
// peak KV bytes referenced, prefix-hit rate. Used by chunkserve-demo and chunkserve-bench.
#ifndef CHUNKSERVE_RUNTIME_ENGINE_WORKLOAD_H_
#define CHUNKSERVE_RUNTIME_ENGINE_WORKLOAD_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "runtime/engine/engine.h"
#include "runtime/sched/request.h"

namespace chunkserve::engine {

struct WorkloadOptions {
  int32_t num_requests = 64;
  std::vector<int32_t> system_prompt_lengths = {1324, 879, 1432};  // one tenant each; may be empty
  int32_t min_suffix_tokens = 16;   // user part of each prompt, uniform in [min, max]
  int32_t max_suffix_tokens = 64;
  int32_t max_new_tokens = 32;
  double arrival_rate = 0.0;  // requests per second (Poisson); 0 = everything at t = 0
  double zipf_s = 1.0;        // tenant popularity exponent; 0 = uniform
  int32_t vocab_size = 1024;
  uint64_t seed = 1;
};

struct WorkloadRequest {
  double arrival_s = 0.0;
  int32_t tenant = -1;  // -1: no shared system prompt
  sched::RequestOptions request;
};

// Deterministic from options.seed. Token ids avoid nothing: every id in [0, vocab) may appear.
std::vector<WorkloadRequest> MakeWorkload(const WorkloadOptions& options);

struct Percentiles {
  double p50 = 0, p90 = 0, p99 = 0, mean = 0, max = 0;
};
Percentiles ComputePercentiles(std::vector<double> values);

struct WorkloadReport {
  int32_t requests = 0;
  int32_t failed = 0;            // ended with anything but stop token or length
  double wall_s = 0;
  uint64_t prompt_tokens = 0;
  uint64_t generated_tokens = 0;
  double generated_tokens_per_s = 0;  // generated tokens / wall time
  Percentiles ttft_ms, tpot_ms, e2e_ms;
  uint64_t kv_bytes_peak = 0;         // referenced by live sequences, shared chunks counted once
  uint64_t kv_bytes_if_unshared_peak = 0;
  double prefix_hit_rate = 0;         // cached prompt tokens / prompt tokens
  uint64_t preemptions = 0;
  uint64_t evicted_chunks = 0;
  int32_t peak_running = 0;           // largest running batch observed
  std::vector<std::vector<TokenId>> outputs;  // per request, in workload order
};

struct RunOptions {
  // Called about every progress_interval_s with the engine's stats and requests finished so far.
  std::function<void(const EngineStats&, int32_t finished, double elapsed_s)> progress;
  double progress_interval_s = 0.5;
};

// Replays `workload` against `engine`. Errors: the first Submit error (the run stops there).
Result<WorkloadReport> RunWorkload(Engine& engine, const std::vector<WorkloadRequest>& workload,
                                   const RunOptions& options = {});

}  // namespace chunkserve::engine

#endif  // CHUNKSERVE_RUNTIME_ENGINE_WORKLOAD_H_
