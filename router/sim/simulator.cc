// The simulator's event loop: one priority queue of timed events (arrivals, step ends, KV
// event deliveries, load report ticks), ties broken by insertion order; the worker model it
// drives is in worker_model.cc.
#include "router/sim/simulator.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <optional>
#include <utility>

#include "router/sim/simulation_internal.h"
#include "runtime/kvcache/chunk_hash.h"

namespace chunkserve::router::sim {
namespace {

double Percentile(std::vector<double>& v, double q) {
  if (v.empty()) return 0;
  const auto k = static_cast<size_t>(std::min<double>(v.size() - 1, std::floor(q * v.size())));
  std::nth_element(v.begin(), v.begin() + static_cast<ptrdiff_t>(k), v.end());
  return v[k];
}

LatencySummary Summarize(std::vector<double> v) {
  LatencySummary s;
  if (v.empty()) return s;
  double sum = 0;
  for (double x : v) sum += x;
  s.mean = sum / static_cast<double>(v.size());
  s.p50 = Percentile(v, 0.5);
  s.p99 = Percentile(v, 0.99);
  return s;
}

Status Validate(const SimOptions& o) {
  auto bad = [](const std::string& m) { return Status::InvalidArgument("sim: " + m); };
  if (o.num_workers < 1 || o.num_workers > 100000) return bad("num_workers not in [1, 100000]");
  if (o.chunk_size < 1) return bad("chunk_size must be >= 1");
  const SimWorkerOptions& w = o.worker;
  if (w.kv_capacity_chunks < 1) return bad("kv_capacity_chunks must be >= 1");
  if (w.max_batch_size < 1) return bad("max_batch_size must be >= 1");
  if (!(w.prefill_tokens_per_s > 0)) return bad("prefill_tokens_per_s must be > 0");
  if (w.prefill_chunk_tokens < 1) return bad("prefill_chunk_tokens must be >= 1");
  if (!(w.step_overhead_s > 0)) return bad("step_overhead_s must be > 0");
  if (!(w.decode_s_per_seq >= 0)) return bad("decode_s_per_seq must be >= 0");
  if (!(o.kv_event_delay_s >= 0)) return bad("kv_event_delay_s must be >= 0");
  if (!(o.load_report_interval_s > 0)) return bad("load_report_interval_s must be > 0");
  return Status::Ok();
}

}  // namespace

namespace simulation_internal {

Result<SimReport> Simulation::Run() {
  for (int32_t w = 0; w < o_.num_workers; ++w) {
    CHUNKSERVE_RETURN_IF_ERROR(core_->AddWorker(
        WorkerInfo{.id = WorkerId(static_cast<uint32_t>(w)),
                   .name = "sim-" + std::to_string(w),
                   .generation = 1,
                   .max_batch_size = o_.worker.max_batch_size,
                   .max_queued = 0,
                   .kv_capacity_tokens = int64_t{o_.worker.kv_capacity_chunks} * o_.chunk_size}));
    // The subscription's first answer: an empty snapshot.
    KvEventBatch snap;
    snap.generation = 1;
    snap.snapshot = true;
    CHUNKSERVE_RETURN_IF_ERROR(
        core_->ApplyKvEvents(WorkerId(static_cast<uint32_t>(w)), snap).status());
    ReportLoad(w);
  }
  CHUNKSERVE_RETURN_IF_ERROR(PullArrival());
  Push(o_.load_report_interval_s, EventType::kLoadReport, -1);

  const std::clock_t cpu_start = std::clock();
  auto wall_last = std::chrono::steady_clock::now();
  uint64_t events_last = 0;
  auto progress = [&](bool final) {
    const auto now = std::chrono::steady_clock::now();
    const double dt = std::chrono::duration<double>(now - wall_last).count();
    std::fprintf(
        stderr,
        "sim %s: %lld requests routed, %lld finished, %.1f s simulated, %llu events, "
        "%.0f events/s%s\n",
        std::string(core_->policy().name()).c_str(), static_cast<long long>(requests_),
        static_cast<long long>(e2e_.size()), now_, static_cast<unsigned long long>(events_done_),
        dt > 0 ? static_cast<double>(events_done_ - events_last) / dt : 0, final ? " (done)" : "");
    wall_last = now;
    events_last = events_done_;
  };
  while (!events_.empty()) {
    const Event e = events_.top();
    events_.pop();
    now_ = e.t;
    if ((++events_done_ & 4095) == 0 && o_.progress &&
        std::chrono::steady_clock::now() - wall_last > std::chrono::seconds(2)) {
      progress(false);
    }
    switch (e.type) {
      case EventType::kArrival:
        CHUNKSERVE_RETURN_IF_ERROR(Arrive());
        CHUNKSERVE_RETURN_IF_ERROR(PullArrival());
        break;
      case EventType::kStepEnd:
        CHUNKSERVE_RETURN_IF_ERROR(StepEnd(e.worker));
        break;
      case EventType::kKvDelivery: {
        Worker& w = workers_[static_cast<size_t>(e.worker)];
        const KvEventBatch batch = std::move(w.in_transit.front());
        w.in_transit.pop_front();
        CHUNKSERVE_ASSIGN_OR_RETURN(
            KvApplyOutcome out,
            core_->ApplyKvEvents(WorkerId(static_cast<uint32_t>(e.worker)), batch));
        if (out != KvApplyOutcome::kApplied) {
          return Status::Internal("sim: kv batch not applied in order: " +
                                  std::string(KvApplyOutcomeName(out)));
        }
        break;
      }
      case EventType::kLoadReport:
        for (int32_t w = 0; w < o_.num_workers; ++w) ReportLoad(w);
        if (next_arrival_ || !active_.empty()) {
          Push(now_ + o_.load_report_interval_s, EventType::kLoadReport, -1);
        }
        break;
    }
  }
  cpu_s_ = static_cast<double>(std::clock() - cpu_start) / CLOCKS_PER_SEC;
  if (o_.progress) progress(true);
  return Report();
}

void Simulation::Push(double t, EventType type, int32_t worker) {
  events_.push(Event{t, order_++, type, worker});
}

Status Simulation::PullArrival() {
  std::optional<workload::WorkloadRequest> next = source_.Next();
  if (!next) {
    next_arrival_.reset();
    return Status::Ok();
  }
  auto r = std::make_unique<Request>();
  r->id = next->index;
  r->arrival = next->arrival_s;
  r->prompt_tokens = workload::PromptLength(*next);
  r->output_tokens = std::max(1, next->output_tokens);
  if (r->prompt_tokens < 1) {
    return Status::InvalidArgument("sim: request " + std::to_string(r->id) + " has no prompt");
  }
  CHUNKSERVE_ASSIGN_OR_RETURN(r->chain, RequestChain(*next, seed_, o_.chunk_size));
  const int64_t total_chunks =
      (r->prompt_tokens + r->output_tokens + o_.chunk_size - 1) / o_.chunk_size;
  r->private_chunks = static_cast<int32_t>(total_chunks - static_cast<int64_t>(r->chain.size()));
  if (total_chunks > o_.worker.kv_capacity_chunks) {
    return Status::InvalidArgument("sim: request " + std::to_string(r->id) + " needs " +
                                   std::to_string(total_chunks) + " KV chunks, a worker has " +
                                   std::to_string(o_.worker.kv_capacity_chunks));
  }
  if (r->arrival < now_) r->arrival = now_;
  first_arrival_ = std::min(first_arrival_, r->arrival);
  Push(r->arrival, EventType::kArrival, -1);
  next_arrival_ = std::move(r);
  return Status::Ok();
}

Status Simulation::Arrive() {
  std::unique_ptr<Request> r = std::move(next_arrival_);
  RoutingRequest rr;
  rr.prompt_tokens = r->prompt_tokens;
  rr.chunk_hashes = r->chain;
  rr.chunk_size = o_.chunk_size;
  rr.max_new_tokens = 0;  // a router knows a cap at best, not the length: the policy assumes
  CHUNKSERVE_ASSIGN_OR_RETURN(
      RoutingDecision d, core_->Route(RequestId(r->id), rr,
                                      RouterTime(static_cast<int64_t>(std::llround(now_ * 1e9)))));
  ++reasons_[static_cast<size_t>(d.reason)];
  r->reason = static_cast<int32_t>(d.reason);
  r->predicted_cached = d.predicted_cached_tokens;
  r->worker = static_cast<int32_t>(d.worker.value());
  if (r->worker < 0 || r->worker >= o_.num_workers) {
    return Status::Internal("sim: policy picked unknown worker " + std::to_string(r->worker));
  }
  Worker& w = workers_[static_cast<size_t>(r->worker)];
  ++w.stats.requests;
  w.stats.prompt_tokens += static_cast<uint64_t>(r->prompt_tokens);
  r->enqueue_uncached = EnqueueUncached(w, *r);
  w.waiting_uncached += r->enqueue_uncached;
  for (uint64_t h : r->chain) ++w.queued[h];
  w.waiting.push_back(r.get());
  w.stats.max_queue = std::max<int64_t>(w.stats.max_queue, static_cast<int64_t>(w.waiting.size()));
  prompt_tokens_ += static_cast<uint64_t>(r->prompt_tokens);
  active_.emplace(r->id, std::move(r));
  ++requests_;
  return StartStep(d.worker.value());
}

SimReport Simulation::Report() {
  SimReport s;
  s.policy = std::string(core_->policy().name());
  s.requests = requests_;
  s.completed = static_cast<int64_t>(e2e_.size());
  s.prompt_tokens = prompt_tokens_;
  s.cached_tokens = cached_tokens_;
  s.hit_rate = prompt_tokens_ ? static_cast<double>(cached_tokens_) / prompt_tokens_ : 0;
  s.ttft_s = Summarize(ttft_);
  s.e2e_s = Summarize(e2e_);
  s.makespan_s = s.completed ? last_finish_ - first_arrival_ : 0;
  if (s.makespan_s > 0) {
    s.throughput_rps = static_cast<double>(s.completed) / s.makespan_s;
    s.output_tokens_per_s = static_cast<double>(output_tokens_) / s.makespan_s;
  }
  double busy = 0, work = 0, max_work = 0, occupancy = 0;
  for (const Worker& w : workers_) {
    SimWorkerStats ws = w.stats;
    ws.work_s = w.work_s;
    ws.busy_s = w.busy_time;
    ws.evictions = w.evictions;
    s.workers.push_back(ws);
    busy += w.busy_time;
    work += w.work_s;
    occupancy += w.occupancy_s;
    max_work = std::max(max_work, w.work_s);
    s.kv_evictions += w.evictions;
  }
  const double n = static_cast<double>(workers_.size());
  s.load_imbalance = work > 0 ? max_work / (work / n) : 0;
  if (s.makespan_s > 0) {
    s.busy_fraction = busy / n / s.makespan_s;
    s.batch_occupancy = occupancy / n / s.makespan_s;
  }
  s.precision = core_->precision().Precision();
  s.recall = core_->precision().Recall();
  s.index_bytes = core_->index().Stats().bytes_used;
  s.events = events_done_;
  s.deferred_admissions = deferred_;
  s.cpu_s = cpu_s_;
  if (cpu_s_ > 0) {
    s.events_per_cpu_s = static_cast<double>(events_done_) / cpu_s_;
    s.requests_per_cpu_s = static_cast<double>(requests_) / cpu_s_;
  }
  s.reasons.assign(reasons_.begin(), reasons_.end());
  for (size_t i = 0; i < reasons_.size(); ++i) {
    s.ttft_mean_by_reason.push_back(reasons_[i] ? ttft_sum_by_reason_[i] / reasons_[i] : 0);
  }
  return s;
}

}  // namespace simulation_internal

Result<std::vector<uint64_t>> RequestChain(const workload::WorkloadRequest& r, uint64_t chain_seed,
                                           int32_t chunk_size) {
  if (r.prompt.empty() && !r.block_ids.empty()) {
    // A block-hash trace: the chain follows block identity, no tokens needed.
    return workload::BlockChunkHashes(chain_seed, chunk_size, r.block_size, r.block_ids,
                                      r.prompt_length);
  }
  return kv::FullChunkHashes(chain_seed, chunk_size, r.prompt);
}

Result<SimReport> RunSimulation(const SimOptions& options, workload::WorkloadSource& source) {
  CHUNKSERVE_RETURN_IF_ERROR(Validate(options));
  RouterCoreOptions core_options = options.router;
  core_options.chain_seeds = {kv::ChunkHashSeed(options.model_fingerprint, options.chunk_size)};
  CHUNKSERVE_ASSIGN_OR_RETURN(std::unique_ptr<RouterCore> core, RouterCore::Create(core_options));
  simulation_internal::Simulation sim(options, source, std::move(core));
  return sim.Run();
}

}  // namespace chunkserve::router::sim
