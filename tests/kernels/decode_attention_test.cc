// TppDecode and PagedDecode against the naive reference, on fresh random inputs.
//
// Tolerance: |got - want| <= 1e-5 + 1e-4 * |want| for every KV dtype. The reference reads the same
// stored (already rounded) fp16/bf16 values the kernels read, so the only difference left is fp32
// accumulation against fp64 plus the exp2 polynomial (~2e-7 relative per term); that is why fp16
// and bf16 need no looser bound than fp32. Outputs are convex combinations of V rows in [-1, 1];
// the errors observed are below ~6e-7 absolute, about 20x inside the bound, while a wrong index,
// mask, rescale or merge gives errors of 1e-3 and more (a 0.1% error in one partial's l already
// fails most cases).
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/cpu_isa.h"
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
  int32_t gqa;  // query heads per KV head
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

class DecodeAttentionTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    if (!CpuSupports(GetParam().isa)) {
      GTEST_SKIP() << "this CPU has no " << CpuIsaName(GetParam().isa);
    }
  }

  Shape MakeShape(int32_t num_kv_heads) const {
    Shape s;
    s.dtype = GetParam().dtype;
    s.head_dim = GetParam().head_dim;
    s.chunk_size = GetParam().chunk_size;
    s.num_kv_heads = num_kv_heads;
    s.num_qo_heads = num_kv_heads * GetParam().gqa;
    return s;
  }

  // Runs TPP (and paged in both task orders) on `layout` and checks each against the reference.
  void CheckLayout(const Layout& layout, int32_t num_kv_heads, Random& rng,
                   int32_t num_threads = 0) {
    const Shape shape = MakeShape(num_kv_heads);
    KvArena arena(shape, layout.num_slots);
    FillLayout(layout, arena, rng);
    const size_t n = static_cast<size_t>(layout.num_seqs) * shape.num_qo_heads * shape.head_dim;
    const std::vector<float> q = rng.Floats(n, -3.0f, 3.0f);
    const float sm_scale = 1.0f / std::sqrt(static_cast<float>(shape.head_dim));
    const std::vector<float> want = NaiveDecode(arena, layout, q, sm_scale);

    // TPP, with a workspace that is deliberately misaligned by 4 bytes and filled with NaN (0xff
    // bytes), so that reading a partial row no task wrote fails the check.
    const TppPlanView plan = layout.Plan();
    std::vector<unsigned char> workspace(
        TppDecodeWorkspaceBytes(plan, shape.num_qo_heads, shape.head_dim) + 4, 0xff);
    std::vector<float> got(n, 12345.0f);
    TppDecodeParams tp;
    tp.q = q.data();
    tp.o = got.data();
    tp.kv = arena.view();
    tp.plan = plan;
    tp.num_qo_heads = shape.num_qo_heads;
    tp.sm_scale = sm_scale;
    tp.workspace = workspace.data() + 4;
    tp.workspace_bytes = workspace.size() - 4;
    tp.pool = &Pool();
    tp.num_threads = num_threads;
    tp.isa = GetParam().isa;
    ASSERT_EQ(TppDecode(tp), KernelStatus::kOk);
    size_t at = 0;
    double worst = WorstError(got, want, kAtol, kRtol, &at);
    EXPECT_LE(worst, 1.0) << "tpp: element " << at << " got " << got[at] << " want " << want[at];

    for (PagedTaskOrder order : {PagedTaskOrder::kSequenceMajor, PagedTaskOrder::kHeadMajor}) {
      std::vector<float> paged(n, 12345.0f);
      PagedDecodeParams pp;
      pp.q = q.data();
      pp.o = paged.data();
      pp.kv = arena.view();
      pp.num_seqs = layout.num_seqs;
      pp.num_qo_heads = shape.num_qo_heads;
      pp.block_indptr = layout.block_indptr.data();
      pp.block_slot = layout.block_slot.data();
      pp.block_len = layout.block_len.data();
      pp.sm_scale = sm_scale;
      pp.order = order;
      pp.pool = &Pool();
      pp.num_threads = num_threads;
      pp.isa = GetParam().isa;
      ASSERT_EQ(PagedDecode(pp), KernelStatus::kOk);
      worst = WorstError(paged, want, kAtol, kRtol, &at);
      EXPECT_LE(worst, 1.0) << "paged (order " << static_cast<int>(order) << "): element " << at
                            << " got " << paged[at] << " want " << want[at];
    }
  }
};

