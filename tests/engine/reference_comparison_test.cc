// The engine against the independent double-precision reference model, token for token, on the
// paths where the engine's own bookkeeping decides what attention sees or which draw a token gets:
// shared prefixes (whole chunks, a chunk shared part-way, retained chunks reused by a later
// wave), chunked prefill, preemption by recompute (greedy and sampled), 200-token outputs, and
// seeded sampling with temperature, top-k and top-p. How tokens are compared, and why float32 vs
// double never makes these flaky: reference_check.h.
//
// Every test draws its prompts from TestSeed() (printed; replay with CHUNKSERVE_TEST_SEED) and
// also asserts, through EngineStats, that the path it is about was taken (sharing hit, prompts
// split across steps, preemptions), so none of them can pass without exercising it.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "runtime/engine/engine.h"
#include "runtime/model/model.h"
#include "runtime/model/tiny_model.h"
#include "tests/engine/reference_check.h"
#include "tests/testing/engine_fixture.h"
#include "tests/testing/random.h"
#include "tests/testing/reference_model.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/tiny_models.h"

namespace chunkserve::engine {
namespace {

using namespace std::chrono_literals;
using sched::RequestOptions;
using sched::RequestStream;
using sched::StreamEvent;

using Outcome = testing::StreamOutcome;

// A generous deadline per request (long outputs on a busy machine) turns a hang into a failure.
Outcome Drain(RequestStream& s) { return testing::Drain(s, std::chrono::seconds(120)); }

class ReferenceComparisonTest : public testing::TinyModelEngineTest {
 protected:
  void SetUp() override {
    TinyModelEngineTest::SetUp();
    if (HasFatalFailure()) return;
    ASSERT_OK_AND_ASSIGN(model::LoadedModel m, model::LoadedModel::Load(model_dir()));
    model_ = std::make_unique<model::LoadedModel>(std::move(m));
    reference_ = std::make_unique<testing::ReferenceModel>(*model_);
    check_ = std::make_unique<testing::ReferenceCheck>(*reference_);
  }

  // 16-token chunks (8 KiB of fp32 KV per slot for this model), room for everything.
  EngineOptions Options() const {
    EngineOptions o = TinyModelEngineTest::Options();
    o.max_batch_size = 16;
    o.prefill_token_budget = 64;
    return o;
  }

  // Submits every request of each wave at once; a wave starts when the previous one has ended
  // (so it finds the previous wave's chunks retained, not live). Outcomes in submission order.
  std::vector<Outcome> Run(const EngineOptions& options,
                           const std::vector<std::vector<RequestOptions>>& waves,
                           EngineStats* stats) {
    auto engine = Engine::Create(options);
    EXPECT_OK(engine.status());
    if (!engine.ok()) return {};
    std::vector<Outcome> out;
    for (const auto& wave : waves) {
      std::vector<std::shared_ptr<RequestStream>> streams;
      for (const RequestOptions& r : wave) {
        auto s = (*engine)->Submit(r);
        EXPECT_OK(s.status());
        if (s.ok()) streams.push_back(*s);
      }
      for (auto& s : streams) out.push_back(Drain(*s));
    }
    (*engine)->Shutdown(ShutdownMode::kDrain);
    *stats = (*engine)->Stats();
    return out;
  }

  // Every request ran to its length and generated the reference's tokens.
  void ExpectReference(const std::vector<RequestOptions>& requests,
                       const std::vector<Outcome>& outcomes) {
    ASSERT_EQ(outcomes.size(), requests.size());
    for (size_t i = 0; i < requests.size(); ++i) {
      const std::string what = "request " + std::to_string(i);
      EXPECT_EQ(outcomes[i].finish.reason, FinishReason::kLength) << what;
      EXPECT_EQ(outcomes[i].tokens.size(), static_cast<size_t>(requests[i].max_new_tokens)) << what;
      check_->Expect(requests[i], outcomes[i].tokens, what);
    }
    check_->Finish();
  }

  static RequestOptions Request(std::vector<TokenId> prompt, int32_t max_new) {
    RequestOptions r;
    r.prompt = std::move(prompt);
    r.max_new_tokens = max_new;
    return r;
  }
  static std::vector<TokenId> Concat(std::vector<TokenId> a, const std::vector<TokenId>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  }

