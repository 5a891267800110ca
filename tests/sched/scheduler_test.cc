// Scheduler against a fake StepRunner that records every step, so the batching rules are checked
// exactly rather than through their effect on generated text (which is the same whether or not a
// step respects its token budget, or whether admission over-commits and later preempts: the
// engine tests compare outputs, and recompute hides both). Every batch is also validated as a
// backend would.
#include "runtime/sched/scheduler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <vector>

#include "runtime/forward/step.h"
#include "tests/testing/status_matchers.h"

namespace chunkserve::sched {
namespace {

constexpr int32_t kVocab = 64;
constexpr int32_t kChunk = 4;

// "Samples" token 1 for every logit row and records each step's shape.
class RecordingRunner final : public forward::StepRunner {
 public:
  struct StepShape {
    int32_t tokens;
    int32_t decode_rows;
  };

  explicit RecordingRunner(int32_t num_slots)
      : shape_{.num_layers = 1,
               .num_slots = num_slots,
               .num_kv_heads = 1,
               .chunk_size = kChunk,
               .head_dim = 8} {}

  std::string name() const override { return "recording"; }
  const backend::KvArenaShape& kv_shape() const override { return shape_; }
  int32_t vocab_size() const override { return kVocab; }
  Status Forward(const forward::StepBatch& batch, std::span<float>) override {
    return forward::ValidateStepBatch(batch, shape_, kVocab);
  }
  Status ForwardSample(const forward::StepBatch& batch, std::span<const backend::SampleRow>,
                       std::span<TokenId> tokens, std::span<TokenLogprobs>) override {
    CHUNKSERVE_RETURN_IF_ERROR(forward::ValidateStepBatch(batch, shape_, kVocab));
    steps.push_back({static_cast<int32_t>(batch.tokens.size()), batch.num_decode});
    std::fill(tokens.begin(), tokens.end(), TokenId{1});
    return Status::Ok();
  }

  std::vector<StepShape> steps;

 private:
  backend::KvArenaShape shape_;
};

class SchedulerTest : public ::testing::Test {
 protected:
  void Make(int32_t num_slots, const SchedulerOptions& options) {
    ASSERT_OK_AND_ASSIGN(kv::PrefixTree tree,
                         kv::PrefixTree::Create({.chunk_size = kChunk, .num_slots = num_slots}));
    tree_.emplace(std::move(tree));
    runner_ = std::make_unique<RecordingRunner>(num_slots);
    scheduler_ = std::make_unique<Scheduler>(options, &*tree_, runner_.get(), nullptr);
  }

  // Prompt tokens first, first + 1, ... (mod the vocabulary).
  std::shared_ptr<RequestStream> Add(uint64_t id, int32_t prompt_len, TokenId first,
                                     int32_t max_new_tokens) {
    RequestOptions o;
    for (int32_t i = 0; i < prompt_len; ++i) o.prompt.push_back((first + i) % kVocab);
    o.max_new_tokens = max_new_tokens;
    auto stream = std::make_shared<RequestStream>(RequestId(id));
    scheduler_->Add({.id = RequestId(id), .options = o, .stream = stream, .arrival = Clock::now()});
    return stream;
  }

  void RunToCompletion() {
    for (int i = 0; i < 1000 && scheduler_->has_work(); ++i) {
      ASSERT_OK(scheduler_->Step(Clock::now()));
      scheduler_->DeliverFinished();
    }
    ASSERT_FALSE(scheduler_->has_work());
  }

  // The request's terminal event (its events must all be there already).
  static FinishInfo FinishOf(RequestStream& stream) {
    StreamEvent e;
    while (stream.Next(&e, std::chrono::nanoseconds(0)) == RequestStream::NextResult::kEvent) {
      if (e.kind == StreamEvent::Kind::kFinished) return e.finish;
    }
    ADD_FAILURE() << "request " << stream.id().value() << " has no terminal event";
    return {};
  }

