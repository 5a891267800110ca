// LoadTracker: reported load merged with this router's own in-flight requests (routing.h).
//
// Why max(reported, own) and not a sum: a worker's report already includes the requests this
// router sent before the report was taken, so summing would count them twice; taking the own
// view alone would miss other routers' requests. The maximum is exact when this router is the
// only one and the report is stale, and never below what the worker last said.
#include <algorithm>
#include <string>
#include <unordered_map>

#include "router/routing.h"

namespace chunkserve::router {

struct LoadTracker::State {
  struct Own {
    WorkerLoad reported;
    int64_t pending_prefill_tokens = 0;  // picked, first token not yet seen
    int32_t pending_prefill_requests = 0;
    int32_t in_flight = 0;  // picked, not finished
  };
  struct Request {
    WorkerId worker;
    int64_t uncached = 0;
    bool prefill_pending = true;
  };
  std::unordered_map<WorkerId, Own> workers;
  std::unordered_map<RequestId, Request> requests;
};

LoadTracker::LoadTracker() : state_(std::make_unique<State>()) {}
LoadTracker::~LoadTracker() = default;
LoadTracker::LoadTracker(LoadTracker&&) noexcept = default;
LoadTracker& LoadTracker::operator=(LoadTracker&&) noexcept = default;

void LoadTracker::SetReported(WorkerId worker, const WorkerLoad& load) {
  state_->workers[worker].reported = load;
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
  it->second = State::Request{worker, uncached, true};
  State::Own& own = state_->workers[worker];
  own.pending_prefill_tokens += uncached;
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
    w->second.pending_prefill_tokens -= r.uncached;
    --w->second.pending_prefill_requests;
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
    if (r.prefill_pending) {
      w->second.pending_prefill_tokens -= r.uncached;
      --w->second.pending_prefill_requests;
    }
    --w->second.in_flight;
  }
  return Status::Ok();
}

WorkerLoad LoadTracker::Effective(WorkerId worker) const {
  auto it = state_->workers.find(worker);
  if (it == state_->workers.end()) return WorkerLoad{};
  const State::Own& own = it->second;
  WorkerLoad load = own.reported;
  load.queued_prefill_tokens =
      std::max<uint64_t>(load.queued_prefill_tokens,
                         static_cast<uint64_t>(std::max<int64_t>(0, own.pending_prefill_tokens)));
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
