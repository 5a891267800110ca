// The simulator's reports as a table and as JSON (simulator.h).
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "router/sim/simulator.h"

namespace chunkserve::router::sim {

std::string FormatTable(const std::vector<SimReport>& reports) {
  std::ostringstream out;
  char line[512];
  auto frac = [](double a, double b) { return b > 0 ? a / b : 0.0; };
  if (!reports.empty() && reports.front().oracle_affinity > 0) {
    std::snprintf(line, sizeof(line),
                  "oracles: infinite cache hit rate %.3f, perfect affinity (LRU, %s) %.3f\n",
                  reports.front().oracle_infinite, "same capacity",
                  reports.front().oracle_affinity);
    out << line;
  }
  std::snprintf(line, sizeof(line),
                "%-22s %8s %6s %6s %9s %9s %9s %9s %9s %8s %6s %6s %7s %7s %9s\n", "policy",
                "hit_rate", "/inf", "/aff", "ttft_mean", "ttft_p50", "ttft_p99", "e2e_p50",
                "e2e_p99", "req/s", "occup", "imbal", "precis", "cpu_s", "req/cpu_s");
  out << line;
  for (const SimReport& r : reports) {
    std::snprintf(
        line, sizeof(line),
        "%-22s %8.3f %5.0f%% %5.0f%% %8.3fs %8.3fs %8.3fs %8.2fs %8.2fs %8.2f %6.2f %6.2f %7.3f "
        "%7.2f %9.0f\n",
        r.policy.c_str(), r.hit_rate, 100 * frac(r.hit_rate, r.oracle_infinite),
        100 * frac(r.hit_rate, r.oracle_affinity), r.ttft_s.mean, r.ttft_s.p50, r.ttft_s.p99,
        r.e2e_s.p50, r.e2e_s.p99, r.throughput_rps, r.batch_occupancy, r.load_imbalance,
        r.precision, r.cpu_s, r.requests_per_cpu_s);
    out << line;
  }
  return out.str();
}

std::string FormatWorkerTable(const SimReport& r) {
  std::ostringstream out;
  char line[256];
  std::snprintf(line, sizeof(line), "%s per worker:\n%6s %8s %10s %8s %9s %9s %9s %9s\n",
                r.policy.c_str(), "worker", "requests", "prompt_tok", "hit_rate", "work_s",
                "busy_s", "evictions", "max_queue");
  out << line;
  for (size_t i = 0; i < r.workers.size(); ++i) {
    const SimWorkerStats& w = r.workers[i];
    std::snprintf(line, sizeof(line), "%6zu %8lld %10llu %8.3f %9.1f %9.1f %9llu %9lld\n", i,
                  static_cast<long long>(w.requests),
                  static_cast<unsigned long long>(w.prompt_tokens),
                  w.prompt_tokens ? static_cast<double>(w.cached_tokens) / w.prompt_tokens : 0.0,
                  w.work_s, w.busy_s, static_cast<unsigned long long>(w.evictions),
                  static_cast<long long>(w.max_queue));
    out << line;
  }
  return out.str();
}

std::string ToJson(const std::vector<SimReport>& reports) {
  nlohmann::json arr = nlohmann::json::array();
  for (const SimReport& r : reports) {
    nlohmann::json reasons = nlohmann::json::object();
    for (size_t i = 0; i < r.reasons.size(); ++i) {
      if (r.reasons[i] > 0) {
        reasons[std::string(DecisionReasonName(static_cast<DecisionReason>(i)))] = {
            {"requests", r.reasons[i]},
            {"ttft_mean_s", i < r.ttft_mean_by_reason.size() ? r.ttft_mean_by_reason[i] : 0}};
      }
    }
    nlohmann::json workers = nlohmann::json::array();
    for (const SimWorkerStats& w : r.workers) {
      workers.push_back({{"requests", w.requests},
                         {"prompt_tokens", w.prompt_tokens},
                         {"cached_tokens", w.cached_tokens},
                         {"hit_rate", w.prompt_tokens ? static_cast<double>(w.cached_tokens) /
                                                            static_cast<double>(w.prompt_tokens)
                                                      : 0.0},
                         {"work_s", w.work_s},
                         {"busy_s", w.busy_s},
                         {"evictions", w.evictions},
                         {"max_queue", w.max_queue}});
    }
    arr.push_back(
        {{"policy", r.policy},
         {"requests", r.requests},
         {"completed", r.completed},
         {"prompt_tokens", r.prompt_tokens},
         {"cached_tokens", r.cached_tokens},
         {"hit_rate", r.hit_rate},
         {"oracle",
          {{"infinite_hit_rate", r.oracle_infinite},
           {"affinity_hit_rate", r.oracle_affinity},
           {"of_infinite", r.oracle_infinite > 0 ? r.hit_rate / r.oracle_infinite : 0},
           {"of_affinity", r.oracle_affinity > 0 ? r.hit_rate / r.oracle_affinity : 0}}},
         {"ttft_s", {{"mean", r.ttft_s.mean}, {"p50", r.ttft_s.p50}, {"p99", r.ttft_s.p99}}},
         {"e2e_s", {{"mean", r.e2e_s.mean}, {"p50", r.e2e_s.p50}, {"p99", r.e2e_s.p99}}},
         {"makespan_s", r.makespan_s},
         {"throughput_rps", r.throughput_rps},
         {"output_tokens_per_s", r.output_tokens_per_s},
         {"busy_fraction", r.busy_fraction},
         {"batch_occupancy", r.batch_occupancy},
         {"load_imbalance", r.load_imbalance},
         {"precision", r.precision},
         {"recall", r.recall},
         {"kv_evictions", r.kv_evictions},
         {"index_bytes", r.index_bytes},
         {"reasons", reasons},
         {"sim", {{"events", r.events}, {"cpu_s", r.cpu_s},
                  {"deferred_admissions", r.deferred_admissions},
                  {"events_per_cpu_s", r.events_per_cpu_s},
                  {"requests_per_cpu_s", r.requests_per_cpu_s}}},
         {"workers", workers}});
  }
  return arr.dump(2);
}

}  // namespace chunkserve::router::sim
