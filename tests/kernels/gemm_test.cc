// Gemm over packed weights against a plain fp64 triple loop, on fresh random inputs, for every
// ISA this CPU has and every weight dtype: ragged shapes (n not a multiple of the panel, m not a
// multiple of the register tile, odd k), row strides, bias, accumulation and thread counts. Also
// the packed layout itself (PackWeights / UnpackWeightRow) and argument checks.
#include "kernels/cpu/gemm.h"

#include <gtest/gtest.h>

#include <cmath>
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

// W [n, k] as its checkpoint dtype would hold it, and the same values in fp32.
struct Weights {
  std::vector<uint16_t> half;  // fp16 / bf16 bits
  std::vector<float> f32;      // the exact values every dtype's weights have
};

Weights RandomWeights(Random& rng, DType dtype, int64_t n, int64_t k) {
  Weights w;
  w.f32 = rng.Floats(static_cast<size_t>(n * k));
  if (dtype == DType::kF32) return w;
  w.half.resize(w.f32.size());
  for (size_t i = 0; i < w.f32.size(); ++i) {
    w.half[i] = dtype == DType::kF16 ? FloatToHalf(w.f32[i]) : FloatToBf16(w.f32[i]);
    w.f32[i] = dtype == DType::kF16 ? HalfToFloat(w.half[i]) : Bf16ToFloat(w.half[i]);
  }
  return w;
}

const void* Source(const Weights& w, DType dtype) {
  return dtype == DType::kF32 ? static_cast<const void*>(w.f32.data()) : w.half.data();
}

struct Packed {
  std::vector<float> f32;
  std::vector<uint16_t> half;
  const void* data(DType d) const {
    return d == DType::kF32 ? static_cast<const void*>(f32.data()) : half.data();
  }
};

Packed Pack(const Weights& w, DType dtype, int64_t n, int64_t k) {
  Packed p;
  const int64_t elems = PackedWeightElements(n, k);
  if (dtype == DType::kF32) {
    p.f32.assign(static_cast<size_t>(elems), NAN);
    EXPECT_EQ(PackWeights(Source(w, dtype), dtype, n, k, dtype, p.f32.data()), KernelStatus::kOk);
  } else {
    p.half.assign(static_cast<size_t>(elems), 0xffff);
    EXPECT_EQ(PackWeights(Source(w, dtype), dtype, n, k, dtype, p.half.data()), KernelStatus::kOk);
  }
  return p;
}

class GemmTest : public ::testing::TestWithParam<CpuIsa> {
 protected:
  void SetUp() override {
    if (!CpuSupports(GetParam())) GTEST_SKIP() << "this CPU has no " << CpuIsaName(GetParam());
  }
};

