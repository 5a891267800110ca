// KvAppend and KvCopy: values land at (slot, offset) of every KV head rounded exactly as the
// portable conversions round (bit for bit, on both ISA paths), and nothing else is written.
#include "kernels/cpu/kv_append.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/dtype.h"
#include "tests/kernels/attention_testing.h"
#include "tests/testing/random.h"

namespace chunkserve::kernels::cpu::testing {
namespace {

using chunkserve::testing::Random;
using chunkserve::testing::TestSeed;

struct Case {
  DType dtype;
  int32_t head_dim;
  CpuIsa isa;
};

std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  return DTypeName(info.param.dtype) + "_hd" + std::to_string(info.param.head_dim) + "_" +
         CpuIsaName(info.param.isa);
}

class KvAppendTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    if (!CpuSupports(GetParam().isa)) {
      GTEST_SKIP() << "this CPU has no " << CpuIsaName(GetParam().isa);
    }
    shape_.dtype = GetParam().dtype;
    shape_.head_dim = GetParam().head_dim;
    shape_.chunk_size = 16;
    shape_.num_kv_heads = 3;
    shape_.num_qo_heads = 3;
  }

  // Values that exercise rounding: random, halfway cases of both 16-bit formats, subnormals,
  // overflow, infinities, NaN.
  std::vector<float> Interesting(size_t n, Random& rng) {
    const float specials[] = {1.0f + 1.0f / 2048,
                              1.0f + 3.0f / 2048,
                              1.0f + 1.0f / 256,
                              1.0f + 3.0f / 256,
                              65504.0f,
                              65520.0f,
                              65519.0f,
                              5.96e-8f,
                              2.98e-8f,
                              4.5e-8f,
                              -0.0f,
                              1e-30f,
                              3.4e38f,
                              std::numeric_limits<float>::infinity(),
                              -std::numeric_limits<float>::infinity(),
                              std::numeric_limits<float>::quiet_NaN()};
    std::vector<float> v = rng.Floats(n, -4.0f, 4.0f);
    for (size_t i = 0; i < n; ++i) {
      if (rng.Bernoulli(0.25)) v[i] = specials[rng.Int(0, std::size(specials) - 1)];
    }
    return v;
  }

  Shape shape_;
};

TEST_P(KvAppendTest, WritesRoundedValuesAtSlotAndOffsetOnly) {
  Random rng(TestSeed());
  KvArena arena(shape_, 4);
  const std::vector<int32_t> slot = {2, 0, 2, 3};
  const std::vector<int32_t> offset = {0, 15, 7, 3};
  const size_t row = static_cast<size_t>(shape_.num_kv_heads) * shape_.head_dim;
  const std::vector<float> k = Interesting(slot.size() * row, rng);
  const std::vector<float> v = Interesting(slot.size() * row, rng);
  KvAppendParams p;
  p.kv = arena.layer();
  p.k = k.data();
  p.v = v.data();
  p.slot = slot.data();
  p.offset = offset.data();
  p.num_tokens = static_cast<int32_t>(slot.size());
  p.isa = GetParam().isa;
  ASSERT_EQ(KvAppend(p), KernelStatus::kOk);

  const size_t elem = DTypeSize(shape_.dtype);
  const size_t row_bytes = shape_.head_dim * elem;
  std::vector<unsigned char> want(row_bytes);
  for (size_t i = 0; i < slot.size(); ++i) {
    for (int32_t h = 0; h < shape_.num_kv_heads; ++h) {
      const size_t src = (i * shape_.num_kv_heads + h) * shape_.head_dim;
      ConvertFromFloat(shape_.dtype, k.data() + src, want.data(), shape_.head_dim);
      EXPECT_EQ(std::memcmp(arena.RowK(slot[i], h, offset[i]), want.data(), row_bytes), 0)
          << "K of token " << i << ", head " << h;
      ConvertFromFloat(shape_.dtype, v.data() + src, want.data(), shape_.head_dim);
      EXPECT_EQ(std::memcmp(arena.RowV(slot[i], h, offset[i]), want.data(), row_bytes), 0)
          << "V of token " << i << ", head " << h;
    }
  }
  // An untouched row is still the NaN fill.
  float untouched = 0.0f;
  ConvertToFloat(shape_.dtype, arena.RowK(1, 0, 0), &untouched, 1);
  EXPECT_TRUE(std::isnan(untouched));
  ConvertToFloat(shape_.dtype, arena.RowV(2, 1, 1), &untouched, 1);
  EXPECT_TRUE(std::isnan(untouched));
}

TEST_P(KvAppendTest, CopyMovesPrefixOfEveryHead) {
  Random rng(TestSeed());
  KvArena arena(shape_, 3);
  for (int32_t t = 0; t < shape_.chunk_size; ++t) arena.FillToken(0, t, rng);
  ASSERT_EQ(KvCopy(arena.layer(), 0, 2, 5), KernelStatus::kOk);
  const size_t row_bytes = shape_.head_dim * DTypeSize(shape_.dtype);
  for (int32_t h = 0; h < shape_.num_kv_heads; ++h) {
    for (int32_t t = 0; t < 5; ++t) {
      EXPECT_EQ(std::memcmp(arena.RowK(2, h, t), arena.RowK(0, h, t), row_bytes), 0)
          << h << " " << t;
      EXPECT_EQ(std::memcmp(arena.RowV(2, h, t), arena.RowV(0, h, t), row_bytes), 0)
          << h << " " << t;
    }
    float after = 0.0f;
    ConvertToFloat(shape_.dtype, arena.RowK(2, h, 5), &after, 1);
    EXPECT_TRUE(std::isnan(after)) << "position 5 of head " << h << " was written";
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, KvAppendTest,
                         ::testing::Values(Case{DType::kF32, 128, CpuIsa::kAvx2},
                                           Case{DType::kF16, 128, CpuIsa::kAvx2},
                                           Case{DType::kBF16, 64, CpuIsa::kAvx2},
                                           Case{DType::kF16, 20, CpuIsa::kAvx2},
                                           Case{DType::kBF16, 36, CpuIsa::kAvx2},
                                           Case{DType::kF32, 128, CpuIsa::kAvx512},
                                           Case{DType::kF16, 20, CpuIsa::kAvx512},
                                           Case{DType::kBF16, 36, CpuIsa::kAvx512},
                                           Case{DType::kF32, 20, CpuIsa::kScalar},
                                           Case{DType::kF16, 64, CpuIsa::kScalar},
                                           Case{DType::kBF16, 128, CpuIsa::kScalar}),
                         CaseName);

}  // namespace
}  // namespace chunkserve::kernels::cpu::testing
