// Randomized model test: PrefixTree (and TppPlan over it) against a naive model that keeps a plain
// token vector per live sequence. Prompts are drawn from a few shared prefixes over a tiny
// vocabulary so that sharing, divergence inside chunks and duplicate chunks happen all the time;
// the slot pool is small so that eviction and exhaustion do too. Every operation is checked, and
// after every operation the whole tree is checked against the model.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <iostream>
#include <map>
#include <set>
#include <tuple>
#include <vector>

#include "runtime/kvcache/prefix_tree.h"
#include "runtime/plan/tpp_plan.h"
#include "tests/testing/plan_check.h"
#include "tests/testing/random.h"
#include "tests/testing/status_matchers.h"

#ifndef CHUNKSERVE_KV_MODEL_OPS
#define CHUNKSERVE_KV_MODEL_OPS 100000
#endif

namespace chunkserve::kv {
namespace {

using ::chunkserve::testing::Random;
using ::chunkserve::testing::StatusIs;

struct ModelSeq {
  std::vector<TokenId> tokens;   // what the tree must spell
  std::vector<TokenId> pending;  // prompt tokens still to prefill
};

// Everything observable about the tree, to prove that a failed operation changed nothing.
struct Snapshot {
  std::vector<std::tuple<int32_t, int32_t, int32_t, uint32_t, std::vector<TokenId>>> chunks;
  std::map<SeqId, std::vector<ChunkId>> paths;
  std::vector<ChunkId> eviction_order;
  int32_t free_slots = 0;
  uint64_t evictions = 0;
  friend bool operator==(const Snapshot&, const Snapshot&) = default;
};

class PrefixTreeModelTest : public ::testing::Test {
 protected:
  void Init(uint64_t seed) {
    rng_.emplace(seed);
    Random& rng = *rng_;
    const int32_t sizes[] = {1, 2, 3, 4, 8};
    c_ = sizes[rng.Int(0, 4)];
    const int32_t slots = static_cast<int32_t>(rng.Int(3, 40));
    std::cout << "[ config   ] chunk_size=" << c_ << " num_slots=" << slots << std::endl;
    Result<PrefixTree> t = PrefixTree::Create(
        {.chunk_size = c_, .num_slots = slots, .slot_bytes = 96, .model_fingerprint = seed});
    ASSERT_OK(t.status());
    tree_.emplace(std::move(*t));
    for (int i = 0; i < 4; ++i) {
      prefixes_.push_back(rng.Tokens(static_cast<size_t>(rng.Int(1, 5 * c_)), 3));
    }
  }

  PrefixTree& tree() { return *tree_; }
  Random& rng() { return *rng_; }

  std::vector<TokenId> RandomPrompt() {
    const std::vector<TokenId>& base = prefixes_[rng().Int(0, 3)];
    std::vector<TokenId> p(base.begin(),
                           base.begin() + rng().Int(0, static_cast<int64_t>(base.size())));
    const std::vector<TokenId> suffix = rng().Tokens(static_cast<size_t>(rng().Int(0, 2 * c_)), 3);
    p.insert(p.end(), suffix.begin(), suffix.end());
    if (p.empty()) p.push_back(0);
    return p;
  }

  SeqId RandomLive() {
    auto it = model_.begin();
    std::advance(it, rng().Int(0, static_cast<int64_t>(model_.size()) - 1));
    return it->first;
  }

  std::vector<SeqId> RandomSubset(int max) {
    std::vector<SeqId> all;
    for (const auto& [seq, m] : model_) all.push_back(seq);
    std::shuffle(all.begin(), all.end(), rng().engine());
    all.resize(std::min<size_t>(all.size(), static_cast<size_t>(rng().Int(0, max))));
    return all;
  }

  // The tokens a chunk's path spells, from the root to the chunk's end.
  std::vector<TokenId> SpellChunk(ChunkId id) {
    std::vector<std::span<const TokenId>> parts;
    for (ChunkId c = id; c.valid();) {
      Result<ChunkInfo> info = tree().Chunk(c);
      parts.push_back(info->tokens);
      c = info->parent;
    }
    std::vector<TokenId> out;
    for (auto it = parts.rbegin(); it != parts.rend(); ++it)
      out.insert(out.end(), it->begin(), it->end());
    return out;
  }