  std::unique_ptr<model::LoadedModel> model_;
  std::unique_ptr<testing::ReferenceModel> reference_;
  std::unique_ptr<testing::ReferenceCheck> check_;
};

TEST_F(ReferenceComparisonTest, SharedPrefixesWholeAndPartChunks) {
  testing::Random rng(testing::TestSeed());
  // A: exactly 4 chunks. B: 6 chunks and 4 tokens, so sharers diverge inside a chunk (the
  // partial match is copied, kv::KvCopy).
  const std::vector<TokenId> a = rng.Tokens(64, 256), b = rng.Tokens(100, 256);
  auto suffix = [&] { return rng.Tokens(static_cast<size_t>(rng.Int(1, 20)), 256); };
  std::vector<RequestOptions> first, second;
  for (int i = 0; i < 3; ++i) {
    first.push_back(Request(Concat(a, suffix()), 16));
    first.push_back(Request(Concat(b, suffix()), 16));
  }
  first.push_back(Request(b, 16));  // the shared part and nothing else
  // Later, against retained chunks: new suffixes, and an exact repeat.
  second.push_back(Request(Concat(a, suffix()), 16));
  second.push_back(Request(Concat(b, suffix()), 16));
  second.push_back(first[0]);
  EngineStats stats;
  const auto outcomes = Run(Options(), {first, second}, &stats);
  std::vector<RequestOptions> all = first;
  all.insert(all.end(), second.begin(), second.end());
  ExpectReference(all, outcomes);
  ASSERT_EQ(outcomes.size(), all.size());
  // Sharing happened: within the first wave, and the second wave found the first's chunks.
  EXPECT_GT(stats.prefix_hit_tokens, 0u);
  const size_t w2 = first.size();
  EXPECT_GE(outcomes[w2].finish.cached_tokens, 64);
  EXPECT_GE(outcomes[w2 + 1].finish.cached_tokens, 100);
  EXPECT_EQ(outcomes[w2 + 2].finish.cached_tokens,
            static_cast<int32_t>(first[0].prompt.size()) - 1);
}

TEST_F(ReferenceComparisonTest, ChunkedPrefill) {
  testing::Random rng(testing::TestSeed());
  std::vector<RequestOptions> requests;
  for (int i = 0; i < 4; ++i) {
    requests.push_back(Request(rng.Tokens(static_cast<size_t>(rng.Int(40, 130)), 256), 12));
  }
  // Two that share 50 tokens: the second waits for, or reuses, a prefill still in progress.
  const auto shared = rng.Tokens(50, 256);
  requests.push_back(Request(Concat(shared, rng.Tokens(30, 256)), 12));
  requests.push_back(Request(Concat(shared, rng.Tokens(9, 256)), 12));
  EngineOptions o = Options();
  o.prefill_token_budget = 7;  // smaller than a chunk, and prime: splits land everywhere
  EngineStats stats;
  const auto outcomes = Run(o, {requests}, &stats);
  ExpectReference(requests, outcomes);
  // No step ran more than 7 tokens: prompts of up to 130 were split across many steps.
  EXPECT_GE(stats.steps * 7, stats.prefill_tokens);
  EXPECT_GE(stats.steps, 130u / 7);
}

TEST_F(ReferenceComparisonTest, PreemptionByRecomputeGreedyAndSampled) {
  testing::Random rng(testing::TestSeed());
  // All greedy, then all sampled: whichever request is preempted (the latest arrival among the
  // running), it is of the kind under test. A preempted sampled request must resume with its
  // next draw, not from its seed again.
  for (const bool sampled : {false, true}) {
    SCOPED_TRACE(sampled ? "sampled" : "greedy");
    std::vector<RequestOptions> requests;
    for (int i = 0; i < 8; ++i) {
      RequestOptions r = Request(rng.Tokens(static_cast<size_t>(rng.Int(30, 50)), 256), 40);
      if (sampled) {
        r.sampling = {.temperature = 1.0f,
                      .top_k = 40,
                      .top_p = 0.95f,
                      .seed = static_cast<uint64_t>(rng.Int(1, 1 << 30))};
      }
      requests.push_back(r);
    }
    EngineOptions o = Options();
    // 14 slots of 16 tokens: any one request fits (at most 90 tokens, 6 slots), three do not.
    o.kv_cache_bytes = 14 * 8192;
    EngineStats stats;
    const auto outcomes = Run(o, {requests}, &stats);
    ExpectReference(requests, outcomes);
    EXPECT_GT(stats.preemptions, 0u) << "the KV budget no longer forces preemption";
  }
}

TEST_F(ReferenceComparisonTest, TwoHundredTokenOutputs) {
  testing::Random rng(testing::TestSeed());
  const auto shared = rng.Tokens(40, 256);
  std::vector<RequestOptions> requests = {
      Request(rng.Tokens(25, 256), 200),
      Request(Concat(shared, rng.Tokens(3, 256)), 200),
      Request(Concat(shared, rng.Tokens(11, 256)), 200),
  };
  EngineStats stats;
  const auto outcomes = Run(Options(), {requests}, &stats);
  ExpectReference(requests, outcomes);
}

TEST_F(ReferenceComparisonTest, SeededSamplingUsesTheSameRandomStream) {
  testing::Random rng(testing::TestSeed());
  struct Rule {
    float temperature;
    int32_t top_k;
    float top_p;
  };
  // Temperatures far from 1 both ways, top-k alone, top-p alone, both, neither.
  const std::vector<Rule> rules = {{0.4f, 5, 1.0f}, {0.7f, 0, 1.0f},   {1.0f, 20, 1.0f},
                                   {1.3f, 0, 0.9f}, {2.5f, 40, 0.95f}, {1.0f, 0, 0.6f},
                                   {5.0f, 0, 1.0f}};
  std::vector<RequestOptions> requests;
  for (const Rule& rule : rules) {
    RequestOptions r = Request(rng.Tokens(static_cast<size_t>(rng.Int(10, 60)), 256), 48);
    r.sampling = {.temperature = rule.temperature,
                  .top_k = rule.top_k,
                  .top_p = rule.top_p,
                  .seed = static_cast<uint64_t>(rng.Int(0, INT64_MAX))};
    requests.push_back(r);
  }
  requests.push_back(requests[1]);  // same prompt and seed in one batch: same tokens
  EngineStats stats;
  const auto outcomes = Run(Options(), {requests}, &stats);
  ExpectReference(requests, outcomes);
  // The draws did sample: many positions left the argmax (a greedy engine would fail above, but
  // this keeps the test honest if the rules above ever become near-greedy).
  EXPECT_GT(check_->sampled_off_argmax(), check_->tokens_checked() / 4);
}

}  // namespace
}  // namespace chunkserve::engine
