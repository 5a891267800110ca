// Real processes agree with the simulator (issue 19): a generated multi-turn workload (200
// requests, 8 conversations at a time behind one shared system prompt) is replayed through a
// real chunkserve-router with 4 chunkserve-workers (built-in tiny model, 64 MiB KV = 256 chunks
// of 64 tokens each) by chunkserve-loadgen, and through chunkserve-sim's model of the same
// cluster (4 workers, 256 chunks, chunk 64, ttft). The prefix hit rates must agree within 0.10
// (absolute): the hit rate is set by where conversations land and what the caches keep, which
// the simulator models; timing (the tiny model's speed on this machine) is not compared. The
// engine reports a little more than the simulator (measured: 0.792 / 0.816 vs 0.767 / 0.768),
// which counts whole chunks only; with 128-token system prompts and short turns the gap was
// 0.08, hence prompts of several hundred tokens here.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "router/sim/simulator.h"
#include "runtime/workload/workload.h"
#include "tests/router/router_test_util.h"
#include "tests/testing/temp_dir.h"

namespace chunkserve::router {
namespace {

using namespace testing;  // NOLINT: the router test helpers
using workload::ForFamily;
using workload::MakeSyntheticWorkload;
using workload::ParseJsonlTrace;
using workload::ToJsonlLine;
using workload::WorkloadFamily;
using workload::WorkloadOptions;

constexpr double kTolerance = 0.10;

double JsonNumber(const std::string& json, const std::string& key) {
  const std::string needle = "\"" + key + "\":";
  const size_t at = json.find(needle);
  if (at == std::string::npos) return std::nan("");
  return std::strtod(json.c_str() + at + needle.size(), nullptr);
}

WorkloadOptions Workload() {
  WorkloadOptions o = ForFamily(WorkloadFamily::kMultiTurn);
  o.num_requests = 200;
  o.arrival_rate = 6;
  o.vocab_size = 1024;  // the built-in tiny model
  o.system_tokens = 256;
  o.min_suffix_tokens = 32;
  o.max_suffix_tokens = 160;
  o.min_output_tokens = 4;
  o.max_output_tokens = 12;
  o.min_turns = 2;
  o.max_turns = 8;
  o.max_prompt_tokens = 2048;
  o.active_conversations = 8;
  o.seed = 19;
  return o;
}

TEST(SimAgreementTest, RealRouterAndWorkersHitTheCacheLikeTheSimulator) {
  ::chunkserve::testing::TempDir dir;
  const std::string trace = (dir.path() / "multi_turn.jsonl").string();
  {
    ASSERT_OK_AND_ASSIGN(auto source, MakeSyntheticWorkload(Workload()));
    std::ofstream out(trace);
    while (auto r = source->Next()) out << ToJsonlLine(*r, /*with_tokens=*/true) << "\n";
    ASSERT_TRUE(out.good());
  }

  // The simulator.
  std::ifstream in(trace);
  std::stringstream text;
  text << in.rdbuf();
  ASSERT_OK_AND_ASSIGN(auto sim_source, ParseJsonlTrace(text.str(), 1024));
  sim::SimOptions so;
  so.num_workers = 4;
  so.chunk_size = 64;
  so.worker.kv_capacity_chunks = 256;
  so.router.policy_kind = PolicyKind::kTtft;
  ASSERT_OK_AND_ASSIGN(sim::SimReport simulated, sim::RunSimulation(so, *sim_source));
  ASSERT_EQ(simulated.completed, 200);

  // The real cluster.
  ASSERT_OK_AND_ASSIGN(auto router, RouterProcess::Start({}));
  std::vector<std::unique_ptr<worker::testing::WorkerProcess>> workers;
  for (int i = 0; i < 4; ++i) {
    ASSERT_OK_AND_ASSIGN(auto w, StartWorker(router->address(), "w" + std::to_string(i)));
    workers.push_back(std::move(w));
  }
  ExpectWorkersAlive(*router, 4);
  const std::string json_path = (dir.path() / "result.json").string();
  std::vector<std::string> args = {CHUNKSERVE_LOADGEN_BIN,
                                   "--target", router->address(),
                                   "--metrics", "127.0.0.1:" + std::to_string(router->http_port()),
                                   "--trace", trace, "--vocab", "1024", "--no-control",
                                   "--connections", "4", "--timeout-s", "240",
                                   "--json", json_path, "--label", "agreement"};
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
  std::ifstream res(json_path);
  std::stringstream rt;
  rt << res.rdbuf();
  const std::string json = rt.str();
  ASSERT_FALSE(json.empty());
  EXPECT_EQ(JsonNumber(json, "finished"), 200);
  const double real = JsonNumber(json, "hit_rate");
  std::printf("hit rate: real router + 4 workers %.3f, simulator %.3f (tolerance %.2f)\n", real,
              simulated.hit_rate, kTolerance);
  EXPECT_GT(simulated.hit_rate, 0.3);
  EXPECT_NEAR(real, simulated.hit_rate, kTolerance);
}

}  // namespace
}  // namespace chunkserve::router
