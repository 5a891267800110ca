// Tensor parallelism end to end on CPU ranks: rank 0 in this process (scheduler, prefix tree,
// sampling), ranks 1..T-1 as real chunkserve-worker rank processes joined over Gloo on
// 127.0.0.1. With prefix sharing on and several requests sharing a system prompt, tp = 2 and
// tp = 4 must give the greedy tokens of tp = 1 exactly, and every sampled logit within
//   |logit_tp - logit_1| <= 1e-4 * max(1, max |logit_1|)
// (the all-reduce sums partial products in another order than one rank's GEMM: fp32 rounding
// of a few ulps per layer, nowhere near a change of argmax for this model).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "runtime/engine/engine.h"
#include "runtime/forward/llama.h"
#include "runtime/kvcache/prefix_tree.h"
#include "runtime/model/model.h"
#include "runtime/model/tiny_model.h"
#include "runtime/sched/scheduler.h"
#include "tests/parallel/tp_testing.h"
#include "tests/testing/engine_fixture.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"
#include "worker/tp_group.h"

namespace chunkserve::parallel {
namespace {

using namespace std::chrono_literals;

using tp_testing::kChunk;
using tp_testing::Requests;
using tp_testing::RunAll;
using tp_testing::RunnerOptions;
using tp_testing::RunResult;

worker::TpGroupOptions GroupOptions(int32_t size) {
  worker::TpGroupOptions o;
  o.size = size;
  o.rank_binary = CHUNKSERVE_WORKER_BIN;
  o.timeout = 60s;  // a loaded CI machine: never near it unless something is broken
  return o;
}

class TpEngineTest : public ::testing::TestWithParam<int32_t> {
 protected:
  void SetUp() override {
    model::TinyModelOptions t;
    t.num_kv_heads = 4;  // 8 query / 4 KV heads: splits over 1, 2 and 4 ranks
    ASSERT_OK(model::WriteTinyModel(dir_.path(), t));
    ASSERT_OK_AND_ASSIGN(model::LoadedModel m, model::LoadedModel::Load(dir_.path()));
    model_ = std::make_unique<model::LoadedModel>(std::move(m));
  }
  testing::TempDir dir_;
  std::unique_ptr<model::LoadedModel> model_;
};

TEST_P(TpEngineTest, GreedyTokensAndLogitsMatchOneRankWithSharedPrefixes) {
  ASSERT_OK_AND_ASSIGN(auto single, forward::CreateLlamaModel(*model_, RunnerOptions()));
  const RunResult reference = RunAll(*model_, std::move(single));
  ASSERT_FALSE(HasFailure());
  ASSERT_GT(reference.prefix_hit_tokens, 0u);  // the shared prompt really was shared

  ASSERT_OK_AND_ASSIGN(auto group, worker::TpGroup::Start(GroupOptions(GetParam())));
  ASSERT_OK_AND_ASSIGN(auto tp_runner, group->RunnerFactory()(*model_, RunnerOptions()));
  EXPECT_EQ(tp_runner->kv_shape().num_kv_heads, 4 / GetParam());  // this rank's heads only
  const RunResult tp = RunAll(*model_, std::move(tp_runner));
  ASSERT_FALSE(HasFailure());

  EXPECT_EQ(tp.tokens, reference.tokens);
  EXPECT_EQ(tp.prefix_hit_tokens, reference.prefix_hit_tokens);
  ASSERT_EQ(tp.logits.size(), reference.logits.size());
  const auto [max_diff, scale] = tp_testing::LogitDiff(tp.logits, reference.logits);
  std::printf("tp=%d: %zu logits, max |diff| %.3g, logit scale %.3g\n", GetParam(),
              tp.logits.size(), max_diff, scale);
  EXPECT_LE(max_diff, 1e-4f * scale);
}

TEST_P(TpEngineTest, OneStepPrefillOfEveryPromptMatchesOneRank) {
  // Every prompt in the first step: its descriptor (about 300 tokens) needs a second broadcast.
  ASSERT_OK_AND_ASSIGN(auto single, forward::CreateLlamaModel(*model_, RunnerOptions()));
  const RunResult reference = RunAll(*model_, std::move(single), 0);
  ASSERT_FALSE(HasFailure());
  ASSERT_OK_AND_ASSIGN(auto group, worker::TpGroup::Start(GroupOptions(GetParam())));
  ASSERT_OK_AND_ASSIGN(auto tp_runner, group->RunnerFactory()(*model_, RunnerOptions()));
  const RunResult tp = RunAll(*model_, std::move(tp_runner), 0);
  ASSERT_FALSE(HasFailure());
  EXPECT_EQ(tp.tokens, reference.tokens);
  ASSERT_EQ(tp.logits.size(), reference.logits.size());
  const auto [max_diff, scale] = tp_testing::LogitDiff(tp.logits, reference.logits);
  EXPECT_LE(max_diff, 1e-4f * scale);
}

TEST_P(TpEngineTest, EngineServesConcurrentRequestsLikeOneRank) {
  auto run = [&](engine::RunnerFactory factory) {
    engine::EngineOptions o;
    o.model_dir = dir_.path().string();
    o.num_threads = 1;
    o.chunk_size = kChunk;
    o.kv_cache_bytes = 16u << 20;
    o.runner_factory = std::move(factory);
    std::vector<std::vector<TokenId>> out;
    Result<std::unique_ptr<engine::Engine>> e = engine::Engine::Create(o);
    EXPECT_OK(e.status());
    if (!e.ok()) return out;
    std::vector<std::shared_ptr<sched::RequestStream>> streams;
    for (sched::RequestOptions& r : Requests()) {
      Result<std::shared_ptr<sched::RequestStream>> s = e.value()->Submit(std::move(r));
      EXPECT_OK(s.status());
      if (s.ok()) streams.push_back(s.value());
    }
    for (auto& s : streams) {
      testing::StreamOutcome o = testing::Drain(*s, 300s);
      EXPECT_EQ(o.finish.reason, FinishReason::kLength) << o.finish.error;
      out.push_back(std::move(o.tokens));
    }
    return out;
  };
  const auto reference = run(nullptr);
  ASSERT_OK_AND_ASSIGN(auto group, worker::TpGroup::Start(GroupOptions(GetParam())));
  EXPECT_EQ(run(group->RunnerFactory()), reference);
}

INSTANTIATE_TEST_SUITE_P(Ranks, TpEngineTest, ::testing::Values(2, 4),
                         [](const auto& info) { return "tp" + std::to_string(info.param); });

// Model variants: biases (q/k/v sliced with their heads; the o bias added once, by rank 0, into
// the all-reduce), bf16 weights (column slices of bf16 tensors), tied embeddings (rank 0's LM
// head is the embedding), and biases with tied embeddings over four ranks.
struct Variant {
  const char* name;
  bool bias;
  model::DType dtype;
  bool tied;
  int32_t ranks;
};

class TpVariantTest : public ::testing::TestWithParam<Variant> {};

TEST_P(TpVariantTest, MatchesOneRank) {
  testing::TempDir dir;
  model::TinyModelOptions t;
  t.num_kv_heads = 4;
  t.attention_bias = GetParam().bias;
  t.dtype = GetParam().dtype;
  t.tie_word_embeddings = GetParam().tied;
  ASSERT_OK(model::WriteTinyModel(dir.path(), t));
  ASSERT_OK_AND_ASSIGN(model::LoadedModel m, model::LoadedModel::Load(dir.path()));
  ASSERT_OK_AND_ASSIGN(auto single, forward::CreateLlamaModel(m, RunnerOptions()));
  const RunResult reference = RunAll(m, std::move(single));
  ASSERT_FALSE(HasFailure());
  ASSERT_OK_AND_ASSIGN(auto group, worker::TpGroup::Start(GroupOptions(GetParam().ranks)));
  ASSERT_OK_AND_ASSIGN(auto tp_runner, group->RunnerFactory()(m, RunnerOptions()));
  const RunResult tp = RunAll(m, std::move(tp_runner));
  ASSERT_FALSE(HasFailure());
  EXPECT_EQ(tp.tokens, reference.tokens);
  ASSERT_EQ(tp.logits.size(), reference.logits.size());
  const auto [max_diff, scale] = tp_testing::LogitDiff(tp.logits, reference.logits);
  EXPECT_LE(max_diff, 1e-4f * scale);
}

INSTANTIATE_TEST_SUITE_P(Models, TpVariantTest,
                         ::testing::Values(Variant{"bias", true, model::DType::kF32, false, 2},
                                           Variant{"bf16", false, model::DType::kBF16, false, 2},
                                           Variant{"tied", false, model::DType::kF32, true, 2},
                                           Variant{"bias_tied_tp4", true, model::DType::kF32, true,
                                                   4}),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(TpGroupTest, ModelThatDoesNotSplitIsAClearErrorOnEveryRank) {
  testing::TempDir dir;
  ASSERT_OK(model::WriteTinyModel(dir.path(), model::TinyModelOptions::Default()));  // 2 KV heads
  ASSERT_OK_AND_ASSIGN(model::LoadedModel m, model::LoadedModel::Load(dir.path()));
  ASSERT_OK_AND_ASSIGN(auto group, worker::TpGroup::Start(GroupOptions(4)));
  const Result<std::unique_ptr<forward::StepRunner>> b = group->RunnerFactory()(m, RunnerOptions());
  EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(b.status().message()).find("num_key_value_heads = 2"), std::string::npos)
      << b.status();
}

TEST(TpGroupTest, IdleGroupStaysHealthyAndAHungRankIsFoundByTheHeartbeat) {
  testing::TempDir dir;
  model::TinyModelOptions t;
  t.num_kv_heads = 4;
  ASSERT_OK(model::WriteTinyModel(dir.path(), t));
  ASSERT_OK_AND_ASSIGN(model::LoadedModel m, model::LoadedModel::Load(dir.path()));
  worker::TpGroupOptions o = GroupOptions(2);
  o.heartbeat = 50ms;
  o.timeout = 2s;
  ASSERT_OK_AND_ASSIGN(auto group, worker::TpGroup::Start(o));
  std::mutex mu;
  std::condition_variable cv;
  Status failure;
  group->SetFailureCallback([&](const Status& s) {
    std::lock_guard<std::mutex> lock(mu);
    failure = s;
    cv.notify_all();
  });
  ASSERT_OK_AND_ASSIGN(auto b, group->RunnerFactory()(m, RunnerOptions()));
  // Idle for many heartbeats (and longer than the follower's idle limit without them): healthy.
  std::this_thread::sleep_for(3s);
  {
    std::lock_guard<std::mutex> lock(mu);
    ASSERT_OK(failure);
  }
  const std::vector<forward::KvCopyOp> copies = {{0, 1, 1}};
  forward::StepBatch batch;
  batch.kv_copies = copies;
  ASSERT_OK(b->Forward(batch, {}));
  // A stopped rank, with no traffic from the engine: the heartbeat notices within its deadline.
  ASSERT_EQ(::kill(group->rank_pids()[0], SIGSTOP), 0);
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, 60s, [&] { return !failure.ok(); }));
  }
  EXPECT_EQ(failure.code(), StatusCode::kUnavailable);
  EXPECT_NE(std::string(failure.message()).find("heartbeat"), std::string::npos) << failure;
  ::kill(group->rank_pids()[0], SIGKILL);
}

