#include "runtime/kvcache/prefix_tree.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>
#include <vector>

#include "runtime/kvcache/chunk_hash.h"
#include "tests/testing/status_matchers.h"

namespace chunkserve::kv {
namespace {

using ::chunkserve::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<TokenId> Iota(TokenId first, int n) {
  std::vector<TokenId> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), first);
  return v;
}

std::vector<TokenId> Concat(std::vector<TokenId> a, const std::vector<TokenId>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

class RecordingObserver : public KvEventObserver {
 public:
  void OnChunkStored(uint64_t hash, uint64_t parent_hash) override {
    stored.push_back({hash, parent_hash});
  }
  void OnChunkEvicted(uint64_t hash) override { evicted.push_back(hash); }

  std::vector<StoredChunkHash> stored;
  std::vector<uint64_t> evicted;
};

// A tree with chunk_size 4 by default; every test ends with a full invariant check.
class PrefixTreeTest : public ::testing::Test {
 protected:
  void SetUp() override { Reset(4, 16); }
  void TearDown() override { EXPECT_OK(tree().CheckInvariants()); }

  void Reset(int32_t chunk_size, int32_t num_slots, uint64_t slot_bytes = 1000) {
    Result<PrefixTree> t = PrefixTree::Create(
        {.chunk_size = chunk_size, .num_slots = num_slots, .slot_bytes = slot_bytes});
    ASSERT_OK(t.status());
    tree_.emplace(std::move(*t));
  }
  PrefixTree& tree() { return *tree_; }

  // Inserts `prompt` caching at most prompt.size() - 1 tokens (as the engine does), then appends
  // the rest as prefill would.
  SeqId AddSeq(const std::vector<TokenId>& prompt) {
    return AddSeqCaching(prompt, static_cast<int32_t>(prompt.size()) - 1);
  }
  SeqId AddSeqCaching(const std::vector<TokenId>& prompt, int32_t max_cached) {
    Result<InsertResult> r = tree().Insert(prompt, max_cached);
    EXPECT_OK(r.status());
    if (!r.ok()) return SeqId();
    Append(r->seq, std::vector<TokenId>(prompt.begin() + r->num_cached_tokens, prompt.end()));
    return r->seq;
  }
  AppendResult Append(SeqId seq, const std::vector<TokenId>& tokens) {
    AppendResult out;
    const SeqTokens req{seq, tokens};
    EXPECT_OK(tree().Append(std::span<const SeqTokens>(&req, 1), &out));
    return out;
  }

  std::vector<TokenId> Spell(SeqId seq) {
    std::vector<TokenId> out;
    Result<SeqInfo> info = tree().Seq(seq);
    EXPECT_OK(info.status());
    if (!info.ok()) return out;
    for (const ChunkId c : info->path) {
      Result<ChunkInfo> chunk = tree().Chunk(c);
      EXPECT_OK(chunk.status());
      out.insert(out.end(), chunk->tokens.begin(), chunk->tokens.end());
    }
    return out;
  }
  std::vector<ChunkId> Path(SeqId seq) {
    Result<SeqInfo> info = tree().Seq(seq);
    EXPECT_OK(info.status());
    return info.ok() ? std::vector<ChunkId>(info->path.begin(), info->path.end())
                     : std::vector<ChunkId>();
  }
  int32_t Ref(ChunkId c) {
    Result<ChunkInfo> chunk = tree().Chunk(c);
    EXPECT_OK(chunk.status());
    return chunk.ok() ? chunk->ref_count : -1;
  }

  std::optional<PrefixTree> tree_;
};

// ---- Create ----

TEST_F(PrefixTreeTest, CreateRejectsNonPositiveChunkSizeAndSlotCount) {
  EXPECT_THAT(PrefixTree::Create({.chunk_size = 0, .num_slots = 4}),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("chunk size")));
  EXPECT_THAT(PrefixTree::Create({.chunk_size = 4, .num_slots = 0}),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("num_slots")));
  EXPECT_THAT(PrefixTree::Create({.chunk_size = 1 << 16, .num_slots = 1 << 16}),
              StatusIs(StatusCode::kInvalidArgument));
}

// ---- Insert and Match ----

TEST_F(PrefixTreeTest, InsertOfEmptyPromptIsInvalidArgument) {
  EXPECT_THAT(tree().Insert({}, 0), StatusIs(StatusCode::kInvalidArgument, HasSubstr("empty")));
  EXPECT_EQ(tree().num_live_seqs(), 0);
}

TEST_F(PrefixTreeTest, InsertWithNegativeCacheLimitIsInvalidArgument) {
  EXPECT_THAT(tree().Insert(Iota(0, 3), -1), StatusIs(StatusCode::kInvalidArgument));
}

