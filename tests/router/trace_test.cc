// Block-hash traces (the public KV-cache trace format): the reader, its errors, the chunk hash
// chain derived from block ids, token synthesis for the load generator, and a simulator replay of
// the committed sample (tests/router/data/block_trace_sample.jsonl, written by
// make_block_trace.py in the same folder).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "router/sim/simulator.h"
#include "runtime/kvcache/chunk_hash.h"
#include "runtime/workload/workload.h"
#include "tests/testing/status_matchers.h"

namespace chunkserve::router {

using workload::BlockChunkHashes;
using workload::LoadTrace;
using workload::ParseTrace;
using workload::PromptLength;
using workload::SynthesizeBlockTokens;
using workload::TraceOptions;
using workload::WorkloadRequest;
using workload::WorkloadSource;

const std::string kSample =
    std::string(CHUNKSERVE_SOURCE_DIR) + "/tests/router/data/block_trace_sample.jsonl";

namespace {

std::vector<WorkloadRequest> Drain(WorkloadSource& s) {
  std::vector<WorkloadRequest> out;
  while (auto r = s.Next()) out.push_back(std::move(*r));
  return out;
}

TEST(BlockTraceTest, ReadsTheSampleWithoutTokens) {
  ASSERT_OK_AND_ASSIGN(auto src, LoadTrace(kSample, TraceOptions{}));
  const std::vector<WorkloadRequest> all = Drain(*src);
  ASSERT_EQ(all.size(), 39u);
  EXPECT_EQ(all[0].arrival_s, 0);
  EXPECT_EQ(all[0].prompt_length, 612);
  EXPECT_TRUE(all[0].prompt.empty());
  EXPECT_EQ(PromptLength(all[0]), 612);
  EXPECT_EQ(all[0].block_ids, (std::vector<uint64_t>{0, 1}));
  EXPECT_EQ(all[0].block_size, 512);
  EXPECT_EQ(all[0].output_tokens, 40);
  EXPECT_DOUBLE_EQ(all[1].arrival_s, 1.0);  // timestamps are milliseconds
  for (size_t i = 1; i < all.size(); ++i) EXPECT_GE(all[i].arrival_s, all[i - 1].arrival_s);
}

TEST(BlockTraceTest, OffsetLimitAndTimeScale) {
  TraceOptions o;
  o.offset = 2;
  o.limit = 5;
  o.time_scale = 0.5;
  ASSERT_OK_AND_ASSIGN(auto src, LoadTrace(kSample, o));
  const std::vector<WorkloadRequest> some = Drain(*src);
  ASSERT_EQ(some.size(), 5u);
  EXPECT_EQ(some[0].index, 0u);
  EXPECT_EQ(some[0].arrival_s, 0);  // relative to the first selected record
  ASSERT_OK_AND_ASSIGN(auto full, LoadTrace(kSample, TraceOptions{}));
  const std::vector<WorkloadRequest> all = Drain(*full);
  for (size_t i = 0; i < some.size(); ++i) {
    EXPECT_EQ(some[i].block_ids, all[i + 2].block_ids);
    EXPECT_DOUBLE_EQ(some[i].arrival_s, 0.5 * (all[i + 2].arrival_s - all[2].arrival_s));
  }
}

TEST(BlockTraceTest, MalformedLinesNameTheirLineNumber) {
  const std::string good = R"({"timestamp": 5, "input_length": 600, "output_length": 3, "hash_ids": [1, 2]})";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{not json", "not a JSON object"},
      {R"({"input_length": 600, "output_length": 3, "hash_ids": [1, 2]})", "timestamp"},
      {R"({"timestamp": 9, "output_length": 3, "hash_ids": [1, 2]})", "input_length"},
      {R"({"timestamp": 9, "input_length": 600, "hash_ids": [1, 2]})", "output_length"},
      {R"({"timestamp": 9, "input_length": 600, "output_length": 3})", "hash_ids"},
      {R"({"timestamp": 9, "input_length": 600, "output_length": 3, "hash_ids": [1]})",
       "needs 2 blocks"},
      {R"({"timestamp": 9, "input_length": 600, "output_length": 3, "hash_ids": [1, -2]})",
       "non-negative integer"},
      {R"({"timestamp": 9, "input_length": 600, "output_length": 3, "hash_ids": [1, "x"]})",
       "non-negative integer"},
      {R"({"timestamp": 1, "input_length": 600, "output_length": 3, "hash_ids": [1, 2]})",
       "decreases"},
      {R"({"timestamp": 9, "input_length": 0, "output_length": 3, "hash_ids": []})",
       "input_length"},
      {R"({"timestamp": 9, "input_length": 1.5, "output_length": 3, "hash_ids": [1]})",
       "not an integer"},
      {R"({"timestamp": -3, "input_length": 600, "output_length": 3, "hash_ids": [1, 2]})",
       "timestamp"},
  };
  for (const auto& [line, what] : cases) {
    // Line 1 is good, line 2 blank, line 3 the bad one.
    const Result<std::unique_ptr<WorkloadSource>> r = ParseTrace(good + "\n\n" + line, {});
    ASSERT_FALSE(r.ok()) << line;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << line;
    const std::string message = r.status().ToString();
    EXPECT_NE(message.find("trace line 3"), std::string::npos) << message;
    EXPECT_NE(message.find(what), std::string::npos) << message;
  }
  TraceOptions bad;
  bad.block_size = 0;
  EXPECT_EQ(ParseTrace(good, bad).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(LoadTrace("/nonexistent/trace.jsonl", {}).status().code(), StatusCode::kNotFound);
}

TEST(BlockTraceTest, ChunkHashesFollowBlockIdentity) {
  const uint64_t seed = kv::ChunkHashSeed(0x5151, 64);
  // Blocks of 512 = 8 chunks of 64. a and b share block 7, then differ.
  ASSERT_OK_AND_ASSIGN(auto a, BlockChunkHashes(seed, 64, 512, {7, 8, 9}, 1200));
  ASSERT_OK_AND_ASSIGN(auto b, BlockChunkHashes(seed, 64, 512, {7, 10}, 600));
  ASSERT_EQ(a.size(), 18u);  // 1200 / 64 full chunks
  ASSERT_EQ(b.size(), 9u);
  for (size_t i = 0; i < 8; ++i) EXPECT_EQ(a[i], b[i]) << i;
  EXPECT_NE(a[8], b[8]);
  // Chunks inside one block are distinct; nothing equals the chain seed.
  for (size_t i = 0; i + 1 < a.size(); ++i) {
    EXPECT_NE(a[i], a[i + 1]);
    EXPECT_NE(a[i], seed);
  }
  // Same block at another position = same prefix by the format's definition.
  ASSERT_OK_AND_ASSIGN(auto c, BlockChunkHashes(seed, 64, 512, {8}, 512));
  EXPECT_EQ(c[0], a[8]);  // block 8, offset 64 in both
  // Chunks larger than blocks: chunk c ends in the block holding its last token.
  ASSERT_OK_AND_ASSIGN(auto d, BlockChunkHashes(seed, 100, 16, {1, 2, 3, 4, 5, 6, 7}, 100));
  ASSERT_OK_AND_ASSIGN(auto e, BlockChunkHashes(seed, 100, 16, {9, 9, 9, 9, 9, 9, 7}, 100));
  EXPECT_EQ(d, e);  // only the last block's id names the prefix
  EXPECT_EQ(BlockChunkHashes(seed, 64, 512, {1}, 1024).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(BlockChunkHashes(seed, 0, 512, {1}, 100).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(BlockTraceTest, SynthesizedTokensShareExactlyWhereBlocksDo) {
  TraceOptions o;
  o.synthesize_tokens = true;
  o.vocab_size = 1024;
  ASSERT_OK_AND_ASSIGN(auto src, LoadTrace(kSample, o));
  const std::vector<WorkloadRequest> all = Drain(*src);
  const uint64_t seed = kv::ChunkHashSeed(0x5151, 64);
  for (const WorkloadRequest& r : all) {
    ASSERT_EQ(static_cast<int64_t>(r.prompt.size()), r.prompt_length);
    for (TokenId t : r.prompt) ASSERT_LT(t, 1024);
  }
  // For every pair: the token chunk chains share a prefix exactly as long as the block chains.
  for (size_t i = 0; i < all.size(); ++i) {
    for (size_t j = i + 1; j < all.size(); ++j) {
      ASSERT_OK_AND_ASSIGN(auto ti, kv::FullChunkHashes(seed, 64, all[i].prompt));
      ASSERT_OK_AND_ASSIGN(auto tj, kv::FullChunkHashes(seed, 64, all[j].prompt));
      ASSERT_OK_AND_ASSIGN(auto bi, BlockChunkHashes(seed, 64, 512, all[i].block_ids,
                                                     all[i].prompt_length));
      ASSERT_OK_AND_ASSIGN(auto bj, BlockChunkHashes(seed, 64, 512, all[j].block_ids,
                                                     all[j].prompt_length));
      auto common = [](const std::vector<uint64_t>& x, const std::vector<uint64_t>& y) {
        size_t k = 0;
        while (k < x.size() && k < y.size() && x[k] == y[k]) ++k;
        return k;
      };
      EXPECT_EQ(common(ti, tj), common(bi, bj)) << i << " " << j;
    }
  }
  // Equal ids, equal tokens; a partial block is the full block's prefix.
  EXPECT_EQ(SynthesizeBlockTokens({3, 4}, 8, 12, 100, 1),
            [] {
              auto full = SynthesizeBlockTokens({3, 4}, 8, 16, 100, 1);
              full.resize(12);
              return full;
            }());
}

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
