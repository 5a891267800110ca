// Block-hash traces (the public KV-cache trace format): the reader, its errors, the chunk hash
// chain derived from block ids and token synthesis for the load generator, on the committed
// sample (tests/router/data/block_trace_sample.jsonl, written by make_block_trace.py there; the
// simulator's replay of it is tests/router/trace_test.cc).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "runtime/kvcache/chunk_hash.h"
#include "runtime/workload/workload.h"
#include "tests/testing/status_matchers.h"

namespace chunkserve::workload {
namespace {

const std::string kSample =
    std::string(CHUNKSERVE_SOURCE_DIR) + "/tests/router/data/block_trace_sample.jsonl";

TEST(BlockTraceTest, ReadsTheSampleWithoutTokens) {
  ASSERT_OK_AND_ASSIGN(auto src, LoadTrace(kSample, TraceOptions{}));
  const std::vector<WorkloadRequest> all = ReadAll(*src);
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
  const std::vector<WorkloadRequest> some = ReadAll(*src);
  ASSERT_EQ(some.size(), 5u);
  EXPECT_EQ(some[0].index, 0u);
  EXPECT_EQ(some[0].arrival_s, 0);  // relative to the first selected record
  ASSERT_OK_AND_ASSIGN(auto full, LoadTrace(kSample, TraceOptions{}));
  const std::vector<WorkloadRequest> all = ReadAll(*full);
  for (size_t i = 0; i < some.size(); ++i) {
    EXPECT_EQ(some[i].block_ids, all[i + 2].block_ids);
    EXPECT_DOUBLE_EQ(some[i].arrival_s, 0.5 * (all[i + 2].arrival_s - all[2].arrival_s));
  }
}

TEST(BlockTraceTest, MalformedLinesNameTheirLineNumber) {
  const std::string good =
      R"({"timestamp": 5, "input_length": 600, "output_length": 3, "hash_ids": [1, 2]})";
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
  EXPECT_EQ(BlockChunkHashes(seed, 0, 512, {1}, 100).status().code(), StatusCode::kInvalidArgument);
}

TEST(BlockTraceTest, SynthesizedTokensShareExactlyWhereBlocksDo) {
  TraceOptions o;
  o.synthesize_tokens = true;
  o.vocab_size = 1024;
  ASSERT_OK_AND_ASSIGN(auto src, LoadTrace(kSample, o));
  const std::vector<WorkloadRequest> all = ReadAll(*src);
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
      ASSERT_OK_AND_ASSIGN(auto bi,
                           BlockChunkHashes(seed, 64, 512, all[i].block_ids, all[i].prompt_length));
      ASSERT_OK_AND_ASSIGN(auto bj,
                           BlockChunkHashes(seed, 64, 512, all[j].block_ids, all[j].prompt_length));
      auto common = [](const std::vector<uint64_t>& x, const std::vector<uint64_t>& y) {
        size_t k = 0;
        while (k < x.size() && k < y.size() && x[k] == y[k]) ++k;
        return k;
      };
      EXPECT_EQ(common(ti, tj), common(bi, bj)) << i << " " << j;
    }
  }
  // Equal ids, equal tokens; a partial block is the full block's prefix.
  EXPECT_EQ(SynthesizeBlockTokens({3, 4}, 8, 12, 100, 1), [] {
    auto full = SynthesizeBlockTokens({3, 4}, 8, 16, 100, 1);
    full.resize(12);
    return full;
  }());
}

}  // namespace
}  // namespace chunkserve::workload
