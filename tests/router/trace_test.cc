// Block-hash traces (the public KV-cache trace format) in the simulator: a native replay of the
// committed sample (tests/router/data/block_trace_sample.jsonl, written by make_block_trace.py in
// the same folder) and the oracles on hand-built traces. The reader itself is tested in
// tests/workload/trace_test.cc.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "router/sim/simulator.h"
#include "runtime/workload/workload.h"
#include "tests/testing/status_matchers.h"

namespace chunkserve::router {

using workload::LoadTrace;
using workload::ParseTrace;
using workload::TraceOptions;
using workload::WorkloadSource;

const std::string kSample =
    std::string(CHUNKSERVE_SOURCE_DIR) + "/tests/router/data/block_trace_sample.jsonl";

namespace {

TEST(BlockTraceTest, SimulatorReplaysTheSampleNatively) {
  ASSERT_OK_AND_ASSIGN(auto src, LoadTrace(kSample, TraceOptions{}));
  sim::SimOptions o;
  o.num_workers = 2;
  o.router.policy_kind = PolicyKind::kTtft;
  ASSERT_OK_AND_ASSIGN(sim::SimReport r, sim::RunSimulation(o, *src));
  EXPECT_EQ(r.requests, 39);
  EXPECT_EQ(r.completed, 39);
  // Every turn after the first re-reads its conversation's earlier full blocks; block 0 is
  // shared by all: the hit rate is well above zero.
  EXPECT_GT(r.hit_rate, 0.3);
  // The same trace expanded to tokens gives the same hit rate (chunk hashes differ, sharing not).
  TraceOptions t;
  t.synthesize_tokens = true;
  ASSERT_OK_AND_ASSIGN(auto tokens, LoadTrace(kSample, t));
  ASSERT_OK_AND_ASSIGN(sim::SimReport rt, sim::RunSimulation(o, *tokens));
  EXPECT_EQ(rt.cached_tokens, r.cached_tokens);
  EXPECT_EQ(rt.prompt_tokens, r.prompt_tokens);
}

}  // namespace
}  // namespace chunkserve::router

