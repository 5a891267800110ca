// The load a router's policy sees for a worker between two of its load reports
// (chunkserve_router_worker_queued_prefill_tokens / _running_sequences), against a worker whose
// reports the test sets to the token (FakeWorker, over the real wire protocol) or a real worker,
// and real chunkserve-router processes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "tests/router/fake_worker.h"
#include "tests/router/router_test_util.h"

namespace chunkserve::router {
namespace {

using namespace testing;

// A FakeWorker sends only what the test tells it to: no keepalive, no periodic report.
const std::vector<std::string> kQuietWorkerArgs = {
    "--lease-ms", "600000", "--link-idle-timeout-ms", "600000", "--stall-timeout-ms", "0"};

std::vector<TokenId> Ids(const std::vector<uint32_t>& tokens) {
  return {tokens.begin(), tokens.end()};
}

std::string Series(const char* name, const std::string& worker) {
  return std::string("chunkserve_router_") + name + "{worker=\"" + worker + "\"}";
}

// Waits until the router's view of `worker` reads `want`.
void ExpectView(const RouterProcess& router, const char* name, const std::string& worker,
                double want) {
  Result<double> v = WaitForMetric(
      router.http_port(), Series(name, worker), [want](double x) { return x == want; }, 30s);
  ASSERT_OK(v.status()) << name;
  EXPECT_EQ(v.value(), want) << name;
}

// A worker counts a prompt's uncached tokens as queued prefill, not the prompt. When the router
// sees the first token of a request whose prefix the worker held, it must take off what it
// expected uncached (16 tokens), not the whole prompt (272): that would show the worker's other
// queued prefill (2000 tokens, from clients this router does not see) as 1744 until the next
// report.
TEST(RouterLoadViewTest, FirstTokenTakesOffTheUncachedPromptOnly) {
  ASSERT_OK_AND_ASSIGN(auto router, RouterProcess::Start(kQuietWorkerArgs));
  ASSERT_OK_AND_ASSIGN(auto worker, FakeWorker::Register(router->port(), {.name = "w0"}));
  ExpectWorkersAlive(*router, 1);
  const std::vector<uint32_t> prefix = Tokens(256, 1);  // four chunks of 64, held by the worker
  const std::vector<uint32_t> prompt = Concat(prefix, Tokens(16, 2));
  ASSERT_OK(worker->SendKvSnapshot(Ids(prefix)));
  ASSERT_OK(worker->SendLoadReport({.queued_prefill_tokens = 1000}));
  ExpectView(*router, "worker_queued_prefill_tokens", "w0", 1000);

  ASSERT_OK_AND_ASSIGN(auto client, router->Connect());
  ASSERT_OK(SendGenerate(*client, 1, prompt, 2));
  ASSERT_OK_AND_ASSIGN(wire::GenerateMessage g, worker->NextGenerate(30s));
  EXPECT_EQ(g.prompt, Ids(prompt));
  ASSERT_OK_AND_ASSIGN(
      double predicted,
      Metric(router->http_port(), Series("worker_predicted_cached_tokens_total", "w0")));
  EXPECT_EQ(predicted, 256);
  // Picked: the router adds the 16 uncached tokens to the last report until a report covers it.
  ExpectView(*router, "worker_queued_prefill_tokens", "w0", 1016);

  // The worker's report covers the request now, beside 2000 tokens of others' prefill.
  ASSERT_OK(worker->SendLoadReport({.queued_prefill_tokens = 2016, .running_sequences = 1}));
  ExpectView(*router, "worker_queued_prefill_tokens", "w0", 2016);
  ExpectView(*router, "worker_running_sequences", "w0", 1);

  ASSERT_OK(worker->SendToken(g.request_id, 7, 0));
  Result<double> after = WaitForMetric(
      router->http_port(), Series("worker_queued_prefill_tokens", "w0"),
      [](double v) { return v != 2016; }, 30s);
  ASSERT_OK(after.status());
  EXPECT_EQ(after.value(), 2000) << "the first token took off more than the uncached prompt";

  ASSERT_OK(worker->SendToken(g.request_id, 8, 1));
  ASSERT_OK(worker->SendFinish({.request_id = g.request_id,
                                .reason = chunkserve::FinishReason::kLength,
                                .error = Status::Ok(),
                                .prompt_tokens = static_cast<int32_t>(prompt.size()),
                                .cached_tokens = 256,
                                .generated_tokens = 2}));
  const Outcome o = ReceiveAll(*client, {1})[1];
  EXPECT_TRUE(o.finished);
  EXPECT_EQ(o.tokens, (std::vector<uint32_t>{7, 8}));
  EXPECT_EQ(o.cached, 256);
  // The request left: the router takes it off the last report's running sequences.
  ExpectView(*router, "worker_running_sequences", "w0", 0);
  ExpectView(*router, "worker_queued_prefill_tokens", "w0", 2000);
}

// Two routers share a worker and a request goes through the first. The second sees no first
// token: only the worker's report tells it that the prefill left the queue, and the worker sends
// one within milliseconds of the first token, not at its next period (a minute here).
TEST(RouterLoadViewTest, AFirstTokenReachesARouterThatDidNotSendTheRequest) {
  // Leases longer than the test: the worker reports only when something happens.
  ASSERT_OK_AND_ASSIGN(auto a, RouterProcess::Start({"--lease-ms", "600000"}));
  ASSERT_OK_AND_ASSIGN(auto b, RouterProcess::Start({"--lease-ms", "600000"}));
  // The engine's test hook: it takes no step while this file exists.
  const std::string stall = ::testing::TempDir() + "/load_view_stall_" + std::to_string(::getpid());
  std::remove(stall.c_str());
  ::setenv("CHUNKSERVE_TEST_STALL_FILE", stall.c_str(), 1);  // inherited by the child only
  auto started =
      StartWorker(a->address() + "," + b->address(), "w0", {"--load-report-ms", "60000"});
  ::unsetenv("CHUNKSERVE_TEST_STALL_FILE");
  ASSERT_OK(started.status());
  ExpectWorkersAlive(*a, 1);
  ExpectWorkersAlive(*b, 1);

  std::ofstream(stall) << "stall\n";
  ASSERT_OK_AND_ASSIGN(auto client, a->Connect());
  ASSERT_OK(SendGenerate(*client, 1, Tokens(300, 3), 1000));
  // Waiting in the frozen engine: the report sent on its arrival shows its prompt.
  ExpectView(*b, "worker_queued_prefill_tokens", "w0", 300);
  std::remove(stall.c_str());
  ASSERT_OK_AND_ASSIGN(DecodedMessage first, client->Receive(60s));
  ASSERT_EQ(first.root().which(), Envelope::TOKEN);
  // Frozen again mid-generation: no end (and so no report for one) comes.
  std::ofstream(stall) << "stall\n";
  ExpectView(*b, "worker_queued_prefill_tokens", "w0", 0);
  std::remove(stall.c_str());
  const Outcome o = ReceiveAll(*client, {1})[1];
  EXPECT_TRUE(o.finished);
}

}  // namespace
}  // namespace chunkserve::router
