// The ttft routing policy (its algorithm is at the top of ttft.cc); made through the
// policy registry (router/policy.cc, MakePolicy).
#ifndef CHUNKSERVE_ROUTER_POLICIES_TTFT_H_
#define CHUNKSERVE_ROUTER_POLICIES_TTFT_H_

#include <memory>

#include "router/routing.h"

namespace chunkserve::router {

std::unique_ptr<Policy> MakeTtftPolicy(const PolicyOptions& options);

}  // namespace chunkserve::router

#endif  // CHUNKSERVE_ROUTER_POLICIES_TTFT_H_
