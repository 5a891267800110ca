#include "router/policies/round_robin.h"

#include <memory>

#include "router/policy.h"

namespace chunkserve::router {
namespace {

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

}  // namespace

std::unique_ptr<Policy> MakeRoundRobinPolicy(const PolicyOptions& /*options*/) {
  return std::make_unique<RoundRobinPolicy>();
}

}  // namespace chunkserve::router
