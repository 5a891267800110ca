// The client protocol codecs (client_protocol.h): random messages round-trip through encode,
// framing and decode; what a receiver must refuse is refused naming the field; unknown finish
// reasons and error codes decode as error / internal.
#include "runtime/wire/client_protocol.h"

#include <capnp/message.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "runtime/wire/framing.h"
#include "runtime/wire/messages.h"
#include "tests/testing/random.h"
#include "tests/testing/status_matchers.h"

namespace chunkserve::wire {
namespace {

using ::chunkserve::testing::StatusIs;
using ::testing::HasSubstr;
using schema::Envelope;

DecodedMessage Frame(const std::vector<uint8_t>& bytes) {
  auto decoded = DecodeFrame(bytes.data(), bytes.size(), ReaderLimits{});
  EXPECT_TRUE(decoded.ok()) << decoded.status();
  return std::move(decoded).value();
}

TEST(ClientProtocolTest, RandomMessagesRoundTrip) {
  testing::Random rnd(testing::TestSeed());
  for (int i = 0; i < 200; ++i) {
    GenerateMessage g;
    g.request_id = static_cast<uint64_t>(rnd.Int(0, INT64_MAX));
    g.prompt = rnd.Tokens(static_cast<size_t>(rnd.Int(1, 300)), INT32_MAX);
    if (rnd.Bernoulli(0.5)) {
      g.sampling = SamplingMessage{rnd.Float(0, 5), static_cast<int32_t>(rnd.Int(0, 100)),
                                   rnd.Float(0.01f, 1.0f), static_cast<uint64_t>(rnd.Int(0, 1e12))};
    }
    g.max_new_tokens = static_cast<int32_t>(rnd.Int(1, 100000));
    g.stop_tokens = rnd.Tokens(static_cast<size_t>(rnd.Int(0, 5)), 1000);
    g.deadline_ms = static_cast<uint32_t>(rnd.Int(0, UINT32_MAX));
    g.priority = static_cast<int32_t>(rnd.Int(INT32_MIN, INT32_MAX));
    g.logprobs = static_cast<int32_t>(rnd.Int(-1, kMaxTopLogprobs));
    DecodedMessage m = Frame(EncodeGenerate(g));
    ASSERT_EQ(m.root().which(), Envelope::GENERATE);
    ASSERT_OK_AND_ASSIGN(GenerateMessage back, DecodeGenerate(m.root().getGenerate()));
    EXPECT_EQ(back.request_id, g.request_id);
    EXPECT_EQ(back.prompt, g.prompt);
    EXPECT_EQ(back.stop_tokens, g.stop_tokens);
    EXPECT_EQ(back.max_new_tokens, g.max_new_tokens);
    EXPECT_EQ(back.deadline_ms, g.deadline_ms);
    EXPECT_EQ(back.priority, g.priority);
    EXPECT_EQ(back.logprobs, g.logprobs);
    ASSERT_EQ(back.sampling.has_value(), g.sampling.has_value());
    if (g.sampling) {
      EXPECT_EQ(back.sampling->temperature, g.sampling->temperature);
      EXPECT_EQ(back.sampling->top_k, g.sampling->top_k);
      EXPECT_EQ(back.sampling->top_p, g.sampling->top_p);
      EXPECT_EQ(back.sampling->seed, g.sampling->seed);
    }

    TokenMessage t{static_cast<uint64_t>(rnd.Int(0, INT64_MAX)),
                   static_cast<TokenId>(rnd.Int(0, INT32_MAX)),
                   static_cast<int32_t>(rnd.Int(0, INT32_MAX)),
                   {}};
    if (rnd.Bernoulli(0.5)) {
      TokenLogprobs& l = t.logprobs.emplace();
      l.logprob = rnd.Float(-30.0f, 0.0f);
      for (int64_t k = rnd.Int(0, kMaxTopLogprobs); k > 0; --k) {
        l.top.push_back({static_cast<TokenId>(rnd.Int(0, INT32_MAX)),
                         rnd.Float(-30.0f, 0.0f)});
      }
    }
    DecodedMessage tm = Frame(EncodeToken(t));
    ASSERT_OK_AND_ASSIGN(TokenMessage tb, DecodeToken(tm.root().getToken()));
    EXPECT_EQ(tb.request_id, t.request_id);
    EXPECT_EQ(tb.token, t.token);
    EXPECT_EQ(tb.index, t.index);
    EXPECT_EQ(tb.logprobs, t.logprobs);

    FinishMessage f;
    f.request_id = static_cast<uint64_t>(rnd.Int(0, INT64_MAX));
    f.reason = static_cast<FinishReason>(rnd.Int(0, 5));
    if (rnd.Bernoulli(0.5)) {
      f.error = Status(static_cast<StatusCode>(rnd.Int(1, 14)), "failure " + std::to_string(i));
    }
    f.prompt_tokens = static_cast<int32_t>(rnd.Int(0, 1 << 20));
    f.cached_tokens = static_cast<int32_t>(rnd.Int(0, 1 << 20));
    f.generated_tokens = static_cast<int32_t>(rnd.Int(0, 1 << 20));
    DecodedMessage fm = Frame(EncodeFinish(f));
    const FinishMessage fb = DecodeFinish(fm.root().getFinish());
    EXPECT_EQ(fb.request_id, f.request_id);
    EXPECT_EQ(fb.reason, f.reason);
    EXPECT_EQ(fb.error, f.error);
    EXPECT_EQ(fb.prompt_tokens, f.prompt_tokens);
    EXPECT_EQ(fb.cached_tokens, f.cached_tokens);
    EXPECT_EQ(fb.generated_tokens, f.generated_tokens);

    DecodedMessage cm = Frame(EncodeCancel(g.request_id));
    ASSERT_EQ(cm.root().which(), Envelope::CANCEL);
    EXPECT_EQ(cm.root().getCancel().getRequestId(), g.request_id);
  }
}

TEST(ClientProtocolTest, GenerateRefusesWhatNoServerCanServe) {
  const auto decode = [](auto fill) {
    capnp::MallocMessageBuilder b;
    auto g = b.initRoot<Envelope>().initGenerate();
    g.setRequestId(7);
    auto prompt = g.initPrompt(2);
    prompt.set(0, 1);
    prompt.set(1, 2);
    fill(g);
    return DecodeGenerate(g.asReader()).status();
  };
  EXPECT_OK(decode([](auto) {}));
  EXPECT_THAT(decode([](auto g) { g.initPrompt(0); }),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("prompt")));
  EXPECT_THAT(decode([](auto g) { g.getPrompt().set(1, 0x80000000u); }),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("prompt: token id 2147483648")));
  EXPECT_THAT(decode([](auto g) { g.initStopTokens(1).set(0, UINT32_MAX); }),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("stopTokens")));
  EXPECT_THAT(decode([](auto g) { g.setMaxNewTokens(0); }),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("maxNewTokens")));
  EXPECT_OK(decode([](auto g) { g.setLogprobs(kMaxTopLogprobs); }));
  EXPECT_THAT(decode([](auto g) { g.setLogprobs(kMaxTopLogprobs + 1); }),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("logprobs")));
  EXPECT_THAT(decode([](auto g) { g.setLogprobs(-2); }),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("logprobs")));
}

