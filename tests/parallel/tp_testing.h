// Shared by the tensor-parallel tests: a backend wrapper that records every step's logits, a
// request set with a shared system prompt, and a scheduler run whose batches depend only on the
// requests and the sampled tokens (every request is added before the first step; steps are run
// by hand), so two backends that sample the same tokens run exactly the same steps.
#ifndef CHUNKSERVE_TESTS_PARALLEL_TP_TESTING_H_
#define CHUNKSERVE_TESTS_PARALLEL_TP_TESTING_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "runtime/backend/cpu_backend.h"
#include "runtime/kvcache/prefix_tree.h"
#include "runtime/model/model.h"
#include "runtime/sched/scheduler.h"
#include "tests/testing/status_matchers.h"

namespace chunkserve::parallel::tp_testing {

using namespace std::chrono_literals;

constexpr int32_t kChunk = 16;
constexpr int32_t kSlots = 256;

// Records the logits of every step, in order.
class RecordingBackend final : public backend::Backend {
 public:
  explicit RecordingBackend(std::unique_ptr<backend::Backend> inner) : inner_(std::move(inner)) {}
  std::string name() const override { return inner_->name(); }
  const backend::KvArenaShape& kv_shape() const override { return inner_->kv_shape(); }
  int32_t vocab_size() const override { return inner_->vocab_size(); }
  Status Forward(const backend::StepBatch& b, std::span<float> logits) override {
    CHUNKSERVE_RETURN_IF_ERROR(inner_->Forward(b, logits));
    const size_t n = b.logit_rows.size() * static_cast<size_t>(vocab_size());
    logits_.insert(logits_.end(), logits.begin(), logits.begin() + static_cast<ptrdiff_t>(n));
    return Status::Ok();
  }
  const std::vector<float>& logits() const { return logits_; }

 private:
  std::unique_ptr<backend::Backend> inner_;
  std::vector<float> logits_;
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
  std::vector<std::vector<TokenId>> tokens;
  std::vector<float> logits;
  uint64_t prefix_hit_tokens = 0;
};

// Every request added before the first step, steps run by hand: the batches depend only on the
// requests and the sampled tokens, so two runs that sample the same tokens run the same steps.
// token_budget 48 spreads prefills over several steps; 0 puts every prompt in the first step
// (a descriptor larger than one 4 KiB broadcast frame).
inline RunResult RunAll(const model::LoadedModel& model, std::unique_ptr<backend::Backend> backend,
                        int32_t token_budget = 48) {
  RunResult run;
  auto recorder = std::make_unique<RecordingBackend>(std::move(backend));
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
  run.prefix_hit_tokens = scheduler.counters().prefix_hit_tokens;
  return run;
}

inline backend::CpuBackendOptions BackendOptions() {
  backend::CpuBackendOptions o;
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
