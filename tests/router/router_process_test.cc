// chunkserve-router and chunkserve-worker as real processes on 127.0.0.1 (ephemeral ports):
// prefix affinity, load cap spill and overload, worker restarts and router restarts (snapshots
// rebuild the index), two routers agreeing on placement, refused registrations, cancellation and
// disconnect propagation. Failover tests are in router_failover_test.cc (slow).
#include <capnp/message.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "tests/router/router_test_util.h"

namespace chunkserve::router {
namespace {

using namespace testing;  // NOLINT: the router test helpers

// Waits until `router` has a load report from each worker with a measured prefill rate (after
// WarmUp): routers assume a default rate for unmeasured workers (router_test_util.h, WarmUp).
void ExpectMeasuredRates(const RouterProcess& router, int workers) {
  for (int i = 0; i < workers; ++i) {
    const Result<double> rate = WaitForMetric(
        router.http_port(),
        "chunkserve_router_worker_reported_prefill_tokens_per_s{worker=\"" + WorkerName(i) + "\"}",
        [](double v) { return v > 0; }, 30s);
    ASSERT_OK(rate.status()) << WorkerName(i);
  }
}

// The worker's engine progress as its load reports count it (steps + requests ended).
Result<double> EngineProgress(WorkerProcess& w) {
  CHUNKSERVE_ASSIGN_OR_RETURN(auto c, w.Connect());
  DecodedMessage holder;
  CHUNKSERVE_ASSIGN_OR_RETURN(auto s, Stats(*c, &holder));
  return static_cast<double>(s.getSteps() + s.getRequestsFinished());
}

// Waits until `router` holds a load report of worker `i` taken after the worker's last engine
// step (the worker is idle, so its progress no longer moves): the router then sees the load the
// worker has now, not a report from before its last request.
void ExpectCurrentReport(const RouterProcess& router, WorkerProcess& w, int i) {
  ASSERT_OK_AND_ASSIGN(const double progress, EngineProgress(w));
  const Result<double> reported = WaitForMetric(
      router.http_port(),
      "chunkserve_router_worker_reported_engine_progress{worker=\"" + WorkerName(i) + "\"}",
      [progress](double v) { return v == progress; }, 30s);
  ASSERT_OK(reported.status()) << WorkerName(i) << " at progress " << progress;
}

TEST(RouterProcessTest, SamePrefixLandsOnTheSameWorkerAndHitsItsCache) {
  const std::vector<uint32_t> prefix = Tokens(192, 1);  // three full chunks of 64
  constexpr int kRequests = 6;
  std::vector<std::vector<uint32_t>> prompts;
  for (int i = 0; i < kRequests; ++i) prompts.push_back(Concat(prefix, Tokens(20, 50 + i)));
  ASSERT_OK_AND_ASSIGN(const auto solo, SoloGreedy(prompts, 4));
  ASSERT_OK_AND_ASSIGN(auto router, RouterProcess::Start({}));
  std::vector<std::unique_ptr<WorkerProcess>> workers;
  for (int i = 0; i < 3; ++i) {
    ASSERT_OK_AND_ASSIGN(auto w, StartWorker(router->address(), WorkerName(i)));
    workers.push_back(std::move(w));
  }
  ExpectWorkersAlive(*router, 3);
  for (size_t i = 0; i < workers.size(); ++i) WarmUp(*workers[i], static_cast<int>(i));
  ASSERT_NO_FATAL_FAILURE(ExpectMeasuredRates(*router, 3));
  ASSERT_OK_AND_ASSIGN(auto client, router->Connect());
  double client_cached = 0;
  for (int i = 0; i < kRequests; ++i) {
    const Outcome o = RunOne(*client, 100 + i, prompts[i], 4);
    ASSERT_TRUE(o.finished);
    client_cached += o.cached;
    EXPECT_EQ(o.reason, FinishReason::LENGTH);
    EXPECT_EQ(o.tokens, solo[i]) << "request " << i << " differs from a solo run";
    EXPECT_EQ(o.prompt_tokens, 212);
    if (i > 0) {
      EXPECT_GE(o.cached, 192) << "request " << i;
    }
  }
  double total = 0, most = 0;
  for (int i = 0; i < 3; ++i) {
    const double n = RoutedTo(*router, WorkerName(i));
    total += n;
    most = std::max(most, n);
  }
  EXPECT_EQ(total, kRequests);
  EXPECT_EQ(most, kRequests) << "requests sharing a prefix were spread over workers";
  ASSERT_OK_AND_ASSIGN(double predicted, Metric(router->http_port(),
                                                "chunkserve_router_predicted_cached_tokens_total"));
  EXPECT_GE(predicted, 192.0 * (kRequests - 1));
  // Precision comes from the core (RouterCore::OnFinished with each Finish's cachedTokens): its
  // reported total is what the clients were told, and the counters agree with the gauge.
  ASSERT_OK_AND_ASSIGN(double reported, Metric(router->http_port(),
                                               "chunkserve_router_reported_cached_tokens_total"));
  EXPECT_EQ(reported, client_cached);
  ASSERT_OK_AND_ASSIGN(
      double overlap, Metric(router->http_port(), "chunkserve_router_overlap_cached_tokens_total"));
  ASSERT_OK_AND_ASSIGN(double precision,
                       Metric(router->http_port(), "chunkserve_router_routing_precision"));
  EXPECT_GT(precision, 0.9);
  EXPECT_NEAR(precision, overlap / predicted, 1e-3);
  ASSERT_OK_AND_ASSIGN(auto ready, worker::testing::HttpGet(router->http_port(), "/readyz"));
  EXPECT_EQ(ready.status, 200);
}

// Register.capacitySlots carries the engine's KV capacity in tokens, and the router keeps it per
// worker (WorkerInfo::kv_capacity_tokens, exposed as a metric). The built-in tiny model has 4
// layers x (K + V) x 2 kv heads x 64 dims x 4 bytes = 4 KiB of KV per token; chunks are 64
// tokens, so 64 MiB hold 256 slots = 16,384 tokens and 12 MiB hold 48 slots = 3,072 tokens.
TEST(RouterProcessTest, WorkersRegisterTheirKvCapacity) {
  ASSERT_OK_AND_ASSIGN(auto router, RouterProcess::Start({}));
  ASSERT_OK_AND_ASSIGN(auto w0, StartWorker(router->address(), "w0"));
  ASSERT_OK_AND_ASSIGN(auto w1, StartWorker(router->address(), "w1", {"--kv-cache-mb", "12"}));
  ExpectWorkersAlive(*router, 2);
  const auto capacity = [&](const std::string& what, const std::string& worker) {
    Result<double> v = Metric(router->http_port(), "chunkserve_router_worker_kv_capacity_" + what +
                                                       "{worker=\"" + worker + "\"}");
    EXPECT_OK(v.status());
    return v.ok() ? v.value() : -1;
  };
  EXPECT_EQ(capacity("tokens", "w0"), 16384);
  EXPECT_EQ(capacity("bytes", "w0"), 64.0 * 1024 * 1024);
  EXPECT_EQ(capacity("tokens", "w1"), 3072);
  EXPECT_EQ(capacity("bytes", "w1"), 12.0 * 1024 * 1024);
}

TEST(RouterProcessTest, LoadCapSpillsToAnotherWorkerThenOverloadIsRetryable) {
  ASSERT_OK_AND_ASSIGN(auto router, RouterProcess::Start({"--max-in-flight-per-worker", "1"}));
  ASSERT_OK_AND_ASSIGN(auto w0, StartWorker(router->address(), "w0"));
  ASSERT_OK_AND_ASSIGN(auto w1, StartWorker(router->address(), "w1"));
  ExpectWorkersAlive(*router, 2);
  ASSERT_OK_AND_ASSIGN(auto client, router->Connect());
  const std::vector<uint32_t> prompt = Concat(Tokens(128, 2), Tokens(10, 3));
  std::map<uint64_t, Outcome> outcomes;
  ASSERT_OK(SendGenerate(*client, 1, prompt, 6000));
  ReceiveTokens(*client, 1, 1, &outcomes);
  ASSERT_OK(SendGenerate(*client, 2, prompt, 6000));
  ReceiveTokens(*client, 2, 1, &outcomes);
  // Same prefix, but the holder is at its cap: the second request went to the other worker.
  EXPECT_EQ(RoutedTo(*router, "w0"), 1);
  EXPECT_EQ(RoutedTo(*router, "w1"), 1);
  // Both at the cap: a retryable resource-exhausted error, not a queue.
  ASSERT_OK(SendGenerate(*client, 3, prompt, 8));
  outcomes = ReceiveAll(*client, {3}, outcomes);
  EXPECT_TRUE(outcomes[3].error);
  EXPECT_EQ(outcomes[3].error_code, wire::schema::ErrorCode::RESOURCE_EXHAUSTED);
  EXPECT_TRUE(outcomes[3].retryable);
  ASSERT_OK(SendCancel(*client, 1));
  ASSERT_OK(SendCancel(*client, 2));
  outcomes = ReceiveAll(*client, {1, 2}, outcomes);
  EXPECT_EQ(outcomes[1].reason, FinishReason::CANCELLED);
  EXPECT_EQ(outcomes[2].reason, FinishReason::CANCELLED);
  EXPECT_TRUE(outcomes[1].indices_continuous);
  // Capacity is back once they ended.
  const Outcome after = RunOne(*client, 4, prompt, 3);
  EXPECT_TRUE(after.finished);
  EXPECT_EQ(after.tokens.size(), 3u);
  // Each stream, cut short or whole, is where the prompt's solo run starts.
  const size_t longest =
      std::max({outcomes[1].tokens.size(), outcomes[2].tokens.size(), size_t{3}});
  ASSERT_OK_AND_ASSIGN(const auto solo, SoloGreedy({prompt}, static_cast<int32_t>(longest)));
  EXPECT_TRUE(StartsLike(outcomes[1].tokens, solo[0]));
  EXPECT_TRUE(StartsLike(outcomes[2].tokens, solo[0]));
  EXPECT_TRUE(StartsLike(after.tokens, solo[0]));
  ASSERT_OK_AND_ASSIGN(double overloaded,
                       Metric(router->http_port(), "chunkserve_router_requests_overloaded_total"));
  EXPECT_EQ(overloaded, 1);
}

TEST(RouterProcessTest, RestartedRouterRebuildsTheIndexFromSnapshotsAndWorkersRestartClean) {
  ASSERT_OK_AND_ASSIGN(auto first, RouterProcess::Start({}));
  const std::string address = first->address();
  ASSERT_OK_AND_ASSIGN(auto w0, StartWorker(address, "w0"));
  ASSERT_OK_AND_ASSIGN(auto w1, StartWorker(address, "w1"));
  ExpectWorkersAlive(*first, 2);
  // Warm a prefix on w0 directly, behind the router's back.
  const std::vector<uint32_t> prefix = Tokens(192, 7);
  {
    ASSERT_OK_AND_ASSIGN(auto direct, w0->Connect());
    ASSERT_TRUE(RunOne(*direct, 1, Concat(prefix, Tokens(5, 1)), 2).finished);
  }
  // A new router process on the same port: the workers reconnect, register again and send
  // snapshots, which must rebuild the index.
  ASSERT_OK(first->Signal(SIGKILL));
  ASSERT_OK(first->Wait(30s).status());
  first.reset();
  ASSERT_OK_AND_ASSIGN(auto router, RouterProcess::Start({"--listen", address}));
  ExpectWorkersAlive(*router, 2);
  ASSERT_OK(WaitForMetric(
                router->http_port(), "chunkserve_router_index_chunk_nodes",
                [](double v) { return v >= 3; }, 60s)
                .status());
  ASSERT_OK_AND_ASSIGN(auto client, router->Connect());
  const Outcome hit = RunOne(*client, 2, Concat(prefix, Tokens(9, 2)), 2);
  ASSERT_TRUE(hit.finished);
  EXPECT_GE(hit.cached, 192);
  EXPECT_EQ(RoutedTo(*router, "w0"), 1);
  ASSERT_OK_AND_ASSIGN(double predicted, Metric(router->http_port(),
                                                "chunkserve_router_predicted_cached_tokens_total"));
  EXPECT_GE(predicted, 192);

  // w0 restarts (new generation): its old entries go at once, the new one registers clean.
  ASSERT_OK(w0->Signal(SIGKILL));
  ExpectWorkersAlive(*router, 1);
  ASSERT_OK_AND_ASSIGN(double entries,
                       Metric(router->http_port(), "chunkserve_router_index_holder_entries"));
  EXPECT_EQ(entries, 0) << "the dead worker's index entries are still there";
  w0.reset();
  ASSERT_OK_AND_ASSIGN(w0, StartWorker(address, "w0"));
  ExpectWorkersAlive(*router, 2);
  ASSERT_OK_AND_ASSIGN(double registered,
                       Metric(router->http_port(), "chunkserve_router_workers_registered_total"));
  EXPECT_EQ(registered, 3);
  ASSERT_OK_AND_ASSIGN(double up,
                       Metric(router->http_port(), "chunkserve_router_worker_up{worker=\"w0\"}"));
  EXPECT_EQ(up, 1);
}

TEST(RouterProcessTest, TwoRoutersPlaceANewPrefixOnTheSameWorker) {
  constexpr int kPrefixes = 4;
  std::vector<std::vector<uint32_t>> prompts;
  for (int k = 0; k < kPrefixes; ++k) prompts.push_back(Concat(Tokens(128, 300 + k), Tokens(4, k)));
  ASSERT_OK_AND_ASSIGN(const auto solo, SoloGreedy(prompts, 2));
  ASSERT_OK_AND_ASSIGN(auto r1, RouterProcess::Start({}));
  ASSERT_OK_AND_ASSIGN(auto r2, RouterProcess::Start({}));
  const std::string both = r1->address() + "," + r2->address();
  std::vector<std::unique_ptr<WorkerProcess>> workers;
  for (int i = 0; i < 3; ++i) {
    ASSERT_OK_AND_ASSIGN(auto w, StartWorker(both, WorkerName(i)));
    workers.push_back(std::move(w));
  }
  ExpectWorkersAlive(*r1, 3);
  ExpectWorkersAlive(*r2, 3);
  for (size_t i = 0; i < workers.size(); ++i) WarmUp(*workers[i], static_cast<int>(i));
  ASSERT_OK_AND_ASSIGN(auto c1, r1->Connect());
  ASSERT_OK_AND_ASSIGN(auto c2, r2->Connect());
  auto routed_sum = [&](const RouterProcess& r) {
    double sum = 0;
    for (int i = 0; i < 3; ++i) sum += RoutedTo(r, WorkerName(i));
    return sum;
  };
  for (int k = 0; k < kPrefixes; ++k) {
    // Loads settle before each prefix: idle workers, and on both routers a report from each
    // taken after its last step.
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(WorkerIdle(*workers[i]));
      ASSERT_NO_FATAL_FAILURE(ExpectCurrentReport(*r1, *workers[i], i));
      ASSERT_NO_FATAL_FAILURE(ExpectCurrentReport(*r2, *workers[i], i));
    }
    std::map<std::string, double> before1, before2;
    for (int i = 0; i < 3; ++i) {
      before1[WorkerName(i)] = RoutedTo(*r1, WorkerName(i));
      before2[WorkerName(i)] = RoutedTo(*r2, WorkerName(i));
    }
    const double sum1 = routed_sum(*r1), sum2 = routed_sum(*r2);
    // The same brand-new prefix reaches both routers while the workers are stopped: neither
    // router has seen it and neither can learn the other's pick (no KV events, no load
    // reports), so only deterministic placement makes them agree.
    for (auto& w : workers) ASSERT_OK(w->Signal(SIGSTOP));
    const std::vector<uint32_t>& prompt = prompts[k];
    ASSERT_OK(SendGenerate(*c1, 10 + k, prompt, 2));
    ASSERT_OK(SendGenerate(*c2, 10 + k, prompt, 2));
    const bool routed =
        WaitFor([&] { return routed_sum(*r1) > sum1 && routed_sum(*r2) > sum2; }, 30s);
    for (auto& w : workers) ASSERT_OK(w->Signal(SIGCONT));
    ASSERT_TRUE(routed);
    const uint64_t id = 10 + k;
    const Outcome o1 = ReceiveAll(*c1, {id})[id], o2 = ReceiveAll(*c2, {id})[id];
    ASSERT_TRUE(o1.finished);
    ASSERT_TRUE(o2.finished);
    EXPECT_EQ(o1.tokens, solo[k]) << "prefix " << k << " through router 1";
    EXPECT_EQ(o2.tokens, solo[k]) << "prefix " << k << " through router 2";
    std::string pick1, pick2;
    for (int i = 0; i < 3; ++i) {
      const std::string w = WorkerName(i);
      if (RoutedTo(*r1, w) > before1[w]) pick1 = w;
      if (RoutedTo(*r2, w) > before2[w]) pick2 = w;
    }
    EXPECT_FALSE(pick1.empty());
    EXPECT_EQ(pick1, pick2) << "prefix " << k;
  }
}

TEST(RouterProcessTest, MismatchedModelIsRefused) {
  ASSERT_OK_AND_ASSIGN(auto router, RouterProcess::Start({"--model-fingerprint", "12345"}));
  ASSERT_OK_AND_ASSIGN(auto w0, StartWorker(router->address(), "w0"));
  ASSERT_OK(WaitForMetric(
                router->http_port(), "chunkserve_router_workers_refused_total",
                [](double v) { return v >= 1; }, 60s)
                .status());
  ASSERT_OK_AND_ASSIGN(double alive,
                       Metric(router->http_port(), "chunkserve_router_workers_alive"));
  EXPECT_EQ(alive, 0);
  ASSERT_OK_AND_ASSIGN(auto ready, worker::testing::HttpGet(router->http_port(), "/readyz"));
  EXPECT_EQ(ready.status, 503);
  ASSERT_OK_AND_ASSIGN(auto client, router->Connect());
  const Outcome o = RunOne(*client, 1, Tokens(70, 1), 2);
  EXPECT_TRUE(o.error);
  EXPECT_TRUE(o.retryable);

  // Chunk size: the cluster adopts the first worker's; a different one is refused.
  ASSERT_OK_AND_ASSIGN(auto r2, RouterProcess::Start({}));
  ASSERT_OK_AND_ASSIGN(auto a, StartWorker(r2->address(), "a"));
  ExpectWorkersAlive(*r2, 1);
  ASSERT_OK_AND_ASSIGN(auto b, StartWorker(r2->address(), "b", {"--chunk-size", "32"}));
  ASSERT_OK(WaitForMetric(
                r2->http_port(), "chunkserve_router_workers_refused_total",
                [](double v) { return v >= 1; }, 60s)
                .status());
  ASSERT_OK_AND_ASSIGN(double alive2, Metric(r2->http_port(), "chunkserve_router_workers_alive"));
  EXPECT_EQ(alive2, 1);
}

TEST(RouterProcessTest, CancelAndDisconnectReachTheWorkerAndFreeItsChunks) {
  ASSERT_OK_AND_ASSIGN(auto router, RouterProcess::Start({}));
  ASSERT_OK_AND_ASSIGN(auto w0, StartWorker(router->address(), "w0"));
  ExpectWorkersAlive(*router, 1);
  {
    ASSERT_OK_AND_ASSIGN(auto client, router->Connect());
    std::map<uint64_t, Outcome> outcomes;
    ASSERT_OK(SendGenerate(*client, 1, Tokens(150, 4), 6000));
    ReceiveTokens(*client, 1, 2, &outcomes);
    ASSERT_OK(SendCancel(*client, 1));
    outcomes = ReceiveAll(*client, {1}, outcomes);
    ASSERT_TRUE(outcomes[1].finished);
    EXPECT_EQ(outcomes[1].reason, FinishReason::CANCELLED);
    EXPECT_LT(outcomes[1].tokens.size(), 6000u);
    EXPECT_TRUE(outcomes[1].indices_continuous);
    EXPECT_TRUE(WorkerIdle(*w0)) << "cancel did not free the worker's chunks";

    // Disconnect mid-stream.
    ASSERT_OK(SendGenerate(*client, 2, Tokens(150, 5), 6000));
    ReceiveTokens(*client, 2, 2, &outcomes);
    client->Close();
  }
  EXPECT_TRUE(WorkerIdle(*w0)) << "disconnect did not free the worker's chunks";
  ASSERT_OK_AND_ASSIGN(auto direct, w0->Connect());
  DecodedMessage holder;
  ASSERT_OK_AND_ASSIGN(auto stats, Stats(*direct, &holder));
  EXPECT_LT(stats.getGeneratedTokens(), 2u * 6000u);
  EXPECT_EQ(stats.getRequestsFinished(), 2u);
}

TEST(RouterProcessTest, BadInputNeverStopsTheRouter) {
  ASSERT_OK_AND_ASSIGN(auto router, RouterProcess::Start({}));
  ASSERT_OK_AND_ASSIGN(auto w0, StartWorker(router->address(), "w0"));
  ExpectWorkersAlive(*router, 1);
  // Garbage bytes: that connection gets an Error and is closed.
  {
    ASSERT_OK_AND_ASSIGN(auto bad, router->Connect());
    ASSERT_OK(bad->SendRaw(std::vector<uint8_t>(64, 0xff)));
    Result<DecodedMessage> m = bad->Receive(30s);
    if (m.ok()) {
      EXPECT_EQ(m.value().root().which(), Envelope::ERROR);
    }
  }
  // A Register with no usable address is refused; it does not become a member.
  {
    ASSERT_OK_AND_ASSIGN(auto fake, router->Connect());
    EXPECT_OK(RegisterRefusedFor(*fake, "fake", "nowhere").status());
  }
  // Worker-only messages from a client, bad Generates: errors, nothing else.
  ASSERT_OK_AND_ASSIGN(auto client, router->Connect());
  {
    capnp::MallocMessageBuilder b;
    b.initRoot<Envelope>().initKvEvents().setSnapshot(true);
    ASSERT_OK(client->Send(b));
  }
  ASSERT_OK(SendGenerate(*client, 1, {}, 4));             // empty prompt
  ASSERT_OK(SendGenerate(*client, 2, Tokens(10, 1), 0));  // maxNewTokens 0
  std::map<uint64_t, Outcome> outcomes = ReceiveAll(*client, {1, 2});
  EXPECT_EQ(outcomes[1].error_code, wire::schema::ErrorCode::INVALID_ARGUMENT);
  EXPECT_EQ(outcomes[2].error_code, wire::schema::ErrorCode::INVALID_ARGUMENT);
  // The router still serves.
  const Outcome ok = RunOne(*client, 3, Tokens(80, 2), 3);
  EXPECT_TRUE(ok.finished);
  EXPECT_EQ(ok.tokens.size(), 3u);
  ASSERT_OK_AND_ASSIGN(double alive,
                       Metric(router->http_port(), "chunkserve_router_workers_alive"));
  EXPECT_EQ(alive, 1);
}

}  // namespace
}  // namespace chunkserve::router