  // By brute force over every chunk: the longest prefix of `p` spelled by any path in the tree,
  // and whether some chunk's path spells exactly that prefix (then Insert shares, else it copies).
  struct BruteMatch {
    int32_t tokens = 0;
    bool exact = false;
  };
  BruteMatch BruteForceMatch(std::span<const TokenId> p) {
    std::vector<std::vector<TokenId>> spelled;
    BruteMatch best;
    for (int32_t i = 0; i < tree().num_slots(); ++i) {
      if (!tree().Chunk(ChunkId(i)).ok()) continue;
      spelled.push_back(SpellChunk(ChunkId(i)));
      const std::vector<TokenId>& s = spelled.back();
      const size_t n = std::min(s.size(), p.size());
      best.tokens = std::max(
          best.tokens, static_cast<int32_t>(
                           std::mismatch(s.begin(), s.begin() + n, p.begin()).first - s.begin()));
    }
    for (const std::vector<TokenId>& s : spelled) {
      best.exact |= static_cast<int32_t>(s.size()) == best.tokens &&
                    std::equal(s.begin(), s.end(), p.begin());
    }
    return best;
  }

  // A live sequence's path (a span into the tree, by value).
  std::span<const ChunkId> PathOf(SeqId seq) {
    Result<SeqInfo> info = tree().Seq(seq);
    EXPECT_OK(info.status());
    return info.ok() ? info->path : std::span<const ChunkId>();
  }

  std::map<ChunkId, int32_t> ExpectedRefs() {
    std::map<ChunkId, int32_t> refs;
    for (const auto& [seq, m] : model_) {
      for (const ChunkId c : PathOf(seq)) ++refs[c];
    }
    return refs;
  }

  Snapshot Snap() {
    Snapshot s;
    for (int32_t i = 0; i < tree().num_slots(); ++i) {
      Result<ChunkInfo> c = tree().Chunk(ChunkId(i));
      if (!c.ok()) continue;
      s.chunks.emplace_back(i, c->len, c->ref_count, c->parent.value(),
                            std::vector<TokenId>(c->tokens.begin(), c->tokens.end()));
    }
    for (const auto& [seq, m] : model_) {
      const std::span<const ChunkId> path = PathOf(seq);
      s.paths[seq].assign(path.begin(), path.end());
    }
    s.eviction_order = tree().EvictionOrder();
    s.free_slots = tree().free_slots();
    s.evictions = tree().Stats().evictions;
    return s;
  }

  // ---- Operations ----

  void OpInsert() {
    const std::vector<TokenId> prompt = RandomPrompt();
    const int32_t size = static_cast<int32_t>(prompt.size());
    const int32_t cap =
        rng().Bernoulli(0.8) ? size - 1 : static_cast<int32_t>(rng().Int(0, size + 2));
    const std::span<const TokenId> cacheable(prompt.data(),
                                             static_cast<size_t>(std::min(cap, size)));
    const BruteMatch brute = BruteForceMatch(cacheable);
    const int32_t expected = brute.tokens;
    const MatchResult match = tree().Match(cacheable);
    ASSERT_EQ(match.num_tokens, expected);
    ASSERT_EQ(match.num_copied_tokens > 0, expected > 0 && !brute.exact);
    ASSERT_LT(match.num_copied_tokens, c_);
    const Snapshot before = Snap();
    Result<InsertResult> r = tree().Insert(prompt, cap);
    if (!r.ok()) {
      ASSERT_THAT(r.status(), StatusIs(StatusCode::kResourceExhausted));
      ASSERT_GT(match.num_copied_tokens, 0);  // only a copy needs a slot
      ASSERT_EQ(tree().free_slots(), 0);
      ASSERT_EQ(Snap(), before);
      ++stats_.exhausted;
      return;
    }
    ASSERT_EQ(r->num_cached_tokens, expected);
    ASSERT_EQ(r->copy.has_value(), match.num_copied_tokens > 0);
    if (r->copy) {
      ASSERT_EQ(r->copy->num_tokens, match.num_copied_tokens);
      ++stats_.copies;
    }
    ASSERT_EQ(model_.count(r->seq), 0u);
    ModelSeq& m = model_[r->seq];
    m.tokens.assign(prompt.begin(), prompt.begin() + expected);
    m.pending.assign(prompt.begin() + expected, prompt.end());
  }