TEST_P(GemmTest, MatchesAPlainLoopOnRandomShapes) {
  const uint64_t seed = TestSeed();
  Random rng(seed);
  ThreadPool pool(3);
  for (int round = 0; round < 60; ++round) {
    const DType dtype = static_cast<DType>(round % 3);
    // Small and ragged most of the time; now and then a model-sized shape.
    const bool big = round % 10 == 9;
    int64_t m = big ? rng.Int(20, 70) : rng.Int(1, 30);
    int64_t n = big ? rng.Int(300, 700) : rng.Int(1, 100);
    int64_t k = big ? rng.Int(200, 700) : rng.Int(1, 80);
    if (round == 0) {  // at least once: enough work for all three threads, a ragged split
      m = 40;
      n = 17 * kGemmPanel + 5;
      k = 600;
    }
    const int64_t ldx = k + rng.Int(0, 3);
    const int64_t ldy = n + rng.Int(0, 3);
    const bool with_bias = rng.Bernoulli(0.5);
    const bool accumulate = rng.Bernoulli(0.5);
    int32_t threads = static_cast<int32_t>(rng.Int(0, 3));
    if (round == 0) threads = 3;
    SCOPED_TRACE("seed " + std::to_string(seed) + " round " + std::to_string(round) + " " +
                 DTypeName(dtype) + " m=" + std::to_string(m) + " n=" + std::to_string(n) +
                 " k=" + std::to_string(k) + " bias=" + std::to_string(with_bias) +
                 " accumulate=" + std::to_string(accumulate) +
                 " threads=" + std::to_string(threads));
    const Weights w = RandomWeights(rng, dtype, n, k);
    const Packed packed = Pack(w, dtype, n, k);
    const std::vector<float> x = rng.Floats(static_cast<size_t>(m * ldx));
    const std::vector<float> bias = rng.Floats(static_cast<size_t>(n));
    std::vector<float> y = rng.Floats(static_cast<size_t>(m * ldy));
    const std::vector<float> y0 = y;

    GemmParams p;
    p.x = x.data();
    p.ldx = ldx;
    p.w = packed.data(dtype);
    p.w_dtype = dtype;
    p.bias = with_bias ? bias.data() : nullptr;
    p.y = y.data();
    p.ldy = ldy;
    p.m = m;
    p.n = n;
    p.k = k;
    p.accumulate = accumulate;
    p.pool = &pool;
    p.num_threads = threads;
    p.isa = GetParam();
    ASSERT_EQ(Gemm(p), KernelStatus::kOk);

    for (int64_t r = 0; r < m; ++r) {
      for (int64_t c = 0; c < ldy; ++c) {
        const float got = y[static_cast<size_t>(r * ldy + c)];
        if (c >= n) {  // the row stride's gap is not written
          ASSERT_EQ(got, y0[static_cast<size_t>(r * ldy + c)]) << "r=" << r << " c=" << c;
          continue;
        }
        double want = accumulate ? y0[static_cast<size_t>(r * ldy + c)] : 0.0;
        double scale = std::fabs(want);
        for (int64_t i = 0; i < k; ++i) {
          const double term = static_cast<double>(x[static_cast<size_t>(r * ldx + i)]) *
                              w.f32[static_cast<size_t>(c * k + i)];
          want += term;
          scale += std::fabs(term);
        }
        if (with_bias) {
          want += bias[static_cast<size_t>(c)];
          scale += std::fabs(bias[static_cast<size_t>(c)]);
        }
        // fp32 accumulation: error grows with the sum of magnitudes, not with the result.
        ASSERT_NEAR(got, want, 1e-6 * scale * std::sqrt(static_cast<double>(k)) + 1e-6)
            << "r=" << r << " c=" << c;
      }
    }
  }
}

TEST_P(GemmTest, EmptyBatchWritesNothing) {
  ThreadPool pool(2);
  const std::vector<float> packed(static_cast<size_t>(PackedWeightElements(5, 4)), 1.0f);
  std::vector<float> y(8, 7.0f);
  const std::vector<float> x(8, 1.0f);
  GemmParams p;
  p.x = x.data();
  p.ldx = 4;
  p.w = packed.data();
  p.y = y.data();
  p.ldy = 5;
  p.m = 0;
  p.n = 5;
  p.k = 4;
  p.pool = &pool;
  p.isa = GetParam();
  EXPECT_EQ(Gemm(p), KernelStatus::kOk);
  EXPECT_EQ(y, std::vector<float>(8, 7.0f));
}

INSTANTIATE_TEST_SUITE_P(Isa, GemmTest,
                         ::testing::Values(CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512),
                         [](const ::testing::TestParamInfo<CpuIsa>& info) {
                           return std::string(CpuIsaName(info.param));
                         });