TEST_F(PrefixTreeTest, FirstPromptFindsNothingCachedAndPrefillFillsChunks) {
  const std::vector<TokenId> prompt = Iota(0, 10);
  ASSERT_OK_AND_ASSIGN(InsertResult r, tree().Insert(prompt, 9));
  EXPECT_EQ(r.num_cached_tokens, 0);
  EXPECT_FALSE(r.copy.has_value());
  EXPECT_TRUE(Path(r.seq).empty());
  const AppendResult out = Append(r.seq, prompt);
  EXPECT_TRUE(out.copies.empty());
  ASSERT_EQ(out.writes.size(), 10u);
  EXPECT_THAT(out.write_indptr, ElementsAre(0, 10));
  const std::vector<ChunkId> path = Path(r.seq);
  ASSERT_EQ(path.size(), 3u);  // 4 + 4 + 2
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(out.writes[i].slot, tree().ChunkSlot(path[i / 4])) << i;
    EXPECT_EQ(out.writes[i].offset, i % 4);
    EXPECT_EQ(out.writes[i].position, i);
  }
  EXPECT_EQ(Spell(r.seq), prompt);
}

TEST_F(PrefixTreeTest, IdenticalPromptReusesAllButTheRecomputedLastToken) {
  const std::vector<TokenId> prompt = Iota(0, 10);
  const SeqId a = AddSeq(prompt);
  const std::vector<ChunkId> pa = Path(a);
  ASSERT_OK_AND_ASSIGN(InsertResult b, tree().Insert(prompt, 9));
  EXPECT_EQ(b.num_cached_tokens, 9);
  // Chunks 0 and 1 are shared; the match ends inside chunk 2 (1 of its 2 tokens): copied.
  const std::vector<ChunkId> pb = Path(b.seq);
  ASSERT_EQ(pb.size(), 3u);
  EXPECT_EQ(pb[0], pa[0]);
  EXPECT_EQ(pb[1], pa[1]);
  EXPECT_NE(pb[2], pa[2]);
  ASSERT_TRUE(b.copy.has_value());
  EXPECT_EQ(*b.copy, (KvCopy{tree().ChunkSlot(pa[2]), tree().ChunkSlot(pb[2]), 1}));
  EXPECT_EQ(Ref(pa[0]), 2);
  EXPECT_EQ(Ref(pa[2]), 1);
  Append(b.seq, {9});
  EXPECT_EQ(Spell(b.seq), prompt);
  EXPECT_EQ(tree().Stats().insert_copies, 1u);
}

TEST_F(PrefixTreeTest, IdenticalPromptsCachedInFullShareTheirPartialTail) {
  const std::vector<TokenId> prompt = Iota(0, 10);
  const SeqId a = AddSeq(prompt);
  ASSERT_OK_AND_ASSIGN(InsertResult b, tree().Insert(prompt, 10));
  EXPECT_EQ(b.num_cached_tokens, 10);
  EXPECT_FALSE(b.copy.has_value());
  EXPECT_EQ(Path(b.seq), Path(a));
  EXPECT_EQ(Ref(Path(a)[2]), 2);
}

TEST_F(PrefixTreeTest, PromptThatIsAPrefixOfAnotherSharesWholeChunks) {
  const SeqId a = AddSeq(Iota(0, 12));
  ASSERT_OK_AND_ASSIGN(InsertResult b, tree().Insert(Iota(0, 8), 8));
  EXPECT_EQ(b.num_cached_tokens, 8);
  EXPECT_FALSE(b.copy.has_value());
  const std::vector<ChunkId> pa = Path(a);
  EXPECT_THAT(Path(b.seq), ElementsAre(pa[0], pa[1]));
}

TEST_F(PrefixTreeTest, PromptEndingInsideAChunkCopiesTheMatchedTokens) {
  const SeqId a = AddSeq(Iota(0, 12));
  ASSERT_OK_AND_ASSIGN(InsertResult b, tree().Insert(Iota(0, 6), 6));
  EXPECT_EQ(b.num_cached_tokens, 6);
  ASSERT_TRUE(b.copy.has_value());
  EXPECT_EQ(b.copy->num_tokens, 2);
  EXPECT_EQ(b.copy->src, tree().ChunkSlot(Path(a)[1]));
  EXPECT_EQ(Spell(b.seq), Iota(0, 6));
}

TEST_F(PrefixTreeTest, DivergenceInsideAChunkCopiesTheCommonPart) {
  AddSeq(Iota(0, 10));
  const std::vector<TokenId> other = Concat(Iota(0, 6), {100, 101, 102});
  EXPECT_EQ(tree().Match(other).num_tokens, 6);
  EXPECT_EQ(tree().Match(other).num_copied_tokens, 2);
  const SeqId b = AddSeq(other);
  EXPECT_EQ(Spell(b), other);
  // Divergence inside the first chunk: the copy hangs under the root.
  const std::vector<TokenId> third = {0, 1, 200, 201, 202};
  ASSERT_OK_AND_ASSIGN(InsertResult c, tree().Insert(third, 4));
  EXPECT_EQ(c.num_cached_tokens, 2);
  ASSERT_TRUE(c.copy.has_value());
  EXPECT_EQ(c.copy->num_tokens, 2);
  ASSERT_OK_AND_ASSIGN(ChunkInfo copy, tree().Chunk(Path(c.seq)[0]));
  EXPECT_FALSE(copy.parent.valid());
  EXPECT_EQ(copy.len, 2);
}

