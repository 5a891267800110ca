// Test helpers for the router process tests: a chunkserve-router child process on 127.0.0.1,
// Prometheus metric scraping, and small wire-client helpers shared by the router tests.
#ifndef CHUNKSERVE_TESTS_ROUTER_ROUTER_PROCESS_H_
#define CHUNKSERVE_TESTS_ROUTER_ROUTER_PROCESS_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/base/status.h"
#include "runtime/wire/client.h"
#include "tests/testing/server_process.h"

namespace chunkserve::router::testing {

class RouterProcess : public ::chunkserve::testing::ServerProcess {
 public:
  // Starts chunkserve-router with --listen 127.0.0.1:0 --http 127.0.0.1:0 followed by `args`
  // (later flags win, so args may pin the ports) and waits for it to print both ports.
  static Result<std::unique_ptr<RouterProcess>> Start(const std::vector<std::string>& args);
};

// The value of one sample of a Prometheus text exposition: `series` is the metric name with its
// labels exactly as exposed (e.g. chunkserve_router_worker_routed_total{worker="w1"}).
// NotFound when absent.
Result<double> Metric(uint16_t http_port, const std::string& series);

// Polls `predicate` until it holds or `timeout` passes (returns whether it held).
bool WaitFor(const std::function<bool()>& predicate, std::chrono::milliseconds timeout);

// Polls the metric until `predicate(value)` holds and returns that value; DeadlineExceeded when it
// still does not hold after `timeout`, the metric's error when it cannot be read.
Result<double> WaitForMetric(uint16_t http_port, const std::string& series,
                             const std::function<bool(double)>& predicate,
                             std::chrono::milliseconds timeout);

}  // namespace chunkserve::router::testing

#endif  // CHUNKSERVE_TESTS_ROUTER_ROUTER_PROCESS_H_
