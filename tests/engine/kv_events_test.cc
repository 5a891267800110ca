// Engine KV events: the callback sees every stored/evicted hash with gap-free sequence numbers,
// and a snapshot equals the replay of the events up to its sequence.
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <mutex>
#include <vector>

#include "runtime/engine/engine.h"
#include "tests/testing/engine_fixture.h"
#include "tests/testing/status_matchers.h"

namespace chunkserve::engine {
namespace {

using namespace std::chrono_literals;

class KvEventsTest : public testing::TinyModelEngineTest {
 protected:
  std::unique_ptr<Engine> MakeEngine(uint64_t kv_bytes) {
    EngineOptions o = Options();
    o.kv_cache_bytes = kv_bytes;
    auto engine = Engine::Create(o);
    EXPECT_OK(engine.status());
    return engine.ok() ? std::move(engine).value() : nullptr;
  }

  void Run(Engine& engine, int first_token, int prompt_len) {
    sched::RequestOptions r;
    for (int i = 0; i < prompt_len; ++i) r.prompt.push_back((first_token + i * 7) % 256);
    r.max_new_tokens = 4;
    auto stream = engine.Submit(r);
    ASSERT_OK(stream.status());
    testing::Drain(**stream);
  }

  // Replays events (sequence must be 1, 2, ...) into hash -> parent.
  static std::map<uint64_t, uint64_t> Replay(const std::vector<KvEvent>& events, uint64_t up_to) {
    std::map<uint64_t, uint64_t> held;
    for (size_t i = 0; i < events.size(); ++i) {
      EXPECT_EQ(events[i].sequence, i + 1);
      if (events[i].sequence > up_to) break;
      if (events[i].kind == KvEvent::Kind::kStored) {
        EXPECT_EQ(held.count(events[i].hash), 0u);
        held[events[i].hash] = events[i].parent_hash;
      } else {
        EXPECT_EQ(held.erase(events[i].hash), 1u);
      }
    }
    return held;
  }

  static std::map<uint64_t, uint64_t> AsMap(const KvSnapshot& s) {
    std::map<uint64_t, uint64_t> m;
    for (const KvEvent& c : s.chunks) m[c.hash] = c.parent_hash;
    return m;
  }

  std::mutex mu_;
  std::vector<KvEvent> events_;
};

TEST_F(KvEventsTest, StoredChunksAreReportedAndSnapshotMatches) {
  auto engine = MakeEngine(8u << 20);
  ASSERT_NE(engine, nullptr);
  engine->SetKvEventCallback([this](const std::vector<KvEvent>& ev) {
    std::lock_guard<std::mutex> lock(mu_);
    events_.insert(events_.end(), ev.begin(), ev.end());
  });
  EXPECT_EQ(engine->GetKvSnapshot().sequence, 0u);
  Run(*engine, 1, 50);  // 3 full chunks of 16 from the prompt
  const KvSnapshot snap = engine->GetKvSnapshot();
  engine->SetKvEventCallback(nullptr);
  std::lock_guard<std::mutex> lock(mu_);
  ASSERT_GE(events_.size(), 3u);
  EXPECT_EQ(snap.sequence, events_.back().sequence);
  EXPECT_EQ(AsMap(snap), Replay(events_, snap.sequence));
  EXPECT_GE(snap.chunks.size(), 3u);
  // The chain: every stored chunk's parent is stored, except the first chunk's seed.
  int roots = 0;
  auto held = AsMap(snap);
  for (const auto& [hash, parent] : held) roots += held.count(parent) == 0;
  EXPECT_EQ(roots, 1);
  engine->Shutdown(ShutdownMode::kDrain);
}

TEST_F(KvEventsTest, EvictionsAreReportedUnderPressure) {
  auto engine = MakeEngine(1u << 20);
  ASSERT_NE(engine, nullptr);
  engine->SetKvEventCallback([this](const std::vector<KvEvent>& ev) {
    std::lock_guard<std::mutex> lock(mu_);
    events_.insert(events_.end(), ev.begin(), ev.end());
  });
  for (int i = 0; i < 40; ++i) Run(*engine, 3 + i * 11, 100);
  const KvSnapshot snap = engine->GetKvSnapshot();
  EXPECT_GT(engine->Stats().evicted_chunks, 0u);
  engine->SetKvEventCallback(nullptr);
  std::lock_guard<std::mutex> lock(mu_);
  int evicted = 0;
  for (const KvEvent& e : events_) evicted += e.kind == KvEvent::Kind::kEvicted;
  EXPECT_GT(evicted, 0);
  EXPECT_EQ(AsMap(snap), Replay(events_, snap.sequence));
  engine->Shutdown(ShutdownMode::kDrain);
}

}  // namespace
}  // namespace chunkserve::engine
