// Seeded random inputs for randomized tests.
//
// Every randomized test takes its seed from TestSeed(), which prints it (as a test property and
// on stdout) so a failure can be replayed: CHUNKSERVE_TEST_SEED=<seed> ctest -R <test>. Without
// the variable each run draws a fresh seed, so repeated CI runs explore new inputs.
#ifndef CHUNKSERVE_TESTS_TESTING_RANDOM_H_
#define CHUNKSERVE_TESTS_TESTING_RANDOM_H_

#include <cstdint>
#include <random>
#include <vector>

namespace chunkserve::testing {

// The seed for the current test: $CHUNKSERVE_TEST_SEED if set, else a fresh random one. Printed.
uint64_t TestSeed();

class Random {
 public:
  explicit Random(uint64_t seed) : rng_(seed) {}

  // Uniform integer in [lo, hi] (inclusive).
  int64_t Int(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng_); }
  // Uniform float in [lo, hi).
  float Float(float lo = -1.0f, float hi = 1.0f) {
    return std::uniform_real_distribution<float>(lo, hi)(rng_);
  }
  bool Bernoulli(double p) { return std::bernoulli_distribution(p)(rng_); }

  std::vector<float> Floats(size_t n, float lo = -1.0f, float hi = 1.0f) {
    std::vector<float> v(n);
    for (float& x : v) x = Float(lo, hi);
    return v;
  }
  std::vector<int32_t> Tokens(size_t n, int32_t vocab) {
    std::vector<int32_t> v(n);
    for (int32_t& t : v) t = static_cast<int32_t>(Int(0, vocab - 1));
    return v;
  }

  std::mt19937_64& engine() { return rng_; }

 private:
  std::mt19937_64 rng_;
};

}  // namespace chunkserve::testing

#endif  // CHUNKSERVE_TESTS_TESTING_RANDOM_H_
