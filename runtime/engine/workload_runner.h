// Replays a workload (runtime/workload/workload.h, the project's one generator) against an
// in-process Engine.
//
// RunWorkload submits each request at its arrival time (relative to the run's start), records
// each stream's events through its callback (on the engine's step thread: no reader threads to
// take the CPU from the engine), and measures per request: time to first token (TTFT), time per output
// token after the first (TPOT), end to end latency; and overall: generated tokens per second,
// peak KV bytes referenced, prefix-hit rate. Used by chunkserve-demo and `chunkserve-bench engine`.
#ifndef CHUNKSERVE_RUNTIME_ENGINE_WORKLOAD_RUNNER_H_
#define CHUNKSERVE_RUNTIME_ENGINE_WORKLOAD_RUNNER_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "runtime/engine/engine.h"
#include "runtime/sched/request.h"
#include "runtime/workload/workload.h"

namespace chunkserve::engine {

struct Percentiles {
  double p50 = 0, p90 = 0, p99 = 0, mean = 0, max = 0;
};
Percentiles ComputePercentiles(std::vector<double> values);

struct WorkloadReport {
  int32_t requests = 0;
  int32_t failed = 0;  // ended with anything but stop token or length
  double wall_s = 0;
  uint64_t prompt_tokens = 0;
  uint64_t generated_tokens = 0;
  double generated_tokens_per_s = 0;  // generated tokens / wall time
  Percentiles ttft_ms, tpot_ms, e2e_ms;
  uint64_t kv_bytes_peak = 0;  // referenced by live sequences, shared chunks counted once
  uint64_t kv_bytes_if_unshared_peak = 0;
  double prefix_hit_rate = 0;  // cached prompt tokens / prompt tokens
  uint64_t preemptions = 0;
  uint64_t evicted_chunks = 0;
  int32_t peak_running = 0;                   // largest running batch observed
  std::vector<std::vector<TokenId>> outputs;  // per request, in workload order
};

struct RunOptions {
  // Called about every progress_interval_s with the engine's stats and requests finished so far.
  std::function<void(const EngineStats&, int32_t finished, double elapsed_s)> progress;
  double progress_interval_s = 0.5;
};

// Replays `workload` against `engine`: each request's prompt (its tokens; block-hash trace
// requests must carry synthesized ones) with max_new_tokens = output_tokens. Errors: the first
// Submit error (the run stops there).
Result<WorkloadReport> RunWorkload(Engine& engine,
                                   const std::vector<workload::WorkloadRequest>& workload,
                                   const RunOptions& options = {});

}  // namespace chunkserve::engine

#endif  // CHUNKSERVE_RUNTIME_ENGINE_WORKLOAD_RUNNER_H_
