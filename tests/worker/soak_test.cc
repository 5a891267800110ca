// Soak (label `slow`): thousands of requests against one worker process with random
// cancellations and disconnects, in a KV cache small enough to evict and preempt all the time.
// Every token stream, per request id, is the one a solo greedy run of the same prompt generates
// (an in-process engine with the worker's settings, one request at a time), whole when the request
// ran to its length and a prefix of it when it was cancelled or its client went away; no request
// gets an Error. Afterwards nothing is referenced, nothing runs or waits, and the worker's
// resident memory has not grown beyond a bound.
#include <capnp/message.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <iostream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "runtime/engine/engine.h"
#include "runtime/wire/client.h"
#include "tests/testing/engine_fixture.h"
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

// The worker under test: two threads and a 1 MiB KV cache of 16-token chunks, 16 slots (256
// tokens) of the built-in model's KV, against four clients' requests of up to 128 tokens each:
// chunks are evicted and running requests preempted (and recomputed) all the time.
const std::vector<std::string> kWorkerArgs = {"--threads",    "2", "--kv-cache-mb", "1",
                                              "--chunk-size", "16"};
constexpr int32_t kMaxNew = 24;

// The prompts requests draw from: a few shared system prompts, each with random tails (1..40
// tokens). A fixed pool, so that the solo reference runs once per prompt, not per request.
std::vector<std::vector<uint32_t>> PromptPool(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::vector<uint32_t>> pool;
  for (int system = 0; system < 4; ++system) {
    for (int t = 0; t < 8; ++t) {
      std::vector<uint32_t> p;
      for (unsigned i = 0; i < 64; ++i) p.push_back((system * 31 + i * 7) % 200);
      const int tail = 1 + static_cast<int>(rng() % 40);
      for (int i = 0; i < tail; ++i) p.push_back(static_cast<uint32_t>(rng() % 200));
      pool.push_back(std::move(p));
    }
  }
  return pool;
}

// kMaxNew greedy tokens of each prompt from an in-process engine with the worker's settings, one
// request at a time: what every request must stream (its first max_new of them).
std::vector<std::vector<uint32_t>> SoloGreedy(const std::vector<std::vector<uint32_t>>& prompts) {
  engine::EngineOptions o;
  o.tiny_model = true;  // the worker's --tiny-model (WorkerProcess adds it)
  o.num_threads = 2;
  o.kv_cache_bytes = 1u << 20;
  o.chunk_size = 16;
  std::vector<sched::RequestOptions> requests(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    requests[i].prompt.assign(prompts[i].begin(), prompts[i].end());
    requests[i].max_new_tokens = kMaxNew;
  }
  const std::vector<chunkserve::testing::StreamOutcome> runs =
      chunkserve::testing::RunEachAlone(o, requests);
  std::vector<std::vector<uint32_t>> out(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    out[i].assign(runs[i].tokens.begin(), runs[i].tokens.end());
    EXPECT_EQ(out[i].size(), static_cast<size_t>(kMaxNew)) << "solo run of prompt " << i;
  }
  return out;
}

// Sends one request with a random prompt of the pool; returns its max_new_tokens.
Result<int32_t> Generate(WireClient& c, uint64_t id, const std::vector<uint32_t>& prompt,
                         std::mt19937_64& rng) {
  capnp::MallocMessageBuilder b;
  auto g = b.initRoot<Envelope>().initGenerate();
  g.setRequestId(id);
  auto p = g.initPrompt(static_cast<unsigned>(prompt.size()));
  for (unsigned i = 0; i < p.size(); ++i) p.set(i, prompt[i]);
  const int32_t max_new = 1 + static_cast<int32_t>(rng() % kMaxNew);
  g.setMaxNewTokens(max_new);
  CHUNKSERVE_RETURN_IF_ERROR(c.Send(b));
  return max_new;
}

