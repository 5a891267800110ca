#include "router/policies/cache_aware_threshold.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "router/policy.h"

namespace chunkserve::router {
namespace {

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

}  // namespace

std::unique_ptr<Policy> MakeCacheAwareThresholdPolicy(const PolicyOptions& options) {
  return std::make_unique<CacheAwareThresholdPolicy>(options);
}

}  // namespace chunkserve::router
