// The routing policies. Each class states its algorithm at its top.
#include "router/policy.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "runtime/kvcache/chunk_hash.h"

namespace chunkserve::router {

uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

int64_t PromptTokens(const RoutingRequest& request) {
  return std::max<int64_t>(request.prompt_tokens, static_cast<int64_t>(request.prompt.size()));
}

int64_t CachedTokens(const RoutingRequest& request, int32_t matched_chunks) {
  if (matched_chunks <= 0 || request.chunk_size <= 0) return 0;
  return std::min<int64_t>(int64_t{matched_chunks} * request.chunk_size, PromptTokens(request));
}

double PredictTtftSeconds(const WorkerState& worker, int64_t uncached_tokens,
                          int32_t expected_output_tokens, const PolicyOptions& options) {
  const WorkerLoad& l = worker.load;
  const double prefill_rate =
      l.prefill_tokens_per_s > 0 ? l.prefill_tokens_per_s : options.default_prefill_tokens_per_s;
  const double decode_rate =
      l.decode_tokens_per_s > 0 ? l.decode_tokens_per_s : options.default_decode_tokens_per_s;
  const double per_running = l.decode_tokens_per_s > 0 ? 1.0 / l.decode_tokens_per_s
                                                       : options.decode_seconds_per_running_seq;
  const double prefill_s =
      (static_cast<double>(l.queued_prefill_tokens) + static_cast<double>(uncached_tokens)) /
      prefill_rate;
  // With the batch full, the request first waits for running sequences to finish: about one
  // completion per (expected output tokens / decode rate) seconds per request ahead of it.
  const int64_t excess = RequestLoad(l) + 1 - std::max(1, worker.info.max_batch_size);
  const double output =
      expected_output_tokens > 0 ? expected_output_tokens : options.default_output_tokens;
  const double slot_wait_s = excess > 0 ? static_cast<double>(excess) * output / decode_rate : 0.0;
  return prefill_s + slot_wait_s + per_running * l.running_sequences;
}

int64_t RequestLoad(const WorkerLoad& load) {
  return int64_t{load.running_sequences} + load.queued_requests;
}

WorkerId RendezvousPick(uint64_t key, std::span<const WorkerId> workers) {
  WorkerId best = WorkerId::Invalid();
  uint64_t best_weight = 0;
  for (WorkerId w : workers) {
    const uint64_t weight = Mix64(key ^ Mix64(0x5eed0000ull + w.value()));
    if (!best.valid() || weight > best_weight || (weight == best_weight && w < best)) {
      best = w;
      best_weight = weight;
    }
  }
  return best;
}

std::string_view PolicyKindName(PolicyKind kind) {
  switch (kind) {
    case PolicyKind::kTtft:
      return "ttft";
    case PolicyKind::kRoundRobin:
      return "round_robin";
    case PolicyKind::kLeastLoaded:
      return "least_loaded";
    case PolicyKind::kConsistentHash:
      return "consistent_hash";
    case PolicyKind::kCacheAwareThreshold:
      return "cache_aware_threshold";
  }
  return "unknown";
}

std::vector<PolicyKind> AllPolicyKinds() {
  return {PolicyKind::kTtft, PolicyKind::kRoundRobin, PolicyKind::kLeastLoaded,
          PolicyKind::kConsistentHash, PolicyKind::kCacheAwareThreshold};
}

Result<PolicyKind> ParsePolicyKind(std::string_view name) {
  std::string valid;
  for (PolicyKind k : AllPolicyKinds()) {
    if (PolicyKindName(k) == name) return k;
    valid += valid.empty() ? "" : ", ";
    valid += PolicyKindName(k);
  }
  return Status::InvalidArgument("unknown routing policy '" + std::string(name) +
                                 "' (valid: " + valid + ")");
}

std::string_view DecisionReasonName(DecisionReason reason) {
  switch (reason) {
    case DecisionReason::kCacheHit:
      return "cache_hit";
    case DecisionReason::kSpill:
      return "spill";
    case DecisionReason::kNewPrefixPlacement:
      return "new_prefix_placement";
    case DecisionReason::kLoadOnly:
      return "load_only";
    case DecisionReason::kLoadCap:
      return "load_cap";
    case DecisionReason::kRoundRobin:
      return "round_robin";
    case DecisionReason::kLeastLoaded:
      return "least_loaded";
    case DecisionReason::kConsistentHash:
      return "consistent_hash";
    case DecisionReason::kImbalance:
      return "imbalance";
  }
  return "unknown";
}

namespace {

Status NoWorkers(const PickContext& context) {
  return Status::Unavailable("no workers accept requests (" +
                             std::to_string(context.workers.size()) + " known)");
}

// Index matches for the request, or none when there is no index or no full chunk.
std::vector<WorkerMatch> Matches(const RoutingRequest& request, const PickContext& context) {
  if (context.index == nullptr || request.chunk_hashes.empty()) return {};
  return context.index->LongestMatch(request.chunk_hashes, context.now);
}

int32_t MatchOf(const std::vector<WorkerMatch>& matches, WorkerId worker) {
  auto it = std::lower_bound(matches.begin(), matches.end(), worker,
                             [](const WorkerMatch& m, WorkerId w) { return m.worker < w; });
  return it != matches.end() && it->worker == worker ? it->matched_chunks : 0;
}

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

// The accepting worker with the least request load; ties: fewer queued prefill tokens, then the
// lower id. nullptr when none accepts.
const WorkerState* LeastLoaded(const PickContext& context) {
  const WorkerState* best = nullptr;
  for (const WorkerState& w : context.workers) {
    if (!w.accepting) continue;
    if (best == nullptr) {
      best = &w;
      continue;
    }
    const auto key = [](const WorkerState& s) {
      return std::make_tuple(RequestLoad(s.load), s.load.queued_prefill_tokens, s.info.id);
    };
    if (key(w) < key(*best)) best = &w;
  }
  return best;
}

RoutingDecision Decide(const RoutingRequest& request, const std::vector<WorkerMatch>& matches,
                       WorkerId worker, DecisionReason reason, double ttft = 0) {
  return RoutingDecision{.worker = worker,
                         .predicted_cached_tokens = CachedTokens(request, MatchOf(matches, worker)),
                         .reason = reason,
                         .predicted_ttft_s = ttft};
}

// ---------------------------------------------------------------------------------------------
// ttft (default).
//
//   1. Look up the longest match per worker (index + recent decisions). For each accepting
//      worker predict TTFT = (queued prefill + uncached prompt tokens) / prefill rate + slot wait
//      (batch full) + decode term (PredictTtftSeconds). Workers over the load cap are left out
//      unless all are over it (then none is).
//   2. Index unusable (no usable worker view and no matching decision): lowest TTFT (load_only).
//   3. Someone holds a prefix of the prompt: the holders are the workers matching at least half
//      of the longest match; take the holder with the lowest TTFT; spill to the best non-holder
//      when the holder's TTFT is more than spill_factor times the non-holder's and the prefix has
//      fewer holders than the holder cap. All holders over the load cap: the best non-holder
//      (load_cap).
//   4. Nobody holds any of it: rendezvous hashing on the first chunk hash among the workers
//      within placement_slack of the lowest TTFT (new_prefix_placement).
class TtftPolicy final : public Policy {
 public:
  explicit TtftPolicy(const PolicyOptions& options) : options_(options) {}
  PolicyKind kind() const override { return PolicyKind::kTtft; }

