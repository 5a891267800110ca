// Liveness: whether a worker may be routed to, decided from what it does rather than from its
// sockets. Pure logic over RouterTime (no sockets, no timers), driven by the router process.
//
//  - Progress. Every LoadReport carries the worker's engine progress counter (steps run plus
//    requests ended). A worker that has work (requests in flight from this router, or requests
//    admitted and not ended by its own account) and whose counter has not moved for
//    `stall_timeout` is *stalled*: no new requests, and its requests in flight move elsewhere (the
//    process and links may be fine; the engine is not). It is readmitted the first time its
//    counter moves again, or once it reports nothing left in flight (a frozen engine cannot: the
//    requests it was given end only when it moves).
//  - Outliers. `failure_threshold` consecutive failed legs (an error or unavailable finish, a
//    first-token timeout, a refusal is not one) eject a worker for a backoff that starts at
//    `eject_min` and doubles per ejection up to `eject_max`; a successful leg resets the count and
//    the backoff.
//
// Thread safety: none (the router's io thread).
#ifndef CHUNKSERVE_ROUTER_LIVENESS_H_
#define CHUNKSERVE_ROUTER_LIVENESS_H_

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "router/routing.h"
#include "runtime/base/ids.h"

namespace chunkserve::router {

struct LivenessOptions {
  RouterTime stall_timeout = std::chrono::seconds(5);  // 0: progress not checked
  int32_t failure_threshold = 5;                       // 0: no outlier ejection
  RouterTime eject_min = std::chrono::seconds(1);
  RouterTime eject_max = std::chrono::seconds(30);
};

class Liveness {
 public:
  explicit Liveness(LivenessOptions options = {}) : options_(options) {}

  // A change of routability: `routable` false = stop sending it requests (`migrate`: and move the
  // ones it has), true = it may be picked again.
  struct Change {
    WorkerId id;
    bool routable = false;
    bool migrate = false;
    std::string why;
  };

  void Add(WorkerId id, RouterTime now);
  void Remove(WorkerId id);

  // A LoadReport: the engine's progress counter and whether the worker has work by its own
  // account (requests admitted and not ended). `in_flight` is this router's requests on it.
  std::vector<Change> OnReport(WorkerId id, uint64_t progress, bool worker_busy, int64_t in_flight,
                               RouterTime now);
  std::vector<Change> OnLegSucceeded(WorkerId id);
  std::vector<Change> OnLegFailed(WorkerId id, RouterTime now);
  // Stalls and ends of ejections that time alone decides.
  std::vector<Change> Tick(RouterTime now);

  bool routable(WorkerId id) const;
  bool stalled(WorkerId id) const;
  uint64_t stalls() const { return stalls_; }
  uint64_t ejections() const { return ejections_; }

 private:
  struct State {
    uint64_t counter = 0;        // the last reported progress counter
    RouterTime progress{};       // last time the counter moved (or Add)
    bool has_work = false;       // as of the last report
    bool stalled = false;
    int32_t failures = 0;        // consecutive failed legs
    RouterTime backoff{};        // current ejection length (0: never ejected since success)
    RouterTime ejected_until{};  // > now: ejected
    bool ejected = false;
  };
  static bool Routable(const State& s) { return !s.stalled && !s.ejected; }

  const LivenessOptions options_;
  std::unordered_map<WorkerId, State> workers_;
  uint64_t stalls_ = 0;
  uint64_t ejections_ = 0;
};

}  // namespace chunkserve::router

#endif  // CHUNKSERVE_ROUTER_LIVENESS_H_