TEST(ClientProtocolTest, TokenRefusesMoreAlternativesThanAnyRequestAsks) {
  const auto decode = [](unsigned top, uint32_t id) {
    capnp::MallocMessageBuilder b;
    auto t = b.initRoot<Envelope>().initToken();
    t.setToken(3);
    auto l = t.initLogprobs();
    l.setLogprob(-0.5f);
    auto list = l.initTop(top);
    for (unsigned i = 0; i < top; ++i) list[i].setToken(id);
    return DecodeToken(t.asReader()).status();
  };
  EXPECT_OK(decode(kMaxTopLogprobs, 5));
  EXPECT_THAT(decode(kMaxTopLogprobs + 1, 5),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("top logprobs")));
  EXPECT_THAT(decode(1, 0x80000000u), StatusIs(StatusCode::kInvalidArgument, HasSubstr("id")));
}

TEST(ClientProtocolTest, UnknownReasonsAndCodesDecodeAsFailures) {
  capnp::MallocMessageBuilder b;
  auto f = b.initRoot<Envelope>().initFinish();
  f.setRequestId(3);
  f.setReason(static_cast<schema::FinishReason>(42));
  f.setErrorCode(static_cast<schema::ErrorCode>(99));
  f.setErrorMessage("from the future");
  const FinishMessage m = DecodeFinish(f.asReader());
  EXPECT_EQ(m.reason, FinishReason::kError);
  EXPECT_THAT(m.error, StatusIs(StatusCode::kInternal, HasSubstr("from the future")));
  capnp::MallocMessageBuilder tb;
  auto t = tb.initRoot<Envelope>().initToken();
  t.setToken(UINT32_MAX);
  EXPECT_THAT(DecodeToken(t.asReader()).status(), StatusIs(StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace chunkserve::wire
