// Engine behaviour end to end on a small random-weight model: outputs against an independent
// reference forward pass, invariance of greedy outputs under prefix sharing, chunked prefill and
// preemption, cancellation, deadlines, bad input, shutdown.
#include "runtime/engine/engine.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "runtime/model/model.h"
#include "runtime/model/tiny_model.h"
#include "tests/testing/engine_fixture.h"
#include "tests/testing/random.h"
#include "tests/testing/reference_model.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/tiny_models.h"

namespace chunkserve::engine {
namespace {

using namespace std::chrono_literals;
using ::chunkserve::testing::StatusIs;
using sched::RequestOptions;
using sched::RequestStream;
using sched::StreamEvent;

model::TinyModelOptions TestModel() { return testing::SmallTestModel(7); }

using Outcome = testing::StreamOutcome;
using testing::Drain;

class EngineTest : public testing::TinyModelEngineTest {
 protected:
  EngineOptions Options() const {
    EngineOptions o = TinyModelEngineTest::Options();
    o.max_batch_size = 16;
    o.prefill_token_budget = 64;
    return o;
  }

  // Three tenants' system prompts (lengths not multiples of the chunk size) and per-request
  // suffixes; two requests repeat another's prompt exactly.
  std::vector<RequestOptions> Workload(uint64_t seed, int per_tenant = 4, int max_new = 8) const {
    testing::Random rng(seed);
    std::vector<std::vector<TokenId>> systems = {rng.Tokens(70, 256), rng.Tokens(37, 256),
                                                 rng.Tokens(100, 256)};
    std::vector<RequestOptions> out;
    for (int i = 0; i < per_tenant; ++i) {
      for (const auto& sys : systems) {
        RequestOptions r;
        r.prompt = sys;
        const auto suffix = rng.Tokens(static_cast<size_t>(rng.Int(1, 20)), 256);
        r.prompt.insert(r.prompt.end(), suffix.begin(), suffix.end());
        r.max_new_tokens = max_new;
        out.push_back(std::move(r));
      }
    }
    // Exact repeats of earlier prompts (copied first: push_back may reallocate).
    for (size_t i : {size_t{0}, size_t{4}}) {
      if (i < out.size()) {
        RequestOptions repeat = out[i];
        out.push_back(std::move(repeat));
      }
    }
    return out;
  }

  std::vector<Outcome> RunAll(const EngineOptions& options,
                              const std::vector<RequestOptions>& requests,
                              EngineStats* stats = nullptr) {
    auto engine = Engine::Create(options);
    EXPECT_TRUE(engine.ok()) << engine.status();
    if (!engine.ok()) return {};
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (const auto& r : requests) {
      auto s = (*engine)->Submit(r);
      EXPECT_TRUE(s.ok()) << s.status();
      if (s.ok()) streams.push_back(*s);
    }
    std::vector<Outcome> out;
    for (auto& s : streams) out.push_back(Drain(*s));
    (*engine)->Shutdown(ShutdownMode::kDrain);
    if (stats) *stats = (*engine)->Stats();
    return out;
  }
};

TEST_F(EngineTest, GreedyOutputMatchesTheReferenceForwardPass) {
  auto loaded = model::LoadedModel::Load(model_dir());
  ASSERT_OK(loaded.status());
  testing::ReferenceModel reference(*loaded);
  auto requests = Workload(testing::TestSeed(), 1, 6);
  requests.resize(3);
  const auto outcomes = RunAll(Options(), requests);
  ASSERT_EQ(outcomes.size(), requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(outcomes[i].tokens, reference.Greedy(requests[i].prompt, 6)) << "request " << i;
    EXPECT_EQ(outcomes[i].finish.reason, FinishReason::kLength);
  }
}

TEST_F(EngineTest, PrefixSharingDoesNotChangeGreedyOutputAndSavesKv) {
  // Long enough generations that many sequences decode at once, where sharing saves memory.
  const auto requests = Workload(testing::TestSeed(), 4, 24);
  EngineOptions on = Options(), off = Options();
  on.prefill_token_budget = off.prefill_token_budget = 0;
  off.enable_prefix_sharing = false;
  EngineStats on_stats, off_stats;
  const auto a = RunAll(on, requests, &on_stats);
  const auto b = RunAll(off, requests, &off_stats);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].tokens, b[i].tokens) << "request " << i;
    EXPECT_EQ(a[i].terminal_events, 1);
    EXPECT_EQ(a[i].finish.prompt_tokens, static_cast<int32_t>(requests[i].prompt.size()));
    EXPECT_EQ(b[i].finish.cached_tokens, 0);
  }
  EXPECT_GT(on_stats.prefix_hit_tokens, 0u);
  EXPECT_EQ(off_stats.prefix_hit_tokens, 0u);
  EXPECT_LT(on_stats.prefill_tokens, off_stats.prefill_tokens);
  EXPECT_LT(on_stats.kv_bytes_peak, off_stats.kv_bytes_peak);
}

