// Logprobs through the engine against the independent reference forward pass: for greedy and
// sampled requests sharing a prompt prefix, every token's log-probability and its alternatives
// equal the reference's log-softmax (double precision) at that position.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

#include "runtime/engine/engine.h"
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
using sched::RequestOptions;
using sched::RequestStream;
using sched::StreamEvent;
using ::chunkserve::testing::StatusIs;

// Float32 engine against the double reference: logits agree to about 1e-5 on the tiny model.
constexpr double kTolerance = 2e-3;

struct Token {
  TokenId id;
  std::optional<TokenLogprobs> logprobs;
};

// The shared Drain's outcome as one (token, logprobs) pair per generated token.
std::vector<Token> Drain(RequestStream& s) {
  const testing::StreamOutcome out = testing::Drain(s);
  std::vector<Token> tokens;
  for (size_t i = 0; i < out.tokens.size(); ++i) tokens.push_back({out.tokens[i], out.logprobs[i]});
  return tokens;
}

std::vector<double> LogSoftmax(const std::vector<double>& logits) {
  const double max = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (double x : logits) sum += std::exp(x - max);
  std::vector<double> out;
  for (double x : logits) out.push_back(x - max - std::log(sum));
  return out;
}

using LogprobsTest = testing::TinyModelEngineTest;

TEST_F(LogprobsTest, EveryTokensLogprobsEqualTheReferenceLogSoftmax) {
  auto loaded = model::LoadedModel::Load(model_dir());
  ASSERT_OK(loaded.status());
  testing::ReferenceModel reference(*loaded);
  testing::Random rng(testing::TestSeed());
  const std::vector<TokenId> shared = rng.Tokens(40, 256);  // two and a half chunks
  std::vector<RequestOptions> requests;
  for (int i = 0; i < 4; ++i) {
    RequestOptions r;
    r.prompt = shared;
    const auto suffix = rng.Tokens(static_cast<size_t>(rng.Int(1, 9)), 256);
    r.prompt.insert(r.prompt.end(), suffix.begin(), suffix.end());
    r.max_new_tokens = 8;
    r.logprobs = i == 0 ? 0 : 5 * i;  // 0, 5, 10, 15 alternatives
    if (i % 2 == 1) r.sampling = {.temperature = 0.9f, .top_k = 50, .top_p = 0.95f,
                                  .seed = static_cast<uint64_t>(i)};
    requests.push_back(std::move(r));
  }
  RequestOptions plain = requests[1];
  plain.logprobs = -1;
  requests.push_back(plain);

  auto engine = Engine::Create(Options());
  ASSERT_OK(engine.status());
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (const auto& r : requests) {
    auto s = (*engine)->Submit(r);
    ASSERT_OK(s.status());
    streams.push_back(*s);
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    const RequestOptions& r = requests[i];
    const std::vector<Token> tokens = Drain(*streams[i]);
    ASSERT_EQ(tokens.size(), 8u) << "request " << i;
    std::vector<TokenId> seq = r.prompt;
    for (const Token& t : tokens) seq.push_back(t.id);
    const auto logits = reference.Logits(seq);
    for (size_t n = 0; n < tokens.size(); ++n) {
      const Token& t = tokens[n];
      if (r.logprobs < 0) {
        EXPECT_FALSE(t.logprobs.has_value()) << "request " << i << " token " << n;
        continue;
      }
      ASSERT_TRUE(t.logprobs.has_value()) << "request " << i << " token " << n;
      const std::vector<double> want = LogSoftmax(logits[r.prompt.size() + n - 1]);
      EXPECT_NEAR(t.logprobs->logprob, want[static_cast<size_t>(t.id)], kTolerance)
          << "request " << i << " token " << n;
      const auto& top = t.logprobs->top;
      ASSERT_EQ(top.size(), static_cast<size_t>(r.logprobs)) << "request " << i;
      for (size_t k = 0; k < top.size(); ++k) {
        EXPECT_NEAR(top[k].logprob, want[static_cast<size_t>(top[k].token)], kTolerance);
        if (k > 0) {
          EXPECT_GE(top[k - 1].logprob, top[k].logprob);
        }
      }
      if (!top.empty()) {
        // Nothing left out was clearly likelier than the last alternative kept.
        for (size_t v = 0; v < want.size(); ++v) {
          const bool kept = std::any_of(top.begin(), top.end(), [&](const TopLogprob& c) {
            return c.token == static_cast<TokenId>(v);
          });
          if (!kept) {
            EXPECT_LT(want[v], top.back().logprob + kTolerance) << "token " << v;
          }
        }
      }
      if (r.sampling.temperature == 0 && !top.empty()) {
        EXPECT_EQ(top[0].token, t.id);
      }
    }
  }
  (*engine)->Shutdown(ShutdownMode::kDrain);
}

TEST_F(LogprobsTest, TokensAreTheSameWithAndWithoutLogprobs) {
  auto engine = Engine::Create(Options());
  ASSERT_OK(engine.status());
  testing::Random rng(testing::TestSeed());
  RequestOptions r;
  r.prompt = rng.Tokens(30, 256);
  r.max_new_tokens = 12;
  r.sampling = {.temperature = 1.2f, .top_k = 0, .top_p = 0.9f, .seed = 11};
  RequestOptions with = r;
  with.logprobs = 20;
  auto s1 = (*engine)->Submit(r);
  auto s2 = (*engine)->Submit(with);
  ASSERT_OK(s1.status());
  ASSERT_OK(s2.status());
  const auto a = Drain(**s1), b = Drain(**s2);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].id, b[i].id) << i;
    ASSERT_TRUE(b[i].logprobs.has_value());
    EXPECT_EQ(b[i].logprobs->top.size(), 20u);
  }
  (*engine)->Shutdown(ShutdownMode::kDrain);
}

TEST_F(LogprobsTest, OutOfRangeCountsAreRefused) {
  auto engine = Engine::Create(Options());
  ASSERT_OK(engine.status());
  RequestOptions r;
  r.prompt = {1, 2, 3};
  for (int32_t bad : {-2, kMaxTopLogprobs + 1}) {
    r.logprobs = bad;
    EXPECT_THAT((*engine)->Submit(r).status(),
                StatusIs(StatusCode::kInvalidArgument, ::testing::HasSubstr("logprobs")));
  }
  (*engine)->Shutdown(ShutdownMode::kDrain);
}

}  // namespace
}  // namespace chunkserve::engine
