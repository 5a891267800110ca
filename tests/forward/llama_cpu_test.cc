// The model definition (forward::LlamaModel) on the CPU backend against the independent
// double-precision reference: a full prefill, a prefill over a cached prefix shared with another
// sequence, and decode steps whose TPP plan has shared chunks, for each KV storage dtype, and
// with fp16 / bf16 checkpoints (the CPU backend keeps those weights half-size and widens them in
// the GEMM; the reference widens the same values, so the tolerance is fp32's).
#include <gtest/gtest.h>

#include <cmath>

#include "runtime/forward/llama.h"
#include "runtime/kvcache/prefix_tree.h"
#include "runtime/model/tiny_model.h"
#include "runtime/plan/tpp_plan.h"
#include "tests/testing/random.h"
#include "tests/testing/reference_model.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/tiny_models.h"

namespace chunkserve::forward {
namespace {

struct DtypeCase {
  const char* name;
  kernels::DType dtype;
  // Absolute logit tolerance. Logits here are O(1); fp32 KV differs from the double reference
  // only by fp32 rounding in GEMMs and softmax (~1e-5); fp16 KV rounds each K/V value to 11
  // significant bits (relative 2^-11), bf16 to 8 (2^-8), errors that attention averages but two
  // layers compound.
  double tolerance;
  kernels::DType weight_dtype = kernels::DType::kF32;  // the checkpoint's
};

class LlamaCpuTest : public ::testing::TestWithParam<DtypeCase> {
 protected:
  void SetUp() override {
    model::TinyModelOptions o = testing::SmallTestModel(3);
    o.vocab_size = 128;
    o.intermediate_size = 96;
    o.max_position_embeddings = 8192;
    o.dtype = GetParam().weight_dtype;
    ASSERT_OK(model::WriteTinyModel(dir_.path(), o));
    ASSERT_OK_AND_ASSIGN(model::LoadedModel m, model::LoadedModel::Load(dir_.path()));
    model_ = std::make_unique<model::LoadedModel>(std::move(m));
    reference_ = std::make_unique<testing::ReferenceModel>(*model_);
    ASSERT_OK_AND_ASSIGN(runner_, CreateLlamaModel(*model_, {.num_threads = 2,
                                                             .num_slots = 64,
                                                             .chunk_size = 16,
                                                             .kv_dtype = GetParam().dtype}));
    ASSERT_OK_AND_ASSIGN(kv::PrefixTree tree,
                         kv::PrefixTree::Create({.chunk_size = 16, .num_slots = 64}));
    tree_ = std::make_unique<kv::PrefixTree>(std::move(tree));
  }

  // Appends `tokens` to `seq` and runs them as one prefill segment; returns all their logits.
  std::vector<float> Prefill(SeqId seq, std::span<const TokenId> tokens, int32_t first_pos) {
    kv::AppendResult ar;
    const kv::SeqTokens st{seq, tokens};
    EXPECT_OK(tree_->Append({&st, 1}, &ar));
    auto info = tree_->Seq(seq);
    EXPECT_OK(info.status());
    std::vector<int32_t> slots, lens, pos, kslot, koff, rows;
    for (ChunkId c : info->path) {
      slots.push_back(static_cast<int32_t>(tree_->ChunkSlot(c).value()));
      lens.push_back(tree_->ChunkLen(c));
    }
    for (size_t i = 0; i < tokens.size(); ++i) {
      pos.push_back(first_pos + static_cast<int32_t>(i));
      kslot.push_back(static_cast<int32_t>(ar.writes[i].slot.value()));
      koff.push_back(ar.writes[i].offset);
      rows.push_back(static_cast<int32_t>(i));
      EXPECT_EQ(ar.writes[i].position, pos.back());
    }
    PrefillSegment seg{0, static_cast<int32_t>(tokens.size()), slots, lens};
    std::vector<KvCopyOp> copies;
    for (const auto& c : ar.copies) {
      copies.push_back(
          {static_cast<int32_t>(c.src.value()), static_cast<int32_t>(c.dst.value()), c.num_tokens});
    }
    StepBatch b;
    b.tokens = tokens;
    b.positions = pos;
    b.kv_slot = kslot;
    b.kv_offset = koff;
    b.prefill = {&seg, 1};
    b.logit_rows = rows;
    b.kv_copies = copies;
    std::vector<float> logits(rows.size() * 128);
    EXPECT_OK(runner_->Forward(b, logits));
    return logits;
  }

