// The least_loaded routing policy (its algorithm is at the top of least_loaded.cc); made through
// the policy registry (router/policy.cc, MakePolicy).
#ifndef CHUNKSERVE_ROUTER_POLICIES_LEAST_LOADED_H_
#define CHUNKSERVE_ROUTER_POLICIES_LEAST_LOADED_H_

#include <memory>

#include "router/routing.h"

namespace chunkserve::router {

std::unique_ptr<Policy> MakeLeastLoadedPolicy(const PolicyOptions& options);

}  // namespace chunkserve::router

#endif  // CHUNKSERVE_ROUTER_POLICIES_LEAST_LOADED_H_
