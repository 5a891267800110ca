// LoadTracker: reported load merged with this router's own in-flight requests (routing.h).
//
// Request counts: max(reported, own). A worker's report already includes the requests this
// router sent before the report was taken, so summing would count them twice; taking the own
// view alone would miss other routers' requests. The maximum is exact when this router is the
// only one and the report is stale, and never below what the worker last said.
//
// Queued prefill tokens: the own view of a request is its uncached prompt at pick time, which
// stays true only until the worker starts on it; a fresh report knows how far the prefill got.
// So the own view of a request counts only until two reports arrived after its pick: a report
// that arrived before the pick cannot include the request, the next one may not (it may have
// been taken before the request arrived), the one after does. Effective:
//   max(reported + picked since the last report, picked since the report before it).
// Counting every own request until its first token instead (max of the two totals) kept a
// worker that was 0.3 s from the end of a 120k-token prefill at the whole 120k for as long as
// the prefill ran: routers moved its requests to cold workers to prefill the document again.
#include <algorithm>
#include <string>
#include <unordered_map>

#include "router/routing.h"

namespace chunkserve::router {

struct LoadTracker::State {
  struct Own {
    WorkerLoad reported;
    uint64_t reports = 0;                // reports received
    // Uncached prompt tokens of the requests picked, first token not yet seen: those picked
    // since the last report, and those picked between the last two reports.
    int64_t pending_since_last = 0;
    int64_t pending_since_previous = 0;
    int32_t pending_prefill_requests = 0;  // picked, first token not yet seen
    int32_t in_flight = 0;  // picked, not finished
  };
  struct Request {
    WorkerId worker;
    int64_t uncached = 0;
    bool prefill_pending = true;
    uint64_t reports_at_pick = 0;  // the worker's Own::reports when picked
  };
  std::unordered_map<WorkerId, Own> workers;
  std::unordered_map<RequestId, Request> requests;

  // The request's prefill is done or abandoned: its tokens leave the sums that hold them.
  static void ReleasePrefill(Own& own, const Request& r) {
    --own.pending_prefill_requests;
    if (r.reports_at_pick == own.reports) {
      own.pending_since_last -= r.uncached;
    } else if (r.reports_at_pick + 1 == own.reports) {
      own.pending_since_previous -= r.uncached;
    }
  }
};

LoadTracker::LoadTracker() : state_(std::make_unique<State>()) {}
LoadTracker::~LoadTracker() = default;
LoadTracker::LoadTracker(LoadTracker&&) noexcept = default;
LoadTracker& LoadTracker::operator=(LoadTracker&&) noexcept = default;

void LoadTracker::SetReported(WorkerId worker, const WorkerLoad& load, bool fresh) {
  State::Own& own = state_->workers[worker];
  own.reported = load;
  if (!fresh) return;
  ++own.reports;
  own.pending_since_previous = own.pending_since_last;
  own.pending_since_last = 0;
}

void LoadTracker::DropWorker(WorkerId worker) {
  // Requests still in flight stay known (the caller re-routes and finishes them); only the
  // worker's counters go. A later OnFinished for them is then harmless.
  state_->workers.erase(worker);
}

Status LoadTracker::OnPicked(RequestId request, WorkerId worker, int64_t uncached_prompt_tokens) {
  if (!worker.valid()) return Status::InvalidArgument("OnPicked with an invalid worker id");
  auto [it, inserted] = state_->requests.try_emplace(request);
  if (!inserted) {
    return Status::AlreadyExists("request " + std::to_string(request.value()) +
                                 " is already in flight");
  }
  const int64_t uncached = std::max<int64_t>(0, uncached_prompt_tokens);
  State::Own& own = state_->workers[worker];
  it->second = State::Request{worker, uncached, true, own.reports};
  own.pending_since_last += uncached;
  ++own.pending_prefill_requests;
  ++own.in_flight;
  return Status::Ok();
}

Status LoadTracker::OnFirstToken(RequestId request) {
  auto it = state_->requests.find(request);
  if (it == state_->requests.end()) {
    return Status::NotFound("request " + std::to_string(request.value()) + " is not in flight");
  }
  State::Request& r = it->second;
  if (!r.prefill_pending) return Status::Ok();
  r.prefill_pending = false;
  if (auto w = state_->workers.find(r.worker); w != state_->workers.end()) {
    State::ReleasePrefill(w->second, r);
  }
  return Status::Ok();
}

Status LoadTracker::OnFinished(RequestId request) {
  auto it = state_->requests.find(request);
  if (it == state_->requests.end()) {
    return Status::NotFound("request " + std::to_string(request.value()) + " is not in flight");
  }
  const State::Request r = it->second;
  state_->requests.erase(it);
  if (auto w = state_->workers.find(r.worker); w != state_->workers.end()) {
    if (r.prefill_pending) State::ReleasePrefill(w->second, r);
    --w->second.in_flight;
  }
  return Status::Ok();
}

WorkerLoad LoadTracker::Effective(WorkerId worker) const {
  auto it = state_->workers.find(worker);
  if (it == state_->workers.end()) return WorkerLoad{};
  const State::Own& own = it->second;
  WorkerLoad load = own.reported;
  const int64_t unreported = std::max<int64_t>(0, own.pending_since_last);
  const int64_t maybe_reported = unreported + std::max<int64_t>(0, own.pending_since_previous);
  load.queued_prefill_tokens = std::max<uint64_t>(
      load.queued_prefill_tokens + static_cast<uint64_t>(unreported),
      static_cast<uint64_t>(maybe_reported));
  // Own requests past prefill are running; those before it are queued (or being prefilled).
  const int32_t own_running = std::max(0, own.in_flight - own.pending_prefill_requests);
  load.running_sequences = std::max(load.running_sequences, own_running);
  load.queued_requests = std::max(load.queued_requests, own.pending_prefill_requests);
  return load;
}

int32_t LoadTracker::InFlight(WorkerId worker) const {
  auto it = state_->workers.find(worker);
  return it == state_->workers.end() ? 0 : it->second.in_flight;
}

WorkerId LoadTracker::WorkerOf(RequestId request) const {
  auto it = state_->requests.find(request);
  return it == state_->requests.end() ? WorkerId::Invalid() : it->second.worker;
}

}  // namespace chunkserve::router
