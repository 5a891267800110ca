// Framing: round trips in every byte split, and every malformed input class gets a Status.
#include "runtime/wire/framing.h"

#include <capnp/message.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "tests/testing/random.h"
#include "tests/testing/status_matchers.h"

namespace chunkserve::wire {
namespace {

using ::chunkserve::testing::StatusIs;

std::vector<uint8_t> GenerateFrame(uint64_t id, int prompt_len) {
  capnp::MallocMessageBuilder builder;
  auto g = builder.initRoot<schema::Envelope>().initGenerate();
  g.setRequestId(id);
  auto prompt = g.initPrompt(static_cast<unsigned>(prompt_len));
  for (int i = 0; i < prompt_len; ++i)
    prompt.set(static_cast<unsigned>(i), static_cast<uint32_t>(i * 3));
  g.setMaxNewTokens(7);
  auto bytes = EncodeFrame(builder);
  EXPECT_OK(bytes.status());
  return bytes.value();
}

void PutLe32(std::vector<uint8_t>* v, size_t at, uint32_t x) {
  for (int i = 0; i < 4; ++i) (*v)[at + i] = static_cast<uint8_t>(x >> (8 * i));
}

TEST(FramingTest, RoundTripOneFrame) {
  const auto frame = GenerateFrame(42, 100);
  ASSERT_OK_AND_ASSIGN(DecodedMessage m, DecodeFrame(frame.data(), frame.size(), {}));
  ASSERT_EQ(m.root().which(), schema::Envelope::GENERATE);
  EXPECT_EQ(m.root().getGenerate().getRequestId(), 42u);
  EXPECT_EQ(m.root().getGenerate().getPrompt().size(), 100u);
  EXPECT_EQ(m.root().getGenerate().getPrompt()[99], 297u);
  EXPECT_EQ(m.frame_bytes(), frame.size());
}

TEST(FramingTest, DecoderHandlesEverySplitAndBackToBackFrames) {
  std::vector<uint8_t> stream;
  for (int i = 0; i < 3; ++i) {
    const auto f = GenerateFrame(static_cast<uint64_t>(i + 1), 10 + i);
    stream.insert(stream.end(), f.begin(), f.end());
  }
  for (size_t step : {size_t{1}, size_t{3}, size_t{7}, size_t{64}, stream.size()}) {
    FrameDecoder decoder;
    std::vector<uint64_t> ids;
    for (size_t at = 0; at < stream.size(); at += step) {
      ASSERT_OK(decoder.Feed(stream.data() + at, std::min(step, stream.size() - at)));
      DecodedMessage m;
      while (decoder.Next(&m)) ids.push_back(m.root().getGenerate().getRequestId());
    }
    EXPECT_EQ(ids, (std::vector<uint64_t>{1, 2, 3})) << "step " << step;
    EXPECT_EQ(decoder.buffered_bytes(), 0u);
  }
}

// Frames larger than the decoder's 16 KiB blocks, fed in random splits: every token intact, and
// the memory held follows the bytes received (rounded up to a block), never the announced size.
TEST(FramingTest, LargeFramesAcrossBlocksInRandomSplits) {
  const uint64_t seed = testing::TestSeed();
  testing::Random rng(seed);
  std::vector<uint8_t> stream;
  const int lengths[] = {5, 20000, 4096, 3, 70000};
  for (int i = 0; i < 5; ++i) {
    const auto f = GenerateFrame(static_cast<uint64_t>(i + 1), lengths[i]);
    stream.insert(stream.end(), f.begin(), f.end());
  }
  FrameDecoder decoder;
  std::vector<uint64_t> ids;
  size_t at = 0, in_frame = 0;
  while (at < stream.size()) {
    const size_t step = std::min<size_t>(static_cast<size_t>(rng.Int(1, 40000)), stream.size() - at);
    ASSERT_OK(decoder.Feed(stream.data() + at, step));
    at += step;
    DecodedMessage m;
    while (decoder.Next(&m)) {
      const auto g = m.root().getGenerate();
      const int n = lengths[ids.size()];
      ASSERT_EQ(g.getPrompt().size(), static_cast<unsigned>(n)) << "seed " << seed;
      EXPECT_EQ(g.getPrompt()[static_cast<unsigned>(n - 1)], static_cast<uint32_t>((n - 1) * 3));
      ids.push_back(g.getRequestId());
      in_frame += m.frame_bytes();
    }
    EXPECT_LE(decoder.buffered_bytes(), at - in_frame + (16u << 10)) << "seed " << seed;
  }
  EXPECT_EQ(ids, (std::vector<uint64_t>{1, 2, 3, 4, 5})) << "seed " << seed;
  EXPECT_EQ(decoder.buffered_bytes(), 0u);
}

TEST(FramingTest, MemoryFollowsReceivedBytesNotTheAnnouncedSize) {
  std::vector<uint8_t> bytes(8 + 1000, 0);
  PutLe32(&bytes, 0, 0);               // one segment
  PutLe32(&bytes, 4, (1u << 20) / 8);  // of 1 MiB
  FrameDecoder decoder;
  ASSERT_OK(decoder.Feed(bytes.data(), bytes.size()));
  EXPECT_EQ(decoder.buffered_bytes(), 16u << 10);
}

TEST(FramingTest, TruncatedFrameIsAnErrorForOneShotDecode) {
  const auto frame = GenerateFrame(1, 10);
  for (size_t n : {size_t{0}, size_t{3}, size_t{8}, frame.size() - 1}) {
    EXPECT_THAT(DecodeFrame(frame.data(), n, {}).status(), StatusIs(StatusCode::kDataLoss));
  }
  // The incremental decoder just waits for more.
  FrameDecoder decoder;
  ASSERT_OK(decoder.Feed(frame.data(), frame.size() - 1));
  DecodedMessage m;
  EXPECT_FALSE(decoder.Next(&m));
}

TEST(FramingTest, TooManySegmentsRejectedBeforeBuffering) {
  std::vector<uint8_t> bytes(8, 0);
  PutLe32(&bytes, 0, 0xFFFFFFFFu);  // 2^32 segments
  FrameDecoder decoder;
  EXPECT_THAT(decoder.Feed(bytes.data(), bytes.size()), StatusIs(StatusCode::kDataLoss));
  EXPECT_LE(decoder.buffered_bytes(), 8u);
  // Sticky.
  EXPECT_FALSE(decoder.Feed(bytes.data(), 1).ok());
}

TEST(FramingTest, OversizedFrameRejectedFromItsSegmentTable) {
  std::vector<uint8_t> bytes(8, 0);
  PutLe32(&bytes, 0, 0);            // one segment
  PutLe32(&bytes, 4, 0x10000000u);  // 2 GiB
  FrameDecoder decoder(ReaderLimits{.max_message_bytes = 1u << 20});
  EXPECT_THAT(decoder.Feed(bytes.data(), bytes.size()), StatusIs(StatusCode::kResourceExhausted));
  EXPECT_LT(decoder.buffered_bytes(), 64u);
}

// max_message_bytes bounds the whole frame, its segment table included: a frame of exactly the
// limit passes, one byte less of limit refuses it (one-shot and incremental), though its segments
// alone would fit. Kills the mutation wire-frame-limit-excludes-table (tests/mutation).
TEST(FramingTest, SizeLimitCountsTheSegmentTable) {
  const auto frame = GenerateFrame(1, 40);
  const ReaderLimits exact{.max_message_bytes = frame.size()};
  EXPECT_OK(DecodeFrame(frame.data(), frame.size(), exact).status());
  FrameDecoder fits(exact);
  ASSERT_OK(fits.Feed(frame.data(), frame.size()));
  DecodedMessage m;
  EXPECT_TRUE(fits.Next(&m));

  const ReaderLimits one_less{.max_message_bytes = frame.size() - 1};
  EXPECT_THAT(DecodeFrame(frame.data(), frame.size(), one_less).status(),
              StatusIs(StatusCode::kResourceExhausted));
  FrameDecoder whole(one_less);
  EXPECT_THAT(whole.Feed(frame.data(), frame.size()), StatusIs(StatusCode::kResourceExhausted));
  FrameDecoder split(one_less);  // the table alone, then the rest
  ASSERT_OK(split.Feed(frame.data(), 4));
  EXPECT_THAT(split.Feed(frame.data() + 4, frame.size() - 4),
              StatusIs(StatusCode::kResourceExhausted));
}

TEST(FramingTest, EmptyFrameRejected) {
  std::vector<uint8_t> bytes(8, 0);
  EXPECT_THAT(DecodeFrame(bytes.data(), bytes.size(), {}).status(),
              StatusIs(StatusCode::kDataLoss));
}

TEST(FramingTest, BadRootPointerIsDataLoss) {
  std::vector<uint8_t> bytes(16, 0);
  PutLe32(&bytes, 4, 1);  // one segment of one word
  // Root: a struct pointer with offset far outside the segment.
  const uint64_t ptr = (uint64_t{0x100000} << 2) | (uint64_t{1} << 32);
  std::memcpy(bytes.data() + 8, &ptr, 8);
  EXPECT_THAT(DecodeFrame(bytes.data(), bytes.size(), {}).status(),
              StatusIs(StatusCode::kDataLoss));
}

TEST(FramingTest, DeepNestingHitsTheNestingLimit) {
  // A well-formed message whose nesting exceeds a tiny limit: Envelope -> Generate -> Sampling.
  capnp::MallocMessageBuilder builder;
  builder.initRoot<schema::Envelope>().initGenerate().initSampling().setTopK(3);
  ASSERT_OK_AND_ASSIGN(auto frame, EncodeFrame(builder));
  EXPECT_OK(DecodeFrame(frame.data(), frame.size(), {}).status());
  EXPECT_THAT(DecodeFrame(frame.data(), frame.size(), ReaderLimits{.nesting_limit = 1}).status(),
              StatusIs(StatusCode::kDataLoss));
}

TEST(FramingTest, TraversalLimitBoundsAmplification) {
  const auto frame = GenerateFrame(1, 4000);
  EXPECT_THAT(
      DecodeFrame(frame.data(), frame.size(), ReaderLimits{.traversal_limit_words = 100}).status(),
      StatusIs(StatusCode::kDataLoss));
}

TEST(FramingTest, RandomBytesNeverCrash) {
  testing::Random rng(testing::TestSeed());
  for (int i = 0; i < 2000; ++i) {
    std::vector<uint8_t> bytes(static_cast<size_t>(rng.Int(0, 200)));
    for (auto& b : bytes) b = static_cast<uint8_t>(rng.Int(0, 255));
    (void)DecodeFrame(bytes.data(), bytes.size(), {});
    FrameDecoder decoder;
    (void)decoder.Feed(bytes.data(), bytes.size());
    DecodedMessage m;
    while (decoder.Next(&m)) (void)m.root().which();
  }
}

}  // namespace
}  // namespace chunkserve::wire
