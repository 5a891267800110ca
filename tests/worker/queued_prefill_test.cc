// QueuedPrefill: the worker's queued prefill counts a prefix once, whether the engine has it
// cached or a request ahead will compute it. Hand-checked cases, then random sequences of
// events against a direct recomputation.
#include "worker/queued_prefill.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <map>
#include <set>
#include <vector>

#include "runtime/kvcache/chunk_hash.h"
#include "tests/testing/random.h"

namespace chunkserve::worker {
namespace {

constexpr int32_t kChunk = 4;
constexpr uint64_t kSeed = 0x1234;

std::vector<TokenId> Tokens(std::initializer_list<int32_t> ids) {
  std::vector<TokenId> t;
  for (int32_t i : ids) t.push_back(i);
  return t;
}

std::vector<uint64_t> Chain(const std::vector<TokenId>& prompt) {
  return kv::FullChunkHashes(kSeed, kChunk, prompt).value();
}

TEST(QueuedPrefillTest, APrefixCountsOnceForTheRequestsQueuedBehindIt) {
  QueuedPrefill q(kSeed, kChunk);
  // Three full chunks and a 2-token tail.
  const auto a = Tokens({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 100, 101});
  const auto b = Tokens({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 200, 201, 202});
  EXPECT_EQ(q.Add(1, a), 14);  // cold: all of it
  EXPECT_EQ(q.Add(2, b), 3);   // the 12 shared tokens are request 1's prefill
  EXPECT_EQ(q.tokens(), 17);
  q.Remove(1);  // request 1 has its first token; request 2 still counts what it added
  EXPECT_EQ(q.tokens(), 3);
  // The engine stored request 1's chunks; a third request finds them cached.
  for (uint64_t h : Chain(a)) q.Stored(h);
  EXPECT_EQ(q.Add(3, a), 2);
  q.Remove(2);
  q.Remove(3);
  EXPECT_EQ(q.tokens(), 0);
  // Only the leading run counts: with chunk 1 evicted, chunks 2 and 3 are no use.
  q.Evicted(Chain(a)[1]);
  EXPECT_EQ(q.Add(4, b), 11);
  EXPECT_EQ(q.stored_chunks(), 2u);
}

TEST(QueuedPrefillTest, TheLastPromptTokenAlwaysCountsAndUnknownKeysAreIgnored) {
  QueuedPrefill q(kSeed, kChunk);
  const auto p = Tokens({1, 2, 3, 4, 5, 6, 7, 8});  // exactly two chunks
  for (uint64_t h : Chain(p)) q.Stored(h);
  EXPECT_EQ(q.Add(7, p), 1);            // its logits give the first token
  EXPECT_EQ(q.Add(8, Tokens({9})), 1);  // shorter than a chunk
  q.Remove(99);
  EXPECT_EQ(q.tokens(), 2);
  EXPECT_EQ(q.Add(7, Tokens({5, 5, 5, 5, 5})), 5);  // a reused key replaces its entry
  EXPECT_EQ(q.tokens(), 6);
  q.Remove(7);
  q.Remove(7);
  q.Remove(8);
  EXPECT_EQ(q.tokens(), 0);
}

// The same bookkeeping written directly: a request's count is its prompt less the leading
// chunks found among the stored ones and the chains of the requests waiting when it joined.
TEST(QueuedPrefillTest, RandomEventsMatchADirectRecomputation) {
  const uint64_t seed = testing::TestSeed();
  testing::Random rng(seed);
  QueuedPrefill q(kSeed, kChunk);
  std::set<uint64_t> stored;
  std::map<uint64_t, std::vector<uint64_t>> waiting_chains;
  std::map<uint64_t, int64_t> waiting_tokens;
  // Prompts from a few shared prefixes so that chains overlap.
  std::vector<std::vector<TokenId>> prefixes;
  for (int i = 0; i < 4; ++i) {
    std::vector<TokenId> p;
    const int64_t n = rng.Int(0, 5) * kChunk;
    for (int64_t t = 0; t < n; ++t) p.push_back(static_cast<TokenId>(rng.Int(0, 3)));
    prefixes.push_back(p);
  }
  uint64_t next_key = 1;
  for (int step = 0; step < 2000; ++step) {
    const int64_t what = rng.Int(0, 9);
    if (what < 4) {
      std::vector<TokenId> prompt = prefixes[static_cast<size_t>(rng.Int(0, 3))];
      const int64_t tail = rng.Int(prompt.empty() ? 1 : 0, 9);
      for (int64_t t = 0; t < tail; ++t) {
        prompt.push_back(static_cast<TokenId>(rng.Int(0, 3)));
      }
      const std::vector<uint64_t> chain = Chain(prompt);
      int64_t known = 0;
      for (uint64_t h : chain) {
        bool queued = false;
        for (const auto& [k, c] : waiting_chains) {
          for (uint64_t x : c) queued |= x == h;
        }
        if (!stored.count(h) && !queued) break;
        ++known;
      }
      const auto n = static_cast<int64_t>(prompt.size());
      const int64_t want = n - std::min(known * kChunk, n - 1);
      const uint64_t key = next_key++;
      ASSERT_EQ(q.Add(key, prompt), want) << "seed " << seed << " step " << step;
      waiting_chains[key] = chain;
      waiting_tokens[key] = want;
    } else if (what < 7 && !waiting_chains.empty()) {
      auto it = waiting_chains.begin();
      std::advance(it, rng.Int(0, static_cast<int64_t>(waiting_chains.size()) - 1));
      // Its first token: the engine stored its chunks (most of the time) and it leaves.
      if (rng.Int(0, 3) > 0) {
        for (uint64_t h : it->second) {
          stored.insert(h);
          q.Stored(h);
        }
      }
      q.Remove(it->first);
      waiting_tokens.erase(it->first);
      waiting_chains.erase(it);
    } else if (!stored.empty()) {
      auto it = stored.begin();
      std::advance(it, rng.Int(0, static_cast<int64_t>(stored.size()) - 1));
      q.Evicted(*it);
      stored.erase(it);
    }
    int64_t total = 0;
    for (const auto& [k, t] : waiting_tokens) total += t;
    ASSERT_EQ(q.tokens(), total) << "seed " << seed << " step " << step;
  }
}

}  // namespace
}  // namespace chunkserve::worker