  Result<RoutingDecision> Pick(const RoutingRequest& request, const PickContext& context) override {
    const std::vector<WorkerMatch> matches = Matches(request, context);
    lookup_.Fill(matches);
    const int64_t prompt_tokens = PromptTokens(request);

    cands_.clear();
    bool any_under = false;
    for (const WorkerState& w : context.workers) {
      if (!w.accepting) continue;
      const int32_t m = lookup_.Get(w.info.id);
      const int64_t uncached = prompt_tokens - CachedTokens(request, m);
      const double cap = options_.load_cap * std::max(1, w.info.max_batch_size);
      const bool over = static_cast<double>(RequestLoad(w.load)) > cap;
      cands_.push_back(
          Cand{&w, m, PredictTtftSeconds(w, uncached, request.max_new_tokens, options_), over});
      any_under |= !over;
    }
    if (cands_.empty()) return NoWorkers(context);

    auto lowest = [&](auto&& filter) -> const Cand* {
      const Cand* best = nullptr;
      for (const Cand& c : cands_) {
        if (!filter(c)) continue;
        if (best == nullptr || c.ttft < best->ttft ||
            (c.ttft == best->ttft && c.w->info.id < best->w->info.id)) {
          best = &c;
        }
      }
      return best;
    };
    auto decide = [&](const Cand* c, DecisionReason reason) {
      return Decide(request, matches, c->w->info.id, reason, c->ttft);
    };

    // Everyone over the cap: the cap protects no one, so choose among all by the same rules
    // (cache affinity then keeps the hit rate up exactly when capacity is scarcest).
    if (!any_under) {
      for (Cand& c : cands_) c.over_cap = false;
    }
    auto under = [](const Cand& c) { return !c.over_cap; };

    const bool index_usable =
        context.index != nullptr && (!matches.empty() || context.index->AnyUsable());
    if (!index_usable || request.chunk_hashes.empty()) {
      return decide(lowest(under), DecisionReason::kLoadOnly);
    }

    int32_t best_match = 0;
    for (const Cand& c : cands_) best_match = std::max(best_match, c.match);
    if (best_match >= options_.min_match_chunks) {
      // Holders: at least half of the longest match, so a worker missing only another request's
      // private tail (or a few deep chunks) still counts as holding the prefix.
      auto is_holder = [&](const Cand& c) {
        return c.match >= options_.min_match_chunks && 2 * int64_t{c.match} >= best_match;
      };
      const Cand* holder = lowest([&](const Cand& c) { return under(c) && is_holder(c); });
      // Every holder is over the load cap: the best of the rest.
      if (holder == nullptr) return decide(lowest(under), DecisionReason::kLoadCap);
      const Cand* other = lowest([&](const Cand& c) { return under(c) && !is_holder(c); });
      int32_t holders = 0;
      for (const Cand& c : cands_) holders += is_holder(c);
      const int32_t cap =
          options_.max_holders_per_prefix > 0
              ? options_.max_holders_per_prefix
              : std::max<int32_t>(
                    2, static_cast<int32_t>(std::ceil(options_.max_holder_fraction *
                                                      static_cast<double>(cands_.size()))));
      if (other != nullptr && holder->ttft > options_.spill_factor * other->ttft && holders < cap) {
        return decide(other, DecisionReason::kSpill);
      }
      return decide(holder, DecisionReason::kCacheHit);
    }

    const Cand* best = lowest(under);
    const double limit = best->ttft * options_.placement_slack + 1e-3;
    ids_.clear();
    for (const Cand& c : cands_) {
      if (under(c) && c.ttft <= limit) ids_.push_back(c.w->info.id);
    }
    const WorkerId pick = RendezvousPick(request.chunk_hashes.front(), ids_);
    const Cand* chosen = lowest([&](const Cand& c) { return c.w->info.id == pick; });
    return decide(chosen, DecisionReason::kNewPrefixPlacement);
  }

