// Failover with real processes: a worker SIGKILLed mid-stream (no request lost, no token
// duplicated, continuous indices, greedy output equal to a solo run) and a SIGSTOPped worker
// whose lease runs out (its request moves). Slow: reference runs of hundreds of tokens.
#include <gtest/gtest.h>
#include <signal.h>

#include <map>
#include <set>
#include <string>
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
  // Reference: one worker alone, greedy.
  std::vector<std::vector<uint32_t>> reference;
  {
    ASSERT_OK_AND_ASSIGN(auto solo, WorkerProcess::Start(kWorkerArgs));
    ASSERT_OK_AND_ASSIGN(auto c, solo->Connect());
    for (int i = 0; i < kRequests; ++i) {
      const Outcome o = RunOne(*c, 1 + i, prompts[i], kMaxNew);
      ASSERT_EQ(o.tokens.size(), static_cast<size_t>(kMaxNew));
      reference.push_back(o.tokens);
    }
  }
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
  ASSERT_OK_AND_ASSIGN(auto router, RouterProcess::Start({"--lease-ms", "1000"}));
  ASSERT_OK_AND_ASSIGN(auto w0, StartWorker(router->address(), "w0"));
  ASSERT_OK_AND_ASSIGN(auto w1, StartWorker(router->address(), "w1"));
  ExpectWorkersAlive(*router, 2);
  ASSERT_OK_AND_ASSIGN(auto client, router->Connect());
  std::map<uint64_t, Outcome> outcomes;
  ASSERT_OK(SendGenerate(*client, 1, Tokens(90, 8), 400));
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
  EXPECT_EQ(outcomes[1].tokens.size(), 400u);
  EXPECT_TRUE(outcomes[1].indices_continuous);
  ASSERT_OK(expired.status());
  EXPECT_GE(expired.value(), 1);
}

}  // namespace
}  // namespace chunkserve::router
