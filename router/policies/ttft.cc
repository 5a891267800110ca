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
//   3. Someone holds a prefix worth more than similar_fraction of the prompt: the holders are
//      the workers matching at least half of the longest match whose cached tokens are within
//      similar_fraction x prompt tokens of the most any worker caches (savings that are alike
//      do not decide); take the holder with the lowest TTFT; spill to the best non-holder when
//      the holder's TTFT is more than spill_factor times the non-holder's (and the prefix has
//      fewer holders than the holder cap, none by default: spilling is load-driven). All
//      holders over the load cap: the best non-holder (load_cap).
//   4. Nobody holds a prefix worth the difference (nothing cached, or only a prefix everyone
//      shares, like a common system prompt): rendezvous hashing on the first chunk nobody holds
//      among the workers whose wait before this request's own prefill is within
//      placement_slack of the shortest (+1 ms) (new_prefix_placement). Keying on the first
//      unheld chunk lets requests behind a prefix shared by all spread, while a new tenant
//      prefix still lands where routers with the same membership agree.
class TtftPolicy final : public Policy {
 public:
  explicit TtftPolicy(const PolicyOptions& options) : options_(options) {}
  PolicyKind kind() const override { return PolicyKind::kTtft; }

  Result<RoutingDecision> Pick(const RoutingRequest& request, const PickContext& context) override {
    const std::vector<WorkerMatch> matches = Matches(request, context);
    lookup_.Fill(matches);
    const int64_t prompt_tokens = PromptTokens(request);
    const int32_t output = ExpectedOutputTokens(request, context);

    cands_.clear();
    bool any_under = false;
    for (const WorkerState& w : context.workers) {
      if (!w.accepting) continue;
      const int32_t m = lookup_.Get(w.info.id);
      const int64_t uncached = prompt_tokens - CachedTokens(request, m);
      const double cap = options_.load_cap * std::max(1, w.info.max_batch_size);
      const bool over = static_cast<double>(RequestLoad(w.load)) > cap;
      cands_.push_back(Cand{&w, m, prompt_tokens - uncached,
                            PredictTtftSeconds(w, uncached, output, options_),
                            over});
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
    int64_t best_saved = 0;
    for (const Cand& c : cands_) {
      best_match = std::max(best_match, c.match);
      best_saved = std::max(best_saved, c.saved);
    }
    // Savings within `similar` tokens of the best one are alike: they do not decide, load does.
    const double similar = options_.similar_fraction * static_cast<double>(prompt_tokens);
    if (best_match >= options_.min_match_chunks && static_cast<double>(best_saved) > similar) {
      // Holders: a match of at least half the longest one (so a worker missing only another
      // request's private tail still holds the prefix) that saves about as much as the best.
      auto is_holder = [&](const Cand& c) {
        return c.match >= options_.min_match_chunks && 2 * int64_t{c.match} >= best_match &&
               static_cast<double>(best_saved - c.saved) <= similar;
      };
      const Cand* holder = lowest([&](const Cand& c) { return under(c) && is_holder(c); });
      // Every holder is over the load cap: the best of the rest.
      if (holder == nullptr) return decide(lowest(under), DecisionReason::kLoadCap);
      const Cand* other = lowest([&](const Cand& c) { return under(c) && !is_holder(c); });
      int32_t holders = 0;
      int64_t holder_load = 0;   // running + queued requests over the holders
      int64_t holder_slots = 0;  // their batch slots
      for (const Cand& c : cands_) {
        if (!is_holder(c)) continue;
        ++holders;
        holder_load += RequestLoad(c.w->load);
        holder_slots += std::max(1, c.w->info.max_batch_size);
      }
      const int32_t cap =
          options_.max_holders_per_prefix > 0
              ? options_.max_holders_per_prefix
              : std::max<int32_t>(
                    2, static_cast<int32_t>(std::ceil(options_.max_holder_fraction *
                                                      static_cast<double>(cands_.size()))));
      // Moving a prefix only one worker holds (a conversation) costs its whole recompute and
      // gains no second copy for others: a larger factor then.
      double factor =
          holders == 1 ? std::max(options_.spill_factor, options_.spill_factor_single_holder)
                       : options_.spill_factor;
      // Holders short of slots: the best holder's batch is full (this request queues for a
      // slot), or, for a prefix several workers hold, their batches together are at least
      // holders_busy_fraction full (a new holder's batch has room while it prefills the prefix,
      // yet the prefix's demand already fills the others). Every later request of the prefix
      // will queue too, while a spill's prefill is paid once and adds a holder: a smaller factor
      // then, where the non-holder has a free slot (else the new holder would queue as well).
      auto batch_full = [](const Cand& c) {
        return RequestLoad(c.w->load) + 1 > std::max(1, c.w->info.max_batch_size);
      };
      const bool short_of_slots =
          batch_full(*holder) ||
          (holders >= 2 && options_.holders_busy_fraction > 0 &&
           static_cast<double>(holder_load + 1) >
               options_.holders_busy_fraction * static_cast<double>(holder_slots));
      if (options_.spill_factor_saturated > 0 && other != nullptr && short_of_slots &&
          !batch_full(*other)) {
        factor = std::min(factor, options_.spill_factor_saturated);
      }
      if (other != nullptr && holder->ttft > factor * other->ttft && holders < cap) {
        return decide(other, DecisionReason::kSpill);
      }
      return decide(holder, DecisionReason::kCacheHit);
    }

    // Nobody holds a prefix worth the difference: place by load. The rendezvous key is the
    // first chunk nobody holds, so a new tenant prefix lands where routers agree, and requests
    // behind a prefix everybody shares (a common system prompt) spread instead of following it.
    // Eligible: workers whose wait before this request's own prefill is within placement_slack
    // of the shortest (+1 ms). Comparing whole TTFTs would let a long prompt's own prefill
    // hide a queue (5 s of prefill x 1.5 admits a worker 2.5 s behind).
    double min_wait = 0;
    bool first = true;
    for (Cand& c : cands_) {
      if (!under(c)) continue;
      c.wait = PredictTtftSeconds(*c.w, 0, output, options_);
      if (first || c.wait < min_wait) min_wait = c.wait;
      first = false;
    }
    const double limit = min_wait * options_.placement_slack + 1e-3;
    ids_.clear();
    for (const Cand& c : cands_) {
      if (under(c) && c.wait <= limit) ids_.push_back(c.w->info.id);
    }
    const size_t key = std::min<size_t>(static_cast<size_t>(best_match),
                                        request.chunk_hashes.size() - 1);
    const WorkerId pick = RendezvousPick(request.chunk_hashes[key], ids_);
    const Cand* chosen = lowest([&](const Cand& c) { return c.w->info.id == pick; });
    return decide(chosen, DecisionReason::kNewPrefixPlacement);
  }

 private:
  struct Cand {
    const WorkerState* w;
    int32_t match;
    int64_t saved;  // predicted cached tokens
    double ttft;
    bool over_cap;
    double wait = 0;  // TTFT without this request's own prefill (placement only)
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
