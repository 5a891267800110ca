// The simulator: determinism, bookkeeping, and the acceptance relations between policies on a
// small deterministic configuration (16 workers, 64 tenants). These compare policies within one
// simulated run; simulated time is deterministic, so nothing here depends on the machine's speed.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>

#include "router/sim/simulator.h"
#include "tests/testing/status_matchers.h"

namespace chunkserve::router::sim {
namespace {

using workload::MakeSyntheticWorkload;
using workload::ParseJsonlTrace;
using workload::WorkloadOptions;

// The README's configuration, shortened: rates at ~70% of what least_loaded sustains on each
// workload (shared: ~121 req/s, control: ~69 req/s; see router/README.md).
constexpr double kSharedRate = 85;
constexpr double kControlRate = 48;
constexpr int64_t kRequests = 3000;

Result<SimReport> RunSim(PolicyKind kind, bool shared, uint64_t seed = 1) {
  WorkloadOptions w;
  w.num_requests = kRequests;
  w.tenants = 64;
  w.arrival_rate = shared ? kSharedRate : kControlRate;
  w.shared_prefixes = shared;
  w.seed = seed;
  CHUNKSERVE_ASSIGN_OR_RETURN(auto source, MakeSyntheticWorkload(w));
  SimOptions o;
  o.num_workers = 16;
  o.router.policy_kind = kind;
  return RunSimulation(o, *source);
}

TEST(SimTest, RunsAreDeterministic) {
  ASSERT_OK_AND_ASSIGN(SimReport a, RunSim(PolicyKind::kTtft, true, 7));
  ASSERT_OK_AND_ASSIGN(SimReport b, RunSim(PolicyKind::kTtft, true, 7));
  EXPECT_EQ(a.cached_tokens, b.cached_tokens);
  EXPECT_EQ(a.ttft_s.mean, b.ttft_s.mean);
  EXPECT_EQ(a.e2e_s.p99, b.e2e_s.p99);
  EXPECT_EQ(a.reasons, b.reasons);
  ASSERT_OK_AND_ASSIGN(SimReport c, RunSim(PolicyKind::kTtft, true, 8));
  EXPECT_NE(a.cached_tokens, c.cached_tokens);
}

TEST(SimTest, EveryRequestCompletesAndIsAccountedFor) {
  for (PolicyKind kind : AllPolicyKinds()) {
    ASSERT_OK_AND_ASSIGN(SimReport r, RunSim(kind, true));
    EXPECT_EQ(r.requests, kRequests) << r.policy;
    EXPECT_EQ(r.completed, kRequests) << r.policy;
    EXPECT_LE(r.cached_tokens, r.prompt_tokens) << r.policy;
    EXPECT_GT(r.throughput_rps, 0) << r.policy;
    EXPECT_GE(r.load_imbalance, 1.0) << r.policy;
    EXPECT_LE(r.ttft_s.p50, r.ttft_s.p99) << r.policy;
    EXPECT_LE(r.ttft_s.mean, r.e2e_s.mean) << r.policy;
    int64_t decisions = 0;
    for (int64_t n : r.reasons) decisions += n;
    EXPECT_EQ(decisions, kRequests) << r.policy;
  }
}

TEST(SimTest, DefaultPolicyBeatsRoundRobinAndLeastLoadedOnSharedPrompts) {
  ASSERT_OK_AND_ASSIGN(SimReport ttft, RunSim(PolicyKind::kTtft, true));
  ASSERT_OK_AND_ASSIGN(SimReport rr, RunSim(PolicyKind::kRoundRobin, true));
  ASSERT_OK_AND_ASSIGN(SimReport ll, RunSim(PolicyKind::kLeastLoaded, true));
  EXPECT_GT(ttft.hit_rate, rr.hit_rate);
  EXPECT_GT(ttft.hit_rate, ll.hit_rate);
  EXPECT_LT(ttft.ttft_s.mean, rr.ttft_s.mean);
  EXPECT_LT(ttft.ttft_s.mean, ll.ttft_s.mean);
  // The router's predictions are mostly right (events lag by kv_event_delay_s).
  EXPECT_GT(ttft.precision, 0.9);
}

TEST(SimTest, DefaultPolicyIsWithinTenPercentOfLeastLoadedWithoutSharing) {
  ASSERT_OK_AND_ASSIGN(SimReport ttft, RunSim(PolicyKind::kTtft, false));
  ASSERT_OK_AND_ASSIGN(SimReport ll, RunSim(PolicyKind::kLeastLoaded, false));
  EXPECT_EQ(ttft.cached_tokens, 0u);
  EXPECT_EQ(ll.cached_tokens, 0u);
  EXPECT_LE(ttft.ttft_s.mean, 1.10 * ll.ttft_s.mean);
}

TEST(SimTest, ReplaysAJsonlTrace) {
  // Two prefixes, alternating, 20 ms apart: after the first request of each, the rest hit.
  std::string trace;
  for (int i = 0; i < 40; ++i) {
    trace += "{\"arrival_s\": " + std::to_string(0.02 * i) +
             ", \"prefix_id\": " + std::to_string(i % 2) +
             ", \"prefix_tokens\": 1024, \"suffix_tokens\": 40, \"output_tokens\": 8}\n";
  }
  ASSERT_OK_AND_ASSIGN(auto source, ParseJsonlTrace(trace));
  SimOptions o;
  o.num_workers = 4;
  ASSERT_OK_AND_ASSIGN(SimReport r, RunSimulation(o, *source));
  EXPECT_EQ(r.completed, 40);
  EXPECT_GT(r.hit_rate, 0.8);  // 38 of 40 requests reuse 1024 of their 1064 tokens
}

TEST(SimTest, BadOptionsAndOversizedRequestsAreErrors) {
  WorkloadOptions w;
  w.num_requests = 10;
  ASSERT_OK_AND_ASSIGN(auto source, MakeSyntheticWorkload(w));
  SimOptions o;
  o.num_workers = 0;
  EXPECT_EQ(RunSimulation(o, *source).status().code(), StatusCode::kInvalidArgument);
  o = {};
  o.worker.kv_capacity_chunks = 8;  // a 1K-token prompt needs more
  EXPECT_EQ(RunSimulation(o, *source).status().code(), StatusCode::kInvalidArgument);
}

TEST(SimTest, ReportRendersAsTableAndJson) {
  ASSERT_OK_AND_ASSIGN(SimReport r, RunSim(PolicyKind::kRoundRobin, false));
  const std::string table = FormatTable({r});
  EXPECT_NE(table.find("round_robin"), std::string::npos);
  const std::string json = ToJson({r});
  EXPECT_NE(json.find("\"hit_rate\""), std::string::npos);
  EXPECT_NE(json.find("\"round_robin\""), std::string::npos);
}

}  // namespace
}  // namespace chunkserve::router::sim

