// A discrete-event simulator of one router in front of many simulated workers.
//
// It runs the real routing code (RouterCore: PrefixIndex, LoadTracker, the policies of
// routing.h) against workers modeled at iteration level, so a policy can be studied at scales
// (hundreds of workers, tens of thousands of requests) no test machine can serve for real.
//
// Worker model (each worker independently):
//  - KV cache: kv_capacity_chunks chunks of chunk_size tokens. A request's full prompt chunks
//    are identified by the chained chunk hash (the router computes the same hashes); chunks of
//    running requests are pinned (shared by hash), the rest of a request's tokens (partial last
//    chunk + output) occupy private chunks. Unpinned hashed chunks are retained in LRU order and
//    evicted when an admission needs room -- each store and eviction is a KV event, delivered to
//    the router's index kv_event_delay_s later, in batches per engine step, with sequence numbers
//    exactly as a real worker numbers them. A snapshot is sent at start.
//  - Admission: FIFO; a request is admitted when the batch has room (max_batch_size) and its new
//    chunks fit (after evicting retained chunks); it then hits the longest cached prefix of its
//    chain (at most prompt - 1 tokens, as the engine must compute the last prompt token). As in
//    the engine's scheduler, a request whose next uncached chunk a running request is still
//    prefilling is deferred until that chunk is stored (requests behind it may pass).
//  - Steps: each step decodes one token for every prefilled running request and prefills up to
//    prefill_chunk_tokens uncached prompt tokens (chunked prefill, FIFO over admitted requests).
//    step time = step_overhead_s + prefilled tokens / prefill_tokens_per_s
//                + decoding requests * decode_s_per_seq.
//    A request's first token comes at the end of the step that finishes its prefill (TTFT), its
//    last after output_tokens - 1 more decode steps.
//  - Load reports reach the router every load_report_interval_s (measured rates included). Their
//    queued prefill is the running requests' remaining prefill plus, per waiting request, the
//    prompt tokens past the leading chunks that were cached, being prefilled or in the chain of
//    a request queued ahead of it when it joined (as worker/queued_prefill.h counts them);
//    between reports the router counts its own picks (LoadTracker).
//
// Routing cost and network delay are not modeled (the router decision is ~microseconds; see the
// router bench). Everything is deterministic given the workload seed: ties in the event queue are
// broken by insertion order.
//
// Thread safety: RunSimulation is reentrant (no shared state).
#ifndef CHUNKSERVE_ROUTER_SIM_SIMULATOR_H_
#define CHUNKSERVE_ROUTER_SIM_SIMULATOR_H_

#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "router/routing.h"
#include "runtime/workload/workload.h"

