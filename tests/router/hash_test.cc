// Router-side hashing equals the worker's: test vectors computed independently with Python's
// xxhash package, and a real Engine (tiny model, in process) whose KV events name exactly the
// hashes MakeRoutingRequest computes for the same prompt.
#include <gtest/gtest.h>

#include <chrono>
#include <mutex>
#include <vector>

#include "router/routing.h"
#include "runtime/engine/engine.h"
#include "runtime/kvcache/chunk_hash.h"
#include "tests/testing/engine_fixture.h"
#include "tests/testing/status_matchers.h"

namespace chunkserve::router {
namespace {

using namespace std::chrono_literals;

// Python:
//   seed = xxh3_64_intdigest(b"CSKVHASH" + struct.pack("<QiI", 0xC0FFEE, 64, 1))
//   toks = [(i * 31337 + 11) % 32000 for i in range(2048 + 17)]
//   h = seed; for each full chunk c: h = xxh3_64_intdigest(struct.pack("<64i", *c), seed=h)
TEST(RouterHashTest, TwoKTokenPromptMatchesPythonVectors) {
  std::vector<TokenId> tokens;
  for (int i = 0; i < 2048 + 17; ++i) tokens.push_back((i * 31337 + 11) % 32000);
  const uint64_t seed = kv::ChunkHashSeed(0xC0FFEE, 64);
  EXPECT_EQ(seed, 0x8fd64ca9ddcc6b18ULL);
  ASSERT_OK_AND_ASSIGN(RoutingRequest r, MakeRoutingRequest(seed, 64, tokens, 16));
  ASSERT_EQ(r.chunk_hashes.size(), 32u);  // the 17-token tail is not hashed
  EXPECT_EQ(r.chunk_hashes[0], 0x6fbc58f41f105284ULL);
  EXPECT_EQ(r.chunk_hashes[1], 0x286f216bb35fa304ULL);
  EXPECT_EQ(r.chunk_hashes[2], 0x11052197326e64bfULL);
  EXPECT_EQ(r.chunk_hashes[31], 0x7b17038906636659ULL);
  EXPECT_EQ(r.prompt_tokens, 2065);
  EXPECT_EQ(r.chunk_size, 64);
  EXPECT_EQ(r.max_new_tokens, 16);
  EXPECT_EQ(MakeRoutingRequest(seed, 0, tokens).status().code(), StatusCode::kInvalidArgument);
}

TEST(RouterHashTest, PromptsSharingAThousandTokensShareFifteenChunks) {
  // 1000 shared tokens = 15 full chunks of 64 (+40 tokens into the 16th, which differs).
  std::vector<TokenId> a, b;
  for (int i = 0; i < 1000; ++i) a.push_back((i * 7) % 32000);
  b = a;
  a.insert(a.end(), 100, 1);
  b.insert(b.end(), 100, 2);
  const uint64_t seed = kv::ChunkHashSeed(0xC0FFEE, 64);
  ASSERT_OK_AND_ASSIGN(RoutingRequest ra, MakeRoutingRequest(seed, 64, a));
  ASSERT_OK_AND_ASSIGN(RoutingRequest rb, MakeRoutingRequest(seed, 64, b));
  ASSERT_EQ(ra.chunk_hashes.size(), 17u);
  size_t k = 0;
  while (k < 17 && ra.chunk_hashes[k] == rb.chunk_hashes[k]) ++k;
  EXPECT_EQ(k, 15u);
}

class RouterEngineHashTest : public ::chunkserve::testing::TinyModelEngineTest {
 protected:
  RouterEngineHashTest() : TinyModelEngineTest(/*model_seed=*/11) {}

  void SetUp() override {
    TinyModelEngineTest::SetUp();
    if (HasFatalFailure()) return;
    auto e = engine::Engine::Create(Options());
    ASSERT_OK(e.status());
    engine_ = std::move(e).value();
  }

  void TearDown() override {
    if (engine_) engine_->Shutdown(engine::ShutdownMode::kDrain);
  }

  void Run(const std::vector<TokenId>& prompt) {
    sched::RequestOptions r;
    r.prompt = prompt;
    r.max_new_tokens = 2;
    auto stream = engine_->Submit(r);
    ASSERT_OK(stream.status());
    ::chunkserve::testing::Drain(**stream);
  }

