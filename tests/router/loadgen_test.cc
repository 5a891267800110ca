// chunkserve-loadgen against a real router with two workers: every request of both phases
// finishes, the shared phase hits the prefix cache and the control does not, and the per-worker
// figures come from the router's metrics.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "router/loadgen/report.h"
#include "runtime/wire/asio.h"
#include "tests/router/router_test_util.h"
#include "tests/testing/temp_dir.h"

namespace chunkserve::router {
namespace {

using namespace testing;  // NOLINT: the router test helpers

// The number after `"key":` in the n-th (0-based) occurrence of the key, or NaN.
double JsonNumber(const std::string& json, const std::string& key, int occurrence) {
  size_t at = 0;
  const std::string needle = "\"" + key + "\":";
  for (int i = 0; i <= occurrence; ++i) {
    at = json.find(needle, i == 0 ? 0 : at + 1);
    if (at == std::string::npos) return std::nan("");
  }
  return std::strtod(json.c_str() + at + needle.size(), nullptr);
}

// Runs chunkserve-loadgen with `args` (plus --json FILE), with `env` ("NAME=VALUE") added to its
// environment; returns its exit status and the JSON it wrote.
struct LoadgenRun {
  int exit_status = -1;
  std::string json;
};
LoadgenRun RunLoadgen(std::vector<std::string> args, const std::string& env = "") {
  ::chunkserve::testing::TempDir dir;
  const std::string json_path = (dir.path() / "result.json").string();
  args.insert(args.begin(), CHUNKSERVE_LOADGEN_BIN);
  args.insert(args.end(), {"--json", json_path});
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  LoadgenRun run;
  const pid_t pid = ::fork();
  if (pid < 0) return run;
  if (pid == 0) {
    if (!env.empty()) ::putenv(const_cast<char*>(env.c_str()));
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return run;
  run.exit_status = WEXITSTATUS(status);
  std::ifstream in(json_path);
  std::stringstream text;
  text << in.rdbuf();
  run.json = text.str();
  return run;
}

// A /metrics endpoint that accepts and never answers (a router behind a silent partition) costs
// the scrape its timeout, not forever: Beast's synchronous calls would ignore the deadline.
TEST(LoadgenTest, AScrapeOfASilentEndpointEndsAtItsTimeout) {
  asio::io_context io;
  asio::ip::tcp::acceptor acceptor(io, {asio::ip::make_address("127.0.0.1"), 0});
  asio::ip::tcp::socket held(io);
  acceptor.async_accept(held, [](const boost::system::error_code&) {});
  std::thread server([&] { io.run_for(std::chrono::seconds(30)); });
  const auto start = std::chrono::steady_clock::now();
  Result<Samples> r = Scrape("127.0.0.1", acceptor.local_endpoint().port(),
                             std::chrono::milliseconds(300));
  const auto took = std::chrono::steady_clock::now() - start;
  io.stop();
  server.join();
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable) << r.status();
  EXPECT_LT(took, std::chrono::seconds(10));  // generous for a loaded machine; the bug hangs
}

TEST(LoadgenTest, ReportsHitRateForSharedPromptsAndNoneForTheControl) {
  ASSERT_OK_AND_ASSIGN(auto router, RouterProcess::Start({}));
  ASSERT_OK_AND_ASSIGN(auto w0, StartWorker(router->address(), "w0"));
  ASSERT_OK_AND_ASSIGN(auto w1, StartWorker(router->address(), "w1"));
  ExpectWorkersAlive(*router, 2);
  const LoadgenRun run = RunLoadgen(
      {"--target", router->address(), "--metrics",
       "127.0.0.1:" + std::to_string(router->http_port()), "--requests", "24", "--rate", "20",
       "--tenants", "2", "--prefix-tokens", "192,128", "--suffix-tokens", "8,16",
       "--output-tokens", "2,4", "--connections", "2", "--label", "test"});
  ASSERT_EQ(run.exit_status, 0);
  const std::string& json = run.json;
  ASSERT_FALSE(json.empty());
  // Phase 0: shared, phase 1: control.
  EXPECT_EQ(JsonNumber(json, "finished", 0), 24);
  EXPECT_EQ(JsonNumber(json, "finished", 1), 24);
  EXPECT_EQ(JsonNumber(json, "errors", 0), 0);
  EXPECT_EQ(JsonNumber(json, "bad_indices", 0), 0);
  EXPECT_EQ(JsonNumber(json, "incomplete", 0), 0);
  EXPECT_EQ(JsonNumber(json, "incomplete", 1), 0);
  EXPECT_GE(JsonNumber(json, "tokens", 0), 2 * 24);
  EXPECT_LE(JsonNumber(json, "tokens", 0), 4 * 24);
  EXPECT_GT(JsonNumber(json, "hit_rate", 0), 0.3);
  EXPECT_LT(JsonNumber(json, "hit_rate", 1), 0.01);
  EXPECT_GT(JsonNumber(json, "ttft_p50_ms", 0), 0);
  EXPECT_GE(JsonNumber(json, "imbalance", 0), 1.0);
  EXPECT_GT(JsonNumber(json, "precision", 0), 0.5);
  // Per-worker routed counts from the router add up to the phase's requests.
  EXPECT_EQ(JsonNumber(json, "routed", 0) + JsonNumber(json, "routed", 1), 24);
}

// A cluster with a secret and a client token (examples/cluster/README.md): loadgen answers the
// router's challenge with $CHUNKSERVE_CLIENT_TOKEN, as the C client does, and counts every token
// of every stream; without the token it is refused.
TEST(LoadgenTest, AnswersTheChallengeWithTheClientTokenFromTheEnvironment) {
  ::chunkserve::testing::TempDir dir;
  const std::string secret = (dir.path() / "secret").string();
  const std::string token = (dir.path() / "token").string();
  std::ofstream(secret) << "0123456789abcdef0123456789abcdef\n";
  std::ofstream(token) << "client-token-0123456789abcdef\n";
  ASSERT_OK_AND_ASSIGN(
      auto router, RouterProcess::Start({"--secret-file", secret, "--client-token-file", token}));
  ASSERT_OK_AND_ASSIGN(auto w0, StartWorker(router->address(), "w0", {"--secret-file", secret}));
  ExpectWorkersAlive(*router, 1);
  const std::vector<std::string> args = {"--target", router->address(), "--requests", "8",
                                         "--rate", "20", "--tenants", "1", "--prefix-tokens",
                                         "128", "--suffix-tokens", "8,8", "--output-tokens",
                                         "5,5", "--no-control", "--timeout-s", "60"};
  const LoadgenRun served =
      RunLoadgen(args, "CHUNKSERVE_CLIENT_TOKEN=client-token-0123456789abcdef");
  ASSERT_EQ(served.exit_status, 0);
  EXPECT_EQ(JsonNumber(served.json, "finished", 0), 8);
  EXPECT_EQ(JsonNumber(served.json, "errors", 0), 0);
  EXPECT_EQ(JsonNumber(served.json, "incomplete", 0), 0);
  EXPECT_EQ(JsonNumber(served.json, "tokens", 0), 8 * 5);
  const LoadgenRun refused = RunLoadgen(args);
  ASSERT_EQ(refused.exit_status, 0);  // it ran; every request failed
  EXPECT_EQ(JsonNumber(refused.json, "finished", 0), 0);
  EXPECT_EQ(JsonNumber(refused.json, "errors", 0), 8);
}

}  // namespace
}  // namespace chunkserve::router