TEST_F(PrefixTreeTest, PromptOfExactlyKChunksSharesEveryChunk) {
  const SeqId a = AddSeq(Iota(0, 8));
  const std::vector<ChunkId> pa = Path(a);
  ASSERT_EQ(pa.size(), 2u);
  ASSERT_OK_AND_ASSIGN(ChunkInfo last, tree().Chunk(pa[1]));
  EXPECT_TRUE(last.full);
  // Cached in full: both chunks shared.
  ASSERT_OK_AND_ASSIGN(InsertResult full, tree().Insert(Iota(0, 8), 8));
  EXPECT_EQ(full.num_cached_tokens, 8);
  EXPECT_FALSE(full.copy.has_value());
  EXPECT_EQ(Path(full.seq), pa);
  // The engine's cap (size - 1) ends the match inside chunk 1: 3 tokens copied.
  ASSERT_OK_AND_ASSIGN(InsertResult capped, tree().Insert(Iota(0, 8), 7));
  EXPECT_EQ(capped.num_cached_tokens, 7);
  ASSERT_TRUE(capped.copy.has_value());
  EXPECT_EQ(capped.copy->num_tokens, 3);
  // Appending after a full chunk grows a new private chunk.
  const AppendResult out = Append(full.seq, {50});
  EXPECT_TRUE(out.copies.empty());
  EXPECT_EQ(Path(full.seq).size(), 3u);
  EXPECT_EQ(out.writes[0].offset, 0);
  EXPECT_EQ(out.writes[0].position, 8);
}

TEST_F(PrefixTreeTest, RetainedPartialTailIsAdoptedInPlace) {
  const SeqId a = AddSeq(Iota(0, 6));
  const ChunkId tail = Path(a)[1];
  ASSERT_OK(tree().Release(a));
  // A longer prompt covers the retained partial chunk exactly and continues past it.
  const std::vector<TokenId> longer = Iota(0, 12);
  ASSERT_OK_AND_ASSIGN(InsertResult b, tree().Insert(longer, 11));
  EXPECT_EQ(b.num_cached_tokens, 6);
  EXPECT_FALSE(b.copy.has_value());
  EXPECT_EQ(Path(b.seq)[1], tail);
  const AppendResult out = Append(b.seq, Iota(6, 6));
  EXPECT_TRUE(out.copies.empty());
  EXPECT_EQ(out.writes[0].slot, tree().ChunkSlot(tail));
  EXPECT_EQ(out.writes[0].offset, 2);
  EXPECT_EQ(Spell(b.seq), longer);
}

TEST_F(PrefixTreeTest, MatchIsReadOnly) {
  const SeqId a = AddSeq(Iota(0, 10));
  ASSERT_OK(tree().Release(a));
  const std::vector<ChunkId> before = tree().EvictionOrder();
  const KvCacheStats stats = tree().Stats();
  EXPECT_EQ(tree().Match(Iota(0, 10)).num_tokens, 10);
  EXPECT_EQ(tree().Match({}).num_tokens, 0);
  EXPECT_EQ(tree().EvictionOrder(), before);
  EXPECT_EQ(tree().Stats().retained_chunks, stats.retained_chunks);
}

TEST_F(PrefixTreeTest, MatchFindsLongestPrefixUnderDuplicateChunks) {
  // Two sequences with the same prompt generate the same chunk: two sibling copies of it. The
  // longest match continues under the second copy only.
  const std::vector<TokenId> prompt = Iota(0, 4);
  const SeqId a = AddSeqCaching(prompt, 0);
  const SeqId b = AddSeqCaching(prompt, 4);
  ASSERT_EQ(Path(b)[0], Path(a)[0]);
  // b's copy is filed last, so it is the first one a lookup meets; the match continues under a's.
  Append(a, {7, 8, 9, 10, 12, 13});
  Append(b, {7, 8, 9, 10, 11});
  ASSERT_NE(Path(a)[1], Path(b)[1]);
  ASSERT_OK_AND_ASSIGN(ChunkInfo dup, tree().Chunk(Path(a)[1]));
  EXPECT_EQ(tree().HashCopies(dup.hash), 2);
  const std::vector<TokenId> query = Concat(prompt, {7, 8, 9, 10, 12, 13, 99});
  EXPECT_EQ(tree().Match(query).num_tokens, 10);
  EXPECT_EQ(tree().Match(query).num_copied_tokens, 0);
  ASSERT_OK_AND_ASSIGN(InsertResult c, tree().Insert(query, 10));
  EXPECT_EQ(Path(c.seq), Path(a));
}

// ---- Append ----