TEST_F(EngineTest, ChunkedPrefillDoesNotChangeGreedyOutput) {
  const auto requests = Workload(testing::TestSeed());
  EngineOptions whole = Options(), chunked = Options();
  whole.prefill_token_budget = 0;
  chunked.prefill_token_budget = 7;
  const auto a = RunAll(whole, requests);
  const auto b = RunAll(chunked, requests);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].tokens, b[i].tokens) << "request " << i;
}

TEST_F(EngineTest, TinyKvBudgetPreemptsAndStillMatches) {
  const auto requests = Workload(testing::TestSeed(), 4, 24);
  EngineOptions roomy = Options(), tight = Options();
  // Slot bytes: 2 (K,V) x 2 layers x 2 kv heads x 16 tokens x 16 dims x 4 bytes = 8 KiB; 14 slots
  // hold a couple of sequences at most.
  tight.kv_cache_bytes = 14 * 8192;
  EngineStats tight_stats;
  const auto a = RunAll(roomy, requests);
  const auto b = RunAll(tight, requests, &tight_stats);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].tokens, b[i].tokens) << "request " << i;
    EXPECT_EQ(b[i].finish.reason, FinishReason::kLength);
  }
  EXPECT_GT(tight_stats.preemptions + tight_stats.evicted_chunks, 0u);
}

TEST_F(EngineTest, CancelEndsTheRequestAndFreesItsChunks) {
  auto engine = Engine::Create(Options());
  ASSERT_OK(engine.status());
  RequestOptions r;
  r.prompt = testing::Random(1).Tokens(50, 256);
  r.max_new_tokens = 500;
  ASSERT_OK_AND_ASSIGN(auto stream, (*engine)->Submit(r));
  StreamEvent e;
  ASSERT_EQ(stream->Next(&e, 30s), RequestStream::NextResult::kEvent);  // first token: running
  ASSERT_EQ(e.kind, StreamEvent::Kind::kToken);
  ASSERT_OK((*engine)->Cancel(stream->id()));
  Outcome out;
  while (stream->Next(&e, 30s) == RequestStream::NextResult::kEvent) {
    if (e.kind == StreamEvent::Kind::kFinished) {
      out.finish = e.finish;
      ++out.terminal_events;
    }
  }
  EXPECT_EQ(out.finish.reason, FinishReason::kCancelled);
  EXPECT_EQ(out.terminal_events, 1);
  // The terminal event is pushed after the release, in the same step.
  EXPECT_EQ((*engine)->Stats().kv_bytes_referenced, 0u);
  EXPECT_THAT((*engine)->Cancel(stream->id()), StatusIs(StatusCode::kNotFound));
}

TEST_F(EngineTest, StreamSideCancelWorksToo) {
  auto engine = Engine::Create(Options());
  ASSERT_OK(engine.status());
  RequestOptions r;
  r.prompt = {1, 2, 3};
  r.max_new_tokens = 500;
  ASSERT_OK_AND_ASSIGN(auto stream, (*engine)->Submit(r));
  stream->RequestCancel();
  EXPECT_EQ(Drain(*stream).finish.reason, FinishReason::kCancelled);
}

TEST_F(EngineTest, DeadlineEndsTheRequest) {
  // A deadline that has passed by the first step ends the request before it produces anything:
  // deterministic, unlike racing a short deadline against a fast model. Waiting and running
  // requests go through the same check at every step boundary.
  auto engine = Engine::Create(Options());
  ASSERT_OK(engine.status());
  RequestOptions r;
  r.prompt = {5, 6, 7};
  r.max_new_tokens = 500;
  r.deadline = sched::Clock::now() - 1ms;
  ASSERT_OK_AND_ASSIGN(auto stream, (*engine)->Submit(r));
  const Outcome out = Drain(*stream);
  EXPECT_EQ(out.finish.reason, FinishReason::kDeadline);
  EXPECT_EQ(out.finish.generated_tokens, 0);
  EXPECT_TRUE(out.tokens.empty());
  EXPECT_EQ((*engine)->Stats().kv_bytes_referenced, 0u);
}

