// The simulated workers (the model is described in router/sim/simulator.h): a KV cache of
// hashed chunks with LRU retention and KV events numbered as a real worker numbers them, FIFO
// admission, steps of chunked prefill and decode, finished requests and their log lines, load
// reports. Driven by the event loop in simulator.cc.
#include <algorithm>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "router/sim/simulation_internal.h"

namespace chunkserve::router::sim::simulation_internal {

int32_t Simulation::MatchChunks(const Worker& w, const Request& r) const {
  int32_t k = 0;
  while (k < static_cast<int32_t>(r.chain.size()) &&
         w.cache.count(r.chain[static_cast<size_t>(k)])) {
    ++k;
  }
  return k;
}

void Simulation::Emit(Worker& w, bool stored, uint64_t hash, uint64_t parent) {
  ++w.sequence;
  if (stored) {
    w.pending.stored.push_back(kv::StoredChunkHash{hash, parent});
  } else {
    w.pending.evicted.push_back(hash);
  }
}

// The worker counts a prefix once however many queued requests wait for it, as the engine
// computes it once (admission deferral below): a chain chunk cached, being prefilled, or in the
// chain of a request queued earlier is not this request's prefill.
int64_t Simulation::EnqueueUncached(const Worker& w, const Request& r) const {
  int64_t k = 0;
  for (uint64_t h : r.chain) {
    if (!w.cache.count(h) && !w.inflight.count(h) && !w.queued.count(h)) break;
    ++k;
  }
  return r.prompt_tokens - std::min<int64_t>(k * o_.chunk_size, r.prompt_tokens - 1);
}

// Admits waiting requests FIFO while they fit (batch slots and KV chunks). Like the engine's
// scheduler, a request whose next uncached chunk is being prefilled by a running request is
// deferred (the requests behind it may pass, up to kMaxDeferred of them are looked at) until
// that prefill has stored the chunk, then admitted with it cached: same-prefix bursts do not
// prefill the prefix twice.
void Simulation::Admit(Worker& w) {
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
    for (uint64_t h : r.chain) {
      if (auto q = w.queued.find(h); q != w.queued.end() && --q->second == 0) w.queued.erase(q);
    }
    w.waiting.erase(w.waiting.begin() + static_cast<ptrdiff_t>(at));
  }
}

Status Simulation::StartStep(uint32_t wi) {
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
  // The engine's busy decode rate (runtime/engine/rate_window.h): step time less the prefill in
  // it at the best prefill-only step's rate, at least a tenth of the step.
  if (decoding == 0 && prefilled > 0) {
    w.best_prefill_rate = std::max(w.best_prefill_rate, static_cast<double>(prefilled) / dt);
  }
  const double decode_s =
      w.best_prefill_rate > 0
          ? std::max(0.1 * dt, dt - static_cast<double>(prefilled) / w.best_prefill_rate)
          : dt;
  w.last_decode_rate = decoding > 0 ? static_cast<double>(decoding) / decode_s : 0;
  w.busy = true;
  w.busy_time += dt;
  w.work_s += dt - o_.worker.step_overhead_s;
  w.occupancy_s += dt * static_cast<double>(w.running.size()) / o_.worker.max_batch_size;
  Push(now_ + dt, EventType::kStepEnd, static_cast<int32_t>(wi));
  return Status::Ok();
}

Status Simulation::StepEnd(int32_t wi) {
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
void Simulation::FinishPrefill(Worker& w, Request& r) {
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

Status Simulation::Finish(Worker& w, Request& r) {
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
                 policy_name_.c_str(), static_cast<unsigned long long>(r.id), r.arrival, r.worker,
                 std::string(DecisionReasonName(static_cast<DecisionReason>(r.reason))).c_str(),
                 static_cast<long long>(r.prompt_tokens),
                 static_cast<long long>(r.predicted_cached),
                 static_cast<long long>(r.cached_tokens), r.first_token - r.arrival, r.first_token,
                 now_, r.output_tokens);
  }
  output_tokens_ += static_cast<uint64_t>(r.output_tokens);
  last_finish_ = std::max(last_finish_, now_);
  CHUNKSERVE_RETURN_IF_ERROR(core_->OnFinished(RequestId(r.id), r.cached_tokens, r.output_tokens));
  active_.erase(r.id);
  return Status::Ok();
}

void Simulation::ReportLoad(int32_t wi) {
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
    // Chunks stored since it joined lower the estimate; never raise it (what it shares with a
    // request ahead of it is that request's prefill).
    waiting += std::min<int64_t>(0, (r->prompt_tokens - cached) - r->enqueue_uncached);
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

}  // namespace chunkserve::router::sim::simulation_internal