  std::unique_ptr<engine::Engine> engine_;
};

// The KV capacity a worker registers with (Register.capacitySlots = kv_capacity_tokens) follows
// from the arena geometry: 2 layers x (K + V) x 2 kv heads x 16 dims x 4 bytes (f32) = 512 bytes
// per token, 16-token slots of 8 KiB, and 8 MiB / 8 KiB = 1024 slots.
TEST_F(RouterEngineHashTest, EngineExposesItsKvCapacityInSlotsAndTokens) {
  const engine::EngineStats s = engine_->Stats();
  EXPECT_EQ(s.kv_bytes_per_slot, 2u * 2 * 2 * 16 * 4 * 16);
  EXPECT_EQ(s.kv_slots_total, 1024);
  EXPECT_EQ(s.kv_capacity_tokens, 1024 * 16);
  EXPECT_EQ(s.kv_bytes_capacity, uint64_t{8} << 20);
  // Fixed at creation: still the same after serving.
  Run(std::vector<TokenId>(40, 7));
  EXPECT_EQ(engine_->Stats().kv_capacity_tokens, 1024 * 16);
}

TEST_F(RouterEngineHashTest, EngineKvEventsNameTheRouterHashes) {
  std::mutex mu;
  std::vector<engine::KvEvent> events;
  engine_->SetKvEventCallback([&](const std::vector<engine::KvEvent>& ev) {
    std::lock_guard<std::mutex> lock(mu);
    events.insert(events.end(), ev.begin(), ev.end());
  });
  std::vector<TokenId> prompt;
  for (int i = 0; i < 70; ++i) prompt.push_back((i * 37 + 3) % 256);  // 4 full chunks of 16
  Run(prompt);
  engine_->SetKvEventCallback(nullptr);

  const uint64_t seed = kv::ChunkHashSeed(engine_->model_fingerprint(), engine_->chunk_size());
  ASSERT_OK_AND_ASSIGN(RoutingRequest r, MakeRoutingRequest(seed, engine_->chunk_size(), prompt));
  ASSERT_EQ(r.chunk_hashes.size(), 4u);
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_GE(events.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(events[i].kind, engine::KvEvent::Kind::kStored);
    EXPECT_EQ(events[i].hash, r.chunk_hashes[i]) << "chunk " << i;
    EXPECT_EQ(events[i].parent_hash, i == 0 ? seed : r.chunk_hashes[i - 1]) << "chunk " << i;
  }

  // The same events, through the index as the router process feeds them: the worker matches the
  // whole chain.
  RouterCoreOptions o;
  o.chain_seeds = {seed};
  ASSERT_OK_AND_ASSIGN(auto core, RouterCore::Create(o));
  WorkerInfo info;
  info.id = WorkerId(0);
  info.generation = 1;
  ASSERT_OK(core->AddWorker(info));
  KvEventBatch snap;
  snap.generation = 1;
  snap.snapshot = true;
  ASSERT_OK(core->ApplyKvEvents(WorkerId(0), snap).status());
  KvEventBatch inc;
  inc.generation = 1;
  for (const engine::KvEvent& e : events) {
    if (e.kind == engine::KvEvent::Kind::kStored) {
      inc.stored.push_back({e.hash, e.parent_hash});
    } else {
      inc.evicted.push_back(e.hash);
    }
    inc.sequence = e.sequence;
  }
  ASSERT_OK_AND_ASSIGN(KvApplyOutcome out, core->ApplyKvEvents(WorkerId(0), inc));
  EXPECT_EQ(out, KvApplyOutcome::kApplied);
  const auto matches = core->index().LongestMatch(r.chunk_hashes, RouterTime(0));
  ASSERT_EQ(matches.size(), 1u);
  EXPECT_EQ(matches[0].matched_chunks, 4);
  // And the snapshot the worker would send on (re)subscription says the same.
  const engine::KvSnapshot s = engine_->GetKvSnapshot();
  KvEventBatch resync;
  resync.generation = 1;
  resync.sequence = s.sequence;
  resync.snapshot = true;
  for (const engine::KvEvent& e : s.chunks) resync.stored.push_back({e.hash, e.parent_hash});
  ASSERT_OK(core->ApplyKvEvents(WorkerId(0), resync).status());
  EXPECT_EQ(core->index().LongestMatch(r.chunk_hashes, RouterTime(0)).at(0).matched_chunks, 4);
}

}  // namespace
}  // namespace chunkserve::router
