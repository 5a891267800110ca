// Worker metrics in Prometheus text exposition format (chunkserve_ prefix).
//
// Counters and gauges come from Engine::Stats at scrape time; the latency histograms are
// recorded by the worker as streams progress. Buckets are fixed (seconds).
//
// Thread safety: all methods are safe from any thread.
#ifndef CHUNKSERVE_WORKER_METRICS_H_
#define CHUNKSERVE_WORKER_METRICS_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>

#include "runtime/engine/engine.h"

namespace chunkserve::worker {

class Histogram {
 public:
  static constexpr std::array<double, 14> kBuckets = {
      0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0};
  void Observe(double seconds);
  // Appends the _bucket / _sum / _count lines of `name` (with HELP and TYPE).
  void Render(const std::string& name, const std::string& help, std::string* out) const;

 private:
  mutable std::mutex mu_;
  std::array<uint64_t, kBuckets.size()> counts_{};  // non-cumulative per bucket
  uint64_t count_ = 0;
  double sum_ = 0;
};

struct WorkerMetrics {
  Histogram ttft;            // submit -> first token
  Histogram time_per_token;  // between consecutive tokens of a request
  Histogram e2e;             // submit -> terminal event
  Histogram queue;           // submit -> first admission into the running batch, as the
                             // scheduler measured it (FinishInfo::queue_seconds)
  std::atomic<uint64_t> rejected_overloaded{0};
  std::atomic<uint64_t> malformed_frames{0};
  std::atomic<uint64_t> connections_total{0};
  std::atomic<uint64_t> connections_refused{0};  // over the connection limit

  // `queued_prefill_tokens`: what the load reports say (queued_prefill.h).
  std::string Render(const engine::EngineStats& stats, bool ready, bool draining,
                     int64_t open_connections, int64_t queued_prefill_tokens) const;
};

}  // namespace chunkserve::worker

#endif  // CHUNKSERVE_WORKER_METRICS_H_
