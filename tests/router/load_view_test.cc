// The load a router's policy sees for a worker between two of its load reports
// (chunkserve_router_worker_queued_prefill_tokens / _running_sequences), against a worker whose
// reports the test sets to the token (FakeWorker, over the real wire protocol) and a real
// chunkserve-router process.
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace chunkserve::router