TEST_P(DecodeAttentionTest, RandomTreeMatchesReference) {
  Random rng(TestSeed());
  const int32_t num_seqs = static_cast<int32_t>(rng.Int(2, 12));
  const Layout layout = RandomTreeLayout(num_seqs, GetParam().chunk_size, rng);
  CheckLayout(layout, /*num_kv_heads=*/2, rng);
}

TEST_P(DecodeAttentionTest, BatchOfOne) {
  Random rng(TestSeed());
  LayoutBuilder b(1);
  b.AddPrivate(0, GetParam().chunk_size);
  b.AddPrivate(0, GetParam().chunk_size);
  b.AddPrivate(0, static_cast<int32_t>(rng.Int(1, GetParam().chunk_size)));
  CheckLayout(b.Finish(rng), /*num_kv_heads=*/2, rng);
}

TEST_P(DecodeAttentionTest, OneSequencePerChunk) {
  Random rng(TestSeed());
  LayoutBuilder b(9);
  for (int32_t s = 0; s < 9; ++s)
    b.AddPrivate(s, static_cast<int32_t>(rng.Int(1, GetParam().chunk_size)));
  CheckLayout(b.Finish(rng), /*num_kv_heads=*/1, rng);
}

TEST_P(DecodeAttentionTest, SixHundredSequencesShareOneChunk) {
  Random rng(TestSeed());
  LayoutBuilder b(600);
  b.AddShared(0, 600, static_cast<int32_t>(rng.Int(1, GetParam().chunk_size)));
  for (int32_t s = 0; s < 600; s += 3) b.AddPrivate(s, static_cast<int32_t>(rng.Int(1, 16)));
  CheckLayout(b.Finish(rng), /*num_kv_heads=*/1, rng);
}

// A long run of shared chunks with one row range: the chunk-first phase merges runs into segments
// (one partial per row per segment) when there are many more chunks than threads.
TEST_P(DecodeAttentionTest, LongSharedPrefixWithPrivateTails) {
  Random rng(TestSeed());
  const int64_t shared = 40 * GetParam().chunk_size - 5;
  CheckLayout(SharedPrefixLayout(4, GetParam().chunk_size, shared, GetParam().chunk_size + 3, rng),
              /*num_kv_heads=*/2, rng);
}

// With one thread the chunk-first phase both merges runs into multi-chunk segments and gives each
// task several KV heads.
TEST_P(DecodeAttentionTest, LongSharedPrefixOnOneThread) {
  Random rng(TestSeed());
  const int64_t shared = 40 * GetParam().chunk_size - 5;
  CheckLayout(SharedPrefixLayout(3, GetParam().chunk_size, shared, 7, rng), /*num_kv_heads=*/2, rng,
              /*num_threads=*/1);
}

