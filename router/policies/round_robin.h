// The round_robin routing policy (its algorithm is at the top of round_robin.cc); made through the
// policy registry (router/policy.cc, MakePolicy).
#ifndef CHUNKSERVE_ROUTER_POLICIES_ROUND_ROBIN_H_
#define CHUNKSERVE_ROUTER_POLICIES_ROUND_ROBIN_H_

#include <memory>

#include "router/routing.h"

namespace chunkserve::router {

std::unique_ptr<Policy> MakeRoundRobinPolicy(const PolicyOptions& options);

}  // namespace chunkserve::router

#endif  // CHUNKSERVE_ROUTER_POLICIES_ROUND_ROBIN_H_
