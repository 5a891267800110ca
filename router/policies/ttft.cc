#include "router/policies/ttft.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "router/policy.h"

namespace chunkserve::router {
namespace {

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

}  // namespace

std::unique_ptr<Policy> MakeTtftPolicy(const PolicyOptions& options) {
  return std::make_unique<TtftPolicy>(options);
}

}  // namespace chunkserve::router
