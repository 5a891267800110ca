#include "runtime/engine/workload_runner.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <thread>

namespace chunkserve::engine {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

Percentiles ComputePercentiles(std::vector<double> v) {
  Percentiles p;
  if (v.empty()) return p;
  std::sort(v.begin(), v.end());
  auto at = [&](double q) {
    const size_t i = static_cast<size_t>(std::ceil(q * v.size())) - 1;
    return v[std::min(i, v.size() - 1)];
  };
  p.p50 = at(0.50);
  p.p90 = at(0.90);
  p.p99 = at(0.99);
  p.max = v.back();
  double sum = 0;
  for (double x : v) sum += x;
  p.mean = sum / v.size();
  return p;
}

Result<WorkloadReport> RunWorkload(Engine& engine,
                                   const std::vector<workload::WorkloadRequest>& workload,
                                   const RunOptions& options) {
  struct PerRequest {
    Clock::time_point submit, first, last;
    std::vector<TokenId> tokens;
    sched::FinishInfo finish;
  };
  const size_t n = workload.size();
  std::vector<PerRequest> per(n);
  std::vector<std::shared_ptr<sched::RequestStream>> streams(n);
  std::atomic<int32_t> finished{0};
  std::atomic<uint64_t> peak{0}, peak_unshared{0};
  std::atomic<int32_t> peak_running{0};

  const Clock::time_point start = Clock::now();
  // Events are recorded by each stream's callback, on the engine's step thread as it delivers
  // them: no reader threads. Polling readers (two threads waking every 500 us) took the CPU from
  // the engine's own threads on a small machine and cost the runs ~30% of their throughput.
  std::mutex done_mu;
  std::condition_variable done_cv;
  size_t done_count = 0;
  // Progress and peak KV sampling.
  std::atomic<bool> stop_monitor{false};
  std::thread monitor([&] {
    auto next_progress = Clock::now();
    while (!stop_monitor.load()) {
      const EngineStats s = engine.Stats();
      peak = std::max<uint64_t>(peak.load(), s.kv_bytes_peak);
      peak_unshared = std::max<uint64_t>(peak_unshared.load(), s.kv_bytes_if_unshared);
      peak_running = std::max(peak_running.load(), s.running);
      if (options.progress && Clock::now() >= next_progress) {
        options.progress(s, finished.load(), Seconds(Clock::now() - start));
        next_progress += std::chrono::duration_cast<Clock::duration>(
            std::chrono::duration<double>(options.progress_interval_s));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  });

  Status submit_error;
  size_t submitted = 0;
  for (size_t i = 0; i < n; ++i) {
    const auto due = start + std::chrono::duration_cast<Clock::duration>(
                                 std::chrono::duration<double>(workload[i].arrival_s));
    std::this_thread::sleep_until(due);
    per[i].submit = Clock::now();
    sched::RequestOptions request;
    request.prompt = workload[i].prompt;
    request.max_new_tokens = workload[i].output_tokens;
    auto s = engine.Submit(request);
    if (!s.ok()) {
      submit_error = s.status().Annotate("request " + std::to_string(i));
      break;
    }
    PerRequest* record = &per[i];
    const Status set = (*s)->SetCallback([record, &finished, &done_mu, &done_cv,
                                          &done_count](const sched::StreamEvent& e) {
      const auto now = Clock::now();
      if (e.kind == sched::StreamEvent::Kind::kToken) {
        if (record->tokens.empty()) record->first = now;
        record->last = now;
        record->tokens.push_back(e.token);
        return;
      }
      record->finish = e.finish;
      record->last = now;
      ++finished;
      std::lock_guard<std::mutex> lock(done_mu);
      ++done_count;
      done_cv.notify_all();
    });
    if (!set.ok()) {
      submit_error = set.Annotate("request " + std::to_string(i));
      break;
    }
    streams[i] = *s;
    ++submitted;
  }
  {
    // Every submitted request ends (the engine delivers a terminal event to each stream).
    std::unique_lock<std::mutex> lock(done_mu);
    done_cv.wait(lock, [&] { return done_count == submitted; });
  }
  const double wall = Seconds(Clock::now() - start);
  stop_monitor = true;
  monitor.join();
  CHUNKSERVE_RETURN_IF_ERROR(submit_error);

  WorkloadReport r;
  const EngineStats s = engine.Stats();
  std::vector<double> ttft, tpot, e2e;
  for (size_t i = 0; i < n; ++i) {
    const PerRequest& p = per[i];
    ++r.requests;
    if (p.finish.reason != FinishReason::kStopToken && p.finish.reason != FinishReason::kLength) {
      ++r.failed;
    }
    r.prompt_tokens += workload[i].prompt.size();
    r.generated_tokens += p.tokens.size();
    if (!p.tokens.empty()) {
      ttft.push_back(Seconds(p.first - p.submit) * 1e3);
      if (p.tokens.size() > 1) {
        tpot.push_back(Seconds(p.last - p.first) * 1e3 / static_cast<double>(p.tokens.size() - 1));
      }
    }
    e2e.push_back(Seconds(p.last - p.submit) * 1e3);
    r.outputs.push_back(p.tokens);
  }
  r.wall_s = wall;
  r.generated_tokens_per_s = wall > 0 ? r.generated_tokens / wall : 0;
  r.ttft_ms = ComputePercentiles(ttft);
  r.tpot_ms = ComputePercentiles(tpot);
  r.e2e_ms = ComputePercentiles(e2e);
  r.kv_bytes_peak = std::max<uint64_t>(peak.load(), s.kv_bytes_peak);
  r.kv_bytes_if_unshared_peak = peak_unshared.load();
  r.prefix_hit_rate =
      s.prompt_tokens > 0 ? static_cast<double>(s.prefix_hit_tokens) / s.prompt_tokens : 0.0;
  r.preemptions = s.preemptions;
  r.evicted_chunks = s.evicted_chunks;
  r.peak_running = peak_running.load();
  return r;
}

}  // namespace chunkserve::engine
