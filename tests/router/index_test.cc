// PrefixIndex: KV event semantics (snapshot, increments, eviction, gaps, generations), the
// decision record, depth limit and byte budget, plus a randomized churn test against a naive
// reference model (held sets per worker, no budget).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <vector>

#include "router/routing.h"
#include "tests/testing/random.h"
#include "tests/testing/status_matchers.h"

namespace chunkserve::router {
namespace {

using std::chrono::milliseconds;

constexpr uint64_t kSeed = 0xabcdef;  // chain seed used as the first chunk's parent

// A synthetic chain: distinct made-up hashes (the index never recomputes hashes).
std::vector<uint64_t> Chain(uint64_t tag, int n) {
  std::vector<uint64_t> c;
  for (int i = 0; i < n; ++i) c.push_back((tag << 20) + static_cast<uint64_t>(i) + 1);
  return c;
}

std::vector<kv::StoredChunkHash> Stored(const std::vector<uint64_t>& chain, int from, int to) {
  std::vector<kv::StoredChunkHash> s;
  for (int i = from; i < to; ++i) {
    s.push_back(
        {chain[static_cast<size_t>(i)], i == 0 ? kSeed : chain[static_cast<size_t>(i - 1)]});
  }
  return s;
}

KvEventBatch Snapshot(uint64_t generation, uint64_t sequence,
                      std::vector<kv::StoredChunkHash> stored) {
  KvEventBatch b;
  b.generation = generation;
  b.sequence = sequence;
  b.snapshot = true;
  b.stored = std::move(stored);
  return b;
}

KvEventBatch Increment(uint64_t generation, uint64_t sequence,
                       std::vector<kv::StoredChunkHash> stored, std::vector<uint64_t> evicted) {
  KvEventBatch b;
  b.generation = generation;
  b.sequence = sequence;
  b.stored = std::move(stored);
  b.evicted = std::move(evicted);
  return b;
}

class PrefixIndexTest : public ::testing::Test {
 protected:
  void SetUp() override { index_ = Make(PrefixIndexOptions{}); }

  static std::unique_ptr<PrefixIndex> Make(const PrefixIndexOptions& o) {
    auto index = PrefixIndex::Create(o);
    EXPECT_OK(index.status());
    if (!index.ok()) return nullptr;
    const uint64_t seeds[] = {kSeed};
    (*index)->SetChainSeeds(seeds);
    return std::move(index).value();
  }

  // matched chunks per worker id, for compact assertions.
  std::map<uint32_t, int32_t> Match(const std::vector<uint64_t>& chain, int64_t now_ms = 0) {
    std::map<uint32_t, int32_t> m;
    for (const WorkerMatch& w : index_->LongestMatch(chain, milliseconds(now_ms))) {
      m[w.worker.value()] = w.matched_chunks;
    }
    return m;
  }

  void Apply(uint32_t worker, const KvEventBatch& b, KvApplyOutcome expected) {
    ASSERT_OK_AND_ASSIGN(KvApplyOutcome out, index_->ApplyKvEvents(WorkerId(worker), b));
    EXPECT_EQ(out, expected) << KvApplyOutcomeName(out);
  }