  void ExpectNear(std::span<const float> got, const std::vector<double>& want,
                  const std::string& what) {
    ASSERT_EQ(got.size(), want.size());
    double worst = 0;
    for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::abs(got[i] - want[i]));
    EXPECT_LE(worst, GetParam().tolerance) << what;
  }

  testing::TempDir dir_;
  std::unique_ptr<model::LoadedModel> model_;
  std::unique_ptr<testing::ReferenceModel> reference_;
  std::unique_ptr<LlamaModel> runner_;
  std::unique_ptr<kv::PrefixTree> tree_;
};

TEST_P(LlamaCpuTest, PrefillSharedPrefixAndTppDecodeMatchReference) {
  testing::Random rng(testing::TestSeed());
  const std::vector<TokenId> a_prompt = rng.Tokens(40, 128);
  std::vector<TokenId> b_prompt(a_prompt.begin(), a_prompt.begin() + 35);
  for (TokenId t : rng.Tokens(6, 128)) b_prompt.push_back(t);
  // B must diverge at token 35 for exactly 35 cached tokens; the draw may coincide.
  if (b_prompt[35] == a_prompt[35]) b_prompt[35] = (a_prompt[35] + 1) % 128;

  // Sequence A: full prefill, every position's logits.
  ASSERT_OK_AND_ASSIGN(kv::InsertResult a, tree_->Insert(a_prompt, 39));
  ASSERT_EQ(a.num_cached_tokens, 0);
  const auto a_logits = Prefill(a.seq, a_prompt, 0);
  const auto a_ref = reference_->Logits(a_prompt);
  for (size_t t = 0; t < a_prompt.size(); ++t) {
    ExpectNear(std::span<const float>(a_logits).subspan(t * 128, 128), a_ref[t],
               "A position " + std::to_string(t));
  }

  // Sequence B reuses A's first 35 tokens: two full chunks shared, three tokens copied.
  ASSERT_OK_AND_ASSIGN(kv::InsertResult b, tree_->Insert(b_prompt, 40));
  ASSERT_EQ(b.num_cached_tokens, 35);
  std::vector<KvCopyOp> copy;
  if (b.copy) {
    copy.push_back({static_cast<int32_t>(b.copy->src.value()),
                    static_cast<int32_t>(b.copy->dst.value()), b.copy->num_tokens});
  }
  StepBatch copies_only;
  copies_only.kv_copies = copy;
  ASSERT_OK(runner_->Forward(copies_only, {}));
  const std::span<const TokenId> b_rest(b_prompt.data() + 35, b_prompt.size() - 35);
  const auto b_logits = Prefill(b.seq, b_rest, 35);
  ExpectNear(std::span<const float>(b_logits).subspan((b_rest.size() - 1) * 128, 128),
             reference_->Logits(b_prompt).back(), "B last prompt position");

  // Three decode steps over {A, B}: the plan shares their common full chunks.
  std::vector<TokenId> a_seq = a_prompt, b_seq = b_prompt;
  plan::TppPlan plan;
  for (int step = 0; step < 3; ++step) {
    a_seq.push_back(static_cast<TokenId>(rng.Int(0, 127)));
    b_seq.push_back(static_cast<TokenId>(rng.Int(0, 127)));
    const TokenId ta = a_seq.back(), tb = b_seq.back();
    const kv::SeqTokens st[2] = {{a.seq, {&ta, 1}}, {b.seq, {&tb, 1}}};
    kv::AppendResult ar;
    ASSERT_OK(tree_->Append(st, &ar));
    const SeqId batch[2] = {a.seq, b.seq};
    ASSERT_OK(plan.Update(*tree_, batch));
    EXPECT_GE(plan.num_shared(), 2);
    std::vector<TokenId> toks;
    std::vector<int32_t> pos, slot, off, rows;
    std::vector<const std::vector<TokenId>*> seqs;
    for (SeqId s : plan.rows()) {
      const int idx = s == a.seq ? 0 : 1;
      const kv::KvWrite& w = ar.writes[idx];
      toks.push_back(idx == 0 ? ta : tb);
      pos.push_back(w.position);
      slot.push_back(static_cast<int32_t>(w.slot.value()));
      off.push_back(w.offset);
      rows.push_back(static_cast<int32_t>(rows.size()));
      seqs.push_back(idx == 0 ? &a_seq : &b_seq);
    }
    std::vector<KvCopyOp> cow;
    for (const auto& c : ar.copies) {
      cow.push_back(
          {static_cast<int32_t>(c.src.value()), static_cast<int32_t>(c.dst.value()), c.num_tokens});
    }
    StepBatch batch_in;
    batch_in.tokens = toks;
    batch_in.positions = pos;
    batch_in.kv_slot = slot;
    batch_in.kv_offset = off;
    batch_in.num_decode = 2;
    batch_in.decode_plan = plan.view();
    batch_in.logit_rows = rows;
    batch_in.kv_copies = cow;
    std::vector<float> logits(2 * 128);
    ASSERT_OK(runner_->Forward(batch_in, logits));
    for (int r = 0; r < 2; ++r) {
      ExpectNear(std::span<const float>(logits).subspan(r * 128, 128),
                 reference_->Logits(*seqs[r]).back(),
                 "decode step " + std::to_string(step) + " row " + std::to_string(r));
    }
  }
}

TEST_P(LlamaCpuTest, MalformedBatchesAreRejected) {
  const TokenId tok = 1000;  // outside the vocabulary
  const int32_t zero = 0;
  StepBatch b;
  b.tokens = {&tok, 1};
  b.positions = {&zero, 1};
  b.kv_slot = {&zero, 1};
  b.kv_offset = {&zero, 1};
  std::vector<float> logits(128);
  EXPECT_THAT(runner_->Forward(b, logits), testing::StatusIs(StatusCode::kInvalidArgument));
  const TokenId ok_tok = 1;
  b.tokens = {&ok_tok, 1};  // no segment covers the row
  EXPECT_THAT(runner_->Forward(b, logits), testing::StatusIs(StatusCode::kInvalidArgument));
}

INSTANTIATE_TEST_SUITE_P(KvDtypes, LlamaCpuTest,
                         ::testing::Values(DtypeCase{"f32", kernels::DType::kF32, 2e-3},
                                           DtypeCase{"f16", kernels::DType::kF16, 2e-2},
                                           DtypeCase{"bf16", kernels::DType::kBF16, 1e-1},
                                           DtypeCase{"f32_kv_bf16_weights", kernels::DType::kF32,
                                                     2e-3, kernels::DType::kBF16},
                                           DtypeCase{"f32_kv_f16_weights", kernels::DType::kF32,
                                                     2e-3, kernels::DType::kF16}),
                         [](const auto& info) { return std::string(info.param.name); });

// A model whose weights were released (the engine does so once its runner holds a copy) cannot
// build another runner: a clear error, not a read of freed memory.
TEST(LlamaModelCreateTest, ReleasedWeightsAreAFailedPrecondition) {
  testing::TempDir dir;
  ASSERT_OK(model::WriteTinyModel(dir.path(), testing::SmallTestModel(3)));
  ASSERT_OK_AND_ASSIGN(model::LoadedModel m, model::LoadedModel::Load(dir.path()));
  m.ReleaseWeights();
  EXPECT_THAT(CreateLlamaModel(m, {.num_threads = 1, .num_slots = 8, .chunk_size = 16}).status(),
              testing::StatusIs(StatusCode::kFailedPrecondition));
}

}  // namespace
}  // namespace chunkserve::forward