 private:
  struct Cand {
    const WorkerState* w;
    int32_t match;
    double ttft;
    bool over_cap;
  };
  PolicyOptions options_;
  std::vector<Cand> cands_;  // scratch, kept to avoid an allocation per pick
  std::vector<WorkerId> ids_;
  MatchLookup lookup_;
};

// ---------------------------------------------------------------------------------------------
// round_robin: the accepting workers in the order given, one after the other.
class RoundRobinPolicy final : public Policy {
 public:
  PolicyKind kind() const override { return PolicyKind::kRoundRobin; }
  Result<RoutingDecision> Pick(const RoutingRequest& request, const PickContext& context) override {
    const size_t n = context.workers.size();
    for (size_t tried = 0; tried < n; ++tried) {
      const WorkerState& w = context.workers[(cursor_ + tried) % n];
      if (!w.accepting) continue;
      cursor_ = (cursor_ + tried + 1) % n;
      return Decide(request, Matches(request, context), w.info.id, DecisionReason::kRoundRobin);
    }
    return NoWorkers(context);
  }

 private:
  size_t cursor_ = 0;
};

// ---------------------------------------------------------------------------------------------
// least_loaded: fewest running + queued requests (ties: fewer queued prefill tokens, lower id).
class LeastLoadedPolicy final : public Policy {
 public:
  PolicyKind kind() const override { return PolicyKind::kLeastLoaded; }
  Result<RoutingDecision> Pick(const RoutingRequest& request, const PickContext& context) override {
    const WorkerState* w = LeastLoaded(context);
    if (w == nullptr) return NoWorkers(context);
    return Decide(request, Matches(request, context), w->info.id, DecisionReason::kLeastLoaded);
  }
};

// ---------------------------------------------------------------------------------------------
// consistent_hash: a ring of virtual_nodes points per worker (positions Mix64(id, v)); the key
// is the first chunk hash (a hash of the whole prompt when it has no full chunk). The request
// goes to the first accepting worker clockwise from the key. The ring covers every known worker,
// accepting or not, so a worker that is briefly unhealthy does not remap everyone else's keys.
class ConsistentHashPolicy final : public Policy {
 public:
  explicit ConsistentHashPolicy(const PolicyOptions& options) : options_(options) {}
  PolicyKind kind() const override { return PolicyKind::kConsistentHash; }

