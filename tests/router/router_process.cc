#include "tests/router/router_process.h"

#include <cstdlib>
#include <sstream>
#include <thread>

#include "tests/worker/worker_process.h"

namespace chunkserve::router::testing {

using namespace std::chrono_literals;

Result<std::unique_ptr<RouterProcess>> RouterProcess::Start(const std::vector<std::string>& args) {
  std::unique_ptr<RouterProcess> p(new RouterProcess());
  CHUNKSERVE_RETURN_IF_ERROR(p->Launch(CHUNKSERVE_ROUTER_BIN, "router", args));
  return p;
}

Result<double> Metric(uint16_t http_port, const std::string& series) {
  CHUNKSERVE_ASSIGN_OR_RETURN(worker::testing::HttpResponse r,
                              worker::testing::HttpGet(http_port, "/metrics"));
  if (r.status != 200) return Status::Unavailable("metrics answered " + std::to_string(r.status));
  std::istringstream in(r.body);
  std::string line;
  while (std::getline(in, line)) {
    if (line.size() > series.size() && line.compare(0, series.size(), series) == 0 &&
        line[series.size()] == ' ') {
      return std::strtod(line.c_str() + series.size() + 1, nullptr);
    }
  }
  return Status::NotFound("no metric " + series);
}

bool WaitFor(const std::function<bool()>& predicate, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (predicate()) return true;
    std::this_thread::sleep_for(20ms);
  }
  return predicate();
}

Result<double> WaitForMetric(uint16_t http_port, const std::string& series,
                             const std::function<bool(double)>& predicate,
                             std::chrono::milliseconds timeout) {
  Result<double> last = Status::NotFound("not polled");
  const bool met = WaitFor(
      [&] {
        last = Metric(http_port, series);
        return last.ok() && predicate(last.value());
      },
      timeout);
  if (met || !last.ok()) return last;
  return Status::DeadlineExceeded(series + " still " + std::to_string(last.value()) + " after " +
                                  std::to_string(timeout.count()) + " ms");
}

}  // namespace chunkserve::router::testing
