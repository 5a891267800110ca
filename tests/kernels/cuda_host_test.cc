// The CPU half of the CUDA kernels, tested without a GPU: shape checks, the TPP work-list schedule
// (checked by *executing* it on the CPU: every task's rows attend to its chunks in fp64, partials
// are merged through the merge list exactly as the device does, and the result must equal the
// naive reference, so a lost, doubled or misindexed chunk, entry or row fails), and the plan
// cache's upload decision (what DevicePlan copies to the device each step).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "kernels/cpu/dtype.h"
#include "kernels/cpu/reference.h"
#include "kernels/cuda/shapes.h"
#include "kernels/cuda/tpp_schedule.h"
#include "runtime/kvcache/prefix_tree.h"
#include "runtime/plan/tpp_plan.h"
#include "tests/kernels/attention_testing.h"
#include "tests/testing/random.h"
#include "tests/testing/status_matchers.h"

namespace chunkserve::kernels::cuda {
namespace {

using chunkserve::testing::Random;
using chunkserve::testing::TestSeed;
namespace kt = ::chunkserve::kernels::cpu::testing;

AttentionShape GoodShape() {
  AttentionShape s;
  s.dtype = DType::kF16;
  s.num_qo_heads = 32;
  s.num_kv_heads = 8;
  s.head_dim = 128;
  s.chunk_size = 64;
  s.num_slots = 10;
  return s;
}

TEST(CudaShapeCheckTest, AcceptsSupportedShapes) {
  for (DType t : {DType::kF16, DType::kBF16}) {
    for (int32_t d : {64, 128}) {
      for (int32_t c : {16, 32, 48, 64, 80, 96, 112, 128}) {
        AttentionShape s = GoodShape();
        s.dtype = t;
        s.head_dim = d;
        s.chunk_size = c;
        EXPECT_EQ(CheckAttentionShape(s), nullptr) << d << " " << c;
      }
    }
  }
}

TEST(CudaShapeCheckTest, RejectsFp32) {
  AttentionShape s = GoodShape();
  s.dtype = DType::kF32;
  EXPECT_NE(CheckAttentionShape(s), nullptr);
}

TEST(CudaShapeCheckTest, RejectsUnsupportedHeadDims) {
  for (int32_t d : {0, 32, 96, 127, 256}) {
    AttentionShape s = GoodShape();
    s.head_dim = d;
    EXPECT_NE(CheckAttentionShape(s), nullptr) << d;
  }
}

TEST(CudaShapeCheckTest, RejectsUnsupportedChunkSizes) {
  for (int32_t c : {0, 8, 15, 24, 40, 100, 144, 256}) {
    AttentionShape s = GoodShape();
    s.chunk_size = c;
    EXPECT_NE(CheckAttentionShape(s), nullptr) << c;
  }
}

TEST(CudaShapeCheckTest, RejectsBadHeadCounts) {
  AttentionShape s = GoodShape();
  s.num_qo_heads = 12;  // not a multiple of 8
  EXPECT_NE(CheckAttentionShape(s), nullptr);
  s = GoodShape();
  s.num_kv_heads = 0;
  EXPECT_NE(CheckAttentionShape(s), nullptr);
  s = GoodShape();
  s.num_slots = 0;
  EXPECT_NE(CheckAttentionShape(s), nullptr);
}

TEST(CudaShapeCheckTest, PointerChecks) {
  alignas(16) static unsigned char buf[64];
  KvCacheView kv;
  kv.k = buf;
  kv.v = buf + 16;
  EXPECT_EQ(CheckAttentionPointers(buf + 32, buf + 48, kv), nullptr);
  EXPECT_NE(CheckAttentionPointers(nullptr, buf + 48, kv), nullptr);
  EXPECT_NE(CheckAttentionPointers(buf + 33, buf + 48, kv), nullptr);  // misaligned q
  EXPECT_NE(CheckAttentionPointers(buf + 32, buf + 32, kv), nullptr);  // o aliases q
  kv.v = nullptr;
  EXPECT_NE(CheckAttentionPointers(buf + 32, buf + 48, kv), nullptr);
}

TEST(CudaShapeCheckTest, BlockLists) {
  const std::vector<int32_t> indptr = {0, 2, 2, 3};
  const std::vector<int32_t> slot = {0, 4, 2};
  std::vector<int32_t> len = {64, 1, 30};
  EXPECT_EQ(CheckBlockLists(3, indptr.data(), slot.data(), len.data(), 5, 64), nullptr);
  EXPECT_NE(CheckBlockLists(3, indptr.data(), slot.data(), len.data(), 4, 64), nullptr);  // slot 4
  len[1] = 0;
  EXPECT_NE(CheckBlockLists(3, indptr.data(), slot.data(), len.data(), 5, 64), nullptr);
  len[1] = 65;
  EXPECT_NE(CheckBlockLists(3, indptr.data(), slot.data(), len.data(), 5, 64), nullptr);
  const std::vector<int32_t> decreasing = {0, 2, 1, 3};
  len[1] = 1;
  EXPECT_NE(CheckBlockLists(3, decreasing.data(), slot.data(), len.data(), 5, 64), nullptr);
  EXPECT_NE(CheckBlockLists(3, nullptr, slot.data(), len.data(), 5, 64), nullptr);
}

TEST(CudaShapeCheckTest, PrefillLists) {
  // Sequence 0: 2 chunks (64 + 10 tokens: positions 0..73), queries at 70..73.
  const std::vector<int32_t> q_indptr = {0, 4};
  std::vector<int32_t> q_pos = {70, 71, 72, 73};
  const std::vector<int32_t> chunk_indptr = {0, 2};
  const std::vector<int32_t> slot = {3, 1};
  const std::vector<int32_t> len = {64, 10};
  EXPECT_EQ(CheckPrefillLists(1, q_indptr.data(), q_pos.data(), chunk_indptr.data(), slot.data(),
                              len.data(), 4, 64, 4),
            nullptr);
  EXPECT_NE(CheckPrefillLists(1, q_indptr.data(), q_pos.data(), chunk_indptr.data(), slot.data(),
                              len.data(), 4, 64, 3),
            nullptr);  // max_q_per_seq too small
  q_pos[3] = 74;       // past the path
  EXPECT_NE(CheckPrefillLists(1, q_indptr.data(), q_pos.data(), chunk_indptr.data(), slot.data(),
                              len.data(), 4, 64, 4),
            nullptr);
}

TEST(CudaShapeCheckTest, ModelOpShapes) {
  EXPECT_EQ(CheckRopeShape(3, 4, 128), nullptr);
  EXPECT_NE(CheckRopeShape(3, 4, 7), nullptr);
  EXPECT_NE(CheckRopeShape(-1, 4, 8), nullptr);
  EXPECT_EQ(CheckRmsNormShape(0, 4096), nullptr);
  EXPECT_NE(CheckRmsNormShape(1, 0), nullptr);
  EXPECT_EQ(CheckKvArenaShape(DType::kBF16, 1, 1, 16, 64), nullptr);
  EXPECT_NE(CheckKvArenaShape(DType::kF32, 1, 1, 16, 64), nullptr);
  EXPECT_NE(CheckKvArenaShape(DType::kF16, 1, 1, 16, 12), nullptr);
  EXPECT_NE(CheckSamplingShape(1, 0), nullptr);
}

// ---------------------------------------------------------------------------------------------
// Executing a schedule on the CPU.
// ---------------------------------------------------------------------------------------------

struct Partial {
  std::vector<double> o;
  double m = -std::numeric_limits<double>::infinity();  // natural-log units here
  double l = 0.0;
};

// Rows of `task` for KV head `h` attend to the task's chunks (fp64, plain softmax state).
void RunTask(const TppTask& t, int32_t h, const TppSchedule& s, const kt::KvArena& arena,
             const std::vector<float>& q, int32_t num_qo_heads, float sm_scale,
             std::vector<Partial>& entries, std::vector<float>& o, std::vector<int>& written) {
  const kt::Shape& shape = arena.shape();
  const int32_t group = num_qo_heads / shape.num_kv_heads;
  const int32_t d = shape.head_dim;
  for (int32_t r = t.row_begin; r < t.row_begin + t.num_rows; ++r) {
    const int32_t seq = t.seq_begin + r / group;
    const int32_t head = h * group + r % group;
    const float* qr = &q[(static_cast<size_t>(seq) * num_qo_heads + head) * d];
    Partial p;
    p.o.assign(d, 0.0);
    for (int32_t c = t.chunk_begin; c < t.chunk_end; ++c) {
      for (int32_t tok = 0; tok < s.chunk_len[c]; ++tok) {
        const float* kr = reinterpret_cast<const float*>(arena.RowK(s.chunk_slot[c], h, tok));
        const float* vr = reinterpret_cast<const float*>(arena.RowV(s.chunk_slot[c], h, tok));
        double dot = 0.0;
        for (int32_t i = 0; i < d; ++i) dot += static_cast<double>(qr[i]) * kr[i];
        dot *= sm_scale;
        const double m = std::max(p.m, dot);
        const double a = std::exp(p.m - m), b = std::exp(dot - m);
        for (int32_t i = 0; i < d; ++i) p.o[i] = p.o[i] * a + b * vr[i];
        p.l = p.l * a + b;
        p.m = m;
      }
    }
    if (t.out == kDirectOutput) {
      for (int32_t i = 0; i < d; ++i) {
        o[(static_cast<size_t>(seq) * num_qo_heads + head) * d + i] =
            static_cast<float>(p.l > 0 ? p.o[i] / p.l : 0.0);
      }
      ++written[static_cast<size_t>(seq) * num_qo_heads + head];
    } else {
      const int64_t e = t.out + static_cast<int64_t>(r / group) * num_qo_heads + head;
      ASSERT_GE(e, 0);
      ASSERT_LT(e, s.num_partial_entries);
      ASSERT_TRUE(entries[e].o.empty()) << "entry " << e << " written twice";
      entries[e] = std::move(p);
    }
  }
}

std::vector<float> RunSchedule(const TppSchedule& s, const kt::KvArena& arena,
                               const std::vector<float>& q, int32_t num_seqs, int32_t num_qo_heads,
                               float sm_scale) {
  const kt::Shape& shape = arena.shape();
  const int32_t d = shape.head_dim;
  std::vector<float> o(static_cast<size_t>(num_seqs) * num_qo_heads * d,
                       std::numeric_limits<float>::quiet_NaN());
  std::vector<int> written(static_cast<size_t>(num_seqs) * num_qo_heads, 0);
  std::vector<Partial> entries(static_cast<size_t>(s.num_partial_entries));
  for (const TppTask& t : s.tasks) {
    EXPECT_GE(t.num_rows, 1);
    EXPECT_LE(t.num_rows, kRowsPerTask);
    for (int32_t h = 0; h < shape.num_kv_heads; ++h) {
      RunTask(t, h, s, arena, q, num_qo_heads, sm_scale, entries, o, written);
    }
  }
  for (size_t k = 0; k < s.merge_seq.size(); ++k) {
    const int32_t seq = s.merge_seq[k];
    for (int32_t h = 0; h < num_qo_heads; ++h) {
      double m = -std::numeric_limits<double>::infinity();
      for (int32_t e = s.merge_indptr[k]; e < s.merge_indptr[k + 1]; ++e) {
        const Partial& p = entries.at(s.merge_entry[e] + h);
        EXPECT_FALSE(p.o.empty()) << "merge reads an entry no task wrote";
        if (p.o.empty()) return o;
        m = std::max(m, p.m);
      }
      std::vector<double> acc(d, 0.0);
      double l = 0.0;
      for (int32_t e = s.merge_indptr[k]; e < s.merge_indptr[k + 1]; ++e) {
        const Partial& p = entries[s.merge_entry[e] + h];
        const double w = m == -std::numeric_limits<double>::infinity() ? 0.0 : std::exp(p.m - m);
        for (int32_t i = 0; i < d; ++i) acc[i] += w * p.o[i];
        l += w * p.l;
      }
      for (int32_t i = 0; i < d; ++i) {
        o[(static_cast<size_t>(seq) * num_qo_heads + h) * d + i] =
            static_cast<float>(l > 0 ? acc[i] / l : 0.0);
      }
      ++written[static_cast<size_t>(seq) * num_qo_heads + h];
    }
  }
  for (size_t i = 0; i < written.size(); ++i) {
    EXPECT_EQ(written[i], 1) << "output row " << i << " written " << written[i] << " times";
  }
  return o;
}

struct ScheduleCase {
  int32_t gqa;
  int32_t max_chunks_per_task;  // 0: automatic
  int32_t num_sms;
};

std::string ScheduleCaseName(const ::testing::TestParamInfo<ScheduleCase>& info) {
  return "gqa" + std::to_string(info.param.gqa) + "_cap" +
         std::to_string(info.param.max_chunks_per_task) + "_sms" +
         std::to_string(info.param.num_sms);
}

class TppScheduleTest : public ::testing::TestWithParam<ScheduleCase> {
 protected:
  void Check(const kt::Layout& layout, int32_t num_kv_heads, Random& rng) {
    kt::Shape shape;
    shape.dtype = DType::kF32;
    shape.head_dim = 8;
    shape.chunk_size = 16;
    shape.num_kv_heads = num_kv_heads;
    shape.num_qo_heads = num_kv_heads * GetParam().gqa;
    kt::KvArena arena(shape, layout.num_slots);
    kt::FillLayout(layout, arena, rng);
    const std::vector<float> q = rng.Floats(
        static_cast<size_t>(layout.num_seqs) * shape.num_qo_heads * shape.head_dim, -2.0f, 2.0f);
    const float sm_scale = 0.35f;
    const std::vector<float> want = kt::NaiveDecode(arena, layout, q, sm_scale);

    TppScheduleShape ss{shape.num_qo_heads, shape.num_kv_heads, shape.chunk_size, layout.num_slots};
    TppScheduleOptions options;
    options.num_sms = GetParam().num_sms;
    options.max_chunks_per_task = GetParam().max_chunks_per_task;
    TppSchedule s;
    ASSERT_EQ(BuildTppSchedule(layout.Plan(), ss, options, &s), nullptr);
    const std::vector<float> got =
        RunSchedule(s, arena, q, layout.num_seqs, shape.num_qo_heads, sm_scale);
    size_t at = 0;
    EXPECT_LE(kt::WorstError(got, want, 1e-5, 1e-5, &at), 1.0)
        << "element " << at << " got " << got[at] << " want " << want[at];
  }
};

TEST_P(TppScheduleTest, RandomTreeExecutesToReference) {
  Random rng(TestSeed());
  Check(kt::RandomTreeLayout(static_cast<int32_t>(rng.Int(2, 40)), 16, rng), 2, rng);
}

TEST_P(TppScheduleTest, LongSharedPrefixWithTails) {
  Random rng(TestSeed());
  Check(kt::SharedPrefixLayout(5, 16, 16 * 23 - 3, 16 * 9 + 2, rng), 2, rng);
}

TEST_P(TppScheduleTest, ManyRowsShareOneChunk) {
  // 150 sequences x the group: more than 64 rows, so the chunk-first task splits into row blocks.
  Random rng(TestSeed());
  kt::LayoutBuilder b(150);
  b.AddShared(0, 150, 11);
  b.AddShared(0, 150, 16);
  for (int32_t s = 0; s < 150; s += 7) b.AddPrivate(s, 5);
  b.AddPrivate(149, 3);
  Check(b.Finish(rng), 1, rng);
}

TEST_P(TppScheduleTest, SequencesWithoutTokensGetZeros) {
  Random rng(TestSeed());
  kt::LayoutBuilder b(3);
  b.AddPrivate(1, 7);
  Check(b.Finish(rng), 1, rng);
}

INSTANTIATE_TEST_SUITE_P(Schedules, TppScheduleTest,
                         ::testing::Values(ScheduleCase{1, 0, 132}, ScheduleCase{4, 0, 132},
                                           ScheduleCase{1, 1, 132}, ScheduleCase{2, 2, 8},
                                           ScheduleCase{8, 3, 8}, ScheduleCase{80, 1, 4},
                                           ScheduleCase{3, 0, 1}),
                         ScheduleCaseName);

TEST(TppScheduleBuildTest, FullSharingSplitsIntoSegmentsThatFillTheGpu) {
  // The benchmark's full-sharing shape: 32 sequences share 64 chunks, 32 KV heads, 132 SMs.
  Random rng(1);
  const kt::Layout layout = kt::SharedPrefixLayout(32, 64, 4096, 0, rng);
  TppSchedule s;
  ASSERT_EQ(BuildTppSchedule(layout.Plan(), {32, 32, 64, layout.num_slots}, {132, 4, 0}, &s),
            nullptr);
  // 132 * 4 / 32 = 16 tasks per head wanted: 64 chunks in segments of 4.
  EXPECT_EQ(s.max_chunks_per_task, 4);
  EXPECT_EQ(s.tasks.size(), 16u);
  EXPECT_EQ(s.merge_seq.size(), 32u);
  for (const TppTask& t : s.tasks) EXPECT_EQ(t.num_rows, 32);  // the 32 sharing rows, no padding
}

TEST(TppScheduleBuildTest, NoSharingWritesOutputsDirectly) {
  Random rng(1);
  const kt::Layout layout = kt::SharedPrefixLayout(32, 64, 0, 1024, rng);
  TppSchedule s;
  ASSERT_EQ(BuildTppSchedule(layout.Plan(), {32, 32, 64, layout.num_slots}, {132, 4, 0}, &s),
            nullptr);
  EXPECT_EQ(s.tasks.size(), 32u);
  EXPECT_TRUE(s.merge_seq.empty());
  EXPECT_EQ(s.num_partial_entries, 0);
  for (const TppTask& t : s.tasks) EXPECT_EQ(t.out, kDirectOutput);
}

TEST(TppScheduleBuildTest, LongContextSmallBatchSplitsKv) {
  Random rng(1);
  const kt::Layout layout = kt::SharedPrefixLayout(1, 64, 0, 32768, rng);
  TppSchedule s;
  ASSERT_EQ(BuildTppSchedule(layout.Plan(), {32, 8, 64, layout.num_slots}, {132, 4, 0}, &s),
            nullptr);
  EXPECT_GT(s.tasks.size(), 32u);  // 512 chunks over 8 heads: split-KV
  EXPECT_EQ(s.merge_seq.size(), 1u);
}

TEST(TppScheduleBuildTest, RejectsMalformedPlans) {
  Random rng(1);
  kt::Layout layout = kt::RandomTreeLayout(6, 16, rng);
  const TppScheduleShape shape{2, 2, 16, layout.num_slots};
  TppSchedule s;
  ASSERT_EQ(BuildTppSchedule(layout.Plan(), shape, {}, &s), nullptr);
  {
    kt::Layout bad = layout;
    if (!bad.private_len.empty()) {
      bad.private_len[0] = 17;
      EXPECT_NE(BuildTppSchedule(bad.Plan(), shape, {}, &s), nullptr);
    }
  }
  {
    kt::Layout bad = layout;
    if (!bad.private_slot.empty()) {
      bad.private_slot[0] = layout.num_slots;
      EXPECT_NE(BuildTppSchedule(bad.Plan(), shape, {}, &s), nullptr);
    }
  }
  {
    kt::Layout bad = layout;
    bad.private_indptr[0] = 1;
    EXPECT_NE(BuildTppSchedule(bad.Plan(), shape, {}, &s), nullptr);
  }
  {
    // A row that omits a shared chunk whose range holds it.
    kt::LayoutBuilder b(3);
    b.AddShared(0, 3, 16);
    b.AddPrivate(0, 4);
    kt::Layout l = b.Finish(rng);
    l.seq_shared_ids.erase(l.seq_shared_ids.begin());
    for (size_t i = 1; i < l.seq_shared_indptr.size(); ++i) --l.seq_shared_indptr[i];
    l.seq_shared_indptr[0] = 0;
    EXPECT_NE(BuildTppSchedule(l.Plan(), {1, 1, 16, l.num_slots}, {}, &s), nullptr);
  }
  EXPECT_NE(BuildTppSchedule(layout.Plan(), {3, 2, 16, layout.num_slots}, {}, &s), nullptr);
  EXPECT_TRUE(s.tasks.empty());
}

// The real producer of the plan (runtime/plan over a prefix tree) through decode steps: every
// step the cache must copy exactly what changed (lengths only while no chunk fills; everything
// when TppPlan restructures), and the schedule must still execute to the reference.
TEST(TppPlanCacheTest, FollowsTheRuntimePlanThroughDecodeSteps) {
  Random rng(TestSeed());
  constexpr int32_t kChunk = 16;
  constexpr int32_t kSlots = 128;
  Result<kv::PrefixTree> created =
      kv::PrefixTree::Create({.chunk_size = kChunk, .num_slots = kSlots});
  ASSERT_OK(created.status());
  kv::PrefixTree tree = std::move(*created);
  auto add = [&](const std::vector<TokenId>& prompt) {
    Result<kv::InsertResult> r = tree.Insert(prompt, static_cast<int32_t>(prompt.size()) - 1);
    EXPECT_OK(r.status());
    const std::vector<TokenId> rest(prompt.begin() + r->num_cached_tokens, prompt.end());
    kv::AppendResult out;
    const kv::SeqTokens req{r->seq, rest};
    EXPECT_OK(tree.Append(std::span<const kv::SeqTokens>(&req, 1), &out));
    return r->seq;
  };
  // Three sequences share 40 prompt tokens, two others share 20, one shares nothing.
  std::vector<TokenId> system(40), other(20);
  for (TokenId& t : system) t = static_cast<TokenId>(rng.Int(0, 999));
  for (TokenId& t : other) t = static_cast<TokenId>(rng.Int(0, 999));
  std::vector<SeqId> batch;
  for (int i = 0; i < 3; ++i) {
    std::vector<TokenId> p = system;
    for (int j = 0; j < 5 + 7 * i; ++j) p.push_back(static_cast<TokenId>(1000 + i * 50 + j));
    batch.push_back(add(p));
  }
  for (int i = 0; i < 2; ++i) {
    std::vector<TokenId> p = other;
    p.push_back(static_cast<TokenId>(2000 + i));
    batch.push_back(add(p));
  }
  batch.push_back(add({7, 8, 9}));

  kt::Shape shape;
  shape.dtype = DType::kF32;
  shape.head_dim = 8;
  shape.chunk_size = kChunk;
  shape.num_kv_heads = 2;
  shape.num_qo_heads = 4;
  kt::KvArena arena(shape, kSlots);
  for (int32_t slot = 0; slot < kSlots; ++slot) {
    for (int32_t t = 0; t < kChunk; ++t) arena.FillToken(slot, t, rng);
  }

  plan::TppPlan plan;
  TppPlanCache cache;
  int lengths_only = 0, full = 0;
  for (int step = 0; step < 40; ++step) {
    ASSERT_OK(plan.Update(tree, batch));
    const TppPlanView view = plan.view();
    PlanUpload u;
    size_t b, e;
    ASSERT_EQ(cache.Prepare(view, {shape.num_qo_heads, shape.num_kv_heads, kChunk, kSlots},
                            {132, 4, 2}, &u, &b, &e),
              nullptr);
    if (step > 0) {
      if (plan.last_update() == plan::TppPlan::UpdateKind::kLengths) {
        EXPECT_EQ(u, PlanUpload::kLengths) << "step " << step;
        EXPECT_EQ(b, cache.layout().chunk_len);
        ++lengths_only;
      } else {
        EXPECT_EQ(u, PlanUpload::kFull) << "step " << step;
        ++full;
      }
    }
    const std::vector<float> q = rng.Floats(
        static_cast<size_t>(view.num_seqs) * shape.num_qo_heads * shape.head_dim, -2.0f, 2.0f);
    const std::vector<float> got =
        RunSchedule(cache.schedule(), arena, q, view.num_seqs, shape.num_qo_heads, 0.3f);
    const std::vector<float> want = kt::NaiveDecode(arena, view, q, 0.3f);
    size_t at = 0;
    ASSERT_LE(kt::WorstError(got, want, 1e-5, 1e-5, &at), 1.0) << "step " << step;
    // One decode token per sequence.
    std::vector<kv::SeqTokens> reqs;
    std::vector<std::vector<TokenId>> toks;
    for (size_t i = 0; i < batch.size(); ++i)
      toks.push_back({static_cast<TokenId>(rng.Int(0, 999))});
    for (size_t i = 0; i < batch.size(); ++i) reqs.push_back({batch[i], toks[i]});
    kv::AppendResult out;
    ASSERT_OK(tree.Append(reqs, &out));
  }
  EXPECT_GT(lengths_only, 20);  // most steps fill no chunk
  EXPECT_GT(full, 0);           // some do
}

// ---------------------------------------------------------------------------------------------
// Upload decisions.
// ---------------------------------------------------------------------------------------------

TEST(TppPlanCacheTest, UploadsEverythingFirstThenNothingForTheSamePlan) {
  Random rng(TestSeed());
  const kt::Layout layout = kt::RandomTreeLayout(8, 16, rng);
  const TppScheduleShape shape{4, 2, 16, layout.num_slots};
  TppPlanCache cache;
  PlanUpload u;
  size_t b, e;
  ASSERT_EQ(cache.Prepare(layout.Plan(), shape, {}, &u, &b, &e), nullptr);
  EXPECT_EQ(u, PlanUpload::kFull);
  EXPECT_EQ(b, 0u);
  EXPECT_EQ(e, cache.layout().total);
  ASSERT_EQ(cache.Prepare(layout.Plan(), shape, {}, &u, &b, &e), nullptr);
  EXPECT_EQ(u, PlanUpload::kNone);
  EXPECT_EQ(e - b, 0u);
  // An equal plan in different memory is recognised too (compared by value).
  const kt::Layout copy = layout;
  ASSERT_EQ(cache.Prepare(copy.Plan(), shape, {}, &u, &b, &e), nullptr);
  EXPECT_EQ(u, PlanUpload::kNone);
}

TEST(TppPlanCacheTest, LengthChangeCopiesOnlyTheLengthSuffix) {
  Random rng(TestSeed());
  kt::Layout layout = kt::SharedPrefixLayout(4, 16, 40, 20, rng);  // tails of 16 + 4 tokens
  const TppScheduleShape shape{4, 2, 16, layout.num_slots};
  TppPlanCache cache;
  PlanUpload u;
  size_t b, e;
  ASSERT_EQ(cache.Prepare(layout.Plan(), shape, {}, &u, &b, &e), nullptr);
  const std::vector<int32_t> before = cache.packed();
  // A decode step: every tail grows by one token.
  for (int32_t s = 0; s < 4; ++s) ++layout.private_len[layout.private_indptr[s + 1] - 1];
  ASSERT_EQ(cache.Prepare(layout.Plan(), shape, {}, &u, &b, &e), nullptr);
  EXPECT_EQ(u, PlanUpload::kLengths);
  EXPECT_EQ(b, cache.layout().chunk_len);
  EXPECT_EQ(e, cache.layout().chunk_len + cache.schedule().chunk_len.size());
  // Outside the copied range nothing changed; inside, the packed lengths are the plan's.
  const std::vector<int32_t>& after = cache.packed();
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < after.size(); ++i) {
    if (i < b || i >= e) {
      EXPECT_EQ(after[i], before[i]) << "word " << i;
    }
  }
  const int32_t ns = static_cast<int32_t>(layout.shared_len.size());
  for (size_t j = 0; j < layout.private_len.size(); ++j) {
    EXPECT_EQ(after[cache.layout().chunk_len + ns + j], layout.private_len[j]);
  }
  // And the schedule equals one built from scratch for the new plan.
  TppSchedule fresh;
  ASSERT_EQ(BuildTppSchedule(layout.Plan(), shape, {}, &fresh), nullptr);
  EXPECT_EQ(fresh.chunk_len, cache.schedule().chunk_len);
}

TEST(TppPlanCacheTest, StructureShapeOrOptionChangesUploadEverything) {
  Random rng(TestSeed());
  kt::Layout layout = kt::SharedPrefixLayout(4, 16, 40, 20, rng);
  const TppScheduleShape shape{4, 2, 16, layout.num_slots};
  TppPlanCache cache;
  PlanUpload u;
  size_t b, e;
  ASSERT_EQ(cache.Prepare(layout.Plan(), shape, {}, &u, &b, &e), nullptr);
  // A tail filled: a new private chunk (the slot list changes).
  kt::Layout grown = kt::SharedPrefixLayout(4, 16, 40, 36, rng);
  ASSERT_EQ(cache.Prepare(grown.Plan(), {4, 2, 16, grown.num_slots}, {}, &u, &b, &e), nullptr);
  EXPECT_EQ(u, PlanUpload::kFull);
  ASSERT_EQ(cache.Prepare(grown.Plan(), {4, 2, 16, grown.num_slots}, {}, &u, &b, &e), nullptr);
  EXPECT_EQ(u, PlanUpload::kNone);
  // Another head count, same plan.
  ASSERT_EQ(cache.Prepare(grown.Plan(), {8, 2, 16, grown.num_slots}, {}, &u, &b, &e), nullptr);
  EXPECT_EQ(u, PlanUpload::kFull);
  // Other schedule options.
  ASSERT_EQ(cache.Prepare(grown.Plan(), {8, 2, 16, grown.num_slots}, {132, 4, 3}, &u, &b, &e),
            nullptr);
  EXPECT_EQ(u, PlanUpload::kFull);
}

TEST(TppPlanCacheTest, ErrorsForgetTheLastPlan) {
  Random rng(TestSeed());
  kt::Layout layout = kt::SharedPrefixLayout(4, 16, 40, 20, rng);
  const TppScheduleShape shape{4, 2, 16, layout.num_slots};
  TppPlanCache cache;
  PlanUpload u;
  size_t b, e;
  ASSERT_EQ(cache.Prepare(layout.Plan(), shape, {}, &u, &b, &e), nullptr);
  kt::Layout bad = layout;
  bad.private_len[0] = 0;  // structure equal, a length invalid
  EXPECT_NE(cache.Prepare(bad.Plan(), shape, {}, &u, &b, &e), nullptr);
  EXPECT_FALSE(cache.valid());
  ASSERT_EQ(cache.Prepare(layout.Plan(), shape, {}, &u, &b, &e), nullptr);
  EXPECT_EQ(u, PlanUpload::kFull);
  cache.Invalidate();
  ASSERT_EQ(cache.Prepare(layout.Plan(), shape, {}, &u, &b, &e), nullptr);
  EXPECT_EQ(u, PlanUpload::kFull);
}

}  // namespace
}  // namespace chunkserve::kernels::cuda