TEST_F(PrefixTreeTest, AppendIsNotLockStep) {
  const SeqId a = AddSeq(Iota(0, 3));
  const SeqId b = AddSeq(Iota(10, 5));
  const SeqId c = AddSeq(Iota(20, 2));
  const std::vector<TokenId> ta = Iota(100, 6), tc = {7};
  const std::vector<SeqTokens> batch = {{c, tc}, {a, ta}, {b, {}}};
  AppendResult out;
  ASSERT_OK(tree().Append(batch, &out));
  EXPECT_THAT(out.write_indptr, ElementsAre(0, 1, 7, 7));
  EXPECT_EQ(out.writes[0].position, 2);
  EXPECT_EQ(out.writes[1].position, 3);
  EXPECT_EQ(Spell(a), Concat(Iota(0, 3), ta));
  EXPECT_EQ(Spell(b), Iota(10, 5));
  EXPECT_EQ(Spell(c), Concat(Iota(20, 2), tc));
}

TEST_F(PrefixTreeTest, AppendToSharedPartialTailCopiesOnWrite) {
  const SeqId a = AddSeq(Iota(0, 6));
  ASSERT_OK_AND_ASSIGN(std::vector<SeqId> forks, tree().Fork(a, 1));
  const ChunkId shared_tail = Path(a)[1];
  EXPECT_EQ(Ref(shared_tail), 2);
  const AppendResult out = Append(a, {50, 51});
  ASSERT_EQ(out.copies.size(), 1u);
  const ChunkId own_tail = Path(a)[1];
  EXPECT_NE(own_tail, shared_tail);
  EXPECT_EQ(out.copies[0], (KvCopy{tree().ChunkSlot(shared_tail), tree().ChunkSlot(own_tail), 2}));
  EXPECT_EQ(out.writes[0].slot, tree().ChunkSlot(own_tail));
  EXPECT_EQ(out.writes[0].offset, 2);
  EXPECT_EQ(Ref(shared_tail), 1);
  EXPECT_EQ(Spell(forks[0]), Iota(0, 6));
  EXPECT_EQ(Spell(a), Concat(Iota(0, 6), {50, 51}));
  EXPECT_EQ(tree().Stats().cow_copies, 1u);
}

TEST_F(PrefixTreeTest, LastSharerOfAPartialTailWritesInPlace) {
  const SeqId a = AddSeq(Iota(0, 6));
  ASSERT_OK_AND_ASSIGN(std::vector<SeqId> forks, tree().Fork(a, 2));
  const ChunkId tail = Path(a)[1];
  const std::vector<TokenId> x = {1}, y = {2}, z = {3};
  const std::vector<SeqTokens> batch = {{a, x}, {forks[0], y}, {forks[1], z}};
  ASSERT_OK_AND_ASSIGN(int32_t need, tree().AppendSlotsNeeded(batch));
  EXPECT_EQ(need, 2);
  AppendResult out;
  ASSERT_OK(tree().Append(batch, &out));
  EXPECT_EQ(out.copies.size(), 2u);
  EXPECT_EQ(Path(forks[1])[1], tail);  // the last one keeps the original chunk
  EXPECT_EQ(Ref(tail), 1);
  EXPECT_EQ(Spell(forks[0]), Concat(Iota(0, 6), y));
}

