// RateWindow: wall and busy rates on hand-checked step sequences.
#include "runtime/engine/rate_window.h"

#include <gtest/gtest.h>

namespace chunkserve::engine {
namespace {

using std::chrono::milliseconds;
using Sample = RateWindow::Sample;

// Feeds back-to-back steps to a window: each takes `step_ms` of step time and wall time and adds
// `prefill` and `decode` tokens.
class Steps {
 public:
  explicit Steps(RateWindow& w) : w_(w) {}
  void Step(int step_ms, uint64_t prefill, uint64_t decode) {
    busy_ += step_ms / 1000.0;
    prefill_ += prefill;
    decode_ += decode;
    w_.Add({.t = RateWindow::Clock::time_point{} + milliseconds(ms_), .busy_s = busy_,
            .decode = decode_, .prefill = prefill_});
    ms_ += step_ms;
  }

 private:
  RateWindow& w_;
  double busy_ = 0;
  uint64_t prefill_ = 0, decode_ = 0;
  int ms_ = 0;
};

TEST(RateWindowTest, BusyStepsGiveTheSameRateBothWays) {
  RateWindow w;
  Steps steps(w);
  // Back-to-back 10 ms steps, 32 decode tokens each: 3,200 tokens/s either way.
  for (int i = 0; i <= 10; ++i) steps.Step(10, 0, 32);
  EXPECT_NEAR(w.rates().decode_per_s, 3200, 1e-6);
  EXPECT_NEAR(w.rates().decode_per_busy_s, 3200, 1e-6);
}

TEST(RateWindowTest, TheFirstStepAfterAnIdleGapKeepsTheBusyRate) {
  RateWindow w;
  const auto t0 = RateWindow::Clock::time_point{};
  w.Add({.t = t0, .busy_s = 0.01, .decode = 32});
  w.Add({.t = t0 + milliseconds(10), .busy_s = 0.02, .decode = 64});
  // Idle for 3 s, then one 10 ms step of 32 tokens: the window keeps the sample before the gap.
  w.Add({.t = t0 + milliseconds(3010), .busy_s = 0.03, .decode = 96});
  EXPECT_NEAR(w.rates().decode_per_s, 32 / 3.0, 1e-9);  // what it did: 32 tokens in 3 s
  EXPECT_NEAR(w.rates().decode_per_busy_s, 3200, 1e-6);  // what it does while it runs
}

TEST(RateWindowTest, OldSamplesLeaveTheWindow) {
  RateWindow w(std::chrono::seconds(2));
  Steps steps(w);
  // 1 s of slow steps (8 tokens / 10 ms), then 3 s of fast ones (64 / 10 ms).
  for (int i = 0; i < 100; ++i) steps.Step(10, 0, 8);
  for (int i = 0; i < 300; ++i) steps.Step(10, 0, 64);
  EXPECT_NEAR(w.rates().decode_per_busy_s, 6400, 1e-6);
  EXPECT_NEAR(w.rates().decode_per_s, 6400, 1e-6);
}

TEST(RateWindowTest, PrefillOnlyStepsReadAsNoDecode) {
  RateWindow w;
  const auto t0 = RateWindow::Clock::time_point{};
  w.Add({.t = t0, .busy_s = 0.1, .prefill = 2048});
  w.Add({.t = t0 + milliseconds(100), .busy_s = 0.2, .prefill = 4096});
  EXPECT_EQ(w.rates().decode_per_busy_s, 0);
  EXPECT_NEAR(w.rates().prefill_per_s, 20480, 1e-6);
}

TEST(RateWindowTest, PrefillTimeInMixedStepsIsNotDecodeTime) {
  RateWindow w;
  Steps steps(w);
  // No prefill-only step yet: a mixed step's whole time counts as decoding.
  steps.Step(10, 0, 8);
  steps.Step(148, 2048, 31);
  EXPECT_NEAR(w.rates().decode_per_busy_s, 31 / 0.148, 1e-6);
  EXPECT_EQ(w.rates().best_prefill_per_s, 0);
  // A prefill-only step: 2,048 tokens in 128 ms, 16,000 tokens/s.
  steps.Step(128, 2048, 0);
  EXPECT_NEAR(w.rates().best_prefill_per_s, 16000, 1e-6);
  // A mixed step: 2,048 prefill tokens (128 ms at that rate) beside 31 decode rows, 160 ms.
  // The window's 148 + 128 + 160 ms of steps (the first sample's step is before its interval)
  // hold 3 x 2,048 prefill tokens, 384 ms: 52 ms of decoding for 62 decode tokens.
  steps.Step(160, 2048, 31);
  EXPECT_NEAR(w.rates().decode_per_busy_s, 62 / 0.052, 1e-6);
  // Decode-only steps keep their whole time.
  for (int i = 0; i < 300; ++i) steps.Step(20, 0, 32);
  EXPECT_NEAR(w.rates().decode_per_busy_s, 1600, 1e-6);
  // A prefill rate too low for later steps never leaves them less than a tenth decoding: a
  // slow prefill-only step (1,000 tokens/s), then 4,096 prefill tokens and 10 decode rows in
  // 100 ms.
  const auto t0 = RateWindow::Clock::time_point{};
  RateWindow slow;
  slow.Add({.t = t0});
  slow.Add({.t = t0 + milliseconds(1000), .busy_s = 1.0, .prefill = 1000});
  slow.Add({.t = t0 + milliseconds(1100), .busy_s = 1.1, .decode = 10, .prefill = 5096});
  EXPECT_NEAR(slow.rates().decode_per_busy_s, 10 / 0.11, 1e-6);
}

TEST(RateWindowTest, AnIntervalWithoutStepTimeKeepsTheLastRates) {
  RateWindow w;
  const auto t0 = RateWindow::Clock::time_point{};
  w.Add({.t = t0, .busy_s = 0.01, .decode = 10});
  EXPECT_EQ(w.rates().decode_per_s, 0);  // one sample: no interval yet
  w.Add({.t = t0 + milliseconds(10), .busy_s = 0.02, .decode = 20});
  EXPECT_NEAR(w.rates().decode_per_busy_s, 1000, 1e-6);
  // A sample with no step between (shutdown publishes one): busy rate unchanged.
  w.Add({.t = t0 + milliseconds(10), .busy_s = 0.02, .decode = 20});
  EXPECT_NEAR(w.rates().decode_per_busy_s, 1000, 1e-6);
}

}  // namespace
}  // namespace chunkserve::engine
