#include "runtime/sched/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <vector>

#include "tests/testing/random.h"

namespace chunkserve::sched {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

TEST(SamplerTest, GreedyTakesArgmaxWithTiesToLowestId) {
  Sampler s({.temperature = 0.0f});
  EXPECT_EQ(s.Sample(std::vector<float>{0.1f, 2.0f, -1.0f, 2.0f}), 1);
  EXPECT_EQ(Argmax(std::vector<float>{-kInf, -kInf}), 0);
  EXPECT_EQ(Argmax(std::vector<float>{std::nanf(""), 1.0f}), 1);
}

TEST(SamplerTest, SameSeedSameTokensDifferentSeedDiffers) {
  testing::Random rng(testing::TestSeed());
  const std::vector<float> logits = rng.Floats(1000, -2.0f, 2.0f);
  const SamplingParams p{.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .seed = 42};
  Sampler a(p), b(p), c({.temperature = 1.0f, .seed = 43});
  std::vector<TokenId> ta, tb, tc;
  for (int i = 0; i < 64; ++i) {
    ta.push_back(a.Sample(logits));
    tb.push_back(b.Sample(logits));
    tc.push_back(c.Sample(logits));
  }
  EXPECT_EQ(ta, tb);
  EXPECT_NE(ta, tc);
}

TEST(SamplerTest, TopKNeverLeavesTheKBest) {
  testing::Random rng(testing::TestSeed());
  std::vector<float> logits = rng.Floats(200);
  logits[17] = 5.0f;
  logits[3] = 4.9f;
  Sampler s({.temperature = 10.0f, .top_k = 2, .seed = rng.engine()()});
  std::map<TokenId, int> seen;
  for (int i = 0; i < 2000; ++i) ++seen[s.Sample(logits)];
  EXPECT_EQ(seen.size(), 2u);
  EXPECT_GT(seen[17], 0);
  EXPECT_GT(seen[3], 0);
}

TEST(SamplerTest, TinyTopPKeepsOnlyTheMostLikely) {
  Sampler s({.temperature = 1.0f, .top_p = 0.01f, .seed = 9});
  for (int i = 0; i < 100; ++i) EXPECT_EQ(s.Sample(std::vector<float>{0.0f, 1.0f, 0.5f}), 1);
}

TEST(SamplerTest, FrequenciesFollowTheSoftmax) {
  // p = (0.5, 0.3, 0.2); 20000 draws: each frequency is within 5 standard deviations.
  const std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  Sampler s({.temperature = 1.0f, .seed = testing::TestSeed()});
  constexpr int kDraws = 20000;
  std::vector<int> count(3);
  for (int i = 0; i < kDraws; ++i) ++count[s.Sample(logits)];
  const double p[] = {0.5, 0.3, 0.2};
  for (int i = 0; i < 3; ++i) {
    const double sd = std::sqrt(kDraws * p[i] * (1 - p[i]));
    EXPECT_NEAR(count[i], kDraws * p[i], 5 * sd) << "token " << i;
  }
}

TEST(SamplerTest, TopPCutsTheTail) {
  // p = (0.5, 0.3, 0.2), top_p 0.7 keeps {0, 1}: token 2 never appears, 0 and 1 as 5:3.
  const std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  Sampler s({.temperature = 1.0f, .top_p = 0.7f, .seed = testing::TestSeed()});
  std::vector<int> count(3);
  for (int i = 0; i < 8000; ++i) ++count[s.Sample(logits)];
  EXPECT_EQ(count[2], 0);
  EXPECT_NEAR(count[0] / 8000.0, 0.625, 0.03);
}

TEST(SamplerTest, NonFiniteLogitsAreNeverSampled) {
  Sampler s({.temperature = 1.0f, .seed = 1});
  const std::vector<float> logits = {std::nanf(""), 0.0f, kInf, -kInf};
  for (int i = 0; i < 100; ++i) EXPECT_EQ(s.Sample(logits), 1);
}

}  // namespace
}  // namespace chunkserve::sched
