// Internal helpers shared by the routing policies (router/policies/, made through the registry in
// policy.cc) and their tests. The public contract is in routing.h (Policy, MakePolicy,
// RendezvousPick).
#ifndef CHUNKSERVE_ROUTER_POLICY_H_
#define CHUNKSERVE_ROUTER_POLICY_H_

#include <bit>
#include <cstdint>
#include <span>
#include <vector>

#include "router/routing.h"

namespace chunkserve::router {

// A 64-bit finalizer (splitmix64): spreads any key over 64 bits. Used for rendezvous weights
// and ring positions, so they are identical on every platform and in every router.
uint64_t Mix64(uint64_t x);

// Prompt length in tokens: max(prompt_tokens, prompt.size()).
int64_t PromptTokens(const RoutingRequest& request);

// Cached prompt tokens implied by `matched_chunks` full chunks (capped at the prompt length).
int64_t CachedTokens(const RoutingRequest& request, int32_t matched_chunks);

// Output tokens to expect from a request: the mean of recent requests
// (PickContext::mean_output_tokens), at most its max_new_tokens; without a mean, its
// max_new_tokens; 0 when neither is known (PredictTtftSeconds then assumes
// PolicyOptions::default_output_tokens).
int32_t ExpectedOutputTokens(const RoutingRequest& request, const PickContext& context);

// The ttft policy's estimate for one worker (routing.h PolicyOptions explains the formula).
double PredictTtftSeconds(const WorkerState& worker, int64_t uncached_tokens,
                          int32_t expected_output_tokens, const PolicyOptions& options);

// running + queued requests: the request-count load the baselines balance.
int64_t RequestLoad(const WorkerLoad& load);

// Unavailable: no worker accepts requests.
Status NoWorkers(const PickContext& context);

// Index matches for the request, or none when there is no index or no full chunk.
std::vector<WorkerMatch> Matches(const RoutingRequest& request, const PickContext& context);

// The matched chunks of `worker` in `matches` (sorted by worker), 0 when absent.
int32_t MatchOf(const std::vector<WorkerMatch>& matches, WorkerId worker);

// The accepting worker with the least request load; ties: fewer queued prefill tokens, then the
// lower id. nullptr when none accepts.
const WorkerState* LeastLoaded(const PickContext& context);

// A decision for `worker`, with the cached tokens its match predicts.
RoutingDecision Decide(const RoutingRequest& request, const std::vector<WorkerMatch>& matches,
                       WorkerId worker, DecisionReason reason, double ttft = 0);

// Matched chunks by worker id in O(1): a dense table over small id values, and an
// open-addressing hash table for large ones (the router process derives ids by hashing worker
// names). Reused across picks; Fill costs O(previous + current matches), not O(workers).
class MatchLookup {
 public:
  void Fill(const std::vector<WorkerMatch>& matches) {
    for (uint32_t id : dense_set_) dense_[id] = 0;
    dense_set_.clear();
    for (uint32_t pos : hashed_set_) hashed_[pos] = Entry{};
    hashed_set_.clear();
    const size_t want = std::bit_ceil(matches.size() * 2 + 2);
    if (hashed_.size() < want) hashed_.assign(want, Entry{});
    for (const WorkerMatch& m : matches) {
      const uint32_t id = m.worker.value();
      if (id < kDenseLimit) {
        if (id >= dense_.size()) dense_.resize(std::max<size_t>(id + 1, dense_.size() * 2), 0);
        dense_[id] = m.matched_chunks;
        dense_set_.push_back(id);
        continue;
      }
      size_t pos = Slot(id);
      while (hashed_[pos].used && hashed_[pos].id != id) pos = (pos + 1) & (hashed_.size() - 1);
      if (!hashed_[pos].used) hashed_set_.push_back(static_cast<uint32_t>(pos));
      hashed_[pos] = Entry{id, m.matched_chunks, true};
    }
  }
  int32_t Get(WorkerId worker) const {
    const uint32_t id = worker.value();
    if (id < kDenseLimit) return id < dense_.size() ? dense_[id] : 0;
    if (hashed_set_.empty()) return 0;
    for (size_t pos = Slot(id); hashed_[pos].used; pos = (pos + 1) & (hashed_.size() - 1)) {
      if (hashed_[pos].id == id) return hashed_[pos].match;
    }
    return 0;
  }

 private:
  struct Entry {
    uint32_t id = 0;
    int32_t match = 0;
    bool used = false;
  };
  size_t Slot(uint32_t id) const { return Mix64(id) & (hashed_.size() - 1); }

  static constexpr uint32_t kDenseLimit = 1u << 16;
  std::vector<int32_t> dense_;
  std::vector<uint32_t> dense_set_;
  std::vector<Entry> hashed_;  // size: a power of two, at most half full
  std::vector<uint32_t> hashed_set_;
};

}  // namespace chunkserve::router

#endif  // CHUNKSERVE_ROUTER_POLICY_H_