// Sequences whose whole context is one segment (here: one shared chunk and nothing else) get their
// output rows from the chunk-first task itself, next to sequences of the same segment that go on
// to private chunks or to a second segment. Two sequences of one KV head take the streaming
// units (2 x group rows <= 4 for groups 1 and 2), 0-1 of another the block tiles.
TEST_P(DecodeAttentionTest, SequencesWhoseOnlySegmentIsShared) {
  Random rng(TestSeed());
  const int32_t c = GetParam().chunk_size;
  for (const int32_t threads : {0, 1}) {
    LayoutBuilder b(9);
    b.AddShared(0, 2, static_cast<int32_t>(rng.Int(1, c)));  // 0, 1: nothing else
    b.AddShared(2, 4, c);                                    // 2: nothing else
    b.AddPrivate(3, static_cast<int32_t>(rng.Int(1, c)));    // 3: a private chunk after it
    b.AddShared(4, 9, c);                                    // 4, 7: nothing else
    b.AddShared(5, 7, static_cast<int32_t>(rng.Int(1, c)));  // 5, 6: a second segment
    b.AddPrivate(8, 5);                                      // 8: a private chunk
    CheckLayout(b.Finish(rng), /*num_kv_heads=*/2, rng, threads);
  }
}

TEST_P(DecodeAttentionTest, FullSharingNoPrivateTokens) {
  Random rng(TestSeed());
  CheckLayout(SharedPrefixLayout(5, GetParam().chunk_size, 3 * GetParam().chunk_size, 0, rng),
              /*num_kv_heads=*/1, rng);
}

TEST_P(DecodeAttentionTest, SingleThreadMatchesReference) {
  Random rng(TestSeed());
  const Layout layout = RandomTreeLayout(6, GetParam().chunk_size, rng);
  CheckLayout(layout, /*num_kv_heads=*/1, rng, /*num_threads=*/1);
}

constexpr CpuIsa kAvx512 = CpuIsa::kAvx512;
constexpr CpuIsa kAvx2 = CpuIsa::kAvx2;
constexpr CpuIsa kScalar = CpuIsa::kScalar;

INSTANTIATE_TEST_SUITE_P(
    Kernels, DecodeAttentionTest,
    ::testing::Values(
        // The fast paths: head_dim 64 and 128, every dtype, GQA 1/4/8, chunk sizes 16/64/256.
        Case{DType::kF32, 128, 64, 1, kAvx2}, Case{DType::kF32, 128, 64, 4, kAvx2},
        Case{DType::kF32, 64, 16, 8, kAvx2}, Case{DType::kF32, 128, 256, 8, kAvx2},
        Case{DType::kF16, 128, 64, 4, kAvx2}, Case{DType::kF16, 64, 256, 1, kAvx2},
        Case{DType::kBF16, 128, 64, 4, kAvx2}, Case{DType::kBF16, 64, 16, 8, kAvx2},
        // Generic head dims: multiples of 8 (40, 96) and not (20, 36), odd GQA ratios.
        Case{DType::kF32, 40, 64, 3, kAvx2}, Case{DType::kF16, 96, 16, 2, kAvx2},
        Case{DType::kBF16, 20, 32, 5, kAvx2}, Case{DType::kF32, 36, 48, 12, kAvx2},
        // The AVX-512 build (wide tiles, 8-lane edges where head_dim or rows are 8 mod 16).
        Case{DType::kF32, 128, 64, 1, kAvx512}, Case{DType::kF32, 128, 64, 4, kAvx512},
        Case{DType::kF32, 64, 16, 8, kAvx512}, Case{DType::kF16, 128, 256, 4, kAvx512},
        Case{DType::kBF16, 64, 64, 1, kAvx512}, Case{DType::kF32, 40, 64, 3, kAvx512},
        Case{DType::kF16, 96, 16, 2, kAvx512}, Case{DType::kBF16, 20, 32, 5, kAvx512},
        Case{DType::kF32, 36, 48, 12, kAvx512},
        // The portable path on the same kinds of shapes.
        Case{DType::kF32, 128, 64, 4, kScalar}, Case{DType::kF16, 64, 16, 1, kScalar},
        Case{DType::kBF16, 128, 256, 8, kScalar}, Case{DType::kF32, 40, 32, 3, kScalar},
        Case{DType::kF16, 20, 64, 2, kScalar}),
    CaseName);

}  // namespace
}  // namespace chunkserve::kernels::cpu::testing
