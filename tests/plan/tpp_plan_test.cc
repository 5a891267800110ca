#include "runtime/plan/tpp_plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <numeric>
#include <optional>
#include <vector>

#include "tests/testing/plan_check.h"
#include "tests/testing/status_matchers.h"

namespace chunkserve::plan {
namespace {

using ::chunkserve::plan::testing::Canonical;
using ::chunkserve::plan::testing::PlanIsValid;
using ::chunkserve::testing::StatusIs;
using ::testing::ElementsAre;
using UpdateKind = TppPlan::UpdateKind;

std::vector<TokenId> Iota(TokenId first, int n) {
  std::vector<TokenId> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), first);
  return v;
}

std::vector<TokenId> Concat(std::vector<TokenId> a, const std::vector<TokenId>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// chunk_size 4; sequences are added the way the engine does (insert, then prefill by Append).
class TppPlanTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Result<kv::PrefixTree> t = kv::PrefixTree::Create({.chunk_size = 4, .num_slots = 64});
    ASSERT_OK(t.status());
    tree_.emplace(std::move(*t));
  }
  kv::PrefixTree& tree() { return *tree_; }

  SeqId Add(const std::vector<TokenId>& prompt) {
    Result<kv::InsertResult> r = tree().Insert(prompt, static_cast<int32_t>(prompt.size()) - 1);
    EXPECT_OK(r.status());
    Append(r->seq, std::vector<TokenId>(prompt.begin() + r->num_cached_tokens, prompt.end()));
    return r->seq;
  }
  void Append(SeqId seq, const std::vector<TokenId>& tokens) {
    kv::AppendResult out;
    const kv::SeqTokens req{seq, tokens};
    EXPECT_OK(tree().Append(std::span<const kv::SeqTokens>(&req, 1), &out));
  }
  std::vector<ChunkId> Path(SeqId seq) {
    const kv::SeqInfo info = *tree().Seq(seq);
    return std::vector<ChunkId>(info.path.begin(), info.path.end());
  }
  // Update must give what a fresh Build gives.
  void ExpectUpdateMatchesRebuild(TppPlan& plan, const std::vector<SeqId>& batch) {
    EXPECT_TRUE(PlanIsValid(tree(), plan, batch));
    TppPlan rebuilt;
    ASSERT_OK(rebuilt.Build(tree(), batch));
    EXPECT_EQ(Canonical(plan), Canonical(rebuilt));
  }

  std::optional<kv::PrefixTree> tree_;
};

TEST_F(TppPlanTest, EmptyBatchGivesAnEmptyPlan) {
  TppPlan plan;
  ASSERT_OK(plan.Build(tree(), {}));
  const kernels::TppPlanView v = plan.view();
  EXPECT_EQ(v.num_seqs, 0);
  EXPECT_EQ(v.num_shared, 0);
  EXPECT_EQ(v.num_partial_rows, 0);
  EXPECT_EQ(v.seq_shared_indptr[0], 0);
  EXPECT_EQ(v.private_indptr[0], 0);
}