namespace chunkserve::router::sim {
namespace {

// A block-hash trace with blocks of one chunk (64 tokens): block ids are chunk ids.
std::unique_ptr<WorkloadSource> Blocks(const std::vector<std::pair<int64_t, std::vector<int>>>& reqs) {
  std::string text;
  int t = 0;
  for (const auto& [len, ids] : reqs) {
    text += "{\"timestamp\": " + std::to_string(t++) + ", \"input_length\": " +
            std::to_string(len) + ", \"output_length\": 1, \"hash_ids\": [";
    for (size_t i = 0; i < ids.size(); ++i) text += (i ? ", " : "") + std::to_string(ids[i]);
    text += "]}\n";
  }
  TraceOptions o;
  o.block_size = 64;
  auto r = ParseTrace(text, o);
  EXPECT_TRUE(r.ok()) << r.status();
  return std::move(r).value();
}

TEST(OracleTest, HandCheckedInfiniteAndSingleWorkerLru) {
  // r0 [1,2]: nothing seen. r1 [1,3]: chunk 1 (64). r2 [1,2,4]: chunks 1,2 (128).
  // r3 [1,3]: both chunks, capped at prompt - 1 = 127. Infinite: 319 of 576.
  // One worker, LRU of 3 chunks, order front (oldest) -> back after each request:
  //   r0: [2,1]  r1: hits 1 -> [2,3,1]  r2: hits 1,2 -> [3,4,2,1] -> evict 3 -> [4,2,1]
  //   r3: hits 1 only (3 was evicted) = 64. Affinity: 0 + 64 + 128 + 64 = 256 of 576.
  const std::vector<std::pair<int64_t, std::vector<int>>> reqs = {
      {128, {1, 2}}, {128, {1, 3}}, {192, {1, 2, 4}}, {128, {1, 3}}};
  SimOptions o;
  o.num_workers = 1;
  o.worker.kv_capacity_chunks = 3;
  auto src = Blocks(reqs);
  ASSERT_OK_AND_ASSIGN(OracleReport r, ComputeOracles(o, *src));
  EXPECT_EQ(r.prompt_tokens, 576u);
  EXPECT_EQ(r.infinite_cached_tokens, 319u);
  EXPECT_EQ(r.affinity_cached_tokens, 256u);
  EXPECT_DOUBLE_EQ(r.infinite_hit_rate, 319.0 / 576);
  EXPECT_DOUBLE_EQ(r.affinity_hit_rate, 256.0 / 576);
  // With room for everything, one worker is the infinite cache.
  o.worker.kv_capacity_chunks = 100;
  auto again = Blocks(reqs);
  ASSERT_OK_AND_ASSIGN(OracleReport big, ComputeOracles(o, *again));
  EXPECT_EQ(big.affinity_cached_tokens, 319u);
}

TEST(OracleTest, APrefixSharedByAllSpreadsAndCostsOneMissPerWorker) {
  // 40 requests [1, unique]: the infinite cache misses chunk 1 once (39 x 64 cached). Perfect
  // affinity on 4 big workers must not put all of it on one worker (the load limit), and each
  // worker it uses misses chunk 1 once.
  std::vector<std::pair<int64_t, std::vector<int>>> reqs;
  for (int i = 0; i < 40; ++i) reqs.push_back({128, {1, 100 + i}});
  SimOptions o;
  o.num_workers = 4;
  o.worker.kv_capacity_chunks = 1000;
  auto src = Blocks(reqs);
  ASSERT_OK_AND_ASSIGN(OracleReport r, ComputeOracles(o, *src));
  EXPECT_EQ(r.infinite_cached_tokens, 39u * 64);
  EXPECT_LE(r.affinity_cached_tokens, r.infinite_cached_tokens);
  EXPECT_GE(r.affinity_cached_tokens, 36u * 64);      // at most 4 misses of chunk 1
  EXPECT_LT(r.affinity_cached_tokens, 39u * 64);      // more than one worker was used
  // Disjoint prefixes, no sharing at all: both oracles are 0.
  std::vector<std::pair<int64_t, std::vector<int>>> none;
  for (int i = 0; i < 10; ++i) none.push_back({128, {2 * i + 1, 2 * i + 2}});
  auto src2 = Blocks(none);
  ASSERT_OK_AND_ASSIGN(OracleReport z, ComputeOracles(o, *src2));
  EXPECT_EQ(z.infinite_cached_tokens, 0u);
  EXPECT_EQ(z.affinity_cached_tokens, 0u);
  auto src3 = Blocks(none);
  EXPECT_EQ(ComputeOracles(o, *src3, 0.5).status().code(), StatusCode::kInvalidArgument);
}

TEST(OracleTest, PoliciesStayBelowTheInfiniteCacheOnTheSample) {
  TraceOptions t;
  ASSERT_OK_AND_ASSIGN(auto src, LoadTrace(kSample, t));
  SimOptions o;
  o.num_workers = 4;
  ASSERT_OK_AND_ASSIGN(OracleReport oracle, ComputeOracles(o, *src));
  EXPECT_GT(oracle.infinite_hit_rate, 0.3);
  EXPECT_LE(oracle.affinity_hit_rate, oracle.infinite_hit_rate);
  for (PolicyKind kind : AllPolicyKinds()) {
    ASSERT_OK_AND_ASSIGN(auto s, LoadTrace(kSample, t));
    o.router.policy_kind = kind;
    ASSERT_OK_AND_ASSIGN(SimReport r, RunSimulation(o, *s));
    EXPECT_LE(r.cached_tokens, oracle.infinite_cached_tokens) << r.policy;
    EXPECT_EQ(r.prompt_tokens, oracle.prompt_tokens);
  }
}

}  // namespace
}  // namespace chunkserve::router::sim
