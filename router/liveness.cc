#include "router/liveness.h"

#include <algorithm>

namespace chunkserve::router {
namespace {

std::string Seconds(RouterTime d) {
  return std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(d).count()) +
         " ms";
}

}  // namespace

void Liveness::Add(WorkerId id, RouterTime now) {
  State s;
  s.progress = now;
  workers_[id] = s;
}

void Liveness::Remove(WorkerId id) { workers_.erase(id); }

bool Liveness::routable(WorkerId id) const {
  auto it = workers_.find(id);
  return it != workers_.end() && Routable(it->second);
}

bool Liveness::stalled(WorkerId id) const {
  auto it = workers_.find(id);
  return it != workers_.end() && it->second.stalled;
}

std::vector<Liveness::Change> Liveness::OnReport(WorkerId id, uint64_t progress,
                                                 bool worker_busy, int64_t in_flight,
                                                 RouterTime now) {
  std::vector<Change> out;
  auto it = workers_.find(id);
  if (it == workers_.end()) return out;
  State& s = it->second;
  s.has_work = worker_busy || in_flight > 0;
  const bool moved = progress != s.counter;
  s.counter = progress;
  // Idle is not stalled: the clock starts when work arrives.
  if (moved || !s.has_work) s.progress = now;
  if (s.stalled && s.progress == now) {
    s.stalled = false;
    if (Routable(s)) {
      out.push_back({id, true, false, moved ? "engine progresses again" : "nothing left in flight"});
    }
  }
  return out;
}

std::vector<Liveness::Change> Liveness::OnLegSucceeded(WorkerId id) {
  auto it = workers_.find(id);
  if (it != workers_.end()) {
    it->second.failures = 0;
    it->second.backoff = RouterTime{};
  }
  return {};
}

std::vector<Liveness::Change> Liveness::OnLegFailed(WorkerId id, RouterTime now) {
  std::vector<Change> out;
  auto it = workers_.find(id);
  if (it == workers_.end() || options_.failure_threshold <= 0) return out;
  State& s = it->second;
  if (++s.failures < options_.failure_threshold || s.ejected) return out;
  const bool was = Routable(s);
  s.backoff = s.backoff == RouterTime{} ? options_.eject_min
                                         : std::min(s.backoff * 2, options_.eject_max);
  s.ejected = true;
  s.ejected_until = now + s.backoff;
  s.failures = 0;
  ejections_++;
  if (was) {
    out.push_back({id, false, false,
                   std::to_string(options_.failure_threshold) +
                       " consecutive failed requests: ejected for " + Seconds(s.backoff)});
  }
  return out;
}

std::vector<Liveness::Change> Liveness::Tick(RouterTime now) {
  std::vector<Change> out;
  for (auto& [id, s] : workers_) {
    const bool was = Routable(s);
    if (s.ejected && now >= s.ejected_until) s.ejected = false;
    if (options_.stall_timeout > RouterTime{} && !s.stalled && s.has_work &&
        now - s.progress >= options_.stall_timeout) {
      s.stalled = true;
      stalls_++;
      out.push_back({id, false, true,
                     "engine made no progress for " + Seconds(now - s.progress) +
                         " while it had work"});
      continue;
    }
    if (!was && Routable(s)) out.push_back({id, true, false, "ejection ended"});
  }
  return out;
}

}  // namespace chunkserve::router
