#include "router/policies/least_loaded.h"

#include <memory>

#include "router/policy.h"

namespace chunkserve::router {
namespace {

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

}  // namespace

std::unique_ptr<Policy> MakeLeastLoadedPolicy(const PolicyOptions& /*options*/) {
  return std::make_unique<LeastLoadedPolicy>();
}

}  // namespace chunkserve::router