  Result<RoutingDecision> Pick(const RoutingRequest& request, const PickContext& context) override {
    if (std::none_of(context.workers.begin(), context.workers.end(),
                     [](const WorkerState& w) { return w.accepting; })) {
      return NoWorkers(context);
    }
    uint64_t key;
    if (!request.chunk_hashes.empty()) {
      key = request.chunk_hashes.front();
    } else if (!request.prompt.empty()) {
      key = kv::ChainChunkHash(0, request.prompt);
    } else {
      const WorkerState* w = LeastLoaded(context);
      return Decide(request, {}, w->info.id, DecisionReason::kLeastLoaded);
    }
    Rebuild(context);
    auto it = std::lower_bound(ring_.begin(), ring_.end(), std::make_pair(key, WorkerId()),
                               [](const auto& a, const auto& b) { return a.first < b.first; });
    for (size_t tried = 0; tried < ring_.size(); ++tried, ++it) {
      if (it == ring_.end()) it = ring_.begin();
      const WorkerState* w = Find(context, it->second);
      if (w != nullptr && w->accepting) {
        return Decide(request, Matches(request, context), w->info.id,
                      DecisionReason::kConsistentHash);
      }
    }
    return NoWorkers(context);
  }

 private:
  const WorkerState* Find(const PickContext& context, WorkerId id) const {
    // Positions are remembered from the last rebuild; verify, since the caller may reorder.
    auto it = position_.find(id);
    if (it != position_.end() && it->second < context.workers.size() &&
        context.workers[it->second].info.id == id) {
      return &context.workers[it->second];
    }
    for (const WorkerState& w : context.workers) {
      if (w.info.id == id) return &w;
    }
    return nullptr;
  }

  // Rebuilds the ring when the membership changed. Membership is compared by count and an
  // order-independent 64-bit signature (sum of mixed ids), so an unchanged membership costs one
  // pass without sorting or allocation.
  void Rebuild(const PickContext& context) {
    uint64_t signature = 0;
    for (const WorkerState& w : context.workers) signature += Mix64(w.info.id.value());
    if (!ring_.empty() && signature == signature_ && context.workers.size() == members_) return;
    signature_ = signature;
    members_ = context.workers.size();
    ring_.clear();
    position_.clear();
    for (size_t i = 0; i < context.workers.size(); ++i) {
      const WorkerId id = context.workers[i].info.id;
      position_[id] = i;
      for (int32_t v = 0; v < options_.virtual_nodes; ++v) {
        ring_.emplace_back(Mix64((uint64_t{id.value()} << 32) ^ static_cast<uint64_t>(v)), id);
      }
    }
    std::sort(ring_.begin(), ring_.end());
  }

  PolicyOptions options_;
  uint64_t signature_ = 0;
  size_t members_ = 0;
  std::unordered_map<WorkerId, size_t> position_;
  std::vector<std::pair<uint64_t, WorkerId>> ring_;
};

// ---------------------------------------------------------------------------------------------
// cache_aware_threshold (after SGLang's router): load = running + queued requests.
//   imbalanced := max - min > balance_abs_threshold && max > balance_rel_threshold * min
//   imbalanced            -> least loaded                                   (imbalance)
//   else longest match m, if m * chunk_size / prompt >= cache_threshold -> that worker
//                         (ties: lower load)                                (cache_hit)
//   else                  -> least loaded                                   (least_loaded)
class CacheAwareThresholdPolicy final : public Policy {
 public:
  explicit CacheAwareThresholdPolicy(const PolicyOptions& options) : options_(options) {}
  PolicyKind kind() const override { return PolicyKind::kCacheAwareThreshold; }

  Result<RoutingDecision> Pick(const RoutingRequest& request, const PickContext& context) override {
    const WorkerState* least = LeastLoaded(context);
    if (least == nullptr) return NoWorkers(context);
    const std::vector<WorkerMatch> matches = Matches(request, context);
    int64_t max_load = 0;
    for (const WorkerState& w : context.workers) {
      if (w.accepting) max_load = std::max(max_load, RequestLoad(w.load));
    }
    const int64_t min_load = RequestLoad(least->load);
    if (max_load - min_load > options_.balance_abs_threshold &&
        static_cast<double>(max_load) > options_.balance_rel_threshold * min_load) {
      return Decide(request, matches, least->info.id, DecisionReason::kImbalance);
    }
    lookup_.Fill(matches);
    const WorkerState* best = nullptr;
    int32_t best_match = 0;
    for (const WorkerState& w : context.workers) {
      if (!w.accepting) continue;
      const int32_t m = lookup_.Get(w.info.id);
      if (m > best_match ||
          (m == best_match && best != nullptr && RequestLoad(w.load) < RequestLoad(best->load))) {
        best = &w;
        best_match = m;
      }
    }
    const int64_t prompt = PromptTokens(request);
    if (best != nullptr && best_match > 0 && prompt > 0 &&
        static_cast<double>(CachedTokens(request, best_match)) / static_cast<double>(prompt) >=
            options_.cache_threshold) {
      return Decide(request, matches, best->info.id, DecisionReason::kCacheHit);
    }
    return Decide(request, matches, least->info.id, DecisionReason::kLeastLoaded);
  }

