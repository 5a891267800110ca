#include "tests/testing/random.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <iostream>
#include <string>

namespace chunkserve::testing {

uint64_t TestSeed() {
  uint64_t seed = 0;
  if (const char* env = std::getenv("CHUNKSERVE_TEST_SEED"); env != nullptr && *env != '\0') {
    seed = std::strtoull(env, nullptr, 10);
  } else {
    std::random_device rd;
    seed = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }
  ::testing::Test::RecordProperty("seed", std::to_string(seed));
  std::cout << "[ seed     ] CHUNKSERVE_TEST_SEED=" << seed << std::endl;
  return seed;
}

}  // namespace chunkserve::testing
