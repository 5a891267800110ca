// Shared by the tensor-parallel tests: a runner wrapper that records every step's logits, a
// request set with a shared system prompt, and a scheduler run whose batches depend only on the
// requests and the sampled tokens (every request is added before the first step; steps are run
// by hand), so two runners that sample the same tokens run exactly the same steps.
#ifndef CHUNKSERVE_TESTS_PARALLEL_TP_TESTING_H_
#define CHUNKSERVE_TESTS_PARALLEL_TP_TESTING_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "kernels/cpu/sampling.h"
#include "runtime/forward/llama.h"
#include "runtime/kvcache/prefix_tree.h"
#include "runtime/model/model.h"
#include "runtime/sched/scheduler.h"
#include "tests/testing/status_matchers.h"

namespace chunkserve::parallel::tp_testing {

using namespace std::chrono_literals;

constexpr int32_t kChunk = 16;
constexpr int32_t kSlots = 256;

// Records the logits of every step, in order: samples on the host, from the logits it records,
// by the rule the backends sample with (kernels/cpu/sampling.h).
class RecordingRunner final : public forward::StepRunner {
 public:
  // With `forced`, the tokens handed to the scheduler are forced[0], forced[1], ... (a reference
  // run's, in its order), so the run takes exactly the reference's steps whatever this runner
  // would have sampled; what it would have sampled is kept in own_tokens().
  explicit RecordingRunner(std::unique_ptr<forward::StepRunner> inner,
                           const std::vector<TokenId>* forced = nullptr)
      : inner_(std::move(inner)), forced_(forced) {}
  std::string name() const override { return inner_->name(); }
  const backend::KvArenaShape& kv_shape() const override { return inner_->kv_shape(); }
  int32_t vocab_size() const override { return inner_->vocab_size(); }
  Status Forward(const forward::StepBatch& b, std::span<float> logits) override {
    CHUNKSERVE_RETURN_IF_ERROR(inner_->Forward(b, logits));
    const size_t n = b.logit_rows.size() * static_cast<size_t>(vocab_size());
    logits_.insert(logits_.end(), logits.begin(), logits.begin() + static_cast<ptrdiff_t>(n));
    return Status::Ok();
  }
  Status ForwardSample(const forward::StepBatch& b, std::span<const backend::SampleRow> rows,
                       std::span<TokenId> tokens, std::span<TokenLogprobs> /*logprobs*/) override {
    const size_t vocab = static_cast<size_t>(vocab_size());
    step_logits_.resize(b.logit_rows.size() * vocab);
    CHUNKSERVE_RETURN_IF_ERROR(Forward(b, step_logits_));
    for (size_t r = 0; r < rows.size(); ++r) {
      if (rows[r].logprobs >= 0) return Status::Unimplemented("RecordingRunner: no logprobs");
      tokens[r] = kernels::cpu::SampleToken(
          std::span<const float>(step_logits_).subspan(r * vocab, vocab),
          {rows[r].temperature, rows[r].top_k, rows[r].top_p}, rows[r].uniform, &scratch_);
      own_tokens_.push_back(tokens[r]);
      if (forced_ != nullptr) {
        if (next_forced_ >= forced_->size())
          return Status::OutOfRange("ran past the forced tokens");
        tokens[r] = (*forced_)[next_forced_++];
      }
    }
    return Status::Ok();
  }
  const std::vector<float>& logits() const { return logits_; }
  const std::vector<TokenId>& own_tokens() const { return own_tokens_; }