  std::optional<kv::PrefixTree> tree_;
  std::unique_ptr<RecordingRunner> runner_;
  std::unique_ptr<Scheduler> scheduler_;
};

// token_budget counts decode tokens too: a step that decodes d sequences prefills at most
// budget - d prompt tokens. Kills the mutation sched-prefill-budget-ignores-decode.
TEST_F(SchedulerTest, TokenBudgetCountsTheStepsDecodeTokens) {
  Make(64, {.max_batch_size = 8, .token_budget = 8});
  auto a = Add(1, 3, 0, 30);    // prefilled in the first step, then decodes
  auto b = Add(2, 40, 10, 2);   // prefilled over many steps beside a's decode
  RunToCompletion();
  bool mixed_full_step = false;
  for (size_t i = 0; i < runner_->steps.size(); ++i) {
    const auto& s = runner_->steps[i];
    EXPECT_LE(s.tokens, 8) << "step " << i << " (" << s.decode_rows << " decode rows)";
    mixed_full_step |= s.decode_rows > 0 && s.tokens == 8;
  }
  EXPECT_TRUE(mixed_full_step) << "no step both decoded and filled the budget with prefill";
  EXPECT_EQ(FinishOf(*a).generated_tokens, 30);
  EXPECT_EQ(FinishOf(*b).generated_tokens, 2);
}

// Admission reserves the slots running prefills still need: with 10 slots, a 24-token prompt
// (6 chunks) being prefilled leaves no room for a second one, which must wait instead of being
// admitted and preempted once both grow. Kills the mutation sched-admit-past-kv-budget.
TEST_F(SchedulerTest, AdmissionReservesTheSlotsRunningPrefillsStillNeed) {
  Make(10, {.max_batch_size = 8, .token_budget = 10});
  auto a = Add(1, 24, 0, 8);
  auto b = Add(2, 24, 30, 8);
  RunToCompletion();
  EXPECT_EQ(scheduler_->counters().preemptions, 0u);
  EXPECT_EQ(scheduler_->counters().admitted, 2u);
  const FinishInfo fa = FinishOf(*a), fb = FinishOf(*b);
  EXPECT_EQ(fa.reason, FinishReason::kLength);
  EXPECT_EQ(fa.generated_tokens, 8);
  EXPECT_EQ(fb.reason, FinishReason::kLength);
  EXPECT_EQ(fb.generated_tokens, 8);
}

// PrefillProgressTokens follows a chunked prefill step by step and drops the request at its
// first token; the cached part of a prompt is not progress.
TEST_F(SchedulerTest, PrefillProgressCountsComputedPromptTokensUntilTheFirstToken) {
  Make(64, {.max_batch_size = 8, .token_budget = 8});
  auto a = Add(1, 20, 0, 4);
  EXPECT_EQ(scheduler_->PrefillProgressTokens(), 0);  // not admitted yet
  std::vector<int64_t> seen;
  for (int i = 0; i < 3; ++i) {
    ASSERT_OK(scheduler_->Step(Clock::now()));
    seen.push_back(scheduler_->PrefillProgressTokens());
  }
  EXPECT_EQ(seen, (std::vector<int64_t>{8, 16, 0}));  // 8 + 8 + 4 tokens; then its first token
  RunToCompletion();
  // The same prompt with a longer tail: its first 20 tokens are cached, so its progress starts
  // past them: 8 of its 12 uncached tokens in the first step.
  auto b = Add(2, 32, 0, 4);
  ASSERT_OK(scheduler_->Step(Clock::now()));
  EXPECT_EQ(scheduler_->PrefillProgressTokens(), 8);
  RunToCompletion();
  EXPECT_EQ(FinishOf(*a).generated_tokens, 4);
  EXPECT_EQ(FinishOf(*b).cached_tokens, 20);
}

}  // namespace
}  // namespace chunkserve::sched
