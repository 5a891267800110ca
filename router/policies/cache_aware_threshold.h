// The cache_aware_threshold routing policy (its algorithm is at the top of
// cache_aware_threshold.cc); made through the policy registry (router/policy.cc, MakePolicy).
#ifndef CHUNKSERVE_ROUTER_POLICIES_CACHE_AWARE_THRESHOLD_H_
#define CHUNKSERVE_ROUTER_POLICIES_CACHE_AWARE_THRESHOLD_H_

#include <memory>

#include "router/routing.h"

namespace chunkserve::router {

std::unique_ptr<Policy> MakeCacheAwareThresholdPolicy(const PolicyOptions& options);

}  // namespace chunkserve::router

#endif  // CHUNKSERVE_ROUTER_POLICIES_CACHE_AWARE_THRESHOLD_H_