TEST_F(EngineTest, BadInputsGetErrorsAndTheEngineKeepsServing) {
  EngineOptions small = Options();
  small.kv_cache_bytes = 32 * 8192;  // 32 chunks of 16 tokens
  auto engine = Engine::Create(small);
  ASSERT_OK(engine.status());
  RequestOptions bad;
  bad.prompt = {1, 256};
  EXPECT_THAT((*engine)->Submit(bad), StatusIs(StatusCode::kInvalidArgument));
  bad.prompt = {};
  EXPECT_THAT((*engine)->Submit(bad), StatusIs(StatusCode::kInvalidArgument));
  bad.prompt = {1};
  bad.max_new_tokens = 0;
  EXPECT_THAT((*engine)->Submit(bad), StatusIs(StatusCode::kInvalidArgument));
  bad.max_new_tokens = 1;
  bad.sampling.top_p = 2.0f;
  EXPECT_THAT((*engine)->Submit(bad), StatusIs(StatusCode::kInvalidArgument));
  RequestOptions huge;
  huge.prompt.assign(500, 3);  // 500 + 23 tokens need 34 chunks: can never fit in 32
  huge.max_new_tokens = 23;
  EXPECT_THAT((*engine)->Submit(huge), StatusIs(StatusCode::kResourceExhausted));

  RequestOptions good;
  good.prompt = {1, 2, 3};
  good.max_new_tokens = 3;
  ASSERT_OK_AND_ASSIGN(auto stream, (*engine)->Submit(good));
  const Outcome out = Drain(*stream);
  EXPECT_EQ(out.tokens.size(), 3u);
  EXPECT_EQ(out.finish.reason, FinishReason::kLength);
}

TEST_F(EngineTest, StopTokenEndsTheRequestAfterStreamingIt) {
  RequestOptions r;
  r.prompt = testing::Random(3).Tokens(20, 256);
  r.max_new_tokens = 8;
  const auto free_run = RunAll(Options(), {r});
  ASSERT_EQ(free_run.size(), 1u);
  ASSERT_EQ(free_run[0].tokens.size(), 8u);
  r.stop_tokens = {free_run[0].tokens[3]};
  const auto stopped = RunAll(Options(), {r});
  ASSERT_EQ(stopped.size(), 1u);
  EXPECT_EQ(stopped[0].finish.reason, FinishReason::kStopToken);
  const auto first_stop =
      std::find(free_run[0].tokens.begin(), free_run[0].tokens.end(), free_run[0].tokens[3]) -
      free_run[0].tokens.begin();
  EXPECT_EQ(stopped[0].tokens.size(), static_cast<size_t>(first_stop + 1));
}

TEST_F(EngineTest, SeededSamplingIsReproducible) {
  RequestOptions r;
  r.prompt = testing::Random(4).Tokens(30, 256);
  r.max_new_tokens = 12;
  r.sampling = {.temperature = 1.0f, .top_k = 50, .top_p = 0.9f, .seed = 1234};
  const auto a = RunAll(Options(), {r, r});
  ASSERT_EQ(a.size(), 2u);
  EXPECT_EQ(a[0].tokens, a[1].tokens);
  r.sampling.seed = 99;
  const auto b = RunAll(Options(), {r});
  EXPECT_NE(a[0].tokens, b[0].tokens);
}

TEST_F(EngineTest, SecondRequestWithTheSamePromptHitsTheCache) {
  auto engine = Engine::Create(Options());
  ASSERT_OK(engine.status());
  RequestOptions r;
  r.prompt = testing::Random(5).Tokens(64, 256);
  r.max_new_tokens = 2;
  ASSERT_OK_AND_ASSIGN(auto first, (*engine)->Submit(r));
  const Outcome a = Drain(*first);
  ASSERT_OK_AND_ASSIGN(auto second, (*engine)->Submit(r));
  const Outcome b = Drain(*second);
  EXPECT_EQ(a.finish.cached_tokens, 0);
  EXPECT_EQ(b.finish.cached_tokens, 63);  // all but the last prompt token, which yields logits
  EXPECT_EQ(a.tokens, b.tokens);
}

