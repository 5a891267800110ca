#include "runtime/sched/stream.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

namespace chunkserve::sched {
namespace {

using namespace std::chrono_literals;
using Kind = StreamEvent::Kind;

TEST(RequestStreamTest, DeliversTokensThenExactlyOneFinish) {
  RequestStream s(RequestId(1));
  s.PushToken(5, 0);
  s.PushToken(6, 1);
  s.PushFinish({.reason = FinishReason::kLength, .generated_tokens = 2});
  s.PushFinish({.reason = FinishReason::kCancelled});  // ignored: already finished
  s.PushToken(7, 2);                                    // ignored
  StreamEvent e;
  ASSERT_EQ(s.Next(&e, 0ms), RequestStream::NextResult::kEvent);
  EXPECT_EQ(e.token, 5);
  ASSERT_EQ(s.Next(&e, 0ms), RequestStream::NextResult::kEvent);
  EXPECT_EQ(e.index, 1);
  ASSERT_EQ(s.Next(&e, 0ms), RequestStream::NextResult::kEvent);
  EXPECT_EQ(e.kind, Kind::kFinished);
  EXPECT_EQ(e.finish.reason, FinishReason::kLength);
  EXPECT_EQ(s.Next(&e, 1s), RequestStream::NextResult::kEnded);  // returns at once
}

TEST(RequestStreamTest, NextTimesOutWhenNothingArrives) {
  RequestStream s(RequestId(1));
  StreamEvent e;
  EXPECT_EQ(s.Next(&e, 1ms), RequestStream::NextResult::kTimeout);
}

TEST(RequestStreamTest, BlockedNextWakesOnPushFromAnotherThread) {
  RequestStream s(RequestId(1));
  std::thread producer([&] { s.PushToken(9, 0); });
  StreamEvent e;
  EXPECT_EQ(s.Next(&e, 10s), RequestStream::NextResult::kEvent);
  EXPECT_EQ(e.token, 9);
  producer.join();
}

TEST(RequestStreamTest, CallbackGetsBacklogThenLiveEventsInOrder) {
  RequestStream s(RequestId(1));
  s.PushToken(1, 0);
  std::vector<TokenId> got;
  bool finished = false;
  std::thread producer([&] {
    for (int i = 1; i < 200; ++i) s.PushToken(static_cast<TokenId>(i + 1), i);
    s.PushFinish({.reason = FinishReason::kStopToken});
  });
  ASSERT_TRUE(s.SetCallback([&](const StreamEvent& e) {
                 if (e.kind == Kind::kToken) got.push_back(e.token);
                 else finished = true;
               }).ok());
  producer.join();
  ASSERT_EQ(got.size(), 200u);
  for (int i = 0; i < 200; ++i) EXPECT_EQ(got[i], i + 1);
  EXPECT_TRUE(finished);
  EXPECT_FALSE(s.SetCallback([](const StreamEvent&) {}).ok());
}

TEST(RequestStreamTest, CancelIsAFlagTheEngineReads) {
  RequestStream s(RequestId(3));
  EXPECT_FALSE(s.cancel_requested());
  s.RequestCancel();
  EXPECT_TRUE(s.cancel_requested());
}

}  // namespace
}  // namespace chunkserve::sched