TEST(TpGroupTest, KilledRankFailsTheNextStepAndTheCallbackRuns) {
  testing::TempDir dir;
  model::TinyModelOptions t;
  t.num_kv_heads = 4;
  ASSERT_OK(model::WriteTinyModel(dir.path(), t));
  ASSERT_OK_AND_ASSIGN(model::LoadedModel m, model::LoadedModel::Load(dir.path()));
  ASSERT_OK_AND_ASSIGN(auto group, worker::TpGroup::Start(GroupOptions(2)));
  std::mutex mu;
  std::condition_variable cv;
  Status failure;
  group->SetFailureCallback([&](const Status& s) {
    std::lock_guard<std::mutex> lock(mu);
    failure = s;
    cv.notify_all();
  });
  ASSERT_OK_AND_ASSIGN(auto b, group->RunnerFactory()(m, RunnerOptions()));
  ASSERT_EQ(group->rank_pids().size(), 1u);
  ::kill(group->rank_pids()[0], SIGKILL);
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, 30s, [&] { return !failure.ok(); }));
  }
  EXPECT_EQ(failure.code(), StatusCode::kUnavailable);
  EXPECT_NE(std::string(failure.message()).find("rank 1"), std::string::npos) << failure;
  EXPECT_NE(std::string(failure.message()).find("signal 9"), std::string::npos) << failure;
  // Any later step fails at once with the same cause.
  const std::vector<forward::KvCopyOp> copies = {{0, 1, 1}};
  forward::StepBatch batch;
  batch.kv_copies = copies;
  const Status s = b->Forward(batch, {});
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_NE(std::string(s.message()).find("rank 1"), std::string::npos) << s;
}

}  // namespace
}  // namespace chunkserve::parallel