void ClientLoop(WorkerProcess& worker, const std::vector<std::vector<uint32_t>>& pool,
                const std::vector<std::vector<uint32_t>>& solo, uint64_t seed, int requests,
                std::atomic<int>* done) {
  std::mt19937_64 rng(seed);
  std::unique_ptr<WireClient> client;
  for (int i = 0; i < requests; ++i) {
    if (!client) {
      auto c = worker.Connect();
      ASSERT_OK(c.status());
      client = std::move(c).value();
    }
    const uint64_t id = static_cast<uint64_t>(i + 1);
    const size_t which = static_cast<size_t>(rng() % pool.size());
    ASSERT_OK_AND_ASSIGN(const int32_t max_new, Generate(*client, id, pool[which], rng));
    const int action = static_cast<int>(rng() % 10);  // 0: cancel, 1: disconnect, else finish
    bool ended = false;
    std::vector<uint32_t> tokens;
    while (!ended) {
      Result<DecodedMessage> m = client->Receive(60s);
      ASSERT_OK(m.status());
      auto root = m.value().root();
      if (root.which() == Envelope::TOKEN) {
        // One request at a time per connection: every token is this request's.
        ASSERT_EQ(root.getToken().getRequestId(), id);
        ASSERT_EQ(root.getToken().getIndex(), static_cast<int32_t>(tokens.size()))
            << "request " << id;
        tokens.push_back(root.getToken().getToken());
        if (tokens.size() == 1 && action == 0) {
          capnp::MallocMessageBuilder b;
          b.initRoot<Envelope>().initCancel().setRequestId(id);
          ASSERT_OK(client->Send(b));
        } else if (tokens.size() == 1 && action == 1) {
          client.reset();  // disconnect mid-stream
          ended = true;
        }
      } else if (root.which() == Envelope::FINISH) {
        // Nothing provokes a failure here: a request ends by its length (all of its tokens
        // streamed, no stop tokens asked), or, when this client cancelled it, by the cancel
        // or by its length if that came first.
        const auto f = root.getFinish();
        ASSERT_EQ(f.getRequestId(), id);
        const bool length = f.getReason() == wire::schema::FinishReason::LENGTH;
        const bool cancelled = f.getReason() == wire::schema::FinishReason::CANCELLED;
        EXPECT_TRUE(length || (action == 0 && cancelled))
            << "request " << id << " (action " << action << ") ended with reason "
            << static_cast<int>(f.getReason());
        if (length) {
          EXPECT_EQ(tokens.size(), static_cast<size_t>(max_new)) << "request " << id;
        }
        ended = true;
      } else if (root.which() == Envelope::ERROR) {
        ADD_FAILURE() << "request " << id << " got an Error: " << root.getError().getMessage().cStr();
        ended = true;
      }
    }
    // Whole or cut short, the stream is the start of the solo run's.
    const auto& want = solo[which];
    const size_t n = std::min(tokens.size(), want.size());
    EXPECT_LE(tokens.size(), want.size()) << "request " << id;
    EXPECT_TRUE(std::equal(tokens.begin(), tokens.begin() + static_cast<long>(n), want.begin()))
        << "request " << id << " (seed " << seed << ", prompt " << which
        << ") differs from a solo run of its prompt";
    done->fetch_add(1);
  }
}

TEST(WorkerSoakTest, ThousandsOfRequestsReturnToBaseline) {
  const uint64_t seed = chunkserve::testing::TestSeed();
  const auto pool = PromptPool(seed);
  const auto solo = SoloGreedy(pool);
  ASSERT_OK_AND_ASSIGN(auto worker, WorkerProcess::Start(kWorkerArgs));
  constexpr int kThreads = 4;
  // 450 each (1,900 with the warm-up; 2,500 before the solo reference and the preemption-heavy
  // cache): about the CPU time the soak took before.
  constexpr int kPerThread = 450;
  std::atomic<int> done{0};
  long rss_warm = -1;
  {
    // Warm-up round, then measure memory.
    std::thread t(ClientLoop, std::ref(*worker), std::cref(pool), std::cref(solo), seed, 100,
                  &done);
    t.join();
    rss_warm = RssKb(worker->pid());
  }
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back(ClientLoop, std::ref(*worker), std::cref(pool), std::cref(solo),
                         seed + 1 + i, kPerThread, &done);
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(done.load(), 100 + kThreads * kPerThread);

  ASSERT_OK_AND_ASSIGN(auto client, worker->Connect());
  const auto give_up = std::chrono::steady_clock::now() + 60s;
  int32_t running = -1, queued = -1;
  uint64_t referenced = 1;
  uint64_t capacity = 0, used = 0, preemptions = 0, evictions = 0;
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
    preemptions = s.getPreemptions();
    evictions = s.getEvictedChunks();
    if (running == 0 && queued == 0 && referenced == 0) break;
  }
  EXPECT_EQ(running, 0);
  EXPECT_EQ(queued, 0);
  EXPECT_EQ(referenced, 0u);  // only retained (reusable) chunks remain
  EXPECT_LE(used, capacity);
  std::cout << "soak: " << preemptions << " preemptions, " << evictions << " evicted chunks"
            << std::endl;
  EXPECT_GT(preemptions, 0u) << "the KV cache no longer forces preemption";
  EXPECT_GT(evictions, 0u);
  const long rss_end = RssKb(worker->pid());
  ASSERT_GT(rss_warm, 0);
  EXPECT_LT(rss_end - rss_warm, 64 * 1024)
      << "RSS grew from " << rss_warm << " to " << rss_end << " KiB";
}

}  // namespace
}  // namespace chunkserve::worker
