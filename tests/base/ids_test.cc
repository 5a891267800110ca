#include "runtime/base/ids.h"

#include <gtest/gtest.h>

#include <sstream>
#include <type_traits>
#include <unordered_set>

namespace chunkserve {
namespace {

TEST(StrongIdTest, DefaultIsInvalid) {
  EXPECT_FALSE(SeqId().valid());
  EXPECT_EQ(SeqId(), SeqId::Invalid());
  EXPECT_TRUE(SeqId(0).valid());
}

TEST(StrongIdTest, DistinctIdTypesDoNotConvert) {
  static_assert(!std::is_convertible_v<SeqId, SlotId>);
  static_assert(!std::is_convertible_v<uint32_t, SeqId>);
  static_assert(sizeof(SeqId) == sizeof(uint32_t));
  static_assert(sizeof(RequestId) == sizeof(uint64_t));
}

TEST(StrongIdTest, OrdersHashesAndPrints) {
  EXPECT_LT(SeqId(1), SeqId(2));
  std::unordered_set<SeqId> set{SeqId(1), SeqId(2), SeqId(1)};
  EXPECT_EQ(set.size(), 2u);
  std::ostringstream os;
  os << SeqId(7) << " " << SlotId();
  EXPECT_EQ(os.str(), "SeqId(7) SlotId(invalid)");
}

}  // namespace
}  // namespace chunkserve
