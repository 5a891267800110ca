// The consistent_hash routing policy (its algorithm is at the top of consistent_hash.cc); made
// through the policy registry (router/policy.cc, MakePolicy).
#ifndef CHUNKSERVE_ROUTER_POLICIES_CONSISTENT_HASH_H_
#define CHUNKSERVE_ROUTER_POLICIES_CONSISTENT_HASH_H_

#include <memory>

#include "router/routing.h"

namespace chunkserve::router {

std::unique_ptr<Policy> MakeConsistentHashPolicy(const PolicyOptions& options);

}  // namespace chunkserve::router

#endif  // CHUNKSERVE_ROUTER_POLICIES_CONSISTENT_HASH_H_
