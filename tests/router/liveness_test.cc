// Liveness: stalls from the progress counter (with work, without, readmission), outlier ejection
// with doubling backoff, and a success resetting both.
#include "router/liveness.h"

#include <gtest/gtest.h>

#include <chrono>

namespace chunkserve::router {
namespace {

using namespace std::chrono_literals;

const WorkerId kW{7};

LivenessOptions Options() {
  LivenessOptions o;
  o.stall_timeout = 2s;
  o.failure_threshold = 3;
  o.eject_min = 1s;
  o.eject_max = 4s;
  return o;
}

TEST(LivenessTest, AnIdleWorkerNeverStalls) {
  Liveness l(Options());
  l.Add(kW, 0s);
  for (int t = 1; t <= 60; ++t) {
    EXPECT_TRUE(l.OnReport(kW, 5, false, 0, RouterTime(std::chrono::seconds(t))).empty());
    EXPECT_TRUE(l.Tick(RouterTime(std::chrono::seconds(t))).empty());
  }
  EXPECT_TRUE(l.routable(kW));
  EXPECT_EQ(l.stalls(), 0u);
}

TEST(LivenessTest, AWorkerThatProgressesNeverStalls) {
  Liveness l(Options());
  l.Add(kW, 0s);
  for (int t = 1; t <= 60; ++t) {
    (void)l.OnReport(kW, static_cast<uint64_t>(t), true, 3, RouterTime(std::chrono::seconds(t)));
    EXPECT_TRUE(l.Tick(RouterTime(std::chrono::seconds(t)) + 500ms).empty());
  }
  EXPECT_TRUE(l.routable(kW));
}

TEST(LivenessTest, WorkWithoutProgressStallsAndMovingAgainReadmits) {
  Liveness l(Options());
  l.Add(kW, 0s);
  (void)l.OnReport(kW, 10, false, 0, 2s);   // idle at 2 s: the clock starts here
  (void)l.OnReport(kW, 10, true, 2, 2500ms);  // work, and the counter does not move
  EXPECT_TRUE(l.Tick(3900ms).empty());        // 1.9 s without progress: not yet
  auto c = l.Tick(4s);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].id, kW);
  EXPECT_FALSE(c[0].routable);
  EXPECT_TRUE(c[0].migrate);
  EXPECT_TRUE(l.stalled(kW));
  EXPECT_FALSE(l.routable(kW));
  EXPECT_EQ(l.stalls(), 1u);
  EXPECT_TRUE(l.Tick(10s).empty());  // reported once
  // Still frozen: the requests it was given are still in flight by its own account.
  EXPECT_TRUE(l.OnReport(kW, 10, true, 0, 11s).empty());
  EXPECT_FALSE(l.routable(kW));
  c = l.OnReport(kW, 11, true, 0, 12s);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_TRUE(c[0].routable);
  EXPECT_FALSE(c[0].migrate);
  EXPECT_TRUE(l.routable(kW));
}

TEST(LivenessTest, AStalledWorkerWithNothingLeftIsReadmitted) {
  Liveness l(Options());
  l.Add(kW, 0s);
  (void)l.OnReport(kW, 3, true, 1, 0s);
  ASSERT_EQ(l.Tick(2s).size(), 1u);
  const auto c = l.OnReport(kW, 3, false, 0, 3s);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_TRUE(c[0].routable);
  EXPECT_TRUE(l.routable(kW));
}

TEST(LivenessTest, ZeroStallTimeoutTurnsTheCheckOff) {
  LivenessOptions o = Options();
  o.stall_timeout = RouterTime{};
  Liveness l(o);
  l.Add(kW, 0s);
  (void)l.OnReport(kW, 3, true, 1, 0s);
  EXPECT_TRUE(l.Tick(3600s).empty());
  EXPECT_TRUE(l.routable(kW));
}

TEST(LivenessTest, ConsecutiveFailuresEjectWithDoublingBackoff) {
  Liveness l(Options());
  l.Add(kW, 0s);
  EXPECT_TRUE(l.OnLegFailed(kW, 0s).empty());
  EXPECT_TRUE(l.OnLegFailed(kW, 0s).empty());
  auto c = l.OnLegFailed(kW, 0s);  // the third: ejected for 1 s
  ASSERT_EQ(c.size(), 1u);
  EXPECT_FALSE(c[0].routable);
  EXPECT_FALSE(c[0].migrate);
  EXPECT_EQ(l.ejections(), 1u);
  EXPECT_TRUE(l.Tick(999ms).empty());
  c = l.Tick(1s);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_TRUE(c[0].routable);
  // Three more without a success between: 2 s, then 4 s, then capped at 4 s.
  const RouterTime lengths[] = {2s, 4s, 4s};
  RouterTime now = 1s;
  for (RouterTime length : lengths) {
    for (int i = 0; i < 3; ++i) (void)l.OnLegFailed(kW, now);
    EXPECT_FALSE(l.routable(kW));
    EXPECT_TRUE(l.Tick(now + length - 1ms).empty());
    ASSERT_EQ(l.Tick(now + length).size(), 1u);
    EXPECT_TRUE(l.routable(kW));
    now += length;
  }
  // A success resets the count and the backoff.
  (void)l.OnLegFailed(kW, now);
  (void)l.OnLegFailed(kW, now);
  (void)l.OnLegSucceeded(kW);
  EXPECT_TRUE(l.OnLegFailed(kW, now).empty());
  EXPECT_TRUE(l.OnLegFailed(kW, now).empty());
  ASSERT_EQ(l.OnLegFailed(kW, now).size(), 1u);
  EXPECT_TRUE(l.Tick(now + 999ms).empty());
  EXPECT_EQ(l.Tick(now + 1s).size(), 1u);
}

TEST(LivenessTest, UnknownAndRemovedWorkersAreNotRoutable) {
  Liveness l(Options());
  EXPECT_FALSE(l.routable(kW));
  EXPECT_TRUE(l.OnReport(kW, 1, true, 1, 0s).empty());
  EXPECT_TRUE(l.OnLegFailed(kW, 0s).empty());
  l.Add(kW, 0s);
  EXPECT_TRUE(l.routable(kW));
  l.Remove(kW);
  EXPECT_FALSE(l.routable(kW));
  EXPECT_TRUE(l.Tick(100s).empty());
}

}  // namespace
}  // namespace chunkserve::router