  void OpAppend() {
    // A random subset, each with its own count (prefill chunks or decode tokens).
    std::vector<SeqId> seqs = RandomSubset(6);
    std::vector<std::vector<TokenId>> tokens(seqs.size());
    std::vector<SeqTokens> batch;
    for (size_t i = 0; i < seqs.size(); ++i) {
      const ModelSeq& m = model_[seqs[i]];
      const size_t n = rng().Bernoulli(0.5) ? 1 : static_cast<size_t>(rng().Int(0, 2 * c_ + 1));
      const size_t from_prompt = std::min(n, m.pending.size());
      tokens[i].assign(m.pending.begin(), m.pending.begin() + from_prompt);
      const std::vector<TokenId> gen = rng().Tokens(n - from_prompt, 3);
      tokens[i].insert(tokens[i].end(), gen.begin(), gen.end());
      batch.push_back({seqs[i], tokens[i]});
    }
    // Slots needed, computed from the model: a shared partial tail costs a copy unless the request
    // is the last holder left; the rest needs ceil(overflow / c) chunks.
    std::map<ChunkId, int32_t> refs = ExpectedRefs();
    int32_t need = 0, cows = 0;
    for (const SeqTokens& req : batch) {
      if (req.tokens.empty()) continue;
      const int32_t len = static_cast<int32_t>(model_[req.seq].tokens.size());
      int32_t room = len % c_ == 0 ? 0 : c_ - len % c_;
      if (room > 0) {
        const ChunkId last = PathOf(req.seq).back();
        if (refs[last] > 1) {
          --refs[last];
          ++need;
          ++cows;
        }
      }
      const int32_t over = static_cast<int32_t>(req.tokens.size()) - room;
      if (over > 0) need += (over + c_ - 1) / c_;
    }
    ASSERT_EQ(*tree().AppendSlotsNeeded(batch), need);
    const int32_t available = tree().available_slots();
    const Snapshot before = Snap();
    AppendResult out;
    const Status status = tree().Append(batch, &out);
    if (need > available) {
      ASSERT_THAT(status, StatusIs(StatusCode::kResourceExhausted));
      ASSERT_EQ(Snap(), before);
      ++stats_.exhausted;
      return;
    }
    ASSERT_OK(status);
    ASSERT_EQ(static_cast<int32_t>(out.copies.size()), cows);
    ASSERT_EQ(out.write_indptr.size(), batch.size() + 1);
    for (size_t i = 0; i < batch.size(); ++i) {
      ModelSeq& m = model_[seqs[i]];
      const std::span<const ChunkId> path = PathOf(seqs[i]);
      ASSERT_EQ(out.write_indptr[i + 1] - out.write_indptr[i],
                static_cast<int32_t>(tokens[i].size()));
      for (int32_t w = out.write_indptr[i]; w < out.write_indptr[i + 1]; ++w) {
        const KvWrite& kw = out.writes[w];
        const int32_t pos = static_cast<int32_t>(m.tokens.size()) + (w - out.write_indptr[i]);
        ASSERT_EQ(kw.position, pos);
        ASSERT_EQ(kw.offset, pos % c_);
        ASSERT_EQ(kw.slot, tree().ChunkSlot(path[pos / c_]));
      }
      m.tokens.insert(m.tokens.end(), tokens[i].begin(), tokens[i].end());
      const size_t consumed = std::min(tokens[i].size(), m.pending.size());
      m.pending.erase(m.pending.begin(), m.pending.begin() + consumed);
    }
    stats_.cows += cows;
  }

  void OpFork() {
    const SeqId seq = RandomLive();
    const int32_t n = static_cast<int32_t>(rng().Int(1, 3));
    Result<std::vector<SeqId>> forks = tree().Fork(seq, n);
    ASSERT_OK(forks.status());
    ASSERT_EQ(forks->size(), static_cast<size_t>(n));
    for (const SeqId f : *forks) {
      ASSERT_EQ(model_.count(f), 0u);
      model_[f] = model_[seq];
    }
  }

  void OpRelease() {
    const SeqId seq = RandomLive();
    ASSERT_OK(tree().Release(seq));
    model_.erase(seq);
    ASSERT_THAT(tree().Release(seq), StatusIs(StatusCode::kNotFound));
  }

