// RunWorkload (runtime/engine/workload_runner.h) against a real engine on the tiny model: every
// request is submitted at its arrival time and recorded from its stream's events, and the report
// adds up (tokens, finish reasons, latencies, outputs in workload order).
#include "runtime/engine/workload_runner.h"

#include <gtest/gtest.h>

#include <vector>

#include "runtime/engine/engine.h"
#include "runtime/workload/workload.h"
#include "tests/testing/engine_fixture.h"
#include "tests/testing/status_matchers.h"

namespace chunkserve::engine {
namespace {

class WorkloadRunnerTest : public testing::TinyModelEngineTest {};

TEST_F(WorkloadRunnerTest, RecordsEveryRequestOfASharedPrefixWorkload) {
  ASSERT_OK_AND_ASSIGN(auto engine, Engine::Create(Options()));
  workload::WorkloadOptions w = workload::ForSharedPrefix(/*n_p=*/48, /*n_s=*/32, /*n_c=*/6);
  w.num_requests = 9;
  w.arrival_rate = 50.0;
  w.vocab_size = engine->vocab_size();
  ASSERT_OK_AND_ASSIGN(std::vector<workload::WorkloadRequest> requests,
                       workload::GenerateWorkload(w));
  ASSERT_EQ(requests.size(), 9u);
  ASSERT_OK_AND_ASSIGN(WorkloadReport r, RunWorkload(*engine, requests));
  engine->Shutdown(ShutdownMode::kDrain);

  EXPECT_EQ(r.requests, 9);
  EXPECT_EQ(r.failed, 0);
  ASSERT_EQ(r.outputs.size(), 9u);
  uint64_t generated = 0, prompt = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    // Length-limited unless the model sampled its stop token first.
    EXPECT_GE(r.outputs[i].size(), 1u) << "request " << i;
    EXPECT_LE(r.outputs[i].size(), static_cast<size_t>(requests[i].output_tokens));
    generated += r.outputs[i].size();
    prompt += requests[i].prompt.size();
  }
  EXPECT_EQ(r.generated_tokens, generated);
  EXPECT_EQ(r.prompt_tokens, prompt);
  EXPECT_GT(r.wall_s, 0.0);
  EXPECT_NEAR(r.generated_tokens_per_s, static_cast<double>(generated) / r.wall_s, 1e-6);
  EXPECT_GT(r.ttft_ms.p50, 0.0);
  EXPECT_LE(r.ttft_ms.p50, r.e2e_ms.max);
  EXPECT_GT(r.prefix_hit_rate, 0.0);  // 32 of every 48 prompt tokens are shared
  EXPECT_GT(r.kv_bytes_peak, 0u);
}

}  // namespace
}  // namespace chunkserve::engine