namespace chunkserve::router::sim {

struct SimWorkerOptions {
  int32_t kv_capacity_chunks = 1536;  // 96K tokens at chunk 64 (a 7B model on an 80 GB GPU)
  int32_t max_batch_size = 32;
  double prefill_tokens_per_s = 16000;
  int32_t prefill_chunk_tokens = 2048;  // prefill tokens per step at most
  double step_overhead_s = 0.012;
  double decode_s_per_seq = 0.00025;
};

struct SimOptions {
  int32_t num_workers = 16;
  int32_t chunk_size = 64;
  SimWorkerOptions worker;
  double kv_event_delay_s = 0.05;  // worker -> router KV event latency
  double load_report_interval_s = 0.1;
  RouterCoreOptions router;             // policy_kind chooses the policy under test
  uint64_t model_fingerprint = 0x5151;  // only seeds the chunk hash chain
  // Observability (none changes the simulated outcome):
  FILE* log = nullptr;    // one JSON line per finished request (see RunSimulation)
  bool progress = false;  // a progress line on stderr every ~2 s of wall time, and at the end
};

struct SimWorkerStats {
  int64_t requests = 0;  // routed to this worker
  uint64_t prompt_tokens = 0;
  uint64_t cached_tokens = 0;
  double work_s = 0;  // prefill + decode compute seconds
  double busy_s = 0;  // stepping, step overhead included
  uint64_t evictions = 0;
  int64_t max_queue = 0;  // longest waiting queue seen
};

struct LatencySummary {
  double mean = 0, p50 = 0, p99 = 0;
};

struct SimReport {
  std::string policy;
  int64_t requests = 0;
  int64_t completed = 0;
  uint64_t prompt_tokens = 0;
  uint64_t cached_tokens = 0;  // prompt tokens that hit the worker's cache
  double hit_rate = 0;         // cached / prompt tokens
  LatencySummary ttft_s, e2e_s;
  double makespan_s = 0;      // first arrival to last completion
  double throughput_rps = 0;  // completed / makespan
  double output_tokens_per_s = 0;
  double busy_fraction = 0;                 // mean fraction of the makespan a worker was stepping
  double batch_occupancy = 0;               // time-averaged running / max_batch_size, all workers
  double load_imbalance = 0;                // max / mean of per-worker work (prefill + decode
                                            // compute seconds, step overhead excluded)
  double precision = 0;                     // predicted cached tokens that were there
  double recall = 0;                        // cached tokens that were predicted
  uint64_t kv_evictions = 0;                // chunks evicted by all workers
  uint64_t index_bytes = 0;                 // router index bytes at the end
  std::vector<int64_t> reasons;             // decisions per DecisionReason value
  std::vector<double> ttft_mean_by_reason;  // mean TTFT (s) of the requests of each reason
  std::vector<SimWorkerStats> workers;      // per worker, by index
  uint64_t events = 0;                      // discrete events processed
  uint64_t deferred_admissions = 0;         // admission attempts deferred behind a prefill
  double cpu_s = 0;                         // CPU seconds of the run (std::clock)
  double events_per_cpu_s = 0;
  double requests_per_cpu_s = 0;
  // Filled by the caller (ComputeOracles on the same workload), 0 when not computed.
  double oracle_infinite = 0;
  double oracle_affinity = 0;
};

// Reference hit rates of a workload, independent of any policy and of timing (printed beside
// every policy's result):
//  - infinite: one cache of unlimited size that every request reaches: a request hits the
//    longest prefix of its chain that any earlier request had (at most prompt - 1 tokens).
//  - affinity ("perfect affinity"): num_workers caches of kv_capacity_chunks chunks each, LRU
//    (a served request's chain becomes most recent, its root last); every request goes to the
//    worker with the longest cached prefix, known exactly and at once, among the workers whose
//    prefill work so far (uncached tokens) is at most affinity_slack x the mean plus this
//    request's prompt -- so a prefix shared by all traffic cannot pull everything onto one
//    worker; ties and new prefixes go by rendezvous hashing on the first chunk. It is a strong
//    reference, not a proven bound: a policy may exceed it.
struct OracleReport {
  uint64_t prompt_tokens = 0;
  uint64_t infinite_cached_tokens = 0;
  uint64_t affinity_cached_tokens = 0;
  double infinite_hit_rate = 0;
  double affinity_hit_rate = 0;
};
Result<OracleReport> ComputeOracles(const SimOptions& options, workload::WorkloadSource& source,
                                    double affinity_slack = 1.25);

// The chunk hash chain the simulator uses for a request (real hashes of its tokens, or the
// block-id derived chain of a block-hash trace request).
Result<std::vector<uint64_t>> RequestChain(const workload::WorkloadRequest& request,
                                           uint64_t chain_seed, int32_t chunk_size);

// Runs one policy over the workload `source` (consumed). With options.log, each finished request
// writes {"policy", "id", "arrival_s", "worker", "reason", "prompt_tokens",
// "predicted_cached_tokens", "cached_tokens", "ttft_s", "first_token_s", "end_s",
// "output_tokens"} as one line (times in simulated seconds since the start). InvalidArgument for
// bad options; a request that can never fit a worker's KV cache is an error too (the workload is
// too long).
Result<SimReport> RunSimulation(const SimOptions& options, workload::WorkloadSource& source);

// Renders reports as an aligned text table / a JSON array.
std::string FormatTable(const std::vector<SimReport>& reports);
std::string ToJson(const std::vector<SimReport>& reports);
// One report's per-worker figures as a text table.
std::string FormatWorkerTable(const SimReport& report);

}  // namespace chunkserve::router::sim

#endif  // CHUNKSERVE_ROUTER_SIM_SIMULATOR_H_