TEST_F(TppPlanTest, ChunksSharedWithinTheBatchGetOneRangeEach) {
  // a and b share chunks 0 and 1, c shares chunk 0 only.
  const std::vector<TokenId> system = Iota(0, 8);
  const SeqId a = Add(Concat(system, {1, 1}));
  const SeqId c = Add(Concat(Iota(0, 4), {3, 3, 3}));
  const SeqId b = Add(Concat(system, {2}));
  const std::vector<ChunkId> pa = Path(a);
  TppPlan plan;
  const std::vector<SeqId> batch = {a, c, b};
  ASSERT_OK(plan.Build(tree(), batch));
  ASSERT_TRUE(PlanIsValid(tree(), plan, batch));
  EXPECT_EQ(plan.last_update(), UpdateKind::kRebuild);
  // DFS order keeps a and b (chunk 1's users) together inside chunk 0's range.
  EXPECT_THAT(plan.rows(), ElementsAre(a, b, c));
  const kernels::TppPlanView v = plan.view();
  ASSERT_EQ(v.num_shared, 2);
  EXPECT_EQ(plan.shared_chunks()[0], pa[0]);
  EXPECT_EQ(plan.shared_chunks()[1], pa[1]);
  EXPECT_EQ(v.shared_seq_begin[0], 0);
  EXPECT_EQ(v.shared_seq_end[0], 3);
  EXPECT_EQ(v.shared_seq_begin[1], 0);
  EXPECT_EQ(v.shared_seq_end[1], 2);
  EXPECT_EQ(v.shared_partial_offset[0], 0);
  EXPECT_EQ(v.shared_partial_offset[1], 3);
  EXPECT_EQ(v.num_partial_rows, 5);
  EXPECT_EQ(v.shared_len[0], 4);
  // Rows: a = [0, 1] + private tail of 2; b = [0, 1] + tail of 1; c = [0] + tail of 3.
  EXPECT_THAT(std::vector<int32_t>(v.seq_shared_indptr, v.seq_shared_indptr + 4),
              ElementsAre(0, 2, 4, 5));
  EXPECT_THAT(std::vector<int32_t>(v.private_indptr, v.private_indptr + 4),
              ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(std::vector<int32_t>(v.private_len, v.private_len + 3), ElementsAre(2, 1, 3));
}

TEST_F(TppPlanTest, ChunkSharedOnlyOutsideTheBatchIsPrivateInIt) {
  const SeqId a = Add(Concat(Iota(0, 8), {1}));
  const SeqId b = Add(Concat(Iota(0, 8), {2}));  // shares a's two chunks, not in the batch
  const SeqId c = Add(Iota(50, 5));
  TppPlan plan;
  const std::vector<SeqId> batch = {a, c};
  ASSERT_OK(plan.Build(tree(), batch));
  ASSERT_TRUE(PlanIsValid(tree(), plan, batch));
  EXPECT_EQ(plan.num_shared(), 0);
  EXPECT_EQ(plan.num_private(), 3 + 2);
  // With b in the batch the two chunks become shared.
  const std::vector<SeqId> with_b = {a, b, c};
  ASSERT_OK(plan.Build(tree(), with_b));
  ASSERT_TRUE(PlanIsValid(tree(), plan, with_b));
  EXPECT_EQ(plan.num_shared(), 2);
}

TEST_F(TppPlanTest, IdenticalPathsShareTheirPartialTail) {
  const SeqId a = Add(Iota(0, 6));
  Result<std::vector<SeqId>> forks = tree().Fork(a, 2);
  ASSERT_OK(forks.status());
  const std::vector<SeqId> batch = {(*forks)[0], a, (*forks)[1]};
  TppPlan plan;
  ASSERT_OK(plan.Build(tree(), batch));
  ASSERT_TRUE(PlanIsValid(tree(), plan, batch));
  EXPECT_EQ(plan.num_shared(), 2);
  EXPECT_EQ(plan.num_private(), 0);
  EXPECT_EQ(plan.view().shared_len[1], 2);
  EXPECT_EQ(plan.num_partial_rows(), 6);
}

TEST_F(TppPlanTest, UpdateAfterInPlaceAppendOnlyMovesLengths) {
  const SeqId a = Add(Concat(Iota(0, 4), {1}));
  const SeqId b = Add(Concat(Iota(0, 4), {2}));
  const std::vector<SeqId> batch = {a, b};
  TppPlan plan;
  ASSERT_OK(plan.Update(tree(), batch));
  EXPECT_EQ(plan.last_update(), UpdateKind::kRebuild);
  Append(a, {5});
  Append(b, {6, 7});
  ASSERT_OK(plan.Update(tree(), batch));
  EXPECT_EQ(plan.last_update(), UpdateKind::kLengths);
  ExpectUpdateMatchesRebuild(plan, batch);
  // The same set in another order is recognised too.
  const std::vector<SeqId> reversed = {b, a};
  Append(a, {8});
  ASSERT_OK(plan.Update(tree(), reversed));
  EXPECT_EQ(plan.last_update(), UpdateKind::kLengths);
  ExpectUpdateMatchesRebuild(plan, reversed);
}

TEST_F(TppPlanTest, UpdateAfterATailGrowsANewChunkRewritesPrivateLists) {
  const SeqId a = Add(Concat(Iota(0, 4), {1, 1, 1}));
  const SeqId b = Add(Concat(Iota(0, 4), {2}));
  const std::vector<SeqId> batch = {a, b};
  TppPlan plan;
  ASSERT_OK(plan.Update(tree(), batch));
  Append(a, {1, 9});  // fills a's tail and starts a new chunk
  ASSERT_OK(plan.Update(tree(), batch));
  EXPECT_EQ(plan.last_update(), UpdateKind::kPrivateLists);
  ExpectUpdateMatchesRebuild(plan, batch);
}

TEST_F(TppPlanTest, UpdateAfterCopyOnWriteRebuilds) {
  const SeqId a = Add(Iota(0, 6));
  Result<std::vector<SeqId>> forks = tree().Fork(a, 1);
  ASSERT_OK(forks.status());
  const std::vector<SeqId> batch = {a, (*forks)[0]};
  TppPlan plan;
  ASSERT_OK(plan.Update(tree(), batch));
  EXPECT_EQ(plan.num_shared(), 2);
  Append(a, {7});  // copies the shared partial tail
  ASSERT_OK(plan.Update(tree(), batch));
  EXPECT_EQ(plan.last_update(), UpdateKind::kRebuild);
  EXPECT_EQ(plan.num_shared(), 1);
  ExpectUpdateMatchesRebuild(plan, batch);
}

TEST_F(TppPlanTest, UpdateWithADifferentBatchRebuilds) {
  const SeqId a = Add(Iota(0, 5));
  const SeqId b = Add(Iota(0, 6));
  TppPlan plan;
  const std::vector<SeqId> first = {a};
  ASSERT_OK(plan.Update(tree(), first));
  const std::vector<SeqId> second = {a, b};
  ASSERT_OK(plan.Update(tree(), second));
  EXPECT_EQ(plan.last_update(), UpdateKind::kRebuild);
  ExpectUpdateMatchesRebuild(plan, second);
}

TEST_F(TppPlanTest, ReleasedSequenceInTheBatchIsNotFoundAndEmptiesThePlan) {
  const SeqId a = Add(Iota(0, 5));
  const SeqId b = Add(Iota(0, 6));
  TppPlan plan;
  const std::vector<SeqId> batch = {a, b};
  ASSERT_OK(plan.Update(tree(), batch));
  ASSERT_OK(tree().Release(b));
  EXPECT_THAT(plan.Update(tree(), batch), StatusIs(StatusCode::kNotFound));
  EXPECT_EQ(plan.num_seqs(), 0);
  EXPECT_EQ(plan.view().num_seqs, 0);
}

TEST_F(TppPlanTest, DuplicateSequenceIsInvalidArgument) {
  const SeqId a = Add(Iota(0, 5));
  TppPlan plan;
  const std::vector<SeqId> batch = {a, a};
  EXPECT_THAT(plan.Build(tree(), batch), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_EQ(plan.num_seqs(), 0);
}

}  // namespace
}  // namespace chunkserve::plan
