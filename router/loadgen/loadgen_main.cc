// chunkserve-loadgen: replays a workload against a chunkserve-router (or a single worker) over
// the wire protocol and reports prefix hit rate, TTFT and end-to-end latency percentiles,
// throughput, load imbalance and routing precision; see router/README.md ("Load generator").
//
// The workload is runtime/workload/workload.h's synthetic generator (a family: multi-tenant with
// Zipf tenant popularity, multi-turn, agent, long documents; Poisson arrivals) or a trace.
// Arrivals are open loop: each request is sent at its arrival time whatever the state of earlier
// ones, over a few connections (round robin). Every run also
// replays the negative control -- the same lengths and arrivals with no shared prefixes -- so the
// hit rate of the shared workload can be read against what sharing-free traffic gets.
//
// Per-worker figures (routed requests, cached and prompt tokens) and routing precision come from
// the router's /metrics (--http), scraped before and after each phase; without --http only the
// client-side figures are reported.
//
// Every stream is checked: token indices must be continuous from 0 (bad_indices), and a request
// that ends normally must have delivered exactly the tokens it asked for, as many as its Finish
// counts (incomplete) -- a lost or duplicated token shows in one or the other.
//
// Like the C client, it answers a server's challenge with $CHUNKSERVE_CLIENT_TOKEN (else
// $CHUNKSERVE_CLUSTER_SECRET), and speaks TLS with --tls-ca (the server's certificate must name
// the --target host).
//
// This file runs the phases in turn (the workload or trace, then its control) and reports them;
// the command line is options.{h,cc}, one phase's run and checks phase.{h,cc}, the metrics scrape,
// tables and JSON report.{h,cc}.
#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "router/loadgen/options.h"
#include "router/loadgen/phase.h"
#include "router/loadgen/report.h"
#include "runtime/base/status.h"
#include "runtime/workload/workload.h"

namespace chunkserve::router::loadgen {
namespace {

using workload::LoadTrace;
using workload::MakeSyntheticWorkload;
using workload::ReadAll;
using workload::Rng;
using workload::WorkloadSource;

Result<std::vector<WorkloadRequest>> Collect(Result<std::unique_ptr<WorkloadSource>> source) {
  if (!source.ok()) return source.status();
  return ReadAll(*source.value());
}

int Main(int argc, char** argv) {
  Options o;
  if (std::optional<int> exit_status = ParseOptions(argc, argv, &o)) return *exit_status;

  struct PhaseSpec {
    std::string name;
    Result<std::vector<WorkloadRequest>> requests;
  };
  std::vector<PhaseSpec> phases;
  if (!o.trace.empty()) {
    TraceOptions t = o.trace_options;
    t.synthesize_tokens = true;  // block-hash traces: real tokens, equal block ids = equal tokens
    t.vocab_size = o.workload.vocab_size;
    t.seed = o.workload.seed;
    phases.push_back({"trace", Collect(LoadTrace(o.trace, t))});
  } else {
    phases.push_back({"shared", Collect(MakeSyntheticWorkload(o.workload))});
  }
  if (o.control && !o.trace.empty()) {
    // The trace's own arrivals and lengths, every prompt token fresh: nothing shared.
    std::vector<WorkloadRequest> control;
    if (phases.front().requests.ok()) {
      Rng rng(o.workload.seed + 1000003);
      for (const WorkloadRequest& r : phases.front().requests.value()) {
        WorkloadRequest c;
        c.index = r.index;
        c.arrival_s = r.arrival_s;
        c.output_tokens = r.output_tokens;
        c.prompt.resize(r.prompt.size());
        for (TokenId& t : c.prompt) {
          t = static_cast<TokenId>(rng.UniformInt(0, o.workload.vocab_size - 1));
        }
        control.push_back(std::move(c));
      }
    }
    phases.push_back({"control", std::move(control)});
  } else if (o.control) {
    // The negative control: the synthetic workload's lengths and arrivals, no shared prefixes
    // (for a trace: the synthetic defaults under the same options).
    WorkloadOptions control = o.workload;
    control.shared_prefixes = false;
    control.seed = o.workload.seed + 1000003;  // tokens unrelated to the shared phase's
    phases.push_back({"control", Collect(MakeSyntheticWorkload(control))});
  }

  std::vector<PhaseReport> reports;
  bool timed_out = false;
  for (PhaseSpec& spec : phases) {
    if (!spec.requests.ok()) {
      std::fprintf(stderr, "workload %s: %s\n", spec.name.c_str(),
                   spec.requests.status().ToString().c_str());
      return 1;
    }
    std::optional<Samples> before;
    if (o.http_port != 0) {
      Result<Samples> s = Scrape(o.http_host, o.http_port);
      if (s.ok()) before = s.value();
    }
    Phase phase(o, std::move(spec.requests).value());
    const Status run = phase.Run();
    if (!run.ok() && run.code() != StatusCode::kDeadlineExceeded) {
      std::fprintf(stderr, "phase %s: %s\n", spec.name.c_str(), run.ToString().c_str());
      return 1;
    }
    // On timeout: report what finished (partial results), then stop with an error.
    PhaseReport report = phase.Report(run.ok() ? spec.name : spec.name + " (timed out)");
    if (before) {
      // After a timeout the router may be out of reach (a partition): a short bound, so that the
      // client's error comes close to its --timeout-s.
      const std::chrono::seconds bound(run.ok() ? 3 : 1);
      Result<Samples> after = Scrape(o.http_host, o.http_port, bound);
      if (after.ok()) AddMetrics(*before, after.value(), &report);
    }
    reports.push_back(std::move(report));
    if (!run.ok()) {
      std::fprintf(stderr, "phase %s: %s; partial results follow\n", spec.name.c_str(),
                   run.ToString().c_str());
      timed_out = true;
      break;
    }
  }
  PrintTable(reports, o.label);
  const std::string json = Json(reports, o.label);
  std::printf("\nJSON %s\n", json.c_str());
  if (!o.json_path.empty()) {
    FILE* f = std::fopen(o.json_path.c_str(), "w");
    if (f == nullptr) {
      std::fprintf(stderr, "cannot write %s\n", o.json_path.c_str());
      return 1;
    }
    std::fprintf(f, "%s\n", json.c_str());
    std::fclose(f);
  }
  return timed_out ? 1 : 0;
}

}  // namespace
}  // namespace chunkserve::router::loadgen

int main(int argc, char** argv) { return chunkserve::router::loadgen::Main(argc, argv); }
