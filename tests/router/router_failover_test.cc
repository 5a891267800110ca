// Failover with real processes: a worker SIGKILLed mid-stream (no request lost, no token
// duplicated, continuous indices, greedy output equal to a solo run) and a SIGSTOPped worker
// whose lease runs out (its request moves), and a worker drained by SIGTERM behind the router
// (stops being picked, loses no token). Slow: reference runs of hundreds of tokens.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "tests/router/router_test_util.h"

namespace chunkserve::router {
namespace {

using namespace testing;  // NOLINT: the router test helpers

TEST(RouterFailoverTest, SigkilledWorkerMidStreamLosesNothingAndDuplicatesNothing) {
  constexpr int32_t kMaxNew = 600;
  constexpr int kRequests = 3;
  std::vector<std::vector<uint32_t>> prompts;
  for (int i = 0; i < kRequests; ++i) prompts.push_back(Concat(Tokens(100, 10 + i), Tokens(7, i)));
  ASSERT_OK_AND_ASSIGN(const auto reference, SoloGreedy(prompts, kMaxNew));
  ASSERT_OK_AND_ASSIGN(auto router, RouterProcess::Start({}));
  ASSERT_OK_AND_ASSIGN(auto w0, StartWorker(router->address(), "w0"));
  ASSERT_OK_AND_ASSIGN(auto w1, StartWorker(router->address(), "w1"));
  ExpectWorkersAlive(*router, 2);
  ASSERT_OK_AND_ASSIGN(auto client, router->Connect());
  std::map<uint64_t, Outcome> outcomes;
  std::vector<uint64_t> ids;
  for (int i = 0; i < kRequests; ++i) {
    ASSERT_OK(SendGenerate(*client, 1 + i, prompts[i], kMaxNew));
    ids.push_back(1 + i);
  }
  for (uint64_t id : ids) ReceiveTokens(*client, id, 3, &outcomes);
  // Kill the worker that carries the most requests, mid-stream.
  WorkerProcess* victim = RoutedTo(*router, "w0") >= RoutedTo(*router, "w1") ? w0.get() : w1.get();
  ASSERT_OK(victim->Signal(SIGKILL));
  outcomes = ReceiveAll(*client, ids, outcomes);
  for (int i = 0; i < kRequests; ++i) {
    const Outcome& o = outcomes[ids[i]];
    ASSERT_TRUE(o.finished) << "request " << ids[i];
    EXPECT_EQ(o.reason, FinishReason::LENGTH);
    EXPECT_TRUE(o.indices_continuous) << "request " << ids[i];
    EXPECT_EQ(o.generated, kMaxNew);
    EXPECT_EQ(o.tokens, reference[i]) << "request " << ids[i] << " differs from a solo run";
  }
  ASSERT_OK_AND_ASSIGN(double migrated,
                       Metric(router->http_port(), "chunkserve_router_requests_migrated_total"));
  EXPECT_GE(migrated, 1) << "the kill came after every stream had ended";
  ExpectWorkersAlive(*router, 1);
}

TEST(RouterFailoverTest, StoppedWorkerLosesItsLeaseAndItsRequestsMove) {
  const std::vector<uint32_t> prompt = Tokens(90, 8);
  ASSERT_OK_AND_ASSIGN(const auto reference, SoloGreedy({prompt}, 400));
  ASSERT_OK_AND_ASSIGN(auto router, RouterProcess::Start({"--lease-ms", "1000"}));
  ASSERT_OK_AND_ASSIGN(auto w0, StartWorker(router->address(), "w0"));
  ASSERT_OK_AND_ASSIGN(auto w1, StartWorker(router->address(), "w1"));
  ExpectWorkersAlive(*router, 2);
  ASSERT_OK_AND_ASSIGN(auto client, router->Connect());
  std::map<uint64_t, Outcome> outcomes;
  ASSERT_OK(SendGenerate(*client, 1, prompt, 400));
  ReceiveTokens(*client, 1, 2, &outcomes);
  WorkerProcess* victim = RoutedTo(*router, "w0") == 1 ? w0.get() : w1.get();
  // SIGSTOP: the links stay open, only the lease (load reports) tells the router.
  ASSERT_OK(victim->Signal(SIGSTOP));
  outcomes = ReceiveAll(*client, {1}, outcomes);
  const Result<double> expired = WaitForMetric(
      router->http_port(), "chunkserve_router_workers_lease_expired_total",
      [](double v) { return v >= 1; }, 60s);
  ASSERT_OK(victim->Signal(SIGCONT));
  EXPECT_TRUE(outcomes[1].finished);
  EXPECT_EQ(outcomes[1].reason, FinishReason::LENGTH);
  EXPECT_EQ(outcomes[1].tokens, reference[0]) << "the moved request differs from a solo run";
  EXPECT_TRUE(outcomes[1].indices_continuous);
  ASSERT_OK(expired.status());
  EXPECT_GE(expired.value(), 1);
}

// A worker drained (SIGTERM) while the router routes to it: its final `draining` load report
// makes the router stop picking it (new requests go to the other worker, without refusals), and
// its in-flight requests, past its drain deadline, end `unavailable` and migrate: every client
// stream is complete, continuous and equal to an uninterrupted greedy run. The worker exits 0.
//
// To make both phases certain on any machine, the draining worker is SIGSTOPped once the router
// saw its draining report: it stays registered (long lease) and draining while the new requests
// are routed, and cannot finish its in-flight requests early; SIGCONT after its 3 s drain
// deadline has passed ends them `unavailable` at once.
TEST(RouterFailoverTest, DrainingWorkerStopsGettingRequestsAndLosesNoToken) {
  // ~1 s of decoding per request even on a fast machine: far longer than the few ms between
  // SIGTERM and SIGSTOP, so the victim cannot finish its requests before it is stopped.
  constexpr int32_t kMaxNew = 1500;
  constexpr int kRequests = 3;
  std::vector<std::vector<uint32_t>> prompts;
  for (int i = 0; i < kRequests; ++i) prompts.push_back(Concat(Tokens(130, 40 + i), Tokens(9, i)));
  // And 4 short requests sent while the victim drains: a prefix it holds, and fresh ones.
  std::vector<std::vector<uint32_t>> fresh_prompts;
  for (int i = 0; i < 4; ++i) {
    fresh_prompts.push_back(i < 2 ? Concat(Tokens(130, 40 + i), Tokens(5, 60 + i))
                                  : Tokens(80, 70 + i));
  }
  std::vector<std::vector<uint32_t>> all_prompts = prompts;
  all_prompts.insert(all_prompts.end(), fresh_prompts.begin(), fresh_prompts.end());
  std::vector<int32_t> all_max_new(kRequests, kMaxNew);
  all_max_new.resize(all_prompts.size(), 8);
  ASSERT_OK_AND_ASSIGN(const auto reference, SoloGreedy(all_prompts, all_max_new));
  ASSERT_OK_AND_ASSIGN(auto router, RouterProcess::Start({"--lease-ms", "60000"}));
  // Both get the short drain deadline; whichever carries more requests is drained.
  ASSERT_OK_AND_ASSIGN(auto w0,
                       StartWorker(router->address(), "w0", {"--drain-timeout-ms", "3000"}));
  ASSERT_OK_AND_ASSIGN(auto w1,
                       StartWorker(router->address(), "w1", {"--drain-timeout-ms", "3000"}));
  ExpectWorkersAlive(*router, 2);
  ASSERT_OK_AND_ASSIGN(auto client, router->Connect());
  std::map<uint64_t, Outcome> outcomes;
  std::vector<uint64_t> ids;
  for (int i = 0; i < kRequests; ++i) {
    ASSERT_OK(SendGenerate(*client, 1 + i, prompts[i], kMaxNew));
    ids.push_back(1 + i);
  }
  for (uint64_t id : ids) ReceiveTokens(*client, id, 3, &outcomes);
  const bool w0_busier = RoutedTo(*router, "w0") >= RoutedTo(*router, "w1");
  WorkerProcess* victim = w0_busier ? w0.get() : w1.get();
  const std::string victim_name = w0_busier ? "w0" : "w1";
  const std::string other_name = w0_busier ? "w1" : "w0";
  const double victim_routed = RoutedTo(*router, victim_name);
  ASSERT_GE(victim_routed, 2);  // 3 requests on 2 workers
  const auto terminated = std::chrono::steady_clock::now();
  ASSERT_OK(victim->Signal(SIGTERM));
  // The final draining report reaches the router: the core stops picking the worker.
  const Result<double> accepting = WaitForMetric(
      router->http_port(), "chunkserve_router_worker_accepting{worker=\"" + victim_name + "\"}",
      [](double v) { return v == 0; }, 30s);
  ASSERT_OK(victim->Signal(SIGSTOP));
  ASSERT_OK(accepting.status());
  ASSERT_EQ(accepting.value(), 0);
  // New requests (a prefix the victim holds, and fresh ones) all go to the other worker, picked
  // there directly: no refusal by the draining worker was needed.
  ASSERT_OK_AND_ASSIGN(double refusals_before,
                       Metric(router->http_port(), "chunkserve_router_worker_refusals_total"));
  const double other_routed = RoutedTo(*router, other_name);
  std::vector<uint64_t> fresh;
  for (int i = 0; i < 4; ++i) {
    const uint64_t id = 100 + i;
    ASSERT_OK(SendGenerate(*client, id, fresh_prompts[i], 8));
    fresh.push_back(id);
  }
  outcomes = ReceiveAll(*client, fresh, outcomes);
  for (int i = 0; i < 4; ++i) {
    const Outcome& o = outcomes[fresh[i]];
    ASSERT_TRUE(o.finished) << "request " << fresh[i];
    EXPECT_EQ(o.reason, FinishReason::LENGTH);
    EXPECT_EQ(o.tokens, reference[kRequests + i])
        << "request " << fresh[i] << " differs from a solo run";
  }
  ASSERT_OK_AND_ASSIGN(double refusals_after,
                       Metric(router->http_port(), "chunkserve_router_worker_refusals_total"));
  EXPECT_EQ(refusals_after, refusals_before);
  EXPECT_EQ(RoutedTo(*router, victim_name), victim_routed);
  EXPECT_EQ(RoutedTo(*router, other_name), other_routed + fresh.size());
  // Still registered and draining the whole time (it was stopped, its lease is long).
  ASSERT_OK_AND_ASSIGN(
      double still,
      Metric(router->http_port(), "chunkserve_router_worker_up{worker=\"" + victim_name + "\"}"));
  EXPECT_EQ(still, 1);
  // Past the drain deadline: the victim ends its requests `unavailable`, the router migrates them.
  std::this_thread::sleep_until(terminated + 3500ms);
  ASSERT_OK(victim->Signal(SIGCONT));
  outcomes = ReceiveAll(*client, ids, outcomes);
  for (int i = 0; i < kRequests; ++i) {
    const Outcome& o = outcomes[ids[i]];
    ASSERT_TRUE(o.finished) << "request " << ids[i];
    EXPECT_EQ(o.reason, FinishReason::LENGTH);
    EXPECT_TRUE(o.indices_continuous) << "request " << ids[i];
    EXPECT_EQ(o.generated, kMaxNew);
    EXPECT_EQ(o.tokens, reference[i]) << "request " << ids[i] << " differs from a solo run";
  }
  // Every request the victim carried moved (legs: one more each on the other worker).
  ASSERT_OK_AND_ASSIGN(double migrated,
                       Metric(router->http_port(), "chunkserve_router_requests_migrated_total"));
  EXPECT_EQ(migrated, victim_routed);
  EXPECT_EQ(RoutedTo(*router, victim_name), victim_routed);
  EXPECT_EQ(RoutedTo(*router, other_name), other_routed + fresh.size() + migrated);
  ASSERT_OK_AND_ASSIGN(int code, victim->Wait(60s));
  EXPECT_EQ(code, 0);
  ExpectWorkersAlive(*router, 1);
}

}  // namespace
}  // namespace chunkserve::router