TEST_F(EngineTest, TheBusyDecodeRateLeavesIdleTimeOut) {
  auto engine = Engine::Create(Options());
  ASSERT_OK(engine.status());
  RequestOptions r;
  r.prompt = testing::Random(6).Tokens(20, 256);
  r.max_new_tokens = 12;
  ASSERT_OK_AND_ASSIGN(auto first, (*engine)->Submit(r));
  Drain(*first);
  std::this_thread::sleep_for(500ms);  // idle: no step, so no time in steps
  r.prompt[0] = (r.prompt[0] + 1) % 256;
  ASSERT_OK_AND_ASSIGN(auto second, (*engine)->Submit(r));
  Drain(*second);
  // Stats are published before the last step's tokens are delivered. The window spans both
  // requests and the 500 ms between them; its step time excludes them.
  const EngineStats s = (*engine)->Stats();
  EXPECT_GT(s.decode_tokens_per_s, 0);
  EXPECT_GT(s.decode_tokens_per_busy_s, s.decode_tokens_per_s);
}

TEST_F(EngineTest, QueueTimeCountsTheWaitForABatchSlot) {
  // One sequence per step: a second request cannot be admitted while the first runs, and its
  // queue time must cover that wait. The first request's stream callback (which runs on the step
  // thread) freezes the engine at its first token through the stall-file test hook, so the first
  // is running and cannot finish while the second waits, whatever the machine's speed or load.
  // (Earlier versions raced the step thread with sleeps and failed now and then under load.) The
  // engine starts frozen too, until the callback is in place: events pushed before SetCallback
  // are replayed on the calling thread, and under load the step thread once ran the whole first
  // request before the callback could freeze it.
  testing::TempDir dir;
  const std::filesystem::path stall_file = dir.path() / "stall";
  ::setenv("CHUNKSERVE_TEST_STALL_FILE", stall_file.c_str(), 1);  // read once, by Create
  EngineOptions o = Options();
  o.max_batch_size = 1;
  auto engine = Engine::Create(o);
  ::unsetenv("CHUNKSERVE_TEST_STALL_FILE");
  ASSERT_OK(engine.status());

  std::mutex mu;
  std::condition_variable cv;
  bool frozen = false;
  std::optional<sched::FinishInfo> first_finish;
  RequestOptions long_request;
  long_request.prompt = testing::Random(6).Tokens(40, 256);
  long_request.max_new_tokens = 200;
  std::ofstream(stall_file).put('x');  // no step until the callback is set
  ASSERT_OK_AND_ASSIGN(auto first, (*engine)->Submit(long_request));
  ASSERT_OK(first->SetCallback([&](const StreamEvent& ev) {
    std::lock_guard<std::mutex> lock(mu);
    if (ev.kind == StreamEvent::Kind::kFinished) {
      first_finish = ev.finish;
    } else if (!frozen) {
      std::ofstream(stall_file).put('x');  // the step thread stops after this step
      frozen = true;
    }
    cv.notify_all();
  }));
  std::filesystem::remove(stall_file);
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, 60s, [&] { return frozen; })) << "no first token";
  }
  RequestOptions short_request = long_request;
  short_request.max_new_tokens = 4;
  const auto before_second = std::chrono::steady_clock::now();
  ASSERT_OK_AND_ASSIGN(auto second, (*engine)->Submit(short_request));
  const auto after_second = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(50ms);
  const auto checked_at = std::chrono::steady_clock::now();
  EXPECT_FALSE(first->finished()) << "the engine took steps while frozen";
  std::filesystem::remove(stall_file);

  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, 60s, [&] { return first_finish.has_value(); }));
  }
  const Outcome b = Drain(*second);
  const auto second_done = std::chrono::steady_clock::now();
  ASSERT_EQ(first_finish->reason, FinishReason::kLength);
  ASSERT_EQ(b.finish.reason, FinishReason::kLength);
  EXPECT_GE(first_finish->queue_seconds, 0.0);
  EXPECT_GE(b.finish.queue_seconds,
            std::chrono::duration<double>(checked_at - after_second).count());
  EXPECT_LE(b.finish.queue_seconds,
            std::chrono::duration<double>(second_done - before_second).count());
}

