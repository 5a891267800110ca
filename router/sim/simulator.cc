#include "router/sim/simulator.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <ctime>
#include <cstdio>
#include <deque>
#include <list>
#include <optional>
#include <queue>
#include <unordered_map>
#include <utility>

#include "runtime/kvcache/chunk_hash.h"

namespace chunkserve::router::sim {
namespace {

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
  int64_t step_prefill = 0;  // tokens prefilled in the current step
  int64_t enqueue_uncached = 0;  // uncached prompt tokens as matched when it joined the queue
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
  int64_t waiting_uncached = 0;  // sum of enqueue_uncached over `waiting`
  std::vector<Request*> running;  // admission order
  bool busy = false;
  double busy_time = 0;
  double work_s = 0;       // prefill + decode compute seconds (step overhead excluded)
  double occupancy_s = 0;  // integral of running / max_batch_size over step time
  double last_decode_rate = 0;
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

class Simulation {
 public:
  Simulation(const SimOptions& o, workload::WorkloadSource& source,
             std::unique_ptr<RouterCore> core)
      : o_(o),
        source_(source),
        core_(std::move(core)),
        seed_(kv::ChunkHashSeed(o.model_fingerprint, o.chunk_size)),
        workers_(static_cast<size_t>(o.num_workers)) {}

