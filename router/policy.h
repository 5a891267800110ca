// Internal helpers shared by the routing policies (policy.cc) and their tests. The public
// contract is in routing.h (Policy, MakePolicy, RendezvousPick).
#ifndef CHUNKSERVE_ROUTER_POLICY_H_
#define CHUNKSERVE_ROUTER_POLICY_H_

#include <cstdint>
#include <span>

#include "router/routing.h"

namespace chunkserve::router {

// A 64-bit finalizer (splitmix64): spreads any key over 64 bits. Used for rendezvous weights
// and ring positions, so they are identical on every platform and in every router.
uint64_t Mix64(uint64_t x);

// Prompt length in tokens: max(prompt_tokens, prompt.size()).
int64_t PromptTokens(const RoutingRequest& request);

// Cached prompt tokens implied by `matched_chunks` full chunks (capped at the prompt length).
int64_t CachedTokens(const RoutingRequest& request, int32_t matched_chunks);

// The ttft policy's estimate for one worker (routing.h PolicyOptions explains the formula).
double PredictTtftSeconds(const WorkerState& worker, int64_t uncached_tokens,
                          int32_t expected_output_tokens, const PolicyOptions& options);

// running + queued requests: the request-count load the baselines balance.
int64_t RequestLoad(const WorkerLoad& load);

}  // namespace chunkserve::router

#endif  // CHUNKSERVE_ROUTER_POLICY_H_