  void OpInvalid() {
    const Snapshot before = Snap();
    AppendResult out;
    const std::vector<TokenId> t = {1};
    if (!model_.empty()) {
      const SeqId seq = RandomLive();
      const std::vector<SeqTokens> twice = {{seq, t}, {seq, t}};
      ASSERT_THAT(tree().Append(twice, &out), StatusIs(StatusCode::kInvalidArgument));
    }
    ASSERT_THAT(tree().Insert({}, 0), StatusIs(StatusCode::kInvalidArgument));
    const std::vector<SeqTokens> unknown = {{SeqId(0x3fffff), t}};
    ASSERT_THAT(tree().Append(unknown, &out), StatusIs(StatusCode::kNotFound));
    ASSERT_EQ(Snap(), before);
  }

  // ---- Whole-tree check ----

  void CheckAll() {
    ASSERT_OK(tree().CheckInvariants());
    const KvCacheStats s = tree().Stats();
    // Paths spell the model's tokens.
    int64_t tokens = 0, unshared = 0;
    for (const auto& [seq, m] : model_) {
      Result<SeqInfo> info = tree().Seq(seq);
      ASSERT_OK(info.status());
      ASSERT_EQ(info->num_tokens, static_cast<int32_t>(m.tokens.size()));
      std::vector<TokenId> spelled;
      for (const ChunkId c : info->path) {
        const ChunkInfo chunk = *tree().Chunk(c);
        spelled.insert(spelled.end(), chunk.tokens.begin(), chunk.tokens.end());
      }
      ASSERT_EQ(spelled, m.tokens) << seq;
      tokens += static_cast<int64_t>(m.tokens.size());
      unshared += (static_cast<int64_t>(m.tokens.size()) + c_ - 1) / c_;
    }
    // Reference counts and accounting, from the model's side.
    const std::map<ChunkId, int32_t> refs = ExpectedRefs();
    int32_t used = 0, referenced = 0;
    std::set<ChunkId> retained;
    for (int32_t i = 0; i < tree().num_slots(); ++i) {
      Result<ChunkInfo> c = tree().Chunk(ChunkId(i));
      if (!c.ok()) continue;
      ++used;
      const auto it = refs.find(ChunkId(i));
      const int32_t want = it == refs.end() ? 0 : it->second;
      ASSERT_EQ(c->ref_count, want) << "chunk " << i;
      if (want > 0) {
        ++referenced;
      } else {
        retained.insert(ChunkId(i));
      }
    }
    ASSERT_EQ(s.used_slots, used);
    ASSERT_EQ(s.free_slots, tree().num_slots() - used);
    ASSERT_EQ(s.referenced_chunks, referenced);
    ASSERT_EQ(s.retained_chunks, static_cast<int32_t>(retained.size()));
    ASSERT_EQ(s.live_seqs, static_cast<int32_t>(model_.size()));
    ASSERT_EQ(s.live_tokens, tokens);
    ASSERT_EQ(s.unshared_chunks, unshared);
    ASSERT_EQ(s.bytes_used, static_cast<uint64_t>(used) * 96);
    ASSERT_EQ(s.bytes_referenced, static_cast<uint64_t>(referenced) * 96);
    ASSERT_EQ(s.bytes_if_unshared, static_cast<uint64_t>(unshared) * 96);
    // Eviction order: exactly the retained chunks, children before parents.
    const std::vector<ChunkId> order = tree().EvictionOrder();
    ASSERT_EQ(std::set<ChunkId>(order.begin(), order.end()), retained);
    for (size_t i = 0; i < order.size(); ++i) {
      const ChunkId parent = tree().Chunk(order[i])->parent;
      const auto pos = std::find(order.begin(), order.end(), parent);
      ASSERT_TRUE(pos == order.end() || pos > order.begin() + static_cast<ptrdiff_t>(i));
    }
    CheckBatch();
  }