TEST_F(PrefixTreeTest, AppendOfUnknownOrDuplicateSequenceFailsAndChangesNothing) {
  const SeqId a = AddSeq(Iota(0, 3));
  const std::vector<TokenId> t = {1, 2};
  AppendResult out;
  const std::vector<SeqTokens> unknown = {{a, t}, {SeqId(12345), t}};
  EXPECT_THAT(tree().Append(unknown, &out), StatusIs(StatusCode::kNotFound));
  const std::vector<SeqTokens> twice = {{a, t}, {a, t}};
  EXPECT_THAT(tree().Append(twice, &out), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_EQ(Spell(a), Iota(0, 3));
  EXPECT_TRUE(out.writes.empty());
}

TEST_F(PrefixTreeTest, AppendThatCannotGetSlotsIsResourceExhaustedAndChangesNothing) {
  Reset(4, 3);
  const SeqId a = AddSeq(Iota(0, 4));
  const SeqId b = AddSeq(Iota(10, 4));
  const SeqId c = AddSeq(Iota(20, 2));
  ASSERT_OK(tree().Release(c));  // 1 retained chunk, 0 free
  const KvCacheStats before = tree().Stats();
  const std::vector<ChunkId> order = tree().EvictionOrder();
  const std::vector<TokenId> t = {1};
  const std::vector<SeqTokens> batch = {{a, t}, {b, t}};  // 2 new chunks, 1 available
  AppendResult out;
  EXPECT_THAT(tree().Append(batch, &out),
              StatusIs(StatusCode::kResourceExhausted, HasSubstr("needs 2")));
  EXPECT_TRUE(out.writes.empty());
  EXPECT_EQ(tree().EvictionOrder(), order);
  EXPECT_EQ(tree().Stats().used_slots, before.used_slots);
  EXPECT_EQ(tree().Stats().evictions, 0u);
  EXPECT_EQ(Spell(a), Iota(0, 4));
  EXPECT_EQ(Spell(b), Iota(10, 4));
  // One of them fits, by evicting the retained chunk.
  const std::vector<SeqTokens> one = {{a, t}};
  ASSERT_OK(tree().Append(one, &out));
  EXPECT_EQ(tree().Stats().evictions, 1u);
}

// ---- Fork ----

TEST_F(PrefixTreeTest, ForkSharesTheWholeHistory) {
  const SeqId a = AddSeq(Iota(0, 10));
  ASSERT_OK_AND_ASSIGN(std::vector<SeqId> forks, tree().Fork(a, 3));
  ASSERT_EQ(forks.size(), 3u);
  for (const SeqId f : forks) {
    EXPECT_NE(f, a);
    EXPECT_EQ(Path(f), Path(a));
  }
  for (const ChunkId c : Path(a)) EXPECT_EQ(Ref(c), 4);
  EXPECT_EQ(tree().Stats().unshared_chunks, 12);
  EXPECT_EQ(tree().Stats().referenced_chunks, 3);
}

TEST_F(PrefixTreeTest, ForkThenDivergeSharesThePrefixOnly) {
  const SeqId a = AddSeq(Iota(0, 6));
  ASSERT_OK_AND_ASSIGN(std::vector<SeqId> forks, tree().Fork(a, 1));
  const SeqId b = forks[0];
  Append(a, {1, 2, 3});
  Append(b, {4, 5, 6});
  EXPECT_EQ(Spell(a), Concat(Iota(0, 6), {1, 2, 3}));
  EXPECT_EQ(Spell(b), Concat(Iota(0, 6), {4, 5, 6}));
  EXPECT_EQ(Path(a)[0], Path(b)[0]);
  EXPECT_NE(Path(a)[1], Path(b)[1]);
  EXPECT_EQ(Ref(Path(a)[0]), 2);
  EXPECT_EQ(tree().Stats().cow_copies, 1u);  // only the first writer copied
}

TEST_F(PrefixTreeTest, ForkRejectsUnknownSequenceAndNegativeCount) {
  const SeqId a = AddSeq(Iota(0, 3));
  EXPECT_THAT(tree().Fork(SeqId(999), 1), StatusIs(StatusCode::kNotFound));
  EXPECT_THAT(tree().Fork(a, -1), StatusIs(StatusCode::kInvalidArgument));
  ASSERT_OK_AND_ASSIGN(std::vector<SeqId> none, tree().Fork(a, 0));
  EXPECT_TRUE(none.empty());
}

// ---- Release, retention and eviction ----

TEST_F(PrefixTreeTest, ReleaseOfLastSequenceMakesLeafEvictable) {
  const SeqId a = AddSeq(Iota(0, 6));
  ASSERT_OK_AND_ASSIGN(std::vector<SeqId> forks, tree().Fork(a, 1));
  ASSERT_OK(tree().Release(a));
  EXPECT_TRUE(tree().EvictionOrder().empty());  // still used by the fork
  const std::vector<ChunkId> path = Path(forks[0]);
  ASSERT_OK(tree().Release(forks[0]));
  // Leaf first, then its parent.
  EXPECT_EQ(tree().EvictionOrder(), (std::vector<ChunkId>{path[1], path[0]}));
  EXPECT_EQ(tree().Stats().retained_chunks, 2);
  EXPECT_EQ(tree().Stats().referenced_chunks, 0);
}

TEST_F(PrefixTreeTest, ReleaseOrderIsEvictionOrder) {
  const SeqId a = AddSeq(Iota(0, 4));
  const SeqId b = AddSeq(Iota(10, 4));
  const SeqId c = AddSeq(Iota(20, 4));
  const ChunkId ca = Path(a)[0], cb = Path(b)[0], cc = Path(c)[0];
  ASSERT_OK(tree().Release(b));
  ASSERT_OK(tree().Release(c));
  ASSERT_OK(tree().Release(a));
  EXPECT_EQ(tree().EvictionOrder(), (std::vector<ChunkId>{cb, cc, ca}));
}

TEST_F(PrefixTreeTest, ReleaseOfUnknownOrStaleSequenceIsNotFound) {
  const SeqId a = AddSeq(Iota(0, 3));
  ASSERT_OK(tree().Release(a));
  EXPECT_THAT(tree().Release(a), StatusIs(StatusCode::kNotFound));
  EXPECT_THAT(tree().Release(SeqId()), StatusIs(StatusCode::kNotFound));
  // The index is reused with a new generation; the old handle stays dead.
  const SeqId b = AddSeq(Iota(0, 3));
  EXPECT_NE(b, a);
  EXPECT_THAT(tree().Seq(a), StatusIs(StatusCode::kNotFound));
  EXPECT_OK(tree().Seq(b).status());
}

TEST_F(PrefixTreeTest, ReusedRetainedChunksLeaveTheEvictionOrder) {
  const SeqId a = AddSeq(Iota(0, 10));
  const std::vector<ChunkId> pa = Path(a);
  ASSERT_OK(tree().Release(a));
  EXPECT_EQ(tree().EvictionOrder().size(), 3u);
  ASSERT_OK_AND_ASSIGN(InsertResult b, tree().Insert(Iota(0, 8), 8));
  EXPECT_EQ(Path(b.seq), (std::vector<ChunkId>{pa[0], pa[1]}));
  EXPECT_EQ(tree().EvictionOrder(), (std::vector<ChunkId>{pa[2]}));
  EXPECT_EQ(tree().Stats().cached_tokens, 8u);
}

TEST_F(PrefixTreeTest, EvictionTakesLeastRecentlyReleasedLeafFirstAndCascades) {
  Reset(4, 4);
  const SeqId a = AddSeq(Iota(0, 6));   // chunks a0 a1
  const SeqId b = AddSeq(Iota(10, 4));  // chunk b0
  const ChunkId a0 = Path(a)[0], a1 = Path(a)[1], b0 = Path(b)[0];
  ASSERT_OK(tree().Release(a));
  ASSERT_OK(tree().Release(b));
  EXPECT_EQ(tree().EvictionOrder(), (std::vector<ChunkId>{a1, a0, b0}));
  // One free slot; two more chunks needed: a1 goes, then a0 (now a leaf), b0 stays.
  const SeqId c = AddSeq(Iota(20, 12));
  EXPECT_EQ(tree().Stats().evictions, 2u);
  EXPECT_EQ(tree().EvictionOrder(), (std::vector<ChunkId>{b0}));
  EXPECT_EQ(tree().Match(Iota(0, 6)).num_tokens, 0);
  EXPECT_EQ(tree().Match(Iota(10, 4)).num_tokens, 4);
  EXPECT_EQ(Spell(c), Iota(20, 12));
}

TEST_F(PrefixTreeTest, EvictionNeverTakesReferencedChunks) {
  Reset(4, 2);
  const SeqId a = AddSeq(Iota(0, 8));
  const std::vector<TokenId> t = {1};
  const std::vector<SeqTokens> batch = {{a, t}};
  AppendResult out;
  EXPECT_THAT(tree().Append(batch, &out), StatusIs(StatusCode::kResourceExhausted));
  EXPECT_EQ(Spell(a), Iota(0, 8));
}

TEST_F(PrefixTreeTest, InsertCopyCannotEvictItsOwnSourceOrPath) {
  Reset(4, 2);
  const SeqId a = AddSeq(Iota(0, 8));
  ASSERT_OK(tree().Release(a));  // both chunks retained, no free slot
  // The match ends inside chunk 1, which is the copy source; chunk 0 is on the path.
  const KvCacheStats before = tree().Stats();
  EXPECT_THAT(tree().Insert(Iota(0, 8), 7), StatusIs(StatusCode::kResourceExhausted));
  EXPECT_EQ(tree().num_live_seqs(), 0);
  EXPECT_EQ(tree().Stats().retained_chunks, before.retained_chunks);
  EXPECT_EQ(tree().Stats().evictions, 0u);
  // Without the copy it fits: the two chunks are shared in place.
  ASSERT_OK_AND_ASSIGN(InsertResult b, tree().Insert(Iota(0, 8), 8));
  EXPECT_EQ(b.num_cached_tokens, 8);
}

TEST_F(PrefixTreeTest, InsertCopyEvictsOtherRetainedChunks) {
  Reset(4, 3);
  const SeqId other = AddSeq(Iota(50, 4));
  const SeqId a = AddSeq(Iota(0, 8));
  ASSERT_OK(tree().Release(other));
  ASSERT_OK(tree().Release(a));
  ASSERT_OK_AND_ASSIGN(InsertResult b, tree().Insert(Iota(0, 8), 7));
  ASSERT_TRUE(b.copy.has_value());
  EXPECT_EQ(tree().Stats().evictions, 1u);
  EXPECT_EQ(tree().Match(Iota(50, 4)).num_tokens, 0);
}

// ---- Scale ----

TEST_F(PrefixTreeTest, FiveHundredTwelveSequencesShareOneChunk) {
  Reset(4, 2048);
  const std::vector<TokenId> prompt = Iota(0, 4);
  const SeqId owner = AddSeqCaching(prompt, 0);
  const ChunkId chunk = Path(owner)[0];
  std::vector<SeqId> seqs;
  for (int i = 0; i < 600; ++i) {
    ASSERT_OK_AND_ASSIGN(InsertResult r, tree().Insert(prompt, 4));
    ASSERT_EQ(r.num_cached_tokens, 4);
    seqs.push_back(r.seq);
  }
  EXPECT_EQ(Ref(chunk), 601);
  // Each decodes its own private tail.
  std::vector<std::vector<TokenId>> tokens(seqs.size());
  std::vector<SeqTokens> batch;
  for (size_t i = 0; i < seqs.size(); ++i) {
    tokens[i] = {static_cast<TokenId>(i)};
    batch.push_back({seqs[i], tokens[i]});
  }
  AppendResult out;
  ASSERT_OK(tree().Append(batch, &out));
  const KvCacheStats s = tree().Stats();
  EXPECT_EQ(s.used_slots, 601);
  EXPECT_EQ(s.unshared_chunks, 1 + 600 * 2);
  EXPECT_NEAR(s.sharing_ratio, 1201.0 / 601.0, 1e-9);
  std::vector<SeqId> order;
  ASSERT_OK(tree().DfsOrder(seqs, &order));
  EXPECT_EQ(order.size(), seqs.size());
  for (const SeqId seq : seqs) ASSERT_OK(tree().Release(seq));
  EXPECT_EQ(Ref(chunk), 1);
}

// ---- KV events ----

TEST_F(PrefixTreeTest, ObserverSeesChainedHashWhenAChunkFills) {
  RecordingObserver obs;
  tree().SetObserver(&obs);
  const SeqId a = AddSeqCaching(Iota(0, 3), 0);
  EXPECT_TRUE(obs.stored.empty());  // partial chunks carry no hash
  Append(a, Iota(3, 6));            // fills chunk 0 and chunk 1
  ASSERT_OK_AND_ASSIGN(std::vector<uint64_t> expected,
                       FullChunkHashes(tree().hash_seed(), 4, Iota(0, 9)));
  ASSERT_EQ(obs.stored.size(), 2u);
  EXPECT_EQ(obs.stored[0], (StoredChunkHash{expected[0], tree().hash_seed()}));
  EXPECT_EQ(obs.stored[1], (StoredChunkHash{expected[1], expected[0]}));
  std::vector<StoredChunkHash> snapshot = tree().StoredHashes();
  std::sort(snapshot.begin(), snapshot.end(),
            [](const StoredChunkHash& x, const StoredChunkHash& y) { return x.hash < y.hash; });
  std::vector<StoredChunkHash> want = obs.stored;
  std::sort(want.begin(), want.end(),
            [](const StoredChunkHash& x, const StoredChunkHash& y) { return x.hash < y.hash; });
  EXPECT_EQ(snapshot, want);
}

TEST_F(PrefixTreeTest, ObserverSeesEvictionOnlyWhenTheLastCopyOfAHashLeaves) {
  Reset(4, 3);
  RecordingObserver obs;
  tree().SetObserver(&obs);
  // Two copies of the same full chunk (each sequence generated it independently).
  const SeqId a = AddSeqCaching(Iota(0, 4), 0);
  const SeqId b = AddSeqCaching(Iota(0, 4), 0);
  ASSERT_NE(Path(a)[0], Path(b)[0]);
  ASSERT_EQ(obs.stored.size(), 1u);
  const uint64_t h = obs.stored[0].hash;
  EXPECT_EQ(tree().HashCopies(h), 2);
  ASSERT_OK(tree().Release(a));
  ASSERT_OK(tree().Release(b));
  // Evict one copy: no event. Evict the other: evicted.
  AddSeq(Iota(100, 9));  // needs 3 chunks: 1 free, 2 evicted
  EXPECT_EQ(tree().Stats().evictions, 2u);
  EXPECT_EQ(tree().HashCopies(h), 0);
  EXPECT_EQ(obs.evicted, std::vector<uint64_t>{h});
  EXPECT_TRUE(tree().StoredHashes().size() == 2u);  // the new sequence's two full chunks
}

// ---- Accounting ----

TEST_F(PrefixTreeTest, StatsCountSharedChunksOnce) {
  Reset(4, 16, /*slot_bytes=*/1000);
  const SeqId a = AddSeq(Iota(0, 10));           // 3 chunks
  const SeqId b = AddSeqCaching(Iota(0, 8), 8);  // shares 2
  const SeqId c = AddSeq(Iota(50, 3));           // 1 chunk
  ASSERT_OK(tree().Release(c));
  const KvCacheStats s = tree().Stats();
  EXPECT_EQ(s.num_slots, 16);
  EXPECT_EQ(s.used_slots, 4);
  EXPECT_EQ(s.free_slots, 12);
  EXPECT_EQ(s.referenced_chunks, 3);
  EXPECT_EQ(s.retained_chunks, 1);
  EXPECT_EQ(s.shared_chunks, 2);
  EXPECT_EQ(s.live_seqs, 2);
  EXPECT_EQ(s.live_tokens, 18);
  EXPECT_EQ(s.unshared_chunks, 5);
  EXPECT_EQ(s.bytes_used, 4000u);
  EXPECT_EQ(s.bytes_referenced, 3000u);
  EXPECT_EQ(s.bytes_if_unshared, 5000u);
  EXPECT_NEAR(s.sharing_ratio, 5.0 / 3.0, 1e-12);
  EXPECT_EQ(tree().available_slots(), 13);
  ASSERT_OK(tree().Release(b));
  EXPECT_EQ(tree().Stats().shared_chunks, 0);
  (void)a;
}

// ---- Batches ----

TEST_F(PrefixTreeTest, DfsOrderMakesSharedChunksContiguous) {
  Reset(4, 64);
  const SeqId a1 = AddSeq(Concat(Iota(0, 8), {1}));
  const SeqId b1 = AddSeq(Concat(Iota(100, 4), {1}));
  const SeqId a2 = AddSeq(Concat(Iota(0, 8), {2}));
  const SeqId b2 = AddSeq(Concat(Iota(100, 4), {2}));
  const SeqId a3 = AddSeq(Concat(Iota(0, 4), {3}));
  const SeqId lone = AddSeq(Iota(200, 5));
  const std::vector<SeqId> batch = {a1, b1, lone, a2, b2, a3};
  std::vector<SeqId> order;
  std::vector<BatchGroup> groups;
  ASSERT_OK(tree().GroupBatch(batch, &order, &groups));
  ASSERT_EQ(order.size(), batch.size());
  EXPECT_EQ(std::set<SeqId>(order.begin(), order.end()),
            std::set<SeqId>(batch.begin(), batch.end()));
  // Groups: a-chunk0 {a1,a2,a3}, a-chunk1 {a1,a2}, b-chunk0 {b1,b2}.
  ASSERT_EQ(groups.size(), 3u);
  for (const BatchGroup& g : groups) {
    EXPECT_GE(g.end - g.begin, 2);
    for (int32_t r = 0; r < static_cast<int32_t>(order.size()); ++r) {
      const std::vector<ChunkId> p = Path(order[r]);
      const bool uses = std::find(p.begin(), p.end(), g.chunk) != p.end();
      EXPECT_EQ(uses, r >= g.begin && r < g.end) << "row " << r;
      if (uses) {
        EXPECT_EQ(p[g.depth], g.chunk);
      }
    }
  }
  // Pre-order: by begin, then depth.
  for (size_t i = 1; i < groups.size(); ++i) {
    EXPECT_TRUE(groups[i - 1].begin < groups[i].begin ||
                (groups[i - 1].begin == groups[i].begin && groups[i - 1].depth < groups[i].depth));
  }
}

TEST_F(PrefixTreeTest, GroupBatchRejectsUnknownAndDuplicateSequences) {
  const SeqId a = AddSeq(Iota(0, 3));
  std::vector<SeqId> order;
  const std::vector<SeqId> unknown = {a, SeqId(777)};
  EXPECT_THAT(tree().DfsOrder(unknown, &order), StatusIs(StatusCode::kNotFound));
  const std::vector<SeqId> twice = {a, a};
  EXPECT_THAT(tree().DfsOrder(twice, &order), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_TRUE(order.empty());
  ASSERT_OK(tree().DfsOrder({}, &order));
  EXPECT_TRUE(order.empty());
}

}  // namespace
}  // namespace chunkserve::kv

