// PrefillAttention (with KvAppend writing the new tokens first) against the naive reference with
// a causal range per query: query at position p of a sequence sees that sequence's tokens [0, p].
//
// Tolerance as in decode_attention_test.cc, and for the same reason: the reference reads the same
// stored values, so only fp32-vs-fp64 accumulation and the exp2 polynomial differ.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/kv_append.h"
#include "kernels/cpu/reference.h"
#include "kernels/cpu/thread_pool.h"
#include "tests/kernels/attention_testing.h"
#include "tests/testing/random.h"

namespace chunkserve::kernels::cpu::testing {
namespace {

using chunkserve::testing::Random;
using chunkserve::testing::TestSeed;

constexpr double kAtol = 1e-5;
constexpr double kRtol = 1e-4;

struct Case {
  DType dtype;
  int32_t head_dim;
  int32_t chunk_size;
  int32_t gqa;
  CpuIsa isa;
};

std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return DTypeName(c.dtype) + "_hd" + std::to_string(c.head_dim) + "_c" +
         std::to_string(c.chunk_size) + "_gqa" + std::to_string(c.gqa) + "_" + CpuIsaName(c.isa);
}

ThreadPool& Pool() {
  static ThreadPool* pool = new ThreadPool(3);
  return *pool;
}

class PrefillAttentionTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    if (!CpuSupports(GetParam().isa)) {
      GTEST_SKIP() << "this CPU has no " << CpuIsaName(GetParam().isa);
    }
  }

  void Check(std::vector<PrefillSeq> seqs, int32_t num_kv_heads, Random& rng) {
    Shape shape;
    shape.dtype = GetParam().dtype;
    shape.head_dim = GetParam().head_dim;
    shape.chunk_size = GetParam().chunk_size;
    shape.num_kv_heads = num_kv_heads;
    shape.num_qo_heads = num_kv_heads * GetParam().gqa;
    const int32_t d = shape.head_dim;
    const int32_t num_seqs = static_cast<int32_t>(seqs.size());
    PrefillBatch batch = MakePrefillBatch(std::move(seqs), shape, /*round_new_kv=*/false, rng);

    // The new tokens' K/V go in through KvAppend.
    KvAppendParams ap;
    ap.kv = batch.arena.layer();
    ap.k = batch.new_k.data();
    ap.v = batch.new_v.data();
    ap.slot = batch.new_slot.data();
    ap.offset = batch.new_offset.data();
    ap.num_tokens = static_cast<int32_t>(batch.new_slot.size());
    ap.isa = GetParam().isa;
    ASSERT_EQ(KvAppend(ap), KernelStatus::kOk);

    const int32_t num_q = batch.q_indptr.back();
    const size_t n = static_cast<size_t>(num_q) * shape.num_qo_heads * d;
    const std::vector<float> q = rng.Floats(n, -3.0f, 3.0f);
    const float sm_scale = 1.0f / std::sqrt(static_cast<float>(d));

    std::vector<float> want;
    ASSERT_EQ(NaivePrefill(batch, q, sm_scale, &want), KernelStatus::kOk);

    std::vector<float> got(n, 12345.0f);
    PrefillAttentionParams pp;
    pp.q = q.data();
    pp.o = got.data();
    pp.kv = batch.arena.view();
    pp.num_seqs = num_seqs;
    pp.num_qo_heads = shape.num_qo_heads;
    pp.q_indptr = batch.q_indptr.data();
    pp.q_pos = batch.q_pos.data();
    pp.chunk_indptr = batch.chunk_indptr.data();
    pp.chunk_slot = batch.chunk_slot.data();
    pp.chunk_len = batch.chunk_len.data();
    pp.sm_scale = sm_scale;
    pp.pool = &Pool();
    pp.isa = GetParam().isa;
    ASSERT_EQ(PrefillAttention(pp), KernelStatus::kOk);
    size_t at = 0;
    const double worst = WorstError(got, want, kAtol, kRtol, &at);
    EXPECT_LE(worst, 1.0) << "element " << at << " (query " << at / (shape.num_qo_heads * d)
                          << ") got " << got[at] << " want " << want[at];
  }
};

TEST_P(PrefillAttentionTest, PromptWithoutCachedPrefix) {
  Random rng(TestSeed());
  const int32_t c = GetParam().chunk_size;
  Check({{0, 2 * c + c / 2 + 1, {}}}, /*num_kv_heads=*/2, rng);
}

TEST_P(PrefillAttentionTest, SuffixAfterCachedPrefix) {
  Random rng(TestSeed());
  const int32_t c = GetParam().chunk_size;
  const int32_t cached = 2 * c + static_cast<int32_t>(rng.Int(0, c - 1));
  Check({{cached, cached + c + 7, {}}}, /*num_kv_heads=*/2, rng);
}

TEST_P(PrefillAttentionTest, OneNewToken) {
  Random rng(TestSeed());
  const int32_t c = GetParam().chunk_size;
  Check({{3 * c, 3 * c + 1, {}}}, /*num_kv_heads=*/1, rng);
}

TEST_P(PrefillAttentionTest, BatchOfSequences) {
  Random rng(TestSeed());
  const int32_t c = GetParam().chunk_size;
  Check({{0, 5, {}}, {c, 3 * c + 1, {}}, {3, 4, {}}, {c + 1, 2 * c, {}}}, /*num_kv_heads=*/2, rng);
}

// Chunked prefill: the queries are a scattered subset of the path's positions (keys after each
// query's position are in the arena but must be masked).
TEST_P(PrefillAttentionTest, QueriesAtScatteredPositions) {
  Random rng(TestSeed());
  const int32_t c = GetParam().chunk_size;
  const int32_t total = 3 * c + 5;
  std::vector<int32_t> positions;
  for (int32_t p = 0; p < total; ++p) {
    if (rng.Bernoulli(0.15)) positions.push_back(p);
  }
  if (positions.empty()) positions.push_back(total - 1);
  Check({{total, total, positions}}, /*num_kv_heads=*/1, rng);
}

constexpr CpuIsa kAvx512 = CpuIsa::kAvx512;
constexpr CpuIsa kAvx2 = CpuIsa::kAvx2;
constexpr CpuIsa kScalar = CpuIsa::kScalar;

INSTANTIATE_TEST_SUITE_P(
    Kernels, PrefillAttentionTest,
    ::testing::Values(Case{DType::kF32, 128, 64, 1, kAvx2}, Case{DType::kF32, 64, 16, 8, kAvx2},
                      Case{DType::kF16, 128, 32, 4, kAvx2}, Case{DType::kBF16, 64, 256, 2, kAvx2},
                      Case{DType::kF32, 40, 16, 3, kAvx2}, Case{DType::kBF16, 20, 64, 4, kAvx2},
                      Case{DType::kF32, 128, 64, 1, kAvx512}, Case{DType::kF32, 64, 16, 8, kAvx512},
                      Case{DType::kF16, 128, 32, 4, kAvx512},
                      Case{DType::kBF16, 64, 256, 2, kAvx512},
                      Case{DType::kF32, 40, 16, 3, kAvx512}, Case{DType::kBF16, 20, 64, 4, kAvx512},
                      Case{DType::kF32, 128, 64, 4, kScalar}, Case{DType::kF16, 36, 16, 1, kScalar},
                      Case{DType::kBF16, 64, 32, 8, kScalar}),
    CaseName);

}  // namespace
}  // namespace chunkserve::kernels::cpu::testing
