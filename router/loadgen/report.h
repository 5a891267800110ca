// chunkserve-loadgen's reports: the router's /metrics scraped before and after a phase, the
// per-phase figures, and their table and JSON forms.
#ifndef CHUNKSERVE_ROUTER_LOADGEN_REPORT_H_
#define CHUNKSERVE_ROUTER_LOADGEN_REPORT_H_

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "runtime/base/status.h"

namespace chunkserve::router {

using Samples = std::map<std::string, double>;  // series (name{labels}) -> value

// GET /metrics of the router at http_host:http_port, parsed into samples; Unavailable when the
// exchange has not finished within `timeout` (a router behind a silent partition).
Result<Samples> Scrape(const std::string& http_host, uint16_t http_port,
                       std::chrono::milliseconds timeout = std::chrono::seconds(3));

struct WorkerFigures {
  double routed = 0;
  double prompt_tokens = 0;
  double cached_tokens = 0;
};

struct PhaseReport {
  std::string name;
  int64_t requests = 0;
  int64_t finished = 0;
  int64_t errors = 0;
  int64_t bad_indices = 0;
  int64_t incomplete = 0;  // ended normally without exactly the tokens asked for (and counted)
  int64_t tokens = 0;      // tokens received by finished requests
  double hit_rate = 0;
  double ttft_mean_ms = 0, ttft_p50_ms = 0, ttft_p99_ms = 0;
  double e2e_p50_ms = 0, e2e_p99_ms = 0;
  double wall_s = 0;
  double requests_per_s = 0;
  double output_tokens_per_s = 0;
  bool have_metrics = false;
  std::map<std::string, WorkerFigures> workers;
  double imbalance = 0;  // max / mean of routed requests over workers (1 = perfectly even)
  double precision = 0;
  double predicted_tokens = 0, reported_tokens = 0;
  std::string first_error;
};

// The p-quantile (0..1) of v, linearly interpolated; 0 for an empty v.
double Percentile(std::vector<double> v, double p);

// Fills the router-side figures of `r` from the metrics before and after its phase.
void AddMetrics(const Samples& before, const Samples& after, PhaseReport* r);

void PrintTable(const std::vector<PhaseReport>& reports, const std::string& label);
std::string Json(const std::vector<PhaseReport>& reports, const std::string& label);

}  // namespace chunkserve::router

#endif  // CHUNKSERVE_ROUTER_LOADGEN_REPORT_H_
