// Soak (label `slow`): thousands of requests against one worker process with random
// cancellations and disconnects; afterwards nothing is referenced, nothing runs or waits, and the
// worker's resident memory has not grown beyond a bound.
#include <capnp/message.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "runtime/wire/client.h"
#include "tests/testing/random.h"
#include "tests/testing/status_matchers.h"
#include "tests/worker/worker_process.h"

namespace chunkserve::worker {
namespace {

using namespace std::chrono_literals;
using testing::WorkerProcess;
using wire::DecodedMessage;
using wire::WireClient;
using wire::schema::Envelope;

long RssKb(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  }
  return -1;
}

// Sends one request; returns its max_new_tokens.
Result<int32_t> Generate(WireClient& c, uint64_t id, std::mt19937_64& rng) {
  capnp::MallocMessageBuilder b;
  auto g = b.initRoot<Envelope>().initGenerate();
  g.setRequestId(id);
  // A few shared system prompts plus a random tail.
  const int system = static_cast<int>(rng() % 4);
  const int tail = 1 + static_cast<int>(rng() % 40);
  auto p = g.initPrompt(static_cast<unsigned>(64 + tail));
  for (unsigned i = 0; i < 64; ++i) p.set(i, static_cast<uint32_t>((system * 31 + i * 7) % 200));
  for (unsigned i = 64; i < p.size(); ++i) p.set(i, static_cast<uint32_t>(rng() % 200));
  const int32_t max_new = 1 + static_cast<int32_t>(rng() % 24);
  g.setMaxNewTokens(max_new);
  CHUNKSERVE_RETURN_IF_ERROR(c.Send(b));
  return max_new;
}

void ClientLoop(WorkerProcess& worker, uint64_t seed, int requests, std::atomic<int>* done) {
  std::mt19937_64 rng(seed);
  std::unique_ptr<WireClient> client;
  for (int i = 0; i < requests; ++i) {
    if (!client) {
      auto c = worker.Connect();
      ASSERT_OK(c.status());
      client = std::move(c).value();
    }
    const uint64_t id = static_cast<uint64_t>(i + 1);
    ASSERT_OK_AND_ASSIGN(const int32_t max_new, Generate(*client, id, rng));
    const int action = static_cast<int>(rng() % 10);  // 0: cancel, 1: disconnect, else finish
    bool ended = false;
    int tokens = 0;
    while (!ended) {
      Result<DecodedMessage> m = client->Receive(60s);
      ASSERT_OK(m.status());
      auto root = m.value().root();
      if (root.which() == Envelope::TOKEN) {
        ++tokens;
        if (tokens == 1 && action == 0) {
          capnp::MallocMessageBuilder b;
          b.initRoot<Envelope>().initCancel().setRequestId(id);
          ASSERT_OK(client->Send(b));
        } else if (tokens == 1 && action == 1) {
          client.reset();  // disconnect mid-stream
          ended = true;
        }
      } else if (root.which() == Envelope::FINISH) {
        // Nothing provokes a failure here: a request ends by its length (all of its tokens
        // streamed, no stop tokens asked), or, when this client cancelled it, by the cancel
        // or by its length if that came first.
        const auto f = root.getFinish();
        const bool length = f.getReason() == wire::schema::FinishReason::LENGTH;
        const bool cancelled = f.getReason() == wire::schema::FinishReason::CANCELLED;
        EXPECT_TRUE(length || (action == 0 && cancelled))
            << "request " << id << " (action " << action << ") ended with reason "
            << static_cast<int>(f.getReason());
        if (length) {
          EXPECT_EQ(tokens, max_new) << "request " << id;
        }
        ended = true;
      } else if (root.which() == Envelope::ERROR) {
        ADD_FAILURE() << "request " << id << " got an Error: " << root.getError().getMessage().cStr();
        ended = true;
      }
    }
    done->fetch_add(1);
  }
}

TEST(WorkerSoakTest, ThousandsOfRequestsReturnToBaseline) {
  ASSERT_OK_AND_ASSIGN(auto worker, WorkerProcess::Start({"--threads", "2", "--kv-cache-mb", "4"}));
  const uint64_t seed = chunkserve::testing::TestSeed();
  constexpr int kThreads = 4;
  constexpr int kPerThread = 600;
  std::atomic<int> done{0};
  long rss_warm = -1;
  {
    // Warm-up round, then measure memory.
    std::thread t(ClientLoop, std::ref(*worker), seed, 100, &done);
    t.join();
    rss_warm = RssKb(worker->pid());
  }
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back(ClientLoop, std::ref(*worker), seed + 1 + i, kPerThread, &done);
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(done.load(), 100 + kThreads * kPerThread);

  ASSERT_OK_AND_ASSIGN(auto client, worker->Connect());
  const auto give_up = std::chrono::steady_clock::now() + 60s;
  int32_t running = -1, queued = -1;
  uint64_t referenced = 1;
  uint64_t capacity = 0, used = 0;
  while (std::chrono::steady_clock::now() < give_up) {
    capnp::MallocMessageBuilder b;
    b.initRoot<Envelope>().initStatsRequest();
    ASSERT_OK(client->Send(b));
    ASSERT_OK_AND_ASSIGN(DecodedMessage m, client->Receive(30s));
    ASSERT_EQ(m.root().which(), Envelope::STATS);
    auto s = m.root().getStats();
    running = s.getRunning();
    queued = s.getQueued();
    referenced = s.getKvBytesReferenced();
    capacity = s.getKvBytesCapacity();
    used = s.getKvBytesUsed();
    if (running == 0 && queued == 0 && referenced == 0) break;
  }
  EXPECT_EQ(running, 0);
  EXPECT_EQ(queued, 0);
  EXPECT_EQ(referenced, 0u);  // only retained (reusable) chunks remain
  EXPECT_LE(used, capacity);
  const long rss_end = RssKb(worker->pid());
  ASSERT_GT(rss_warm, 0);
  EXPECT_LT(rss_end - rss_warm, 64 * 1024)
      << "RSS grew from " << rss_warm << " to " << rss_end << " KiB";
}

}  // namespace
}  // namespace chunkserve::worker