  std::unique_ptr<PrefixIndex> index_;
};

TEST_F(PrefixIndexTest, SnapshotThenLongestMatchPerWorker) {
  const auto a = Chain(1, 6);
  Apply(0, Snapshot(1, 10, Stored(a, 0, 6)), KvApplyOutcome::kApplied);
  Apply(1, Snapshot(1, 3, Stored(a, 0, 2)), KvApplyOutcome::kApplied);
  EXPECT_EQ(Match(a), (std::map<uint32_t, int32_t>{{0, 6}, {1, 2}}));
  // A query that diverges after 3 chunks.
  auto q = a;
  q[3] = 999;
  EXPECT_EQ(Match(q), (std::map<uint32_t, int32_t>{{0, 3}, {1, 2}}));
  EXPECT_TRUE(Match(Chain(2, 3)).empty());
  const PrefixIndexStats s = index_->Stats();
  EXPECT_EQ(s.chunk_nodes, 6u);
  EXPECT_EQ(s.holder_entries, 8u);
  EXPECT_EQ(s.usable_workers, 2u);
  EXPECT_GT(s.bytes_used, 0u);
}

TEST_F(PrefixIndexTest, SnapshotInAnyOrderResolvesDepths) {
  const auto a = Chain(1, 5);
  auto stored = Stored(a, 0, 5);
  std::reverse(stored.begin(), stored.end());  // children before parents
  Apply(0, Snapshot(1, 5, stored), KvApplyOutcome::kApplied);
  EXPECT_EQ(Match(a), (std::map<uint32_t, int32_t>{{0, 5}}));
  EXPECT_EQ(index_->Stats().orphaned, 0u);
}

TEST_F(PrefixIndexTest, IncrementsStoreAndEvict) {
  const auto a = Chain(1, 4);
  Apply(0, Snapshot(1, 0, {}), KvApplyOutcome::kApplied);
  Apply(0, Increment(1, 2, Stored(a, 0, 2), {}), KvApplyOutcome::kApplied);
  EXPECT_EQ(Match(a)[0], 2);
  Apply(0, Increment(1, 4, Stored(a, 2, 4), {}), KvApplyOutcome::kApplied);
  EXPECT_EQ(Match(a)[0], 4);
  Apply(0, Increment(1, 6, {}, {a[3], a[2]}), KvApplyOutcome::kApplied);
  EXPECT_EQ(Match(a)[0], 2);
  // Evicting the last holder of a hash frees its node.
  EXPECT_EQ(index_->Stats().chunk_nodes, 2u);
}

TEST_F(PrefixIndexTest, StoreAndEvictOfOneHashInOneBatchUseNetCount) {
  const auto a = Chain(1, 2);
  Apply(0, Snapshot(1, 1, Stored(a, 0, 1)), KvApplyOutcome::kApplied);
  // stored a1 then evicted a1 (order lost on the wire): net 0 -> unchanged (not held).
  Apply(0, Increment(1, 3, Stored(a, 1, 2), {a[1]}), KvApplyOutcome::kApplied);
  EXPECT_EQ(Match(a)[0], 1);
  // Held a0: evicted then stored again in one batch: net 0 -> unchanged (held).
  Apply(0, Increment(1, 5, Stored(a, 0, 1), {a[0]}), KvApplyOutcome::kApplied);
  EXPECT_EQ(Match(a)[0], 1);
}

TEST_F(PrefixIndexTest, GapMakesWorkerUnusableUntilSnapshot) {
  const auto a = Chain(1, 3);
  Apply(0, Snapshot(1, 3, Stored(a, 0, 3)), KvApplyOutcome::kApplied);
  Apply(1, Snapshot(1, 3, Stored(a, 0, 3)), KvApplyOutcome::kApplied);
  // Sequence 5 after 3 with one change: event 4 was lost.
  Apply(0, Increment(1, 5, {}, {a[2]}), KvApplyOutcome::kNeedSnapshot);
  EXPECT_FALSE(index_->IsUsable(WorkerId(0)));
  EXPECT_EQ(Match(a), (std::map<uint32_t, int32_t>{{1, 3}}));
  // Increments keep being refused until the snapshot.
  Apply(0, Increment(1, 6, {}, {a[1]}), KvApplyOutcome::kNeedSnapshot);
  Apply(0, Snapshot(1, 6, Stored(a, 0, 1)), KvApplyOutcome::kApplied);
  EXPECT_TRUE(index_->IsUsable(WorkerId(0)));
  EXPECT_EQ(Match(a), (std::map<uint32_t, int32_t>{{0, 1}, {1, 3}}));
  EXPECT_EQ(index_->Stats().gaps, 1u);
}

// A snapshot replaces what the worker held, also within one generation and without a gap (a
// resubscription): chunks it no longer lists are gone from the index.
TEST_F(PrefixIndexTest, SnapshotOfTheSameGenerationClearsStaleEntries) {
  const auto a = Chain(1, 4), b = Chain(2, 2);
  Apply(0, Snapshot(1, 3, Stored(a, 0, 4)), KvApplyOutcome::kApplied);
  Apply(1, Snapshot(1, 1, Stored(a, 0, 4)), KvApplyOutcome::kApplied);
  ASSERT_EQ(Match(a), (std::map<uint32_t, int32_t>{{0, 4}, {1, 4}}));
  std::vector<kv::StoredChunkHash> now = Stored(a, 0, 1);
  for (const auto& s : Stored(b, 0, 2)) now.push_back(s);
  Apply(0, Snapshot(1, 7, now), KvApplyOutcome::kApplied);
  EXPECT_TRUE(index_->IsUsable(WorkerId(0)));
  EXPECT_EQ(Match(a), (std::map<uint32_t, int32_t>{{0, 1}, {1, 4}}));
  EXPECT_EQ(Match(b), (std::map<uint32_t, int32_t>{{0, 2}}));
  EXPECT_EQ(index_->Stats().holder_entries, 3u + 4u);
  // And increments continue from the snapshot's sequence.
  Apply(0, Increment(1, 8, {}, {b[1]}), KvApplyOutcome::kApplied);
  EXPECT_EQ(Match(b), (std::map<uint32_t, int32_t>{{0, 1}}));
}

TEST_F(PrefixIndexTest, IncrementBeforeAnySnapshotNeedsSnapshot) {
  Apply(0, Increment(1, 1, Stored(Chain(1, 1), 0, 1), {}), KvApplyOutcome::kNeedSnapshot);
  EXPECT_TRUE(Match(Chain(1, 1)).empty());
}

TEST_F(PrefixIndexTest, DuplicateSequenceIsIgnored) {
  const auto a = Chain(1, 3);
  Apply(0, Snapshot(1, 2, Stored(a, 0, 2)), KvApplyOutcome::kApplied);
  Apply(0, Increment(1, 2, {}, {a[1]}), KvApplyOutcome::kStaleIgnored);
  EXPECT_EQ(Match(a)[0], 2);
  EXPECT_TRUE(index_->IsUsable(WorkerId(0)));
}

TEST_F(PrefixIndexTest, NewGenerationDropsEverythingOfTheOld) {
  const auto a = Chain(1, 3), b = Chain(2, 2);
  Apply(0, Snapshot(1, 3, Stored(a, 0, 3)), KvApplyOutcome::kApplied);
  Apply(0, Snapshot(2, 2, Stored(b, 0, 2)), KvApplyOutcome::kNewGeneration);
  EXPECT_TRUE(Match(a).empty());
  EXPECT_EQ(Match(b)[0], 2);
  // An increment of yet another generation drops the entries and asks for a snapshot.
  Apply(0, Increment(3, 1, {}, {}), KvApplyOutcome::kNeedSnapshot);
  EXPECT_TRUE(Match(b).empty());
  EXPECT_EQ(index_->Stats().holder_entries, 0u);
}

TEST_F(PrefixIndexTest, DropWorkerForgetsEntriesAndDecisions) {
  const auto a = Chain(1, 3);
  Apply(0, Snapshot(1, 3, Stored(a, 0, 3)), KvApplyOutcome::kApplied);
  index_->RecordDecision(WorkerId(0), Chain(2, 2), milliseconds(0));
  index_->DropWorker(WorkerId(0));
  EXPECT_TRUE(Match(a).empty());
  EXPECT_TRUE(Match(Chain(2, 2)).empty());
  EXPECT_EQ(index_->Stats().chunk_nodes, 0u);
  EXPECT_EQ(index_->Stats().bytes_used, 0u);
}

TEST_F(PrefixIndexTest, MalformedBatchesAreErrors) {
  KvEventBatch bad = Snapshot(1, 1, {});
  bad.evicted = {5};
  EXPECT_EQ(index_->ApplyKvEvents(WorkerId(0), bad).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(index_->ApplyKvEvents(WorkerId::Invalid(), Snapshot(1, 0, {})).status().code(),
            StatusCode::kInvalidArgument);
  PrefixIndexOptions o;
  o.byte_budget = 100;
  EXPECT_EQ(PrefixIndex::Create(o).status().code(), StatusCode::kInvalidArgument);
  o = {};
  o.max_depth = 0;
  EXPECT_EQ(PrefixIndex::Create(o).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(PrefixIndexTest, DepthLimitStopsIndexingAndLookups) {
  PrefixIndexOptions o;
  o.max_depth = 4;
  index_ = Make(o);
  const auto a = Chain(1, 10);
  Apply(0, Snapshot(1, 10, Stored(a, 0, 10)), KvApplyOutcome::kApplied);
  EXPECT_EQ(Match(a)[0], 4);
  EXPECT_EQ(index_->Stats().chunk_nodes, 4u);
  EXPECT_EQ(index_->Stats().depth_limited, 6u);
  index_->RecordDecision(WorkerId(1), a, milliseconds(0));
  EXPECT_EQ(Match(a)[1], 4);
}

TEST_F(PrefixIndexTest, OrphanStoredHashIsIgnored) {
  // Parent 777 is neither a root nor indexed: depth unknown, so not indexed.
  Apply(0, Snapshot(1, 1, {{42, 777}}), KvApplyOutcome::kApplied);
  EXPECT_EQ(index_->Stats().chunk_nodes, 0u);
  EXPECT_EQ(index_->Stats().orphaned, 1u);
}

TEST_F(PrefixIndexTest, DecisionRecordCountsUntilItExpires) {
  PrefixIndexOptions o;
  o.decision_ttl = milliseconds(100);
  index_ = Make(o);
  const auto a = Chain(1, 5);
  index_->RecordDecision(WorkerId(3), a, milliseconds(1000));
  auto m = index_->LongestMatch(a, milliseconds(1050));
  ASSERT_EQ(m.size(), 1u);
  EXPECT_EQ(m[0].worker, WorkerId(3));
  EXPECT_EQ(m[0].matched_chunks, 5);
  EXPECT_TRUE(m[0].from_decision);
  EXPECT_TRUE(Match(a, 1100).empty());  // expiry == now: gone
  EXPECT_EQ(index_->Stats().decisions, 0u);
}

TEST_F(PrefixIndexTest, DecisionAndIndexMerge) {
  const auto a = Chain(1, 6);
  Apply(0, Snapshot(1, 2, Stored(a, 0, 2)), KvApplyOutcome::kApplied);
  index_->RecordDecision(WorkerId(0), a, milliseconds(0));
  auto m = index_->LongestMatch(a, milliseconds(1));
  ASSERT_EQ(m.size(), 1u);
  EXPECT_EQ(m[0].matched_chunks, 6);
  EXPECT_TRUE(m[0].from_decision);
}

TEST_F(PrefixIndexTest, MaxDecisionsDropsOldest) {
  PrefixIndexOptions o;
  o.max_decisions = 2;
  index_ = Make(o);
  for (uint32_t w = 0; w < 3; ++w) index_->RecordDecision(WorkerId(w), Chain(w + 1, 2), {});
  EXPECT_EQ(index_->Stats().decisions, 2u);
  EXPECT_TRUE(Match(Chain(1, 2)).empty());
  EXPECT_EQ(Match(Chain(3, 2))[2], 2);
}

TEST_F(PrefixIndexTest, ByteBudgetEvictsLeastRecentlyUsed) {
  PrefixIndexOptions o;
  o.byte_budget = 4096;
  index_ = Make(o);
  const size_t per_node = PrefixIndex::BytesPerNode();
  const auto old_chain = Chain(1, 8);
  Apply(0, Snapshot(1, 8, Stored(old_chain, 0, 8)), KvApplyOutcome::kApplied);
  uint64_t seq = 8;
  // Keep adding chains until the budget forces evictions; the old chain is never touched again.
  for (uint64_t t = 2; t < 200; ++t) {
    seq += 4;
    Apply(0, Increment(1, seq, Stored(Chain(t, 4), 0, 4), {}), KvApplyOutcome::kApplied);
    ASSERT_LE(index_->Stats().bytes_used, o.byte_budget);
  }
  const PrefixIndexStats s = index_->Stats();
  EXPECT_GT(s.lru_evictions, 0u);
  EXPECT_LE(s.chunk_nodes * per_node, o.byte_budget);
  EXPECT_TRUE(Match(old_chain).empty());
  EXPECT_EQ(Match(Chain(199, 4))[0], 4);  // the newest survives
}

// --- randomized churn against a reference model ------------------------------------------------

struct ChurnParams {
  const char* name;
  size_t byte_budget;
};

class PrefixIndexChurnTest : public ::testing::TestWithParam<ChurnParams> {};

TEST_P(PrefixIndexChurnTest, MatchesReferenceModel) {
  const uint64_t seed = testing::TestSeed();
  testing::Random rng(seed);
  const bool unbounded = GetParam().byte_budget == 0;
  PrefixIndexOptions o;
  o.byte_budget = unbounded ? (size_t{1} << 40) : GetParam().byte_budget;
  o.max_depth = 64;
  ASSERT_OK_AND_ASSIGN(auto index, PrefixIndex::Create(o));
  const uint64_t seeds[] = {kSeed};
  index->SetChainSeeds(seeds);

  // A forest of chains: tenant t has a trunk, each chain = trunk prefix + own branch.
  constexpr int kWorkers = 6, kChains = 40;
  std::vector<std::vector<uint64_t>> chains;
  std::map<uint64_t, uint64_t> parent;
  std::map<uint64_t, std::set<uint64_t>> children;
  uint64_t next_hash = 1000;
  for (int c = 0; c < kChains; ++c) {
    std::vector<uint64_t> chain;
    if (c >= 4) {  // share a prefix with an earlier chain
      const auto& base = chains[static_cast<size_t>(rng.Int(0, c - 1))];
      chain.assign(base.begin(), base.begin() + rng.Int(1, static_cast<int64_t>(base.size())));
    }
    const int64_t extra = rng.Int(1, 12);
    for (int64_t i = 0; i < extra; ++i) chain.push_back(next_hash++);
    for (size_t i = 0; i < chain.size(); ++i) {
      const uint64_t p = i == 0 ? kSeed : chain[i - 1];
      parent[chain[i]] = p;
      children[p].insert(chain[i]);
    }
    chains.push_back(std::move(chain));
  }

  struct RefWorker {
    std::set<uint64_t> held;
    uint64_t generation = 1, sequence = 0;
  };
  std::vector<RefWorker> ref(kWorkers);
  for (int w = 0; w < kWorkers; ++w) {
    KvEventBatch b = Snapshot(1, 0, {});
    ASSERT_OK(index->ApplyKvEvents(WorkerId(static_cast<uint32_t>(w)), b).status());
  }

  auto ref_match = [&](int w, const std::vector<uint64_t>& chain) {
    int32_t k = 0;
    while (k < static_cast<int32_t>(chain.size()) && k < o.max_depth &&
           ref[static_cast<size_t>(w)].held.count(chain[static_cast<size_t>(k)])) {
      ++k;
    }
    return k;
  };

  for (int step = 0; step < 3000; ++step) {
    const int w = static_cast<int>(rng.Int(0, kWorkers - 1));
    RefWorker& r = ref[static_cast<size_t>(w)];
    const WorkerId id(static_cast<uint32_t>(w));
    const int64_t op = rng.Int(0, 99);
    if (op < 80) {
      // One batch of 1-3 worker-valid changes: store a chain prefix, or evict leaves.
      KvEventBatch b = Increment(r.generation, 0, {}, {});
      const int64_t changes = rng.Int(1, 3);
      for (int64_t c = 0; c < changes; ++c) {
        if (rng.Bernoulli(0.6)) {
          const auto& chain = chains[static_cast<size_t>(rng.Int(0, kChains - 1))];
          const int64_t len = rng.Int(1, static_cast<int64_t>(chain.size()));
          for (int64_t i = 0; i < len; ++i) {
            const uint64_t h = chain[static_cast<size_t>(i)];
            if (r.held.insert(h).second) b.stored.push_back({h, parent[h]});
          }
        } else {
          std::vector<uint64_t> leaves;
          for (uint64_t h : r.held) {
            bool leaf = true;
            for (uint64_t ch : children[h]) leaf &= !r.held.count(ch);
            if (leaf) leaves.push_back(h);
          }
          if (leaves.empty()) continue;
          const uint64_t h = leaves[static_cast<size_t>(rng.Int(0, leaves.size() - 1))];
          r.held.erase(h);
          b.evicted.push_back(h);
        }
      }
      r.sequence += b.stored.size() + b.evicted.size();
      b.sequence = r.sequence;
      ASSERT_OK_AND_ASSIGN(KvApplyOutcome out, index->ApplyKvEvents(id, b));
      ASSERT_EQ(out, KvApplyOutcome::kApplied);
    } else if (op < 88) {
      // Lost events: a gap, then the snapshot that heals it.
      r.sequence += 2;
      ASSERT_OK_AND_ASSIGN(KvApplyOutcome out,
                           index->ApplyKvEvents(id, Increment(r.generation, r.sequence, {}, {1})));
      ASSERT_EQ(out, KvApplyOutcome::kNeedSnapshot);
      EXPECT_FALSE(index->IsUsable(id));
      std::vector<kv::StoredChunkHash> all;
      for (uint64_t h : r.held) all.push_back({h, parent[h]});
      ASSERT_OK(index->ApplyKvEvents(id, Snapshot(r.generation, r.sequence, all)).status());
    } else if (op < 94) {
      // Restart: a new generation with an empty cache.
      r = RefWorker{};
      r.generation = static_cast<uint64_t>(step) + 100;
      ASSERT_OK(index->ApplyKvEvents(id, Snapshot(r.generation, 0, {})).status());
    } else {
      // Lookups: the index never claims more than the reference, and claims exactly as much
      // when nothing was dropped for the budget.
      for (const auto& chain : chains) {
        std::map<uint32_t, int32_t> got;
        for (const WorkerMatch& m : index->LongestMatch(chain, RouterTime(0))) {
          got[m.worker.value()] = m.matched_chunks;
        }
        for (int v = 0; v < kWorkers; ++v) {
          const int32_t want = ref_match(v, chain);
          const int32_t have =
              got.count(static_cast<uint32_t>(v)) ? got[static_cast<uint32_t>(v)] : 0;
          if (unbounded) {
            ASSERT_EQ(have, want) << "worker " << v << " step " << step << " seed " << seed;
          } else {
            ASSERT_LE(have, want) << "worker " << v << " step " << step << " seed " << seed;
          }
        }
      }
    }
    const PrefixIndexStats s = index->Stats();
    ASSERT_LE(s.bytes_used, o.byte_budget) << "step " << step << " seed " << seed;
    if (unbounded) {
      size_t entries = 0;
      for (const RefWorker& rw : ref) entries += rw.held.size();
      ASSERT_EQ(s.holder_entries, entries) << "step " << step << " seed " << seed;
    }
  }
  if (!unbounded) {
    EXPECT_GT(index->Stats().lru_evictions, 0u);
  }
}

INSTANTIATE_TEST_SUITE_P(Budgets, PrefixIndexChurnTest,
                         ::testing::Values(ChurnParams{"unbounded", 0},
                                           ChurnParams{"budget_8k", 8192}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace chunkserve::router
