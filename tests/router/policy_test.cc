// Routing policies, the load tracker and RouterCore: each policy's defining behavior.
#include "router/policy.h"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <vector>

#include "router/routing.h"
#include "runtime/kvcache/chunk_hash.h"
#include "tests/testing/status_matchers.h"

namespace chunkserve::router {
namespace {

using std::chrono::milliseconds;

constexpr int32_t kChunk = 64;
const uint64_t kChainSeed = kv::ChunkHashSeed(0xfeed, kChunk);

// A prompt of `prefix` tokens shared by everyone with the same tenant, then `suffix` unique ones.
std::vector<TokenId> Prompt(int tenant, int prefix, int suffix, int unique) {
  std::vector<TokenId> p;
  for (int i = 0; i < prefix; ++i) p.push_back((tenant * 1009 + i * 13) % 32000);
  for (int i = 0; i < suffix; ++i) p.push_back((unique * 7919 + i * 31 + 5) % 32000);
  return p;
}

WorkerInfo Info(uint32_t id, int32_t batch = 32) {
  WorkerInfo w;
  w.id = WorkerId(id);
  w.name = std::to_string(id);
  w.generation = 1;
  w.max_batch_size = batch;
  return w;
}

KvEventBatch SnapshotOf(const std::vector<uint64_t>& chain, size_t n) {
  KvEventBatch b;
  b.generation = 1;
  b.snapshot = true;
  for (size_t i = 0; i < n && i < chain.size(); ++i) {
    b.stored.push_back({chain[i], i == 0 ? kChainSeed : chain[i - 1]});
  }
  return b;
}

class RouterCoreTest : public ::testing::Test {
 protected:
  std::unique_ptr<RouterCore> Make(PolicyKind kind, int workers, PolicyOptions p = {}) {
    RouterCoreOptions o;
    o.policy_kind = kind;
    o.policy = p;
    o.chain_seeds = {kChainSeed};
    auto core = RouterCore::Create(o);
    EXPECT_OK(core.status());
    for (int w = 0; w < workers; ++w) {
      EXPECT_OK((*core)->AddWorker(Info(static_cast<uint32_t>(w))));
      // Every worker subscribed: empty snapshot, usable index.
      EXPECT_OK(
          (*core)->ApplyKvEvents(WorkerId(static_cast<uint32_t>(w)), SnapshotOf({}, 0)).status());
    }
    return std::move(core).value();
  }

  RoutingRequest Req(const std::vector<TokenId>& prompt) {
    auto r = MakeRoutingRequest(kChainSeed, kChunk, prompt);
    EXPECT_OK(r.status());
    return *r;
  }

