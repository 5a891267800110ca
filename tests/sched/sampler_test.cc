#include "runtime/sched/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <string>
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

// The distribution a rule gives, computed independently of the sampler: softmax(logits / T) over
// tokens already sorted by logit, the first top_k kept, then the shortest prefix whose mass
// reaches top_p, renormalized.
std::vector<double> Expected(const std::vector<float>& logits, float t, int top_k, float top_p) {
  std::vector<double> q;
  for (float x : logits) q.push_back(std::exp(static_cast<double>(x) / t));
  if (top_k > 0) q.resize(std::min<size_t>(q.size(), static_cast<size_t>(top_k)));
  double total = 0;
  for (double v : q) total += v;
  double mass = 0;
  size_t kept = q.size();
  for (size_t i = 0; i < q.size(); ++i) {
    mass += q[i] / total;
    if (mass >= top_p) {
      kept = i + 1;
      break;
    }
  }
  q.resize(kept);
  double kept_total = 0;
  for (double v : q) kept_total += v;
  std::vector<double> out(logits.size(), 0.0);
  for (size_t i = 0; i < kept; ++i) out[i] = q[i] / kept_total;
  return out;
}

// Temperature, top-k and top-p together: the frequencies of 40000 draws are those of the
// renormalized distribution within 5 standard deviations, and filtered tokens never appear. (A
// sampler that ignored the temperature would miss by tens of deviations: at T = 0.5 the first
// token's share is 0.53, at T = 1 it would be 0.43.)
TEST(SamplerTest, TemperatureTopKAndTopPGiveTheRenormalizedDistribution) {
  const std::vector<double> p = {0.30, 0.22, 0.18, 0.12, 0.10, 0.08};
  std::vector<float> logits;
  for (double v : p) logits.push_back(static_cast<float>(std::log(v)));
  struct Case {
    float temperature;
    int top_k;
    float top_p;
  };
  for (const Case& c :
       {Case{0.5f, 4, 0.9f}, Case{2.0f, 0, 1.0f}, Case{1.5f, 5, 0.8f}, Case{0.7f, 3, 1.0f}}) {
    const std::vector<double> want = Expected(logits, c.temperature, c.top_k, c.top_p);
    Sampler s({.temperature = c.temperature,
               .top_k = c.top_k,
               .top_p = c.top_p,
               .seed = testing::TestSeed() + static_cast<uint64_t>(c.top_k)});
    constexpr int kDraws = 40000;
    std::vector<int> count(p.size());
    for (int i = 0; i < kDraws; ++i) ++count[s.Sample(logits)];
    for (size_t i = 0; i < p.size(); ++i) {
      if (want[i] == 0.0) {
        EXPECT_EQ(count[i], 0) << "T " << c.temperature << " token " << i << " is filtered";
        continue;
      }
      const double sd = std::sqrt(kDraws * want[i] * (1 - want[i]));
      EXPECT_NEAR(count[i], kDraws * want[i], 5 * sd)
          << "T " << c.temperature << " top_k " << c.top_k << " top_p " << c.top_p << " token "
          << i;
    }
  }
}

// Pearson's chi-square over the grid temperature x top_k x top_p, temperatures far from 1
// included, against the independently computed distribution. The statistic of a correct sampler
// follows chi-square with (kept tokens - 1) degrees of freedom; the bound, df + 8 sqrt(2 df) + 8,
// is beyond its 1e-9 quantile for these df, while a sampler that ignores the temperature, top_k
// or top_p misses by hundreds. Filtered tokens must never appear.
TEST(SamplerTest, ChiSquareOverTemperatureTopKAndTopP) {
  const std::vector<double> p = {0.28, 0.2, 0.16, 0.12, 0.1, 0.08, 0.06};
  std::vector<float> logits;
  for (double v : p) logits.push_back(static_cast<float>(std::log(v)));
  const uint64_t seed = testing::TestSeed();
  int cases = 0;
  for (float t : {0.1f, 0.4f, 1.0f, 3.0f, 10.0f}) {
    for (int top_k : {0, 2, 5}) {
      for (float top_p : {1.0f, 0.6f}) {
        const std::vector<double> want = Expected(logits, t, top_k, top_p);
        Sampler s({.temperature = t,
                   .top_k = top_k,
                   .top_p = top_p,
                   .seed = seed + static_cast<uint64_t>(cases++)});
        constexpr int kDraws = 20000;
        std::vector<int> count(p.size());
        for (int i = 0; i < kDraws; ++i) ++count[s.Sample(logits)];
        // Bins: tokens expected at least 5 times each; rarer kept tokens pooled into one bin (or
        // into the last bin when even the pool is rarer), as the chi-square approximation needs.
        std::vector<std::pair<double, double>> bins;  // (observed, expected)
        std::pair<double, double> pool{0, 0};
        for (size_t i = 0; i < p.size(); ++i) {
          const std::string where = "T " + std::to_string(t) + " top_k " +
                                    std::to_string(top_k) + " top_p " + std::to_string(top_p) +
                                    " token " + std::to_string(i);
          if (want[i] == 0.0) {
            EXPECT_EQ(count[i], 0) << where << " is filtered";
            continue;
          }
          const double expected = kDraws * want[i];
          if (expected >= 5) {
            bins.emplace_back(count[i], expected);
          } else {
            pool.first += count[i];
            pool.second += expected;
          }
        }
        if (pool.second >= 5 || bins.empty()) {
          bins.push_back(pool);
        } else {
          bins.back().first += pool.first;
          bins.back().second += pool.second;
        }
        double chi2 = 0;
        for (const auto& [observed, expected] : bins) {
          if (expected > 0) chi2 += (observed - expected) * (observed - expected) / expected;
        }
        const int kept = static_cast<int>(bins.size());
        const double df = std::max(1, kept - 1);
        EXPECT_LT(chi2, df + 8 * std::sqrt(2 * df) + 8)
            << "T " << t << " top_k " << top_k << " top_p " << top_p << ": chi-square " << chi2
            << " with " << df << " degrees of freedom";
      }
    }
  }
}

TEST(SamplerTest, NonFiniteLogitsAreNeverSampled) {
  Sampler s({.temperature = 1.0f, .seed = 1});
  const std::vector<float> logits = {std::nanf(""), 0.0f, kInf, -kInf};
  for (int i = 0; i < 100; ++i) EXPECT_EQ(s.Sample(logits), 1);
}

}  // namespace
}  // namespace chunkserve::sched