namespace chunkserve::router::sim {
namespace {

TEST(SimTest, PerRequestLogAndPerWorkerStatsAddUp) {
  WorkloadOptions w;
  w.num_requests = 400;
  w.tenants = 8;
  w.arrival_rate = 40;
  ASSERT_OK_AND_ASSIGN(auto source, MakeSyntheticWorkload(w));
  SimOptions o;
  o.num_workers = 4;
  FILE* log = std::tmpfile();
  ASSERT_NE(log, nullptr);
  o.log = log;
  ASSERT_OK_AND_ASSIGN(SimReport r, RunSimulation(o, *source));
  ASSERT_EQ(r.workers.size(), 4u);
  int64_t requests = 0;
  uint64_t prompt = 0, cached = 0;
  for (const SimWorkerStats& s : r.workers) {
    requests += s.requests;
    prompt += s.prompt_tokens;
    cached += s.cached_tokens;
    EXPECT_LE(s.work_s, s.busy_s);
  }
  EXPECT_EQ(requests, r.requests);
  EXPECT_EQ(prompt, r.prompt_tokens);
  EXPECT_EQ(cached, r.cached_tokens);
  EXPECT_GT(r.events, static_cast<uint64_t>(r.requests));
  // One JSON line per finished request, with the documented fields.
  std::rewind(log);
  char buf[1024];
  int64_t lines = 0;
  uint64_t logged_cached = 0;
  while (std::fgets(buf, sizeof(buf), log) != nullptr) {
    const auto j = nlohmann::json::parse(buf);
    for (const char* key : {"policy", "id", "arrival_s", "worker", "reason", "prompt_tokens",
                            "predicted_cached_tokens", "cached_tokens", "ttft_s", "first_token_s",
                            "end_s", "output_tokens"}) {
      EXPECT_TRUE(j.contains(key)) << key << " in " << buf;
    }
    EXPECT_LE(j["arrival_s"].get<double>(), j["first_token_s"].get<double>());
    EXPECT_LE(j["first_token_s"].get<double>(), j["end_s"].get<double>());
    logged_cached += j["cached_tokens"].get<uint64_t>();
    ++lines;
  }
  std::fclose(log);
  EXPECT_EQ(lines, r.completed);
  EXPECT_EQ(logged_cached, r.cached_tokens);
}

}  // namespace
}  // namespace chunkserve::router::sim