  uint64_t next_id_ = 1;
};

TEST_F(RouterCoreTest, SamePrefixBurstGoesToOneWorkerBeforeAnyKvEvent) {
  auto core = Make(PolicyKind::kTtft, 16);
  std::set<uint32_t> chosen;
  std::vector<std::vector<TokenId>> prompts;
  // 2K shared tokens, 64 private: a holder's queue of ten private parts stays far below the
  // spill point (its TTFT would have to exceed 1.5x a full 2K prefill elsewhere).
  for (int i = 0; i < 10; ++i) prompts.push_back(Prompt(3, 2048, 64, i));
  for (int i = 0; i < 10; ++i) {
    ASSERT_OK_AND_ASSIGN(
        RoutingDecision d,
        core->Route(RequestId(next_id_++), Req(prompts[static_cast<size_t>(i)]), milliseconds(i)));
    chosen.insert(d.worker.value());
    if (i == 0) {
      EXPECT_EQ(d.reason, DecisionReason::kNewPrefixPlacement);
    } else {
      EXPECT_EQ(d.reason, DecisionReason::kCacheHit);
      EXPECT_EQ(d.predicted_cached_tokens, 2048);  // 32 shared chunks from the decision record
    }
  }
  EXPECT_EQ(chosen.size(), 1u);
}

TEST_F(RouterCoreTest, KvEventsAttractTheRequestToTheHolder) {
  auto core = Make(PolicyKind::kTtft, 8);
  const auto prompt = Prompt(5, 1024, 80, 1);
  const RoutingRequest r = Req(prompt);
  ASSERT_OK(core->ApplyKvEvents(WorkerId(6), SnapshotOf(r.chunk_hashes, 16)).status());
  ASSERT_OK_AND_ASSIGN(RoutingDecision d, core->Route(RequestId(1), r, milliseconds(0)));
  EXPECT_EQ(d.worker, WorkerId(6));
  EXPECT_EQ(d.reason, DecisionReason::kCacheHit);
  EXPECT_EQ(d.predicted_cached_tokens, 1024);
  // Precision accounting: the worker reports what it really hit, at finish.
  ASSERT_OK(core->OnFirstToken(RequestId(1)));
  EXPECT_EQ(core->precision().requests, 0u);  // nothing reported yet
  ASSERT_OK(core->OnFinished(RequestId(1), 1024));
  EXPECT_EQ(core->precision().requests, 1u);
  EXPECT_DOUBLE_EQ(core->precision().Precision(), 1.0);
}

TEST_F(RouterCoreTest, FirstTokenReleasesPrefillAndFinishRecordsPrecision) {
  auto core = Make(PolicyKind::kTtft, 4);
  const auto prompt = Prompt(7, 1024, 80, 2);
  const RoutingRequest r = Req(prompt);
  ASSERT_OK(core->ApplyKvEvents(WorkerId(2), SnapshotOf(r.chunk_hashes, 8)).status());
  ASSERT_OK_AND_ASSIGN(RoutingDecision d, core->Route(RequestId(1), r, milliseconds(0)));
  ASSERT_EQ(d.worker, WorkerId(2));
  ASSERT_EQ(d.predicted_cached_tokens, 512);
  const auto load_of = [&](WorkerId id) {
    for (const WorkerState& w : core->workers()) {
      if (w.info.id == id) return w.load;
    }
    return WorkerLoad{};
  };
  // Picked: the uncached tokens are pending prefill and the request is queued.
  EXPECT_EQ(load_of(WorkerId(2)).queued_prefill_tokens,
            static_cast<uint64_t>(r.prompt_tokens - 512));
  EXPECT_EQ(load_of(WorkerId(2)).queued_requests, 1);
  // First token: prefill released, the request now runs; no precision sample yet.
  ASSERT_OK(core->OnFirstToken(RequestId(1)));
  EXPECT_EQ(load_of(WorkerId(2)).queued_prefill_tokens, 0u);
  EXPECT_EQ(load_of(WorkerId(2)).running_sequences, 1);
  EXPECT_EQ(core->precision().requests, 0u);
  // Finish with the worker's report (it hit less than predicted: 256 of 512).
  ASSERT_OK(core->OnFinished(RequestId(1), 256));
  EXPECT_EQ(load_of(WorkerId(2)).running_sequences, 0);
  EXPECT_EQ(core->precision().requests, 1u);
  EXPECT_EQ(core->precision().predicted_tokens, 512u);
  EXPECT_EQ(core->precision().reported_tokens, 256u);
  EXPECT_EQ(core->precision().overlap_tokens, 256u);
  EXPECT_DOUBLE_EQ(core->precision().Precision(), 0.5);
  // A leg ended without a report (re-routed, cancelled before prefill) adds no sample.
  ASSERT_OK_AND_ASSIGN(d, core->Route(RequestId(2), r, milliseconds(0)));
  ASSERT_OK(core->OnFinished(RequestId(2)));
  EXPECT_EQ(core->precision().requests, 1u);
  // Unknown requests are errors and record nothing.
  EXPECT_EQ(core->OnFirstToken(RequestId(99)).code(), StatusCode::kNotFound);
  EXPECT_EQ(core->OnFinished(RequestId(99), 10).code(), StatusCode::kNotFound);
  EXPECT_EQ(core->OnFinished(RequestId(1), 10).code(), StatusCode::kNotFound);
  EXPECT_EQ(core->precision().requests, 1u);
}

TEST_F(RouterCoreTest, LoadCapSpillsAwayFromOverloadedHolder) {
  PolicyOptions p;
  p.load_cap = 1.0;  // running + queued > 32 is over
  auto core = Make(PolicyKind::kTtft, 4, p);
  const RoutingRequest r = Req(Prompt(1, 640, 64, 0));
  ASSERT_OK(core->ApplyKvEvents(WorkerId(2), SnapshotOf(r.chunk_hashes, 10)).status());
  WorkerLoad busy;
  busy.running_sequences = 32;
  busy.queued_requests = 3;
  ASSERT_OK(core->UpdateLoad(WorkerId(2), busy));
  ASSERT_OK_AND_ASSIGN(RoutingDecision d, core->Route(RequestId(1), r, milliseconds(0)));
  EXPECT_NE(d.worker, WorkerId(2));
  EXPECT_EQ(d.reason, DecisionReason::kLoadCap);
}

TEST_F(RouterCoreTest, AllOverCapKeepsCacheAffinity) {
  PolicyOptions p;
  p.load_cap = 1.0;
  auto core = Make(PolicyKind::kTtft, 3, p);
  const RoutingRequest r = Req(Prompt(1, 1024, 64, 0));
  ASSERT_OK(core->ApplyKvEvents(WorkerId(2), SnapshotOf(r.chunk_hashes, 16)).status());
  for (uint32_t w = 0; w < 3; ++w) {
    WorkerLoad l;
    l.running_sequences = 33;
    l.queued_prefill_tokens = 4000;
    ASSERT_OK(core->UpdateLoad(WorkerId(w), l));
  }
  ASSERT_OK_AND_ASSIGN(RoutingDecision d, core->Route(RequestId(1), r, milliseconds(0)));
  EXPECT_EQ(d.worker, WorkerId(2));
  EXPECT_EQ(d.reason, DecisionReason::kCacheHit);
}

TEST_F(RouterCoreTest, TwoRoutersWithSameMembershipAgreeOnNewPrefixes) {
  auto a = Make(PolicyKind::kTtft, 12);
  // The second router learns the workers in another order.
  RouterCoreOptions o;
  o.chain_seeds = {kChainSeed};
  ASSERT_OK_AND_ASSIGN(auto b, RouterCore::Create(o));
  for (int w = 11; w >= 0; --w) {
    ASSERT_OK(b->AddWorker(Info(static_cast<uint32_t>(w))));
    ASSERT_OK(b->ApplyKvEvents(WorkerId(static_cast<uint32_t>(w)), SnapshotOf({}, 0)).status());
  }
  std::set<uint32_t> used;
  for (int t = 0; t < 100; ++t) {
    const RoutingRequest r = Req(Prompt(t, 256, 16, t));
    ASSERT_OK_AND_ASSIGN(RoutingDecision da, a->Route(RequestId(1000 + t), r, milliseconds(0)));
    ASSERT_OK_AND_ASSIGN(RoutingDecision db, b->Route(RequestId(1000 + t), r, milliseconds(0)));
    EXPECT_EQ(da.worker, db.worker) << "tenant " << t;
    EXPECT_EQ(da.reason, DecisionReason::kNewPrefixPlacement);
    used.insert(da.worker.value());
    // Keep both idle so load does not steer placement.
    ASSERT_OK(a->OnFinished(RequestId(1000 + t)));
    ASSERT_OK(b->OnFinished(RequestId(1000 + t)));
  }
  EXPECT_GE(used.size(), 8u);  // rendezvous spreads prefixes
}

TEST(RendezvousTest, RemovingAWorkerOnlyMovesItsKeys) {
  std::vector<WorkerId> all, fewer;
  for (uint32_t w = 0; w < 10; ++w) all.push_back(WorkerId(w));
  for (uint32_t w = 0; w < 10; ++w) {
    if (w != 4) fewer.push_back(WorkerId(w));
  }
  int moved = 0;
  for (uint64_t k = 0; k < 2000; ++k) {
    const WorkerId before = RendezvousPick(Mix64(k), all);
    const WorkerId after = RendezvousPick(Mix64(k), fewer);
    if (before != WorkerId(4)) {
      EXPECT_EQ(before, after);
    } else {
      ++moved;
    }
  }
  EXPECT_GT(moved, 100);
  EXPECT_FALSE(RendezvousPick(1, {}).valid());
}

class TtftSpillTest : public RouterCoreTest {
 protected:
  // Worker 0 holds the prefix but has a long prefill queue; the others are idle.
  void Setup(int32_t max_holders, uint64_t holder_queue) {
    PolicyOptions p;
    p.max_holders_per_prefix = max_holders;
    core_ = Make(PolicyKind::kTtft, 4, p);
    request_ = Req(Prompt(9, 2048, 64, 0));
    ASSERT_OK(core_->ApplyKvEvents(WorkerId(0), SnapshotOf(request_.chunk_hashes, 32)).status());
    WorkerLoad l;
    l.queued_prefill_tokens = holder_queue;
    l.prefill_tokens_per_s = 10000;
    ASSERT_OK(core_->UpdateLoad(WorkerId(0), l));
  }
  std::unique_ptr<RouterCore> core_;
  RoutingRequest request_;
};

TEST_F(TtftSpillTest, HolderWinsWhileNotClearlyWorse) {
  // Holder: 3000 / 10000 = 0.3 s; others: 2112 / 8000 = 0.264 s: within the factor 2.
  Setup(4, 3000);
  ASSERT_OK_AND_ASSIGN(RoutingDecision d, core_->Route(RequestId(1), request_, milliseconds(0)));
  EXPECT_EQ(d.worker, WorkerId(0));
  EXPECT_EQ(d.reason, DecisionReason::kCacheHit);
}

TEST_F(TtftSpillTest, HotPrefixSpillsToASecondHolder) {
  Setup(4, 40000);  // holder 4 s vs 0.26 s elsewhere
  ASSERT_OK_AND_ASSIGN(RoutingDecision d, core_->Route(RequestId(1), request_, milliseconds(0)));
  EXPECT_NE(d.worker, WorkerId(0));
  EXPECT_EQ(d.reason, DecisionReason::kSpill);
  // The next request of the prefix sees two holders (index + decision record) and takes the
  // faster one: the second holder.
  ASSERT_OK_AND_ASSIGN(RoutingDecision d2, core_->Route(RequestId(2), request_, milliseconds(1)));
  EXPECT_EQ(d2.worker, d.worker);
  EXPECT_EQ(d2.reason, DecisionReason::kCacheHit);
}

TEST_F(TtftSpillTest, HolderCapStopsSpilling) {
  Setup(1, 40000);
  ASSERT_OK_AND_ASSIGN(RoutingDecision d, core_->Route(RequestId(1), request_, milliseconds(0)));
  EXPECT_EQ(d.worker, WorkerId(0));
  EXPECT_EQ(d.reason, DecisionReason::kCacheHit);
}

// A prefix only one worker holds (a conversation) moves only when its holder is 2x slower; a
// prefix two workers already hold spreads at 1.5x. Holder 4,600 queued tokens at 10,000 tok/s
// (~0.47 s) vs an idle worker's own prefill of 2,112 tokens at 8,000 tok/s (~0.26 s): 1.75x.
TEST_F(RouterCoreTest, ASingleHolderNeedsALargerGapToSpill) {
  const RoutingRequest r = Req(Prompt(9, 2048, 64, 0));
  WorkerLoad busy;
  busy.queued_prefill_tokens = 4600;
  busy.prefill_tokens_per_s = 10000;
  auto one = Make(PolicyKind::kTtft, 4);
  ASSERT_OK(one->ApplyKvEvents(WorkerId(0), SnapshotOf(r.chunk_hashes, 32)).status());
  ASSERT_OK(one->UpdateLoad(WorkerId(0), busy));
  ASSERT_OK_AND_ASSIGN(RoutingDecision d1, one->Route(RequestId(1), r, milliseconds(0)));
  EXPECT_EQ(d1.worker, WorkerId(0));
  EXPECT_EQ(d1.reason, DecisionReason::kCacheHit);
  auto two = Make(PolicyKind::kTtft, 4);
  for (uint32_t w : {0u, 1u}) {
    ASSERT_OK(two->ApplyKvEvents(WorkerId(w), SnapshotOf(r.chunk_hashes, 32)).status());
    ASSERT_OK(two->UpdateLoad(WorkerId(w), busy));
  }
  ASSERT_OK_AND_ASSIGN(RoutingDecision d2, two->Route(RequestId(1), r, milliseconds(0)));
  EXPECT_EQ(d2.reason, DecisionReason::kSpill);
  EXPECT_GE(d2.worker.value(), 2u);
}

// The same wait at the holder means different things: behind a prefill queue the request only
// waits its turn, behind a full batch the holders are short of slots for the prefix's demand and
// every later request will queue too. A spill then pays once for another holder, even a little
// ahead of the holder's own TTFT, but only to a worker with a free slot.
TEST_F(RouterCoreTest, AFullBatchSpillsSoonerThanAPrefillQueue) {
  const RoutingRequest r = Req(Prompt(9, 2048, 64, 0));
  auto route = [&](const WorkerLoad& holder, const WorkerLoad& others, PolicyOptions p) {
    auto core = Make(PolicyKind::kTtft, 4, p);
    EXPECT_OK(core->ApplyKvEvents(WorkerId(0), SnapshotOf(r.chunk_hashes, 32)).status());
    for (uint32_t w = 0; w < 4; ++w) {
      EXPECT_OK(core->UpdateLoad(WorkerId(w), w == 0 ? holder : others));
    }
    auto d = core->Route(RequestId(1), r, milliseconds(0));
    EXPECT_OK(d.status());
    return d.ok() ? d->reason : DecisionReason::kLoadOnly;
  };
  WorkerLoad idle;
  idle.prefill_tokens_per_s = 8000;
  idle.decode_tokens_per_s = 1000;
  // A cold worker: 2112 tokens of prefill, 0.264 s.
  WorkerLoad queue = idle;  // 2000 tokens queued: 0.258 s
  queue.queued_prefill_tokens = 2000;
  queue.running_sequences = 4;
  WorkerLoad full = idle;  // 32 running of 32: a slot in ~0.128 s, 0.168 s in all
  full.running_sequences = 32;
  EXPECT_EQ(route(queue, idle, {}), DecisionReason::kCacheHit);
  EXPECT_EQ(route(full, idle, {}), DecisionReason::kSpill);
  // Every other batch full too: a second holder would queue as well.
  EXPECT_EQ(route(full, full, {}), DecisionReason::kCacheHit);
  PolicyOptions off;
  off.spill_factor_saturated = 0;
  EXPECT_EQ(route(full, idle, off), DecisionReason::kCacheHit);

  // Two holders: worker 1 has just taken the prefix (its prefill is queued, its batch has
  // room), worker 0's batch is full. Together they are short of slots: spill. With worker 0
  // not busy, worker 1 keeps it.
  auto route2 = [&](const WorkerLoad& first) {
    auto core = Make(PolicyKind::kTtft, 4);
    for (uint32_t w : {0u, 1u}) {
      EXPECT_OK(core->ApplyKvEvents(WorkerId(w), SnapshotOf(r.chunk_hashes, 32)).status());
    }
    for (uint32_t w = 0; w < 4; ++w) {
      EXPECT_OK(core->UpdateLoad(WorkerId(w), w == 0 ? first : w == 1 ? queue : idle));
    }
    auto d = core->Route(RequestId(1), r, milliseconds(0));
    EXPECT_OK(d.status());
    return d.ok() ? std::make_pair(d->worker, d->reason)
                  : std::make_pair(WorkerId::Invalid(), DecisionReason::kLoadOnly);
  };
  WorkerLoad worker0_full = full;
  worker0_full.queued_prefill_tokens = 8000;  // so that worker 1 is the best holder
  EXPECT_EQ(route2(worker0_full).second, DecisionReason::kSpill);
  WorkerLoad worker0_busy = queue;
  worker0_busy.queued_prefill_tokens = 8000;
  EXPECT_EQ(route2(worker0_busy), std::make_pair(WorkerId(1), DecisionReason::kCacheHit));
}

TEST(ExpectedOutputTokensTest, TheRecentMeanCappedByTheRequestsLimit) {
  RoutingRequest r;
  PickContext none, seen;
  seen.mean_output_tokens = 150.4;
  EXPECT_EQ(ExpectedOutputTokens(r, none), 0);  // PredictTtftSeconds assumes its default
  EXPECT_EQ(ExpectedOutputTokens(r, seen), 150);
  r.max_new_tokens = 64;
  EXPECT_EQ(ExpectedOutputTokens(r, none), 64);
  EXPECT_EQ(ExpectedOutputTokens(r, seen), 64);
  r.max_new_tokens = 4096;
  EXPECT_EQ(ExpectedOutputTokens(r, seen), 150);
}

// The slot wait behind a full batch is (requests ahead) x expected output / decode rate, and
// the expected output is what recent requests generated. The holder's batch is full; with the
// spill factor at 2 (single holder), its ~0.04 s + slot wait loses to a cold worker's 0.264 s
// once the slot wait passes ~0.49 s: outputs of 1,000 tokens (1 s) spill, of 100 do not.
TEST_F(RouterCoreTest, SlotWaitsFollowTheOutputLengthsRequestsHad) {
  const RoutingRequest r = Req(Prompt(9, 2048, 64, 0));
  auto route_after = [&](int32_t outputs) {
    PolicyOptions p;
    p.spill_factor_saturated = 0;  // the plain factors only
    auto core = Make(PolicyKind::kTtft, 4, p);
    EXPECT_OK(core->ApplyKvEvents(WorkerId(0), SnapshotOf(r.chunk_hashes, 32)).status());
    WorkerLoad idle;
    idle.prefill_tokens_per_s = 8000;
    idle.decode_tokens_per_s = 1000;
    for (uint32_t w = 0; w < 4; ++w) EXPECT_OK(core->UpdateLoad(WorkerId(w), idle));
    // Earlier requests (other prompts) ended on their own with `outputs` tokens each.
    for (uint64_t id = 100; id < 110; ++id) {
      EXPECT_OK(core->Route(RequestId(id), Req(Prompt(int(id), 256, 16, 0)), milliseconds(0))
                    .status());
      EXPECT_OK(core->OnFinished(RequestId(id), std::nullopt, outputs));
    }
    WorkerLoad full = idle;
    full.running_sequences = 32;
    EXPECT_OK(core->UpdateLoad(WorkerId(0), full));
    auto d = core->Route(RequestId(1), r, milliseconds(0));
    EXPECT_OK(d.status());
    return d.ok() ? d->reason : DecisionReason::kLoadOnly;
  };
  EXPECT_EQ(route_after(1000), DecisionReason::kSpill);
  EXPECT_EQ(route_after(100), DecisionReason::kCacheHit);
}

TEST_F(RouterCoreTest, DefaultSpillIsLoadDrivenWithoutAHolderCount) {
  // 8 workers. Worker 0 holds the prefix and is slow: the first request spills (second holder);
  // once both holders are slow, a third one (no count cap by default: load decides).
  auto core = Make(PolicyKind::kTtft, 8);
  const RoutingRequest r = Req(Prompt(9, 2048, 64, 0));
  ASSERT_OK(core->ApplyKvEvents(WorkerId(0), SnapshotOf(r.chunk_hashes, 32)).status());
  WorkerLoad slow;
  slow.queued_prefill_tokens = 40000;
  slow.prefill_tokens_per_s = 8000;
  ASSERT_OK(core->UpdateLoad(WorkerId(0), slow));
  ASSERT_OK_AND_ASSIGN(RoutingDecision d1, core->Route(RequestId(1), r, milliseconds(0)));
  EXPECT_EQ(d1.reason, DecisionReason::kSpill);
  ASSERT_NE(d1.worker, WorkerId(0));
  ASSERT_OK(core->UpdateLoad(d1.worker, slow));
  ASSERT_OK_AND_ASSIGN(RoutingDecision d2, core->Route(RequestId(2), r, milliseconds(1)));
  EXPECT_EQ(d2.reason, DecisionReason::kSpill);
  EXPECT_NE(d2.worker, WorkerId(0));
  EXPECT_NE(d2.worker, d1.worker);
  // With a count cap of 2 (the old 25% of 8 workers), the third spill is refused.
  PolicyOptions capped;
  capped.max_holder_fraction = 0.25;
  auto old = Make(PolicyKind::kTtft, 8, capped);
  ASSERT_OK(old->ApplyKvEvents(WorkerId(0), SnapshotOf(r.chunk_hashes, 32)).status());
  ASSERT_OK(old->UpdateLoad(WorkerId(0), slow));
  ASSERT_OK_AND_ASSIGN(RoutingDecision o1, old->Route(RequestId(1), r, milliseconds(0)));
  ASSERT_EQ(o1.reason, DecisionReason::kSpill);
  ASSERT_OK(old->UpdateLoad(o1.worker, slow));
  ASSERT_OK_AND_ASSIGN(RoutingDecision o2, old->Route(RequestId(2), r, milliseconds(1)));
  EXPECT_EQ(o2.reason, DecisionReason::kCacheHit);
}

// Issue 19's failure, small: every prompt starts with the same 512-token block, which only
// worker 0 holds at first. The block saves little of a 4.5k-token prompt, so it must not make
// worker 0 the only candidate: 40 requests in a row (never finishing, so load piles up in the
// router's own view) spread over the workers.
TEST_F(RouterCoreTest, APrefixSharedByAllDoesNotPinTheLoadOnItsHolders) {
  auto core = Make(PolicyKind::kTtft, 4);
  const RoutingRequest first = Req(Prompt(1, 512, 4000, 0));
  ASSERT_OK(core->ApplyKvEvents(WorkerId(0), SnapshotOf(first.chunk_hashes, 8)).status());
  std::map<uint32_t, int> per_worker;
  for (int i = 0; i < 40; ++i) {
    ASSERT_OK_AND_ASSIGN(RoutingDecision d,
                         core->Route(RequestId(100 + i), Req(Prompt(1, 512, 4000, i + 1)),
                                     milliseconds(i)));
    per_worker[d.worker.value()]++;
  }
  EXPECT_EQ(per_worker.size(), 4u);
  for (const auto& [w, n] : per_worker) EXPECT_LE(n, 14) << "worker " << w;
  // The old rule (holders by match length alone, cap 25%) pins all of them on worker 0.
  PolicyOptions old;
  old.similar_fraction = 0;
  old.max_holder_fraction = 0.25;
  auto pinned = Make(PolicyKind::kTtft, 4, old);
  ASSERT_OK(pinned->ApplyKvEvents(WorkerId(0), SnapshotOf(first.chunk_hashes, 8)).status());
  ASSERT_OK(pinned->ApplyKvEvents(WorkerId(1), SnapshotOf(first.chunk_hashes, 8)).status());
  int on_holders = 0;
  for (int i = 0; i < 40; ++i) {
    ASSERT_OK_AND_ASSIGN(RoutingDecision d,
                         pinned->Route(RequestId(100 + i), Req(Prompt(1, 512, 4000, i + 1)),
                                       milliseconds(i)));
    on_holders += d.worker == WorkerId(0) || d.worker == WorkerId(1);
  }
  EXPECT_EQ(on_holders, 40);
}

// A match that saves most of the prompt still decides over moderate load differences.
TEST_F(RouterCoreTest, ALongMatchStillWinsOverModerateLoad) {
  auto core = Make(PolicyKind::kTtft, 4);
  const RoutingRequest conv = Req(Prompt(2, 6400, 300, 1));  // 100 chunks held by worker 2
  ASSERT_OK(core->ApplyKvEvents(WorkerId(2), SnapshotOf(conv.chunk_hashes, 100)).status());
  WorkerLoad busy;
  busy.queued_prefill_tokens = 3000;
  busy.prefill_tokens_per_s = 8000;
  ASSERT_OK(core->UpdateLoad(WorkerId(2), busy));
  ASSERT_OK_AND_ASSIGN(RoutingDecision d, core->Route(RequestId(1), conv, milliseconds(0)));
  EXPECT_EQ(d.worker, WorkerId(2));
  EXPECT_EQ(d.reason, DecisionReason::kCacheHit);
}

// A decision on a long prompt outlives decision_ttl until its predicted first token: a second
// request of the same 100k-token document 5 s later still follows it (at 2 s it would be lost,
// and the document prefilled twice).
TEST_F(RouterCoreTest, ALongPrefillKeepsItsDecisionPastTheTtl) {
  auto core = Make(PolicyKind::kTtft, 4);
  std::vector<TokenId> doc = Prompt(3, 100000, 64, 1);
  ASSERT_OK_AND_ASSIGN(RoutingDecision d1, core->Route(RequestId(1), Req(doc), milliseconds(0)));
  EXPECT_GT(d1.predicted_ttft_s, 5.0);  // 100k tokens at the default 8,000 tokens/s
  std::vector<TokenId> again = Prompt(3, 100000, 64, 2);
  ASSERT_OK_AND_ASSIGN(RoutingDecision d2,
                       core->Route(RequestId(2), Req(again), milliseconds(5000)));
  EXPECT_EQ(d2.worker, d1.worker);
  EXPECT_GT(d2.predicted_cached_tokens, 60000);
}

TEST_F(RouterCoreTest, HashedWorkerIdsWork) {
  // The process derives ids from worker names: large, unordered values.
  RouterCoreOptions o;
  o.chain_seeds = {kChainSeed};
  ASSERT_OK_AND_ASSIGN(auto core, RouterCore::Create(o));
  std::vector<uint32_t> ids;
  for (uint32_t i = 0; i < 40; ++i) ids.push_back(static_cast<uint32_t>(Mix64(i) >> 33) + 70000);
  for (uint32_t id : ids) {
    ASSERT_OK(core->AddWorker(Info(id)));
    ASSERT_OK(core->ApplyKvEvents(WorkerId(id), SnapshotOf({}, 0)).status());
  }
  for (int t = 0; t < 20; ++t) {
    const RoutingRequest r = Req(Prompt(t, 512, 32, t));
    const uint32_t holder = ids[static_cast<size_t>(t) * 7 % ids.size()];
    ASSERT_OK(core->ApplyKvEvents(WorkerId(holder), SnapshotOf(r.chunk_hashes, 8)).status());
    const auto matches = core->index().LongestMatch(r.chunk_hashes, milliseconds(0));
    for (size_t i = 1; i < matches.size(); ++i) EXPECT_LT(matches[i - 1].worker, matches[i].worker);
    ASSERT_OK_AND_ASSIGN(RoutingDecision d, core->Route(RequestId(t + 1), r, milliseconds(0)));
    EXPECT_EQ(d.worker, WorkerId(holder)) << "tenant " << t;
    EXPECT_EQ(d.predicted_cached_tokens, 512);
    ASSERT_OK(core->OnFinished(RequestId(t + 1)));
  }
}

TEST_F(RouterCoreTest, UnusableIndexFallsBackToLoadOnly) {
  RouterCoreOptions o;
  o.chain_seeds = {kChainSeed};
  ASSERT_OK_AND_ASSIGN(auto core, RouterCore::Create(o));
  for (uint32_t w = 0; w < 3; ++w) {
    ASSERT_OK(core->AddWorker(Info(w)));
    WorkerLoad l;
    l.queued_prefill_tokens = w == 1 ? 0 : 50000;
    ASSERT_OK(core->UpdateLoad(WorkerId(w), l));
    // A gap before any snapshot: never usable.
    KvEventBatch inc;
    inc.generation = 1;
    inc.sequence = 7;
    inc.evicted = {1};
    ASSERT_OK_AND_ASSIGN(KvApplyOutcome out, core->ApplyKvEvents(WorkerId(w), inc));
    EXPECT_EQ(out, KvApplyOutcome::kNeedSnapshot);
  }
  ASSERT_OK_AND_ASSIGN(RoutingDecision d,
                       core->Route(RequestId(1), Req(Prompt(2, 512, 20, 0)), milliseconds(0)));
  EXPECT_EQ(d.worker, WorkerId(1));
  EXPECT_EQ(d.reason, DecisionReason::kLoadOnly);
}

TEST(PolicyTest, NoIndexMeansLoadOnlyAndNoWorkersIsTheOnlyError) {
  ASSERT_OK_AND_ASSIGN(auto policy, MakePolicy("ttft"));
  std::vector<WorkerState> workers(3);
  for (uint32_t w = 0; w < 3; ++w) {
    workers[w].info = Info(w);
    workers[w].load.queued_prefill_tokens = w == 2 ? 0 : 1000;
  }
  RoutingRequest r;
  r.prompt_tokens = 100;
  ASSERT_OK_AND_ASSIGN(RoutingDecision d, policy->Pick(r, PickContext{.workers = workers}));
  EXPECT_EQ(d.worker, WorkerId(2));
  EXPECT_EQ(d.reason, DecisionReason::kLoadOnly);
  for (auto& w : workers) w.accepting = false;
  for (PolicyKind k : AllPolicyKinds()) {
    ASSERT_OK_AND_ASSIGN(auto p, MakePolicy(k));
    EXPECT_EQ(p->Pick(r, PickContext{.workers = workers}).status().code(), StatusCode::kUnavailable)
        << p->name();
    EXPECT_EQ(p->Pick(r, PickContext{}).status().code(), StatusCode::kUnavailable) << p->name();
  }
}

TEST(PolicyTest, NamesParseAndBadOptionsAreRejected) {
  for (PolicyKind k : AllPolicyKinds()) {
    ASSERT_OK_AND_ASSIGN(PolicyKind parsed, ParsePolicyKind(PolicyKindName(k)));
    EXPECT_EQ(parsed, k);
  }
  EXPECT_EQ(MakePolicy("fastest").status().code(), StatusCode::kInvalidArgument);
  PolicyOptions bad;
  bad.spill_factor = 0.5;
  EXPECT_EQ(MakePolicy(PolicyKind::kTtft, bad).status().code(), StatusCode::kInvalidArgument);
  bad = {};
  bad.virtual_nodes = 0;
  EXPECT_EQ(MakePolicy(PolicyKind::kConsistentHash, bad).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(PolicyTest, RoundRobinCyclesOverAcceptingWorkers) {
  ASSERT_OK_AND_ASSIGN(auto policy, MakePolicy(PolicyKind::kRoundRobin));
  std::vector<WorkerState> workers(4);
  for (uint32_t w = 0; w < 4; ++w) workers[w].info = Info(w);
  workers[2].accepting = false;
  std::vector<uint32_t> got;
  RoutingRequest r;
  for (int i = 0; i < 6; ++i) {
    ASSERT_OK_AND_ASSIGN(RoutingDecision d, policy->Pick(r, PickContext{.workers = workers}));
    got.push_back(d.worker.value());
    EXPECT_EQ(d.reason, DecisionReason::kRoundRobin);
  }
  EXPECT_EQ(got, (std::vector<uint32_t>{0, 1, 3, 0, 1, 3}));
}

TEST(PolicyTest, LeastLoadedTakesFewestRequests) {
  ASSERT_OK_AND_ASSIGN(auto policy, MakePolicy(PolicyKind::kLeastLoaded));
  std::vector<WorkerState> workers(3);
  for (uint32_t w = 0; w < 3; ++w) workers[w].info = Info(w);
  workers[0].load.running_sequences = 4;
  workers[1].load.running_sequences = 1;
  workers[1].load.queued_requests = 1;
  workers[2].load.running_sequences = 3;
  RoutingRequest r;
  ASSERT_OK_AND_ASSIGN(RoutingDecision d, policy->Pick(r, PickContext{.workers = workers}));
  EXPECT_EQ(d.worker, WorkerId(1));
}

TEST(PolicyTest, ConsistentHashIsStickyAndMinimalOnRemoval) {
  ASSERT_OK_AND_ASSIGN(auto policy, MakePolicy(PolicyKind::kConsistentHash));
  std::vector<WorkerState> workers(8);
  for (uint32_t w = 0; w < 8; ++w) workers[w].info = Info(w);
  std::map<uint64_t, WorkerId> first;
  for (uint64_t k = 0; k < 500; ++k) {
    RoutingRequest r;
    r.chunk_hashes = {Mix64(k), 7};
    r.chunk_size = 64;
    ASSERT_OK_AND_ASSIGN(RoutingDecision d, policy->Pick(r, PickContext{.workers = workers}));
    EXPECT_EQ(d.reason, DecisionReason::kConsistentHash);
    first[k] = d.worker;
    ASSERT_OK_AND_ASSIGN(RoutingDecision again, policy->Pick(r, PickContext{.workers = workers}));
    EXPECT_EQ(again.worker, d.worker);
  }
  // Worker 5 stops accepting: only its keys move.
  workers[5].accepting = false;
  for (uint64_t k = 0; k < 500; ++k) {
    RoutingRequest r;
    r.chunk_hashes = {Mix64(k)};
    ASSERT_OK_AND_ASSIGN(RoutingDecision d, policy->Pick(r, PickContext{.workers = workers}));
    if (first[k] != WorkerId(5)) {
      EXPECT_EQ(d.worker, first[k]);
    }
    EXPECT_NE(d.worker, WorkerId(5));
  }
}

TEST_F(RouterCoreTest, CacheAwareThresholdFollowsCacheUnlessImbalanced) {
  PolicyOptions p;
  p.balance_abs_threshold = 4;
  auto core = Make(PolicyKind::kCacheAwareThreshold, 3, p);
  const RoutingRequest r = Req(Prompt(4, 640, 64, 0));  // 10 of 11 chunks cached on worker 2
  ASSERT_OK(core->ApplyKvEvents(WorkerId(2), SnapshotOf(r.chunk_hashes, 10)).status());
  WorkerLoad l;
  l.running_sequences = 3;
  ASSERT_OK(core->UpdateLoad(WorkerId(2), l));
  ASSERT_OK_AND_ASSIGN(RoutingDecision d, core->Route(RequestId(1), r, milliseconds(0)));
  EXPECT_EQ(d.worker, WorkerId(2));
  EXPECT_EQ(d.reason, DecisionReason::kCacheHit);
  // A short match (below cache_threshold) goes to the least loaded worker.
  const RoutingRequest low = Req(Prompt(4, 64, 640, 1));
  ASSERT_OK_AND_ASSIGN(RoutingDecision d2, core->Route(RequestId(2), low, milliseconds(0)));
  EXPECT_EQ(d2.reason, DecisionReason::kLeastLoaded);
  EXPECT_NE(d2.worker, WorkerId(2));
  // Imbalance beyond both thresholds: least loaded even for a full match.
  l.running_sequences = 20;
  ASSERT_OK(core->UpdateLoad(WorkerId(2), l));
  ASSERT_OK_AND_ASSIGN(RoutingDecision d3, core->Route(RequestId(3), r, milliseconds(0)));
  EXPECT_EQ(d3.reason, DecisionReason::kImbalance);
  EXPECT_NE(d3.worker, WorkerId(2));
}

TEST(LoadTrackerTest, RequestsCountFromThePickOn) {
  LoadTracker t;
  WorkerLoad reported;
  reported.queued_prefill_tokens = 100;
  reported.running_sequences = 1;
  t.SetReported(WorkerId(0), reported);
  ASSERT_OK(t.OnPicked(RequestId(1), WorkerId(0), 500));
  ASSERT_OK(t.OnPicked(RequestId(2), WorkerId(0), 300));
  EXPECT_EQ(t.OnPicked(RequestId(2), WorkerId(0), 1).code(), StatusCode::kAlreadyExists);
  WorkerLoad e = t.Effective(WorkerId(0));
  EXPECT_EQ(e.queued_prefill_tokens, 900u);  // the report predates both picks: on top of it
  EXPECT_EQ(e.queued_requests, 2);
  EXPECT_EQ(t.InFlight(WorkerId(0)), 2);
  ASSERT_OK(t.OnFirstToken(RequestId(1)));
  e = t.Effective(WorkerId(0));
  EXPECT_EQ(e.queued_prefill_tokens, 400u);
  EXPECT_EQ(e.running_sequences, 1);
  ASSERT_OK(t.OnFinished(RequestId(2)));  // finished before its first token (cancelled)
  ASSERT_OK(t.OnFinished(RequestId(1)));
  e = t.Effective(WorkerId(0));
  EXPECT_EQ(e.queued_prefill_tokens, 100u);  // back to the report
  EXPECT_EQ(t.InFlight(WorkerId(0)), 0);
  EXPECT_EQ(t.OnFinished(RequestId(1)).code(), StatusCode::kNotFound);
  EXPECT_EQ(t.OnFirstToken(RequestId(9)).code(), StatusCode::kNotFound);
}

TEST(LoadTrackerTest, ReportsTakeOverAPrefillInProgress) {
  LoadTracker t;
  const WorkerId w(0);
  auto report = [&](uint64_t queued_prefill) {
    WorkerLoad l;
    l.queued_prefill_tokens = queued_prefill;
    l.running_sequences = 1;
    t.SetReported(w, l);
  };
  report(0);
  ASSERT_OK(t.OnPicked(RequestId(1), w, 120000));  // a cold 120k-token document
  EXPECT_EQ(t.Effective(w).queued_prefill_tokens, 120000u);
  // The next report may have been taken before the request arrived: the own view stands.
  report(0);
  EXPECT_EQ(t.Effective(w).queued_prefill_tokens, 120000u);
  // Two reports after the pick the worker has it: its progress is the truth, not the pick's
  // estimate (which lasted until the first token before: 100k tokens too high below).
  report(119000);
  EXPECT_EQ(t.Effective(w).queued_prefill_tokens, 119000u);
  report(20000);
  EXPECT_EQ(t.Effective(w).queued_prefill_tokens, 20000u);
  // A new pick counts on top of the report it postdates, then the same way.
  ASSERT_OK(t.OnPicked(RequestId(2), w, 300));
  EXPECT_EQ(t.Effective(w).queued_prefill_tokens, 20300u);
  report(10300);
  EXPECT_EQ(t.Effective(w).queued_prefill_tokens, 10300u);
  ASSERT_OK(t.OnFirstToken(RequestId(1)));  // out of every sum already: nothing changes
  EXPECT_EQ(t.Effective(w).queued_prefill_tokens, 10300u);
  // A correction of the last report (the router saw a request start) is no newer report: a
  // pick made since still counts on top, twice over.
  ASSERT_OK(t.OnPicked(RequestId(3), w, 5000));
  WorkerLoad corrected;
  corrected.queued_prefill_tokens = 10000;
  t.SetReported(w, corrected, /*fresh=*/false);
  t.SetReported(w, corrected, /*fresh=*/false);
  EXPECT_EQ(t.Effective(w).queued_prefill_tokens, 15000u);
  ASSERT_OK(t.OnFinished(RequestId(3)));
  ASSERT_OK(t.OnFinished(RequestId(2)));  // released from the sum it was in
  report(0);
  EXPECT_EQ(t.Effective(w).queued_prefill_tokens, 0u);
  EXPECT_EQ(t.InFlight(w), 1);
}

TEST_F(RouterCoreTest, LoadCountsAtPickTimeSoABurstSpreads) {
  // 8 requests arrive before any load report: counted at pick time, least_loaded spreads them.
  auto core = Make(PolicyKind::kLeastLoaded, 4);
  std::map<uint32_t, int> per_worker;
  for (int i = 0; i < 8; ++i) {
    ASSERT_OK_AND_ASSIGN(
        RoutingDecision d,
        core->Route(RequestId(i + 1), Req(Prompt(i, 512, 10, i)), milliseconds(0)));
    ++per_worker[d.worker.value()];
  }
  for (const auto& [w, n] : per_worker) EXPECT_EQ(n, 2) << "worker " << w;
}

TEST_F(RouterCoreTest, MembershipAndErrors) {
  auto core = Make(PolicyKind::kTtft, 2);
  EXPECT_EQ(core->UpdateLoad(WorkerId(9), {}).code(), StatusCode::kNotFound);
  EXPECT_EQ(core->RemoveWorker(WorkerId(9)).code(), StatusCode::kNotFound);
  WorkerInfo bad = Info(5);
  bad.max_batch_size = 0;
  EXPECT_EQ(core->AddWorker(bad).code(), StatusCode::kInvalidArgument);
  const RoutingRequest r = Req(Prompt(1, 256, 10, 0));
  ASSERT_OK(core->ApplyKvEvents(WorkerId(1), SnapshotOf(r.chunk_hashes, 4)).status());
  ASSERT_OK_AND_ASSIGN(RoutingDecision d, core->Route(RequestId(1), r, milliseconds(0)));
  EXPECT_EQ(d.worker, WorkerId(1));
  EXPECT_EQ(core->Route(RequestId(1), r, milliseconds(0)).status().code(),
            StatusCode::kAlreadyExists);
  // A restarted worker (new generation) loses its entries at once.
  WorkerInfo restarted = Info(1);
  restarted.generation = 2;
  ASSERT_OK(core->AddWorker(restarted));
  EXPECT_TRUE(core->index().LongestMatch(r.chunk_hashes, milliseconds(0)).empty());
  ASSERT_OK(core->RemoveWorker(WorkerId(1)));
  ASSERT_OK(core->SetAccepting(WorkerId(0), false));
  EXPECT_EQ(core->Route(RequestId(2), r, milliseconds(0)).status().code(),
            StatusCode::kUnavailable);
  ASSERT_OK(core->OnFinished(RequestId(1)));  // still known after its worker left
}

TEST(PrecisionStatsTest, PrecisionAndRecall) {
  PrecisionStats s;
  EXPECT_DOUBLE_EQ(s.Precision(), 1.0);
  s.Add(100, 100);
  s.Add(200, 50);
  s.Add(0, 64);
  EXPECT_EQ(s.requests, 3u);
  EXPECT_EQ(s.exact, 1u);
  EXPECT_DOUBLE_EQ(s.Precision(), 150.0 / 300.0);
  EXPECT_DOUBLE_EQ(s.Recall(), 150.0 / 214.0);
}

}  // namespace
}  // namespace chunkserve::router
