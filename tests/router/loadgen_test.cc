// chunkserve-loadgen against a real router with two workers: every request of both phases
// finishes, the shared phase hits the prefix cache and the control does not, and the per-worker
// figures come from the router's metrics.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

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

TEST(LoadgenTest, ReportsHitRateForSharedPromptsAndNoneForTheControl) {
  ASSERT_OK_AND_ASSIGN(auto router, RouterProcess::Start({}));
  ASSERT_OK_AND_ASSIGN(auto w0, StartWorker(router->address(), "w0"));
  ASSERT_OK_AND_ASSIGN(auto w1, StartWorker(router->address(), "w1"));
  ExpectWorkersAlive(*router, 2);
  ::chunkserve::testing::TempDir dir;
  const std::string json_path = (dir.path() / "result.json").string();
  std::vector<std::string> args = {CHUNKSERVE_LOADGEN_BIN,
                                   "--target", router->address(),
                                   "--metrics", "127.0.0.1:" + std::to_string(router->http_port()),
                                   "--requests", "24", "--rate", "20", "--tenants", "2",
                                   "--prefix-tokens", "192,128", "--suffix-tokens", "8,16",
                                   "--output-tokens", "2,4", "--connections", "2",
                                   "--json", json_path, "--label", "test"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 0);
  std::ifstream in(json_path);
  std::stringstream text;
  text << in.rdbuf();
  const std::string json = text.str();
  ASSERT_FALSE(json.empty());
  // Phase 0: shared, phase 1: control.
  EXPECT_EQ(JsonNumber(json, "finished", 0), 24);
  EXPECT_EQ(JsonNumber(json, "finished", 1), 24);
  EXPECT_EQ(JsonNumber(json, "errors", 0), 0);
  EXPECT_EQ(JsonNumber(json, "bad_indices", 0), 0);
  EXPECT_GT(JsonNumber(json, "hit_rate", 0), 0.3);
  EXPECT_LT(JsonNumber(json, "hit_rate", 1), 0.01);
  EXPECT_GT(JsonNumber(json, "ttft_p50_ms", 0), 0);
  EXPECT_GE(JsonNumber(json, "imbalance", 0), 1.0);
  EXPECT_GT(JsonNumber(json, "precision", 0), 0.5);
  // Per-worker routed counts from the router add up to the phase's requests.
  EXPECT_EQ(JsonNumber(json, "routed", 0) + JsonNumber(json, "routed", 1), 24);
}

}  // namespace
}  // namespace chunkserve::router