TEST(PackWeightsTest, UnpackGivesBackEveryRowAndPaddingIsZero) {
  const uint64_t seed = TestSeed();
  Random rng(seed);
  for (const DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    const int64_t n = rng.Int(1, 90);
    const int64_t k = rng.Int(1, 40);
    SCOPED_TRACE(DTypeName(dtype) + " n=" + std::to_string(n) + " k=" + std::to_string(k));
    const Weights w = RandomWeights(rng, dtype, n, k);
    const Packed packed = Pack(w, dtype, n, k);
    std::vector<float> row(static_cast<size_t>(k));
    for (int64_t r = 0; r < n; ++r) {
      ASSERT_EQ(UnpackWeightRow(packed.data(dtype), dtype, n, k, r, row.data()), KernelStatus::kOk);
      for (int64_t i = 0; i < k; ++i) ASSERT_EQ(row[i], w.f32[static_cast<size_t>(r * k + i)]);
    }
    // Rows past n in the last panel are zeros (their products add nothing).
    const int64_t padded = PackedWeightElements(n, k) / k;
    for (int64_t r = n; r < padded; ++r) {
      for (int64_t i = 0; i < k; ++i) {
        const int64_t at = r / kGemmPanel * kGemmPanel * k + i * kGemmPanel + r % kGemmPanel;
        const float v = dtype == DType::kF32 ? packed.f32[static_cast<size_t>(at)]
                                             : static_cast<float>(packed.half[static_cast<size_t>(at)]);
        ASSERT_EQ(v, 0.0f) << "row " << r;
      }
    }
    // Widening to fp32 at pack time gives the same values.
    if (dtype != DType::kF32) {
      std::vector<float> wide(static_cast<size_t>(PackedWeightElements(n, k)));
      ASSERT_EQ(PackWeights(Source(w, dtype), dtype, n, k, DType::kF32, wide.data()),
                KernelStatus::kOk);
      for (int64_t r = 0; r < n; ++r) {
        ASSERT_EQ(UnpackWeightRow(wide.data(), DType::kF32, n, k, r, row.data()), KernelStatus::kOk);
        for (int64_t i = 0; i < k; ++i) ASSERT_EQ(row[i], w.f32[static_cast<size_t>(r * k + i)]);
      }
    }
  }
}

TEST(PackWeightsTest, RefusesBadArguments) {
  std::vector<float> src(12, 1.0f), dst(static_cast<size_t>(PackedWeightElements(3, 4)));
  EXPECT_EQ(PackedWeightElements(0, 4), 0);
  EXPECT_EQ(PackedWeightElements(3, -1), 0);
  EXPECT_EQ(PackWeights(nullptr, DType::kF32, 3, 4, DType::kF32, dst.data()),
            KernelStatus::kInvalidArgument);
  EXPECT_EQ(PackWeights(src.data(), DType::kF32, 0, 4, DType::kF32, dst.data()),
            KernelStatus::kInvalidArgument);
  // Narrowing is not packing.
  EXPECT_EQ(PackWeights(src.data(), DType::kF32, 3, 4, DType::kBF16, dst.data()),
            KernelStatus::kInvalidArgument);
  EXPECT_EQ(PackWeights(src.data(), static_cast<DType>(9), 3, 4, DType::kF32, dst.data()),
            KernelStatus::kInvalidArgument);
  float row[4];
  EXPECT_EQ(UnpackWeightRow(dst.data(), DType::kF32, 3, 4, 3, row), KernelStatus::kInvalidArgument);
  EXPECT_EQ(UnpackWeightRow(dst.data(), DType::kF32, 3, 4, -1, row), KernelStatus::kInvalidArgument);

  std::vector<float> x(8, 1.0f), y(6, 0.0f);
  GemmParams p;
  p.x = x.data();
  p.ldx = 4;
  p.w = dst.data();
  p.y = y.data();
  p.ldy = 3;
  p.m = 2;
  p.n = 3;
  p.k = 4;
  EXPECT_EQ(Gemm(p), KernelStatus::kOk);  // no pool: the caller's thread
  GemmParams bad = p;
  bad.ldx = 3;  // shorter than a row
  EXPECT_EQ(Gemm(bad), KernelStatus::kInvalidArgument);
  bad = p;
  bad.ldy = 2;
  EXPECT_EQ(Gemm(bad), KernelStatus::kInvalidArgument);
  bad = p;
  bad.w = nullptr;
  EXPECT_EQ(Gemm(bad), KernelStatus::kInvalidArgument);
  bad = p;
  bad.m = -1;
  EXPECT_EQ(Gemm(bad), KernelStatus::kInvalidArgument);
  bad = p;
  bad.w_dtype = static_cast<DType>(7);
  EXPECT_EQ(Gemm(bad), KernelStatus::kInvalidArgument);
}

}  // namespace
}  // namespace chunkserve::kernels::cpu::testing