TEST_F(EngineTest, RequestsThatNeverRanHaveNoQueueTime) {
  // The second request is cancelled while it waits behind a long first one.
  EngineOptions o = Options();
  o.max_batch_size = 1;
  auto engine = Engine::Create(o);
  ASSERT_OK(engine.status());
  RequestOptions r;
  r.prompt = testing::Random(8).Tokens(40, 256);
  r.max_new_tokens = 400;
  ASSERT_OK_AND_ASSIGN(auto first, (*engine)->Submit(r));
  ASSERT_OK_AND_ASSIGN(auto second, (*engine)->Submit(r));
  second->RequestCancel();
  const Outcome b = Drain(*second);
  const Outcome a = Drain(*first);
  ASSERT_EQ(b.finish.reason, FinishReason::kCancelled);
  EXPECT_TRUE(b.tokens.empty());
  EXPECT_LT(b.finish.queue_seconds, 0.0);
  EXPECT_GE(a.finish.queue_seconds, 0.0);
}

TEST_F(EngineTest, AbortEndsEveryRequestAsUnavailable) {
  auto engine = Engine::Create(Options());
  ASSERT_OK(engine.status());
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < 4; ++i) {
    RequestOptions r;
    r.prompt = {1, 2, 3, static_cast<TokenId>(i)};
    r.max_new_tokens = 400;
    ASSERT_OK_AND_ASSIGN(auto s, (*engine)->Submit(r));
    streams.push_back(s);
  }
  (*engine)->Shutdown(ShutdownMode::kAbort);
  for (auto& s : streams) {
    const Outcome out = Drain(*s);
    EXPECT_EQ(out.terminal_events, 1);
    EXPECT_EQ(out.finish.reason, FinishReason::kUnavailable);
  }
  RequestOptions late;
  late.prompt = {1};
  EXPECT_THAT((*engine)->Submit(late), StatusIs(StatusCode::kUnavailable));
}

TEST_F(EngineTest, DrainFinishesEveryRequest) {
  auto engine = Engine::Create(Options());
  ASSERT_OK(engine.status());
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (const auto& r : Workload(11, 2, 4)) {
    ASSERT_OK_AND_ASSIGN(auto s, (*engine)->Submit(r));
    streams.push_back(s);
  }
  (*engine)->Shutdown(ShutdownMode::kDrain);
  for (auto& s : streams) EXPECT_EQ(Drain(*s).finish.reason, FinishReason::kLength);
  EXPECT_EQ((*engine)->Stats().requests_finished, streams.size());
}

TEST_F(EngineTest, ConcurrentSubmittersAllGetTheirTokens) {
  constexpr int kThreads = 4, kPerThread = 5;
  auto request = [](int t, int i) {
    RequestOptions r;
    r.prompt = {1, 2, static_cast<TokenId>(t), static_cast<TokenId>(i)};
    r.max_new_tokens = 3;
    return r;
  };
  // What each request generates alone (one request at a time, on an engine of its own).
  std::vector<std::vector<std::vector<TokenId>>> solo(kThreads);
  {
    auto engine = Engine::Create(Options());
    ASSERT_OK(engine.status());
    for (int t = 0; t < kThreads; ++t) {
      for (int i = 0; i < kPerThread; ++i) {
        ASSERT_OK_AND_ASSIGN(auto s, (*engine)->Submit(request(t, i)));
        solo[t].push_back(Drain(*s).tokens);
      }
    }
  }
  auto engine = Engine::Create(Options());
  ASSERT_OK(engine.status());
  std::vector<std::vector<Outcome>> got(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        auto s = (*engine)->Submit(request(t, i));
        EXPECT_OK(s.status());
        got[t].push_back(s.ok() ? Drain(**s) : Outcome{});
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int t = 0; t < kThreads; ++t) {
    for (int i = 0; i < kPerThread; ++i) {
      EXPECT_EQ(got[t][i].finish.reason, FinishReason::kLength) << t << "/" << i;
      EXPECT_EQ(got[t][i].tokens.size(), 3u) << t << "/" << i;
      EXPECT_EQ(got[t][i].tokens, solo[t][i]) << t << "/" << i << " differs from a solo run";
    }
  }
}

TEST(EngineCreateTest, RandomWeightsOnlyWhenAskedFor) {
  EXPECT_THAT(Engine::Create(EngineOptions()),
              StatusIs(StatusCode::kInvalidArgument, ::testing::HasSubstr("no model")));
  EngineOptions both;
  both.tiny_model = true;
  both.model_dir = "/some/model";
  EXPECT_THAT(Engine::Create(both),
              StatusIs(StatusCode::kInvalidArgument, ::testing::HasSubstr("exclude")));
}