 private:
  PolicyOptions options_;
  MatchLookup lookup_;
};

Status ValidateOptions(const PolicyOptions& o) {
  auto bad = [](const std::string& what) {
    return Status::InvalidArgument("policy option " + what);
  };
  if (!(o.default_prefill_tokens_per_s > 0)) return bad("default_prefill_tokens_per_s must be > 0");
  if (!(o.default_decode_tokens_per_s > 0)) return bad("default_decode_tokens_per_s must be > 0");
  if (!(o.default_output_tokens > 0)) return bad("default_output_tokens must be > 0");
  if (!(o.decode_seconds_per_running_seq >= 0)) {
    return bad("decode_seconds_per_running_seq must be >= 0");
  }
  if (!(o.load_cap > 0)) return bad("load_cap must be > 0");
  if (!(o.spill_factor >= 1)) return bad("spill_factor must be >= 1");
  if (o.max_holders_per_prefix < 0) return bad("max_holders_per_prefix must be >= 0");
  if (!(o.max_holder_fraction > 0 && o.max_holder_fraction <= 1)) {
    return bad("max_holder_fraction must be in (0, 1]");
  }
  if (o.min_match_chunks < 1) return bad("min_match_chunks must be >= 1");
  if (!(o.placement_slack >= 1)) return bad("placement_slack must be >= 1");
  if (o.virtual_nodes < 1 || o.virtual_nodes > 100000) {
    return bad("virtual_nodes must be in [1, 100000]");
  }
  if (o.balance_abs_threshold < 0) return bad("balance_abs_threshold must be >= 0");
  if (!(o.balance_rel_threshold >= 1)) return bad("balance_rel_threshold must be >= 1");
  if (!(o.cache_threshold >= 0 && o.cache_threshold <= 1)) {
    return bad("cache_threshold must be in [0, 1]");
  }
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<Policy>> MakePolicy(PolicyKind kind, const PolicyOptions& options) {
  CHUNKSERVE_RETURN_IF_ERROR(ValidateOptions(options));
  switch (kind) {
    case PolicyKind::kTtft:
      return std::unique_ptr<Policy>(new TtftPolicy(options));
    case PolicyKind::kRoundRobin:
      return std::unique_ptr<Policy>(new RoundRobinPolicy());
    case PolicyKind::kLeastLoaded:
      return std::unique_ptr<Policy>(new LeastLoadedPolicy());
    case PolicyKind::kConsistentHash:
      return std::unique_ptr<Policy>(new ConsistentHashPolicy(options));
    case PolicyKind::kCacheAwareThreshold:
      return std::unique_ptr<Policy>(new CacheAwareThresholdPolicy(options));
  }
  return Status::InvalidArgument("unknown policy kind " +
                                 std::to_string(static_cast<int32_t>(kind)));
}

Result<std::unique_ptr<Policy>> MakePolicy(std::string_view name, const PolicyOptions& options) {
  CHUNKSERVE_ASSIGN_OR_RETURN(PolicyKind kind, ParsePolicyKind(name));
  return MakePolicy(kind, options);
}

void PrecisionStats::Add(int64_t predicted, int64_t reported) {
  const auto p = static_cast<uint64_t>(std::max<int64_t>(0, predicted));
  const auto r = static_cast<uint64_t>(std::max<int64_t>(0, reported));
  ++requests;
  predicted_tokens += p;
  reported_tokens += r;
  overlap_tokens += std::min(p, r);
  exact += p == r;
}

double PrecisionStats::Precision() const {
  return predicted_tokens == 0 ? 1.0 : static_cast<double>(overlap_tokens) / predicted_tokens;
}

double PrecisionStats::Recall() const {
  return reported_tokens == 0 ? 1.0 : static_cast<double>(overlap_tokens) / reported_tokens;
}

}  // namespace chunkserve::router
