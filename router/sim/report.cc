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
  std::snprintf(line, sizeof(line), "%-22s %8s %6s %6s %9s %9s %9s %9s %9s %8s %6s %6s %7s\n",
                "policy", "hit_rate", "/inf", "/aff", "ttft_mean", "ttft_p50", "ttft_p99",
                "e2e_p50", "e2e_p99", "req/s", "occup", "imbal", "precis");
  out << line;
  for (const SimReport& r : reports) {
    std::snprintf(
        line, sizeof(line),
        "%-22s %8.3f %5.0f%% %5.0f%% %8.3fs %8.3fs %8.3fs %8.2fs %8.2fs %8.2f %6.2f %6.2f %7.3f\n",
        r.policy.c_str(), r.hit_rate, 100 * frac(r.hit_rate, r.oracle_infinite),
        100 * frac(r.hit_rate, r.oracle_affinity), r.ttft_s.mean, r.ttft_s.p50, r.ttft_s.p99,
        r.e2e_s.p50, r.e2e_s.p99, r.throughput_rps, r.batch_occupancy, r.load_imbalance,
        r.precision);
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
         {"reasons", reasons}});
  }
  return arr.dump(2);
}

}  // namespace chunkserve::router::sim