TEST(EngineCreateTest, RejectsBadOptionsAndModels) {
  EngineOptions o;
  o.tiny_model = true;
  o.chunk_size = 8;
  EXPECT_THAT(Engine::Create(o), StatusIs(StatusCode::kInvalidArgument));
  o = EngineOptions();
  o.model_dir = "/nonexistent/chunkserve-model";
  EXPECT_FALSE(Engine::Create(o).ok());
  testing::TempDir dir;
  ASSERT_OK(model::WriteTinyModel(dir.path(), TestModel()));
  o.model_dir = dir.path().string();
  o.kv_cache_bytes = 100;
  EXPECT_THAT(Engine::Create(o), StatusIs(StatusCode::kInvalidArgument));
}

// The tiny model is written to a temporary directory that is gone as soon as the engine has
// loaded it (the weights stay mapped), so a process killed while serving leaves nothing behind.
TEST(EngineCreateTest, BuiltInTinyModelServesAndLeavesNoFilesBehind) {
  testing::TempDir tmp;
  const char* saved = std::getenv("TMPDIR");
  const std::string saved_value = saved != nullptr ? saved : "";
  ASSERT_EQ(setenv("TMPDIR", tmp.path().c_str(), 1), 0);
  EngineOptions o;
  o.tiny_model = true;
  o.num_threads = 2;
  auto engine = Engine::Create(o);
  if (saved != nullptr) {
    setenv("TMPDIR", saved_value.c_str(), 1);
  } else {
    unsetenv("TMPDIR");
  }
  ASSERT_OK(engine.status());
  EXPECT_TRUE(std::filesystem::is_empty(tmp.path())) << "the tiny model's files outlived Create";
  RequestOptions r;
  r.prompt = {1, 2, 3};
  r.max_new_tokens = 2;
  ASSERT_OK_AND_ASSIGN(auto s, (*engine)->Submit(r));
  EXPECT_EQ(Drain(*s).tokens.size(), 2u);
}

// The engine keeps each weight once, in the checkpoint's dtype (the CPU backend packs fp16 / bf16
// weights half-size and drops the loaded checkpoint), and says so in its stats.
TEST_F(EngineTest, WeightsAreResidentOnceInTheCheckpointDtype) {
  uint64_t f32_bytes = 0;
  for (const kernels::DType dtype : {kernels::DType::kF32, kernels::DType::kBF16}) {
    testing::TempDir dir;
    model::TinyModelOptions o = TestModel();
    o.dtype = dtype;
    ASSERT_OK(model::WriteTinyModel(dir.path(), o));
    ASSERT_OK_AND_ASSIGN(model::LoadedModel checkpoint, model::LoadedModel::Load(dir.path()));
    const uint64_t checkpoint_bytes = checkpoint.store().total_bytes();
    const model::ModelConfig& c = checkpoint.config();
    EngineOptions options = Options();
    options.model_dir = dir.path().string();
    ASSERT_OK_AND_ASSIGN(auto engine, Engine::Create(options));
    const EngineStats s = engine->Stats();
    SCOPED_TRACE(std::string(model::DTypeName(dtype)));
    // The checkpoint's bytes, plus panel padding and fp32 norms: never a second copy.
    EXPECT_GE(s.weight_bytes, checkpoint_bytes);
    EXPECT_LE(s.weight_bytes, checkpoint_bytes + checkpoint_bytes / 4);
    EXPECT_GT(s.resident_bytes, s.weight_bytes);
    const uint64_t h = c.hidden_size, q = c.q_dim(), kv = c.kv_dim(), i = c.intermediate_size;
    EXPECT_EQ(s.projection_flops_per_token,
              2 * static_cast<uint64_t>(c.num_layers) * (2 * h * q + 2 * h * kv + 3 * h * i));
    if (dtype == kernels::DType::kF32) {
      f32_bytes = s.weight_bytes;
    } else {
      EXPECT_LT(s.weight_bytes, f32_bytes * 6 / 10) << "bf16 weights are kept half-size";
    }
    engine->Shutdown(ShutdownMode::kDrain);
  }
}

}  // namespace
}  // namespace chunkserve::engine