  void CheckBatch() {
    const std::vector<SeqId> batch = RandomSubset(10);
    // DFS order: every chunk two or more rows use covers exactly a contiguous range of them.
    std::vector<SeqId> order;
    std::vector<BatchGroup> groups;
    ASSERT_OK(tree().GroupBatch(batch, &order, &groups));
    std::map<ChunkId, std::vector<int32_t>> users;
    for (int32_t r = 0; r < static_cast<int32_t>(order.size()); ++r) {
      for (const ChunkId c : PathOf(order[r])) users[c].push_back(r);
    }
    std::set<ChunkId> shared;
    for (const auto& [chunk, rows] : users) {
      if (rows.size() < 2) continue;
      shared.insert(chunk);
      ASSERT_EQ(rows.back() - rows.front() + 1, static_cast<int32_t>(rows.size()))
          << "rows sharing chunk " << chunk << " are not contiguous";
    }
    ASSERT_EQ(groups.size(), shared.size());
    for (const BatchGroup& g : groups) {
      ASSERT_EQ(shared.count(g.chunk), 1u);
      ASSERT_EQ(g.begin, users[g.chunk].front());
      ASSERT_EQ(g.end, users[g.chunk].back() + 1);
    }
    // A fresh plan covers every row's tokens exactly once.
    plan::TppPlan fresh;
    ASSERT_OK(fresh.Build(tree(), batch));
    ASSERT_TRUE(plan::testing::PlanIsValid(tree(), fresh, batch));

    // The persistent plan follows its batch with Update; it must equal a rebuild.
    std::erase_if(persistent_batch_, [&](SeqId s) { return model_.count(s) == 0; });
    if (rng().Bernoulli(0.02)) persistent_batch_ = RandomSubset(12);
    ASSERT_OK(persistent_.Update(tree(), persistent_batch_));
    ++stats_.update_kinds[static_cast<int>(persistent_.last_update())];
    ASSERT_TRUE(plan::testing::PlanIsValid(tree(), persistent_, persistent_batch_));
    plan::TppPlan rebuilt;
    ASSERT_OK(rebuilt.Build(tree(), persistent_batch_));
    ASSERT_EQ(plan::testing::Canonical(persistent_), plan::testing::Canonical(rebuilt));
  }

  void Run(uint64_t seed, int num_ops) {
    Init(seed);
    for (int op = 0; op < num_ops; ++op) {
      const int64_t dice = rng().Int(0, 99);
      const size_t live = model_.size();
      // Keep the pool under pressure without drowning in failed operations: with no slot to be
      // had, release half of the time.
      const bool starved = tree().available_slots() == 0 && rng().Bernoulli(0.5);
      if (live > 0 && starved) {
        OpRelease();
      } else if (live == 0 || (dice < 30 && live < 40)) {
        OpInsert();
      } else if (dice < 65) {
        OpAppend();
      } else if (dice < 73 && live < 40) {
        OpFork();
      } else if (dice < 99) {
        OpRelease();
      } else {
        OpInvalid();
      }
      if (::testing::Test::HasFatalFailure()) {
        ADD_FAILURE() << "at operation " << op;
        return;
      }
      CheckAll();
      if (::testing::Test::HasFatalFailure()) {
        ADD_FAILURE() << "after operation " << op;
        return;
      }
    }
    const KvCacheStats s = tree().Stats();
    std::cout << "[ coverage ] evictions=" << s.evictions << " insert_copies=" << stats_.copies
              << " cow_copies=" << stats_.cows << " exhausted=" << stats_.exhausted
              << " plan updates (none/lengths/private/rebuild)=" << stats_.update_kinds[0] << "/"
              << stats_.update_kinds[1] << "/" << stats_.update_kinds[2] << "/"
              << stats_.update_kinds[3] << std::endl;
    // The run must have exercised what it is for.
    if (c_ > 1) {  // with chunk_size 1 no chunk is ever partial
      EXPECT_GT(stats_.copies + stats_.cows, 0);
    }
    EXPECT_GT(stats_.update_kinds[static_cast<int>(plan::TppPlan::UpdateKind::kLengths)], 0);
  }

  int32_t c_ = 0;
  std::optional<Random> rng_;
  std::optional<PrefixTree> tree_;
  std::vector<std::vector<TokenId>> prefixes_;
  std::map<SeqId, ModelSeq> model_;
  plan::TppPlan persistent_;
  std::vector<SeqId> persistent_batch_;
  struct {
    int64_t copies = 0, cows = 0, exhausted = 0;
    int64_t update_kinds[4] = {0, 0, 0, 0};
  } stats_;
};

TEST_F(PrefixTreeModelTest, RandomOperationsMatchNaiveModel) {
  Run(::chunkserve::testing::TestSeed(), CHUNKSERVE_KV_MODEL_OPS);
}

}  // namespace
}  // namespace chunkserve::kv
