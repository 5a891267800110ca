// The simulator's internals, shared by the files that implement it (not a public header):
//   simulator.cc     the event loop (arrivals routed by the RouterCore under test, KV event
//                    deliveries, load report ticks), the run's report, RunSimulation
//   worker_model.cc  the simulated workers: KV cache and its events, admission, steps (chunked
//                    prefill and decode), finishing a request (and its per-request log line),
//                    load reports
// The model is described in router/sim/simulator.h. One Simulation runs one policy over one
// workload on the caller's thread, once.
#ifndef CHUNKSERVE_ROUTER_SIM_SIMULATION_INTERNAL_H_
#define CHUNKSERVE_ROUTER_SIM_SIMULATION_INTERNAL_H_

#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <queue>
#include <string>
#include <unordered_map>
#include <vector>

#include "router/routing.h"
#include "router/sim/simulator.h"
#include "runtime/kvcache/chunk_hash.h"
#include "runtime/workload/workload.h"

namespace chunkserve::router::sim::simulation_internal {

struct Request {
  uint64_t id = 0;
  double arrival = 0;
  int64_t prompt_tokens = 0;
  int32_t output_tokens = 1;
  std::vector<uint64_t> chain;
  int32_t worker = -1;
  int32_t reason = 0;  // DecisionReason of the routing decision
  int64_t predicted_cached = 0;
  // Set at admission.
  int32_t matched_chunks = 0;
  int64_t cached_tokens = 0;
  int64_t prefill_remaining = 0;
  int32_t private_chunks = 0;
  // Progress.
  int32_t decoded = 0;
  double first_token = -1;
  int64_t step_prefill = 0;      // tokens prefilled in the current step
  // Prompt tokens this request adds to the worker's prefill when it joins the queue: its chain
  // chunks neither cached, nor being prefilled, nor in the chain of a request queued before it.
  int64_t enqueue_uncached = 0;
};

struct CacheEntry {
  int32_t refs = 0;
  std::list<uint64_t>::iterator lru;  // valid when refs == 0
};

struct Worker {
  std::unordered_map<uint64_t, CacheEntry> cache;
  std::list<uint64_t> lru;  // retained hashes, front = least recently released
  int64_t used_chunks = 0;  // cached hashes (pinned + retained) + reserved + private chunks
  std::deque<Request*> waiting;
  std::unordered_map<uint64_t, int32_t> inflight;  // chunks being prefilled -> requests
  // Chain chunks of the requests in `waiting` -> how many of them: a request joining the queue
  // behind one that will prefill the same prefix counts only what it adds (QueuedChunks).
  std::unordered_map<uint64_t, int32_t> queued;
  int64_t waiting_uncached = 0;                    // sum of enqueue_uncached over `waiting`
  std::vector<Request*> running;                   // admission order
  bool busy = false;
  double busy_time = 0;
  double work_s = 0;       // prefill + decode compute seconds (step overhead excluded)
  double occupancy_s = 0;  // integral of running / max_batch_size over step time
  double last_decode_rate = 0;   // the last step's decode tokens / its decoding time, as the
                                 // engine reports (runtime/engine/rate_window.h)
  double best_prefill_rate = 0;  // prefill tokens / step time, best prefill-only step
  uint64_t sequence = 0;
  KvEventBatch pending;  // events of the current step
  SimWorkerStats stats;
  std::deque<KvEventBatch> in_transit;
  uint64_t evictions = 0;
};

enum class EventType : int32_t { kArrival, kStepEnd, kKvDelivery, kLoadReport };

struct Event {
  double t;
  uint64_t order;
  EventType type;
  int32_t worker;
  bool operator>(const Event& o) const { return t != o.t ? t > o.t : order > o.order; }
};

class Simulation {
 public:
  Simulation(const SimOptions& o, workload::WorkloadSource& source,
             std::unique_ptr<RouterCore> core)
      : o_(o),
        source_(source),
        core_(std::move(core)),
        seed_(kv::ChunkHashSeed(o.model_fingerprint, o.chunk_size)),
        workers_(static_cast<size_t>(o.num_workers)) {}

  // Runs the event loop until no event is left; then the report.
  Result<SimReport> Run();

 private:
  // --- the event loop (simulator.cc) ---
  void Push(double t, EventType type, int32_t worker);
  // Reads the workload's next request and schedules its arrival (none left: next_arrival_ empty).
  Status PullArrival();
  // Routes next_arrival_ and queues it on the chosen worker.
  Status Arrive();
  SimReport Report();

  // --- the worker model (worker_model.cc) ---
  // Leading chunks of r's chain that w holds (pinned or retained).
  int32_t MatchChunks(const Worker& w, const Request& r) const;
  int64_t EnqueueUncached(const Worker& w, const Request& r) const;
  // Numbers one KV event and adds it to w's batch of the current step.
  void Emit(Worker& w, bool stored, uint64_t hash, uint64_t parent);
  void Admit(Worker& w);
  // Admits and starts a step on an idle worker that has work.
  Status StartStep(uint32_t wi);
  // Ends a worker's step: prefill and decode progress, first tokens, finished requests, the
  // step's KV events sent; then the next step.
  Status StepEnd(int32_t wi);
  void FinishPrefill(Worker& w, Request& r);
  // Unpins r's chunks, counts it, writes its log line and tells the router.
  Status Finish(Worker& w, Request& r);
  // Sends worker wi's load to the router.
  void ReportLoad(int32_t wi);

  const SimOptions& o_;
  workload::WorkloadSource& source_;
  std::unique_ptr<RouterCore> core_;
  const uint64_t seed_;
  std::vector<Worker> workers_;
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> events_;
  uint64_t order_ = 0;
  double now_ = 0;
  std::unique_ptr<Request> next_arrival_;
  std::unordered_map<uint64_t, std::unique_ptr<Request>> active_;
  std::vector<double> ttft_, e2e_;
  uint64_t prompt_tokens_ = 0, cached_tokens_ = 0, output_tokens_ = 0;
  int64_t requests_ = 0;
  double first_arrival_ = 1e300, last_finish_ = 0;
  uint64_t events_done_ = 0;
  uint64_t deferred_ = 0;
  double cpu_s_ = 0;
  std::string policy_name_ = std::string(core_->policy().name());
  std::array<int64_t, 9> reasons_{};
  std::array<double, 9> ttft_sum_by_reason_{};
};

}  // namespace chunkserve::router::sim::simulation_internal

#endif  // CHUNKSERVE_ROUTER_SIM_SIMULATION_INTERNAL_H_