// ---- Hash collisions (through the test seam) ----

namespace chunkserve::kv {
namespace {

// A chain hash that collides on purpose: chunks whose first tokens have the same parity get the
// same hash under the same parent.
uint64_t ParityHash(uint64_t prev, std::span<const TokenId> tokens) {
  return prev * 31 + static_cast<uint64_t>(tokens[0] & 1) + 1;
}

class CollidingPrefixTreeTest : public PrefixTreeTest {
 protected:
  void SetUp() override {
    Result<PrefixTree> t = PrefixTree::Create(
        {.chunk_size = 4, .num_slots = 16, .slot_bytes = 1000, .chunk_hash = &ParityHash});
    ASSERT_OK(t.status());
    tree_.emplace(std::move(*t));
  }
};

TEST_F(CollidingPrefixTreeTest, ACollidingChunkIsNeverShared) {
  const std::vector<TokenId> a = {2, 5, 6, 7, 9};
  const SeqId sa = AddSeq(a);
  // Same hash as a's first chunk (first token even), other tokens: must not alias a's K/V.
  const std::vector<TokenId> b = {4, 8, 8, 8, 1};
  EXPECT_EQ(tree().Match(b).num_tokens, 0);
  const SeqId sb = AddSeq(b);
  EXPECT_EQ(Spell(sb), b);
  EXPECT_NE(Path(sb)[0], Path(sa)[0]);
  EXPECT_EQ(tree().HashCopies(ParityHash(tree().hash_seed(), std::vector<TokenId>{2})), 2);
  // A true match still shares, whichever colliding copy the index lists first.
  const std::vector<TokenId> c = {2, 5, 6, 7, 3};
  EXPECT_EQ(tree().Match(c).num_tokens, 4);
  const SeqId sc = AddSeq(c);
  EXPECT_EQ(Path(sc)[0], Path(sa)[0]);
  const std::vector<TokenId> d = {4, 8, 8, 8, 0};
  EXPECT_EQ(tree().Match(d).num_tokens, 4);
  const SeqId sd = AddSeq(d);
  EXPECT_EQ(Path(sd)[0], Path(sb)[0]);
  EXPECT_EQ(Spell(sd), d);
}

// Deeper: the second chunk collides under a first chunk that truly matches.
TEST_F(CollidingPrefixTreeTest, ACollisionBelowATrueMatchBacksOffOneChunk) {
  const std::vector<TokenId> a = {1, 1, 1, 1, 2, 2, 2, 2, 9};
  AddSeq(a);
  const std::vector<TokenId> b = {1, 1, 1, 1, 4, 6, 8, 0, 9};  // chunk 2 collides with a's
  EXPECT_EQ(tree().Match(b).num_tokens, 4);
  const SeqId sb = AddSeq(b);
  EXPECT_EQ(Spell(sb), b);
}

}  // namespace
}  // namespace chunkserve::kv