 private:
  std::unique_ptr<forward::StepRunner> inner_;
  const std::vector<TokenId>* forced_;
  size_t next_forced_ = 0;
  std::vector<TokenId> own_tokens_;
  std::vector<float> logits_, step_logits_;
  kernels::cpu::SamplingScratch scratch_;
};

// A system prompt shared by four requests (2.5 chunks, so a partial chunk is copied), and two
// requests with prompts of their own.
inline std::vector<sched::RequestOptions> Requests() {
  std::vector<TokenId> system;
  for (int i = 0; i < 40; ++i) system.push_back((i * 37 + 11) % 1000 + 3);
  std::vector<sched::RequestOptions> out;
  for (int r = 0; r < 6; ++r) {
    sched::RequestOptions o;
    if (r < 4) o.prompt = system;
    for (int i = 0; i < 5 + 4 * r; ++i) o.prompt.push_back((r * 101 + i * 13) % 1000 + 3);
    o.max_new_tokens = 12;
    out.push_back(std::move(o));
  }
  return out;
}

struct RunResult {
  std::vector<std::vector<TokenId>> tokens;  // per request
  std::vector<float> logits;                 // every sampled row, in step order
  std::vector<TokenId> step_tokens;          // what the runner sampled, in step order
  uint64_t prefix_hit_tokens = 0;
};

// Every request added before the first step, steps run by hand: the batches depend only on the
// requests and the sampled tokens, so two runs that sample the same tokens run the same steps.
// token_budget 48 spreads prefills over several steps; 0 puts every prompt in the first step
// (a descriptor larger than one 4 KiB broadcast frame).
// With `forced` (a reference run's step_tokens), the run follows the reference's steps exactly.
inline RunResult RunAll(const model::LoadedModel& model,
                        std::unique_ptr<forward::StepRunner> runner, int32_t token_budget = 48,
                        const std::vector<TokenId>* forced = nullptr) {
  RunResult run;
  auto recorder = std::make_unique<RecordingRunner>(std::move(runner), forced);
  Result<kv::PrefixTree> tree = kv::PrefixTree::Create({.chunk_size = kChunk,
                                                        .num_slots = kSlots,
                                                        .slot_bytes = 1,
                                                        .model_fingerprint = model.fingerprint()});
  EXPECT_OK(tree.status());
  if (!tree.ok()) return run;
  sched::Scheduler scheduler({.max_batch_size = 16,
                              .token_budget = token_budget,
                              .prefix_sharing = true,
                              .max_context = model.config().MaxContextLength()},
                             &tree.value(), recorder.get(), [](RequestId) {});
  std::vector<std::shared_ptr<sched::RequestStream>> streams;
  uint64_t id = 1;
  for (sched::RequestOptions& o : Requests()) {
    auto stream = std::make_shared<sched::RequestStream>(RequestId(id));
    streams.push_back(stream);
    scheduler.Add({.id = RequestId(id++),
                   .options = std::move(o),
                   .stream = stream,
                   .arrival = sched::Clock::now()});
  }
  while (scheduler.has_work()) {
    const Status s = scheduler.Step(sched::Clock::now());
    EXPECT_OK(s);
    if (!s.ok()) return run;
    scheduler.DeliverFinished();
  }
  for (auto& stream : streams) {
    std::vector<TokenId> tokens;
    sched::StreamEvent e;
    while (stream->Next(&e, 0ns) == sched::RequestStream::NextResult::kEvent) {
      if (e.kind == sched::StreamEvent::Kind::kToken) {
        tokens.push_back(e.token);
      } else {
        EXPECT_EQ(e.finish.reason, FinishReason::kLength) << e.finish.error;
      }
    }
    run.tokens.push_back(tokens);
  }
  run.logits = recorder->logits();
  run.step_tokens = recorder->own_tokens();
  run.prefix_hit_tokens = scheduler.counters().prefix_hit_tokens;
  return run;
}

inline forward::RunnerOptions RunnerOptions() {
  forward::RunnerOptions o;
  o.num_threads = 1;  // ranks share the machine's cores
  o.num_slots = kSlots;
  o.chunk_size = kChunk;
  return o;
}

// max |a - b| over the logits, and the reference's logit scale max(1, max |b|).
inline std::pair<float, float> LogitDiff(const std::vector<float>& a, const std::vector<float>& b) {
  float scale = 1.0f, max_diff = 0.0f;
  for (float x : b) scale = std::max(scale, std::fabs(x));
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    max_diff = std::max(max_diff, std::fabs(a[i] - b[i]));
  }
  return {max_diff, scale};
}

}  // namespace chunkserve::parallel::tp_testing

#endif  // CHUNKSERVE_TESTS_PARALLEL_TP_TESTING_H_
