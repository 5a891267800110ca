// The portable fp16 / bf16 conversions: exhaustive round trips, rounding ties, specials, and
// agreement with the F16C instructions where the CPU has them.
#include "kernels/cpu/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "tests/testing/random.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace chunkserve::kernels::cpu {
namespace {

using chunkserve::testing::Random;
using chunkserve::testing::TestSeed;

TEST(HalfTest, EveryHalfRoundTrips) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = HalfToFloat(static_cast<uint16_t>(h));
    const bool is_nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0;
    if (is_nan) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << h;
      ASSERT_TRUE(std::isnan(HalfToFloat(FloatToHalf(f)))) << std::hex << h;
    } else {
      ASSERT_EQ(FloatToHalf(f), h) << std::hex << h << " -> " << f;
    }
  }
}

TEST(HalfTest, RoundsToNearestEven) {
  EXPECT_EQ(FloatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(FloatToHalf(1.0f + 1.0f / 2048), 0x3c00);  // tie -> even (down)
  EXPECT_EQ(FloatToHalf(1.0f + 3.0f / 2048), 0x3c02);  // tie -> even (up)
  EXPECT_EQ(FloatToHalf(1.0f + 1.0f / 2048 + 1e-7f), 0x3c01);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(65519.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);  // tie between max and 2^16 -> inf
  EXPECT_EQ(FloatToHalf(-1e9f), 0xfc00);
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -24)), 0x0001);     // smallest subnormal
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -25)), 0x0000);     // tie -> even (zero)
  EXPECT_EQ(FloatToHalf(std::ldexp(3.0f, -25)), 0x0002);     // 1.5 ulp: tie -> even (2)
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -14)), 0x0400);     // smallest normal
  EXPECT_EQ(FloatToHalf(std::ldexp(1023.5f, -24)), 0x0400);  // rounds up into the normals
  EXPECT_EQ(FloatToHalf(-0.0f), 0x8000);
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(Bf16Test, RoundsToNearestEven) {
  EXPECT_EQ(FloatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBf16(BitsFloat(0x3f808000u)), 0x3f80);  // tie -> even (down)
  EXPECT_EQ(FloatToBf16(BitsFloat(0x3f818000u)), 0x3f82);  // tie -> even (up)
  EXPECT_EQ(FloatToBf16(BitsFloat(0x3f808001u)), 0x3f81);
  EXPECT_EQ(FloatToBf16(BitsFloat(0x7f7fffffu)), 0x7f80);  // max float rounds to inf
  EXPECT_EQ(FloatToBf16(-std::numeric_limits<float>::infinity()), 0xff80);
  const uint16_t nan = FloatToBf16(BitsFloat(0x7f800001u));  // signalling NaN whose payload is low
  EXPECT_TRUE(std::isnan(Bf16ToFloat(nan)));
  EXPECT_NE(nan & 0x40, 0);  // quiet
  EXPECT_EQ(Bf16ToFloat(0x4049), 3.140625f);
}

TEST(Bf16Test, EveryBf16RoundTrips) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = Bf16ToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(FloatToBf16(f), h) << std::hex << h;
  }
}

#if defined(__x86_64__) || defined(__i386__)
__attribute__((target("f16c"))) uint16_t HardwareHalf(float f) {
  return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
}
__attribute__((target("f16c"))) float HardwareHalfToFloat(uint16_t h) { return _cvtsh_ss(h); }

TEST(HalfTest, MatchesF16cOnRandomBits) {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("f16c")) GTEST_SKIP() << "no F16C on this CPU";
  Random rng(TestSeed());
  for (int i = 0; i < 1 << 20; ++i) {
    // Exponents around the half range, where rounding, subnormals and overflow happen.
    const uint32_t bits = static_cast<uint32_t>(rng.Int(0, 0xffffffffLL));
    const uint32_t exponent = static_cast<uint32_t>(rng.Int(96, 146));
    const float f = BitsFloat((bits & 0x807fffffu) | (exponent << 23));
    ASSERT_EQ(FloatToHalf(f), HardwareHalf(f)) << std::hexfloat << f;
  }
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float want = HardwareHalfToFloat(static_cast<uint16_t>(h));
    const float got = HalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got));
    } else {
      ASSERT_EQ(FloatBits(got), FloatBits(want)) << std::hex << h;
    }
  }
}
#endif

TEST(ConvertTest, BulkConversionsMatchScalarOnes) {
  Random rng(TestSeed());
  const std::vector<float> x = rng.Floats(1000, -100.0f, 100.0f);
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
    std::vector<uint32_t> stored(x.size());
    std::vector<float> back(x.size());
    ConvertFromFloat(t, x.data(), stored.data(), x.size());
    ConvertToFloat(t, stored.data(), back.data(), x.size());
    for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(back[i], RoundThrough(t, x[i])) << i;
  }
}

}  // namespace
}  // namespace chunkserve::kernels::cpu
