#include "runtime/kvcache/flat_index.h"

#include <gtest/gtest.h>

#include <map>

#include "tests/testing/random.h"

namespace chunkserve::kv::internal {
namespace {

TEST(FlatIndexTest, FindsWhatWasSetAndForgetsWhatWasErased) {
  FlatIndex index(8);
  EXPECT_EQ(index.Find(5), FlatIndex::kEmpty);
  index.Set(5, 50);
  index.Set(0, 7);  // key 0 is an ordinary key
  EXPECT_EQ(index.Find(5), 50u);
  EXPECT_EQ(index.Find(0), 7u);
  index.Set(5, 51);
  EXPECT_EQ(index.Find(5), 51u);
  EXPECT_EQ(index.size(), 2u);
  EXPECT_TRUE(index.Erase(5));
  EXPECT_FALSE(index.Erase(5));
  EXPECT_EQ(index.Find(5), FlatIndex::kEmpty);
  EXPECT_EQ(index.size(), 1u);
}

TEST(FlatIndexTest, DefaultConstructedIsEmpty) {
  FlatIndex index;
  EXPECT_EQ(index.Find(1), FlatIndex::kEmpty);
  EXPECT_FALSE(index.Erase(1));
}

// Random inserts and erases at full load against std::map: backward-shift deletion must keep every
// remaining key reachable.
TEST(FlatIndexTest, RandomOperationsMatchStdMap) {
  chunkserve::testing::Random rng(chunkserve::testing::TestSeed());
  constexpr size_t kMax = 64;
  FlatIndex index(kMax);
  std::map<uint64_t, uint32_t> model;
  for (int op = 0; op < 200000; ++op) {
    // Small key space so probes collide and runs wrap around the table.
    const uint64_t key = static_cast<uint64_t>(rng.Int(0, 150)) * 0x9e3779b97f4a7c15ULL;
    if (rng.Bernoulli(0.5) && (model.size() < kMax || model.count(key) != 0)) {
      const uint32_t value = static_cast<uint32_t>(rng.Int(0, 1000));
      index.Set(key, value);
      model[key] = value;
    } else {
      ASSERT_EQ(index.Erase(key), model.erase(key) == 1);
    }
    ASSERT_EQ(index.size(), model.size());
    if (op % 64 == 0) {
      for (const auto& [k, v] : model) ASSERT_EQ(index.Find(k), v);
      size_t n = 0;
      index.ForEach([&](uint64_t k, uint32_t v) {
        ++n;
        EXPECT_EQ(model.at(k), v);
      });
      ASSERT_EQ(n, model.size());
    }
  }
}

}  // namespace
}  // namespace chunkserve::kv::internal
