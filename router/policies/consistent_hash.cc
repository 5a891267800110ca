#include "router/policies/consistent_hash.h"

#include <algorithm>
#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

#include "router/policy.h"
#include "runtime/kvcache/chunk_hash.h"

namespace chunkserve::router {
namespace {

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

}  // namespace

std::unique_ptr<Policy> MakeConsistentHashPolicy(const PolicyOptions& options) {
  return std::make_unique<ConsistentHashPolicy>(options);
}

}  // namespace chunkserve::router
