#include "worker/metrics.h"

#include <cstdio>

namespace chunkserve::worker {
namespace {

std::string Num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}

void Metric(std::string* out, const std::string& name, const char* type, const std::string& help,
            double value) {
  *out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n" + name + " " +
          Num(value) + "\n";
}

}  // namespace

void Histogram::Observe(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < kBuckets.size(); ++i) {
    if (seconds <= kBuckets[i]) {
      ++counts_[i];
      break;
    }
  }
  ++count_;
  sum_ += seconds;
}

void Histogram::Render(const std::string& name, const std::string& help, std::string* out) const {
  std::lock_guard<std::mutex> lock(mu_);
  *out += "# HELP " + name + " " + help + "\n# TYPE " + name + " histogram\n";
  uint64_t cumulative = 0;
  for (size_t i = 0; i < kBuckets.size(); ++i) {
    cumulative += counts_[i];
    *out += name + "_bucket{le=\"" + Num(kBuckets[i]) + "\"} " + std::to_string(cumulative) + "\n";
  }
  *out += name + "_bucket{le=\"+Inf\"} " + std::to_string(count_) + "\n";
  *out += name + "_sum " + Num(sum_) + "\n";
  *out += name + "_count " + std::to_string(count_) + "\n";
}

std::string WorkerMetrics::Render(const engine::EngineStats& s, bool ready, bool draining,
                                  int64_t open_connections, int64_t queued_prefill_tokens) const {
  std::string out;
  auto d = [](auto v) { return static_cast<double>(v); };
  Metric(&out, "chunkserve_requests_total", "counter", "Requests admitted by the engine.",
         d(s.requests_submitted));
  Metric(&out, "chunkserve_requests_finished_total", "counter", "Requests that ended.",
         d(s.requests_finished));
  Metric(&out, "chunkserve_requests_rejected_overloaded_total", "counter",
         "Generate requests answered with a retryable overloaded error.",
         d(rejected_overloaded.load()));
  Metric(&out, "chunkserve_generated_tokens_total", "counter", "Tokens streamed out.",
         d(s.generated_tokens));
  Metric(&out, "chunkserve_prompt_tokens_total", "counter", "Prompt tokens of admitted requests.",
         d(s.prompt_tokens));
  Metric(&out, "chunkserve_prefix_hit_tokens_total", "counter",
         "Prompt tokens whose KV came from the prefix cache.", d(s.prefix_hit_tokens));
  Metric(&out, "chunkserve_prefill_tokens_total", "counter", "Tokens run through prefill.",
         d(s.prefill_tokens));
  Metric(&out, "chunkserve_evictions_total", "counter", "KV chunks evicted.", d(s.evicted_chunks));
  Metric(&out, "chunkserve_preemptions_total", "counter", "Requests preempted by recompute.",
         d(s.preemptions));
  Metric(&out, "chunkserve_steps_total", "counter", "Engine steps.", d(s.steps));
  Metric(&out, "chunkserve_malformed_frames_total", "counter",
         "Connections closed for a malformed or oversized frame.", d(malformed_frames.load()));
  Metric(&out, "chunkserve_connections_total", "counter", "Wire connections accepted.",
         d(connections_total.load()));
  Metric(&out, "chunkserve_connections_refused_total", "counter",
         "Wire connections refused at the connection limit.", d(connections_refused.load()));
  Metric(&out, "chunkserve_running", "gauge", "Sequences in the running batch.", d(s.running));
  Metric(&out, "chunkserve_queued", "gauge", "Requests submitted, not yet admitted.", d(s.queued));
  Metric(&out, "chunkserve_queued_prefill_tokens", "gauge",
         "Prompt tokens the engine will prefill for requests without their first token, a "
         "shared prefix counted once (the load reports' queuedPrefillTokens).",
         d(queued_prefill_tokens));
  Metric(&out, "chunkserve_kv_bytes_used", "gauge", "KV bytes in use (shared counted once).",
         d(s.kv_bytes_used));
  Metric(&out, "chunkserve_kv_bytes_referenced", "gauge", "KV bytes referenced by live sequences.",
         d(s.kv_bytes_referenced));
  Metric(&out, "chunkserve_kv_bytes_capacity", "gauge", "KV arena size in bytes.",
         d(s.kv_bytes_capacity));
  Metric(&out, "chunkserve_weight_bytes", "gauge",
         "Bytes of model weights the engine keeps resident (the leader's share under --tp).",
         d(s.weight_bytes));
  Metric(&out, "chunkserve_resident_bytes", "gauge", "The worker process's resident memory.",
         d(s.resident_bytes));
  Metric(&out, "chunkserve_chunks", "gauge", "KV chunks in the prefix tree.", d(s.chunks_total));
  Metric(&out, "chunkserve_shared_chunks", "gauge",
         "Chunks referenced by two or more live sequences.", d(s.chunks_shared));
  Metric(&out, "chunkserve_retained_chunks", "gauge", "Unreferenced chunks kept for reuse.",
         d(s.chunks_retained));
  Metric(&out, "chunkserve_open_connections", "gauge", "Open wire connections.",
         d(open_connections));
  Metric(&out, "chunkserve_ready", "gauge", "1 when /readyz answers 200.", ready ? 1 : 0);
  Metric(&out, "chunkserve_draining", "gauge", "1 once SIGTERM started the drain.",
         draining ? 1 : 0);
  ttft.Render("chunkserve_ttft_seconds", "Time from receipt to the first token.", &out);
  time_per_token.Render("chunkserve_time_per_output_token_seconds",
                        "Time between consecutive tokens of a request.", &out);
  e2e.Render("chunkserve_e2e_seconds", "Time from receipt to the terminal event.", &out);
  queue.Render("chunkserve_queue_seconds",
               "Time from submission to admission into the running batch.", &out);
  return out;
}

}  // namespace chunkserve::worker