  Result<SimReport> Run() {
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
      std::fprintf(stderr,
                   "sim %s: %lld requests routed, %lld finished, %.1f s simulated, %llu events, "
                   "%.0f events/s%s\n",
                   std::string(core_->policy().name()).c_str(), static_cast<long long>(requests_),
                   static_cast<long long>(e2e_.size()), now_,
                   static_cast<unsigned long long>(events_done_),
                   dt > 0 ? static_cast<double>(events_done_ - events_last) / dt : 0,
                   final ? " (done)" : "");
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

 private:
  void Push(double t, EventType type, int32_t worker) {
    events_.push(Event{t, order_++, type, worker});
  }

  Status PullArrival() {
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

  Status Arrive() {
    std::unique_ptr<Request> r = std::move(next_arrival_);
    RoutingRequest rr;
    rr.prompt_tokens = r->prompt_tokens;
    rr.chunk_hashes = r->chain;
    rr.chunk_size = o_.chunk_size;
    rr.max_new_tokens = 0;  // a router knows a cap at best, not the length: the policy assumes
    CHUNKSERVE_ASSIGN_OR_RETURN(
        RoutingDecision d,
        core_->Route(RequestId(r->id), rr,
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
    r->enqueue_uncached =
        r->prompt_tokens -
        std::min<int64_t>(int64_t{MatchChunks(w, *r)} * o_.chunk_size, r->prompt_tokens - 1);
    w.waiting_uncached += r->enqueue_uncached;
    w.waiting.push_back(r.get());
    w.stats.max_queue = std::max<int64_t>(w.stats.max_queue, static_cast<int64_t>(w.waiting.size()));
    prompt_tokens_ += static_cast<uint64_t>(r->prompt_tokens);
    active_.emplace(r->id, std::move(r));
    ++requests_;
    return StartStep(d.worker.value());
  }

  int32_t MatchChunks(const Worker& w, const Request& r) const {
    int32_t k = 0;
    while (k < static_cast<int32_t>(r.chain.size()) &&
           w.cache.count(r.chain[static_cast<size_t>(k)])) {
      ++k;
    }
    return k;
  }

  void Emit(Worker& w, bool stored, uint64_t hash, uint64_t parent) {
    ++w.sequence;
    if (stored) {
      w.pending.stored.push_back(kv::StoredChunkHash{hash, parent});
    } else {
      w.pending.evicted.push_back(hash);
    }
  }

  // Admits waiting requests FIFO while they fit (batch slots and KV chunks). Like the engine's
  // scheduler, a request whose next uncached chunk is being prefilled by a running request is
  // deferred (the requests behind it may pass, up to kMaxDeferred of them are looked at) until
  // that prefill has stored the chunk, then admitted with it cached: same-prefix bursts do not
  // prefill the prefix twice.
  void Admit(Worker& w) {
    constexpr size_t kMaxDeferred = 16;
    const int64_t capacity = o_.worker.kv_capacity_chunks;
    size_t at = 0;
    while (at < w.waiting.size() &&
           static_cast<int32_t>(w.running.size()) < o_.worker.max_batch_size) {
      Request& r = *w.waiting[at];
      const int32_t k = MatchChunks(w, r);
      if (static_cast<size_t>(k) < r.chain.size() &&
          w.inflight.count(r.chain[static_cast<size_t>(k)])) {
        ++deferred_;
        if (++at >= kMaxDeferred) break;
        continue;
      }
      int64_t matched_retained = 0;
      for (int32_t i = 0; i < k; ++i) {
        matched_retained += w.cache.at(r.chain[static_cast<size_t>(i)]).refs == 0;
      }
      const int64_t need = static_cast<int64_t>(r.chain.size()) - k + r.private_chunks;
      const int64_t evictable = static_cast<int64_t>(w.lru.size()) - matched_retained;
      if (capacity - w.used_chunks + evictable < need) break;  // head of line waits
      for (int32_t i = 0; i < k; ++i) {
        CacheEntry& e = w.cache.at(r.chain[static_cast<size_t>(i)]);
        if (e.refs++ == 0) w.lru.erase(e.lru);
      }
      while (capacity - w.used_chunks < need) {
        const uint64_t victim = w.lru.front();
        w.lru.pop_front();
        w.cache.erase(victim);
        --w.used_chunks;
        ++w.evictions;
        Emit(w, false, victim, 0);
      }
      w.used_chunks += need;  // new hashed chunks are reserved now, stored at prefill end
      for (size_t i = static_cast<size_t>(k); i < r.chain.size(); ++i) ++w.inflight[r.chain[i]];
      r.matched_chunks = k;
      r.cached_tokens = std::min<int64_t>(int64_t{k} * o_.chunk_size, r.prompt_tokens - 1);
      r.prefill_remaining = r.prompt_tokens - r.cached_tokens;
      w.running.push_back(&r);
      w.waiting_uncached -= r.enqueue_uncached;
      w.waiting.erase(w.waiting.begin() + static_cast<ptrdiff_t>(at));
    }
  }

  Status StartStep(uint32_t wi) {
    Worker& w = workers_[wi];
    if (w.busy) return Status::Ok();
    Admit(w);
    if (w.running.empty()) return Status::Ok();
    int64_t budget = o_.worker.prefill_chunk_tokens, prefilled = 0, decoding = 0;
    for (Request* r : w.running) {
      r->step_prefill = 0;
      if (r->prefill_remaining == 0) {
        ++decoding;
      } else if (budget > 0) {
        r->step_prefill = std::min(budget, r->prefill_remaining);
        budget -= r->step_prefill;
        prefilled += r->step_prefill;
      }
    }
    const double dt = o_.worker.step_overhead_s +
                      static_cast<double>(prefilled) / o_.worker.prefill_tokens_per_s +
                      static_cast<double>(decoding) * o_.worker.decode_s_per_seq;
    w.last_decode_rate = decoding > 0 ? static_cast<double>(decoding) / dt : 0;
    w.busy = true;
    w.busy_time += dt;
    w.work_s += dt - o_.worker.step_overhead_s;
    w.occupancy_s += dt * static_cast<double>(w.running.size()) / o_.worker.max_batch_size;
    Push(now_ + dt, EventType::kStepEnd, static_cast<int32_t>(wi));
    return Status::Ok();
  }

  Status StepEnd(int32_t wi) {
    Worker& w = workers_[static_cast<size_t>(wi)];
    w.busy = false;
    std::vector<Request*> still;
    still.reserve(w.running.size());
    for (Request* r : w.running) {
      bool done = false;
      if (r->prefill_remaining == 0) {
        done = ++r->decoded >= r->output_tokens;
      } else if (r->step_prefill > 0) {
        r->prefill_remaining -= r->step_prefill;
        if (r->prefill_remaining == 0) {
          FinishPrefill(w, *r);
          r->first_token = now_;
          r->decoded = 1;
          ttft_.push_back(now_ - r->arrival);
          ttft_sum_by_reason_[static_cast<size_t>(r->reason)] += now_ - r->arrival;
          cached_tokens_ += static_cast<uint64_t>(r->cached_tokens);
          CHUNKSERVE_RETURN_IF_ERROR(core_->OnFirstToken(RequestId(r->id)));
          done = r->output_tokens <= 1;
        }
      }
      if (done) {
        CHUNKSERVE_RETURN_IF_ERROR(Finish(w, *r));
      } else {
        still.push_back(r);
      }
    }
    w.running.swap(still);
    if (!w.pending.stored.empty() || !w.pending.evicted.empty()) {
      w.pending.generation = 1;
      w.pending.sequence = w.sequence;
      w.in_transit.push_back(std::move(w.pending));
      w.pending = KvEventBatch{};
      Push(now_ + o_.kv_event_delay_s, EventType::kKvDelivery, wi);
    }
    return StartStep(static_cast<uint32_t>(wi));
  }

  // The prompt's K/V is written: its new full chunks become cached (and KV events).
  void FinishPrefill(Worker& w, Request& r) {
    for (size_t i = static_cast<size_t>(r.matched_chunks); i < r.chain.size(); ++i) {
      const uint64_t h = r.chain[i];
      if (auto f = w.inflight.find(h); f != w.inflight.end() && --f->second == 0) {
        w.inflight.erase(f);
      }
      auto [it, inserted] = w.cache.try_emplace(h);
      if (!inserted) {
        // Another request stored the same chunk meanwhile: share it, give back the reservation.
        if (it->second.refs++ == 0) w.lru.erase(it->second.lru);
        --w.used_chunks;
        continue;
      }
      it->second.refs = 1;
      Emit(w, true, h, i == 0 ? seed_ : r.chain[i - 1]);
    }
    r.matched_chunks = static_cast<int32_t>(r.chain.size());  // all pinned now
  }

  Status Finish(Worker& w, Request& r) {
    // Deepest first, so children sit ahead of their parents in the LRU (leaves go first).
    for (size_t i = static_cast<size_t>(r.matched_chunks); i-- > 0;) {
      CacheEntry& e = w.cache.at(r.chain[i]);
      if (--e.refs == 0) e.lru = w.lru.insert(w.lru.end(), r.chain[i]);
    }
    w.used_chunks -= r.private_chunks;
    e2e_.push_back(now_ - r.arrival);
    w.stats.cached_tokens += static_cast<uint64_t>(r.cached_tokens);
    if (o_.log != nullptr) {
      std::fprintf(o_.log,
                   "{\"policy\":\"%s\",\"id\":%llu,\"arrival_s\":%.6f,\"worker\":%d,"
                   "\"reason\":\"%s\",\"prompt_tokens\":%lld,\"predicted_cached_tokens\":%lld,"
                   "\"cached_tokens\":%lld,\"ttft_s\":%.6f,\"first_token_s\":%.6f,"
                   "\"end_s\":%.6f,\"output_tokens\":%d}\n",
                   policy_name_.c_str(), static_cast<unsigned long long>(r.id), r.arrival,
                   r.worker,
                   std::string(DecisionReasonName(static_cast<DecisionReason>(r.reason))).c_str(),
                   static_cast<long long>(r.prompt_tokens),
                   static_cast<long long>(r.predicted_cached),
                   static_cast<long long>(r.cached_tokens), r.first_token - r.arrival,
                   r.first_token, now_, r.output_tokens);
    }
    output_tokens_ += static_cast<uint64_t>(r.output_tokens);
    last_finish_ = std::max(last_finish_, now_);
    CHUNKSERVE_RETURN_IF_ERROR(core_->OnFinished(RequestId(r.id), r.cached_tokens));
    active_.erase(r.id);
    return Status::Ok();
  }

  void ReportLoad(int32_t wi) {
    const Worker& w = workers_[static_cast<size_t>(wi)];
    WorkerLoad load;
    for (const Request* r : w.running) load.queued_prefill_tokens += r->prefill_remaining;
    // The head of the queue is matched against the cache as it is now; past kExactQueue
    // requests or kExactChunks chain chunks the match from when each joined the queue stands
    // in, so a report costs a bounded number of lookups however long the queue grows (an
    // overloaded worker's queue reaches thousands: matching all of them every report made the
    // run quadratic).
    constexpr size_t kExactQueue = 64;
    constexpr size_t kExactChunks = 4096;
    int64_t waiting = w.waiting_uncached;
    size_t chunks = 0;
    for (size_t i = 0; i < w.waiting.size() && i < kExactQueue; ++i) {
      const Request* r = w.waiting[i];
      chunks += r->chain.size();
      if (i > 0 && chunks > kExactChunks) break;
      const int64_t cached =
          std::min<int64_t>(int64_t{MatchChunks(w, *r)} * o_.chunk_size, r->prompt_tokens - 1);
      waiting += (r->prompt_tokens - cached) - r->enqueue_uncached;
    }
    load.queued_prefill_tokens += static_cast<uint64_t>(std::max<int64_t>(0, waiting));
    load.running_sequences = static_cast<int32_t>(w.running.size());
    load.queued_requests = static_cast<int32_t>(w.waiting.size());
    load.free_kv_slots = static_cast<uint64_t>(
        (o_.worker.kv_capacity_chunks - w.used_chunks + static_cast<int64_t>(w.lru.size())) *
        o_.chunk_size);
    load.prefill_tokens_per_s = o_.worker.prefill_tokens_per_s;
    load.decode_tokens_per_s = w.last_decode_rate;
    core_->UpdateLoad(WorkerId(static_cast<uint32_t>(wi)), load).IgnoreError();  // known worker
  }

  SimReport Report() {
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
  Simulation sim(options, source, std::move(core));
  return sim.Run();
}

}  // namespace chunkserve::router::sim
