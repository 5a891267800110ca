// One phase of chunkserve-loadgen: its requests sent open loop at their arrival times over
// --connections wire connections (round robin), every stream checked as it comes back, and the
// client-side figures of the phase (PhaseReport, router/loadgen/report.h).
#ifndef CHUNKSERVE_ROUTER_LOADGEN_PHASE_H_
#define CHUNKSERVE_ROUTER_LOADGEN_PHASE_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "router/loadgen/options.h"
#include "router/loadgen/report.h"
#include "runtime/base/status.h"
#include "runtime/wire/asio.h"
#include "runtime/wire/connection.h"
#include "runtime/workload/workload.h"

namespace chunkserve::router::loadgen {

using Clock = std::chrono::steady_clock;
using workload::WorkloadRequest;

struct RequestResult {
  Clock::time_point sent;
  std::optional<Clock::time_point> first_token;
  std::optional<Clock::time_point> end;
  int32_t prompt_tokens = 0;
  int32_t cached_tokens = 0;
  int32_t generated = 0;
  int32_t expected_index = 0;  // tokens received so far
  int32_t max_new_tokens = 0;
  bool error = false;
  bool bad_index = false;
  bool incomplete = false;  // ended normally with fewer or more tokens than asked, or than counted
  std::string error_message;
};

// Runs on the calling thread, once: Run, then Report.
class Phase {
 public:
  Phase(const Options& o, std::vector<WorkloadRequest> requests)
      : o_(o), requests_(std::move(requests)), results_(requests_.size()), timer_(io_) {}

  // Connects, sends every request at its arrival time and returns when all have ended (OK), a
  // connect failed or a connection with requests outstanding closed (Unavailable), or
  // --timeout-s passed (DeadlineExceeded; the requests that finished are still in Report).
  Status Run();
  // The phase's client-side figures (no router metrics), named `name`.
  PhaseReport Report(const std::string& name) const;

 private:
  void ScheduleNext();
  void Send(size_t i);
  std::string Why(const std::string& message) const;
  void Fail(size_t i, const std::string& message);
  void Done();
  void OnMessage(wire::DecodedMessage& m);

  const Options& o_;
  std::vector<WorkloadRequest> requests_;
  std::vector<RequestResult> results_;
  asio::io_context io_;
  asio::steady_timer timer_;
  std::unique_ptr<asio::steady_timer> deadline_timer_;
  std::vector<std::shared_ptr<wire::Connection>> connections_;
  size_t next_ = 0;
  size_t completed_ = 0;
  int64_t outstanding_ = 0;
  bool stopping_ = false;
  Status lost_;
  // Why a connection closed (its close reason, or the server's Error with requestId 0).
  std::string connection_problem_;
  Clock::time_point start_, end_;
};

}  // namespace chunkserve::router::loadgen

#endif  // CHUNKSERVE_ROUTER_LOADGEN_PHASE_H_
