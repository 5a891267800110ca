// The policy registry (one table: kind, name, factory) and what every policy shares: hashing,
// token and load arithmetic, the TTFT estimate, index matches, decisions. Each policy is a file
// in router/policies/ with its algorithm at the top.
#include "router/policy.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "router/policies/cache_aware_threshold.h"
#include "router/policies/consistent_hash.h"
#include "router/policies/least_loaded.h"
#include "router/policies/round_robin.h"
#include "router/policies/ttft.h"

namespace chunkserve::router {
namespace {

// Every policy: adding one is a line here (and its PolicyKind).
struct PolicyEntry {
  PolicyKind kind;
  std::string_view name;
  std::unique_ptr<Policy> (*make)(const PolicyOptions& options);
};

constexpr PolicyEntry kPolicies[] = {
    {PolicyKind::kTtft, "ttft", &MakeTtftPolicy},
    {PolicyKind::kRoundRobin, "round_robin", &MakeRoundRobinPolicy},
    {PolicyKind::kLeastLoaded, "least_loaded", &MakeLeastLoadedPolicy},
    {PolicyKind::kConsistentHash, "consistent_hash", &MakeConsistentHashPolicy},
    {PolicyKind::kCacheAwareThreshold, "cache_aware_threshold", &MakeCacheAwareThresholdPolicy},
};

const PolicyEntry* Find(PolicyKind kind) {
  for (const PolicyEntry& e : kPolicies) {
    if (e.kind == kind) return &e;
  }
  return nullptr;
}

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
  if (!(o.spill_factor_saturated >= 0)) return bad("spill_factor_saturated must be >= 0");
  if (!(o.holders_busy_fraction >= 0)) return bad("holders_busy_fraction must be >= 0");
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

int32_t ExpectedOutputTokens(const RoutingRequest& request, const PickContext& context) {
  const int32_t cap = std::max(0, request.max_new_tokens);
  if (!(context.mean_output_tokens >= 1)) return cap;
  const auto mean = static_cast<int32_t>(std::lround(std::min(context.mean_output_tokens, 1e9)));
  return cap > 0 ? std::min(cap, mean) : mean;
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
  const PolicyEntry* e = Find(kind);
  return e != nullptr ? e->name : "unknown";
}

std::vector<PolicyKind> AllPolicyKinds() {
  std::vector<PolicyKind> out;
  for (const PolicyEntry& e : kPolicies) out.push_back(e.kind);
  return out;
}

Result<PolicyKind> ParsePolicyKind(std::string_view name) {
  std::string valid;
  for (const PolicyEntry& e : kPolicies) {
    if (e.name == name) return e.kind;
    valid += valid.empty() ? "" : ", ";
    valid += e.name;
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

Status NoWorkers(const PickContext& context) {
  return Status::Unavailable("no workers accept requests (" +
                             std::to_string(context.workers.size()) + " known)");
}

std::vector<WorkerMatch> Matches(const RoutingRequest& request, const PickContext& context) {
  if (context.index == nullptr || request.chunk_hashes.empty()) return {};
  return context.index->LongestMatch(request.chunk_hashes, context.now);
}

int32_t MatchOf(const std::vector<WorkerMatch>& matches, WorkerId worker) {
  auto it = std::lower_bound(matches.begin(), matches.end(), worker,
                             [](const WorkerMatch& m, WorkerId w) { return m.worker < w; });
  return it != matches.end() && it->worker == worker ? it->matched_chunks : 0;
}

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
                       WorkerId worker, DecisionReason reason, double ttft) {
  return RoutingDecision{.worker = worker,
                         .predicted_cached_tokens = CachedTokens(request, MatchOf(matches, worker)),
                         .reason = reason,
                         .predicted_ttft_s = ttft};
}

Result<std::unique_ptr<Policy>> MakePolicy(PolicyKind kind, const PolicyOptions& options) {
  CHUNKSERVE_RETURN_IF_ERROR(ValidateOptions(options));
  const PolicyEntry* e = Find(kind);
  if (e == nullptr) {
    return Status::InvalidArgument("unknown policy kind " +
                                   std::to_string(static_cast<int32_t>(kind)));
  }
  return e->make(options);
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
