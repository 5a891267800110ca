#include "runtime/model/dtype.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "tests/testing/random.h"
#include "tests/testing/status_matchers.h"

namespace chunkserve::model {
namespace {

using ::chunkserve::testing::Random;
using ::chunkserve::testing::StatusIs;
using ::chunkserve::testing::TestSeed;

// Independent reference: the representable value nearest to x among `candidates` (sorted
// ascending, finite), ties to the one with an even bit pattern; past the top, IEEE overflow rules
// (round to the largest finite value only below max + half an ulp).
uint16_t NearestBits(double x, const std::vector<std::pair<double, uint16_t>>& candidates,
                     double overflow_threshold, uint16_t inf_bits) {
  if (x >= overflow_threshold) return inf_bits;
  auto hi = std::lower_bound(candidates.begin(), candidates.end(), std::make_pair(x, uint16_t{0}),
                             [](const auto& a, const auto& b) { return a.first < b.first; });
  if (hi == candidates.end()) return candidates.back().second;
  if (hi->first == x || hi == candidates.begin()) return hi->second;
  auto lo = hi - 1;
  const double dlo = x - lo->first, dhi = hi->first - x;
  if (dlo < dhi) return lo->second;
  if (dhi < dlo) return hi->second;
  return (lo->second & 1) == 0 ? lo->second : hi->second;
}

// Positive finite values of a 16-bit format, ascending (both formats order like their bits).
std::vector<std::pair<double, uint16_t>> PositiveFinite(float (*to_float)(uint16_t),
                                                        uint16_t inf_bits) {
  std::vector<std::pair<double, uint16_t>> v;
  for (uint32_t b = 0; b < inf_bits; ++b) v.push_back({to_float(static_cast<uint16_t>(b)), b});
  return v;
}

TEST(DTypeTest, NamesRoundTrip) {
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
    EXPECT_EQ(*ParseDType(DTypeName(t)), t);
    EXPECT_EQ(*ParseDType(SafetensorsDTypeName(t)), t);
    EXPECT_EQ(*ParseDType(TorchDTypeName(t)), t);
  }
  EXPECT_THAT(ParseDType("int8"), StatusIs(StatusCode::kInvalidArgument));
}

TEST(DTypeTest, HalfRoundTripsEveryNonNanValue) {
  for (uint32_t b = 0; b <= 0xffff; ++b) {
    const uint16_t h = static_cast<uint16_t>(b);
    const float f = HalfToFloat(h);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(f)))) << b;
    } else {
      EXPECT_EQ(FloatToHalf(f), h) << b;
    }
  }
}

TEST(DTypeTest, HalfDecodesKnownValues) {
  EXPECT_EQ(HalfToFloat(0x3c00), 1.0f);
  EXPECT_EQ(HalfToFloat(0xc000), -2.0f);
  EXPECT_EQ(HalfToFloat(0x7bff), 65504.0f);
  EXPECT_EQ(HalfToFloat(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(HalfToFloat(0x0400), std::ldexp(1.0f, -14));  // smallest normal
  EXPECT_TRUE(std::isinf(HalfToFloat(0x7c00)));
  EXPECT_TRUE(std::signbit(HalfToFloat(0x8000)));
}

TEST(DTypeTest, HalfRoundsEdgeCasesToNearestEven) {
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(65519.99f), 0x7bff);
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);  // the tie goes to even: infinity
  EXPECT_EQ(FloatToHalf(1e10f), 0x7c00);
  EXPECT_EQ(FloatToHalf(-1e10f), 0xfc00);
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -25)), 0x0000);         // tie between 0 and 2^-24
  EXPECT_EQ(FloatToHalf(std::ldexp(3.0f, -26)), 0x0001);         // 0.75 ulp rounds up
  EXPECT_EQ(FloatToHalf(std::ldexp(3.0f, -25)), 0x0002);         // 1.5 ulp ties to even 2
  EXPECT_EQ(FloatToHalf(std::ldexp(5.0f, -25)), 0x0002);         // 2.5 ulp ties to even 2
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie: keep even 1.0
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(3.0f, -11)), 0x3c02);  // tie: round to even 0x3c02
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(std::nanf("")))));
}

TEST(DTypeTest, HalfMatchesNearestValueReferenceOnRandomFloats) {
  const std::vector<std::pair<double, uint16_t>> halves = PositiveFinite(HalfToFloat, 0x7c00);
  Random rng(TestSeed());
  for (int i = 0; i < 200000; ++i) {
    // Random bit patterns across the half range, from below the subnormals to past the top.
    const uint32_t exponent = static_cast<uint32_t>(rng.Int(95, 144));
    const uint32_t bits = (exponent << 23) | static_cast<uint32_t>(rng.Int(0, (1 << 23) - 1));
    const float f = std::bit_cast<float>(bits);
    const uint16_t expected = NearestBits(f, halves, 65520.0, 0x7c00);
    ASSERT_EQ(FloatToHalf(f), expected) << f;
    ASSERT_EQ(FloatToHalf(-f), expected | 0x8000) << -f;
  }
}

TEST(DTypeTest, Bf16RoundTripsEveryNonNanValue) {
  for (uint32_t b = 0; b <= 0xffff; ++b) {
    const uint16_t h = static_cast<uint16_t>(b);
    const float f = Bf16ToFloat(h);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(f)))) << b;
    } else {
      EXPECT_EQ(FloatToBf16(f), h) << b;
    }
  }
}

TEST(DTypeTest, Bf16MatchesNearestValueReferenceOnRandomFloats) {
  const std::vector<std::pair<double, uint16_t>> values = PositiveFinite(Bf16ToFloat, 0x7f80);
  // Largest bf16 plus half an ulp: 0x7f7f is (2 - 2^-7) * 2^127.
  const double overflow = std::ldexp(2.0 - std::ldexp(1.0, -8), 127);
  Random rng(TestSeed());
  for (int i = 0; i < 200000; ++i) {
    const uint32_t bits = static_cast<uint32_t>(rng.Int(0, 0x7f7fffff));
    const float f = std::bit_cast<float>(bits);
    const uint16_t expected = NearestBits(f, values, overflow, 0x7f80);
    ASSERT_EQ(FloatToBf16(f), expected) << f;
  }
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(std::nanf("")))));
  EXPECT_EQ(FloatToBf16(std::numeric_limits<float>::infinity()), 0x7f80);
}

TEST(DTypeTest, BufferConversionsHandleUnalignedPointers) {
  const std::vector<float> src = {1.0f, -2.5f, 0.333f, 65504.0f, 1e-3f};
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
    std::vector<unsigned char> buf(1 + src.size() * DTypeSize(t));
    ConvertFromFloat(src, t, buf.data() + 1);
    std::vector<float> back(src.size());
    ConvertToFloat(t, buf.data() + 1, back);
    for (size_t i = 0; i < src.size(); ++i) {
      float expected = src[i];
      if (t == DType::kF16) expected = HalfToFloat(FloatToHalf(src[i]));
      if (t == DType::kBF16) expected = Bf16ToFloat(FloatToBf16(src[i]));
      EXPECT_EQ(back[i], expected) << DTypeName(t) << " " << i;
    }
  }
}

}  // namespace
}  // namespace chunkserve::model
