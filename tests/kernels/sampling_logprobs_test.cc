// kernels::cpu::TokenLogprobs against a plain double-precision log-softmax and sort on fresh random
// rows, and its handling of rows with -inf / NaN / +inf logits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "kernels/cpu/sampling.h"
#include "tests/testing/random.h"

namespace chunkserve::kernels::cpu {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

struct Result {
  float logprob;
  std::vector<int32_t> ids;
  std::vector<float> values;
};

Result Logprobs(const std::vector<float>& row, int32_t token, int32_t k) {
  SamplingScratch scratch;
  Result r;
  r.ids.assign(static_cast<size_t>(std::max(k, 0)), -7);
  r.values.assign(static_cast<size_t>(std::max(k, 0)), 0);
  int32_t n = -1;
  r.logprob = TokenLogprobs(row, token, k, r.ids.data(), r.values.data(), &n, &scratch);
  r.ids.resize(static_cast<size_t>(n));
  r.values.resize(static_cast<size_t>(n));
  return r;
}

TEST(TokenLogprobsTest, MatchesAPlainLogSoftmaxOnRandomRows) {
  testing::Random rng(testing::TestSeed());
  for (int trial = 0; trial < 200; ++trial) {
    const int vocab = static_cast<int>(rng.Int(1, 3000));
    // Wide ranges (up to +-60) so that a missing max subtraction would overflow exp() in float.
    const float scale = rng.Float(0.1f, 60.0f);
    std::vector<float> row = rng.Floats(static_cast<size_t>(vocab), -scale, scale);
    if (vocab > 4 && rng.Bernoulli(0.3)) row[2] = row[3];  // a tie: the lower id first
    const auto token = static_cast<int32_t>(rng.Int(0, vocab - 1));
    const auto k = static_cast<int32_t>(rng.Int(0, 20));

    double max = -1e300, sum = 0;
    for (float x : row) max = std::max(max, static_cast<double>(x));
    for (float x : row) sum += std::exp(static_cast<double>(x) - max);
    const double log_z = max + std::log(sum);
    std::vector<int32_t> order(static_cast<size_t>(vocab));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return row[a] > row[b]; });

    const Result r = Logprobs(row, token, k);
    EXPECT_NEAR(r.logprob, row[token] - log_z, 1e-5 * (1 + std::abs(row[token] - log_z)))
        << "trial " << trial;
    ASSERT_EQ(r.ids.size(), static_cast<size_t>(std::min(k, vocab))) << "trial " << trial;
    for (size_t i = 0; i < r.ids.size(); ++i) {
      EXPECT_EQ(r.ids[i], order[i]) << "trial " << trial << " rank " << i;
      EXPECT_NEAR(r.values[i], row[order[i]] - log_z, 1e-5 * (1 + std::abs(row[order[i]] - log_z)));
    }
  }
}

TEST(TokenLogprobsTest, NonFiniteLogitsHaveProbabilityZero) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> row = {nan, -kInf, 0.0f, kInf, std::log(3.0f)};
  const Result r = Logprobs(row, 2, 5);
  EXPECT_NEAR(r.logprob, std::log(0.25), 1e-6);  // softmax over {0, log 3}: 1/4 and 3/4
  EXPECT_EQ(r.ids, (std::vector<int32_t>{4, 2}));  // only the finite logits are candidates
  EXPECT_NEAR(r.values[0], std::log(0.75), 1e-6);
  EXPECT_EQ(Logprobs(row, 0, 0).logprob, -kInf);  // NaN
  EXPECT_EQ(Logprobs(row, 3, 0).logprob, -kInf);  // +inf is not finite either
  EXPECT_EQ(Logprobs(row, 9, 0).logprob, -kInf);  // outside the row

  const Result none = Logprobs({-kInf, nan}, 0, 3);
  EXPECT_EQ(none.logprob, -kInf);
  EXPECT_TRUE(none.ids.empty());
}

}  // namespace
}  // namespace chunkserve::kernels::cpu
