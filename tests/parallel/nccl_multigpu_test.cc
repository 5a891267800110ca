// NCCL tensor parallelism with tp = 2 on the CUDA backend, one rank per device, the ranks as
// threads of this process; skipped with fewer than two devices (MultiGpuTest). The group follows
// the one-rank run's steps (its tokens are forced, so a near-tie decided differently by fp16
// rounding cannot fork the runs) and every logit is within 1e-2 of the one-rank logit scale
// (fp32 all-reduce in another order, then fp16 activations: a few 16-bit ulps); the group's own
// greedy choice equals the one-rank choice wherever the one-rank top-2 margin exceeds 2e-2.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <thread>
#include <vector>

#include "runtime/model/model.h"
#include "runtime/model/tiny_model.h"
#include "runtime/parallel/nccl_communicator.h"
#include "runtime/parallel/tp_runner.h"
#include "tests/parallel/tp_testing.h"
#include "tests/testing/gpu.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace chunkserve::parallel {
namespace {

using namespace std::chrono_literals;

class NcclTwoRankTest : public chunkserve::testing::MultiGpuTest {};

TEST_F(NcclTwoRankTest, TensorParallelTwoDevicesMatchOneRank) {
  chunkserve::testing::TempDir dir;
  model::TinyModelOptions t;
  t.num_kv_heads = 4;
  ASSERT_OK(model::WriteTinyModel(dir.path(), t));
  ASSERT_OK_AND_ASSIGN(model::LoadedModel m, model::LoadedModel::Load(dir.path()));
  forward::RunnerOptions cuda = tp_testing::RunnerOptions();
  cuda.backend = forward::BackendKind::kCuda;
  cuda.kv_dtype = kernels::DType::kF16;
  ASSERT_OK_AND_ASSIGN(auto plain, forward::CreateLlamaModel(m, cuda));
  const tp_testing::RunResult reference = tp_testing::RunAll(m, std::move(plain));

  ASSERT_OK_AND_ASSIGN(std::vector<char> id, NewNcclUniqueId());
  std::unique_ptr<NcclCommunicator> comms[2];
  Status created[2];
  {
    std::vector<std::thread> threads;  // ncclCommInitRank is collective: both at once
    for (int32_t r = 0; r < 2; ++r) {
      threads.emplace_back([&, r] {
        Result<std::unique_ptr<NcclCommunicator>> c = NcclCommunicator::Create(
            {.rank = r, .size = 2, .device = r, .unique_id = id, .timeout = 60s});
        created[r] = c.status();
        if (c.ok()) comms[r] = std::move(c).value();
      });
    }
    for (auto& th : threads) th.join();
  }
  ASSERT_OK(created[0]);
  ASSERT_OK(created[1]);
  Status follower;
  std::thread rank1([&] { follower = RunTpFollower(comms[1].get(), 120s); });
  tp_testing::RunResult tp;
  {
    Result<std::unique_ptr<TpLeaderRunner>> leader =
        TpLeaderRunner::Create(m, cuda, comms[0].get(), TpOptions{});
    EXPECT_OK(leader.status());
    if (leader.ok())
      tp = tp_testing::RunAll(m, std::move(leader).value(), 48, &reference.step_tokens);
    if (!leader.ok()) comms[0]->Abort(leader.status());
  }  // the leader's destructor sends shutdown
  rank1.join();
  EXPECT_OK(follower);
  EXPECT_EQ(tp.tokens, reference.tokens);  // forced: the same steps
  ASSERT_EQ(tp.logits.size(), reference.logits.size());
  const auto [max_diff, scale] = tp_testing::LogitDiff(tp.logits, reference.logits);
  std::printf("tp=2 on two GPUs: %zu logits, max |diff| %.3g, logit scale %.3g\n", tp.logits.size(),
              max_diff, scale);
  EXPECT_LE(max_diff, 1e-2f * scale);
  const size_t vocab = static_cast<size_t>(m.config().vocab_size);
  ASSERT_EQ(tp.step_tokens.size(), reference.step_tokens.size());
  for (size_t r = 0; r < reference.step_tokens.size(); ++r) {
    std::vector<float> row(reference.logits.begin() + r * vocab,
                           reference.logits.begin() + (r + 1) * vocab);
    std::partial_sort(row.begin(), row.begin() + 2, row.end(), std::greater<float>());
    if (row[0] - row[1] > 2e-2f * scale) {
      EXPECT_EQ(tp.step_tokens[r], reference.step_tokens[r]) << "sampled row " << r;
    }
  }
}

}  // namespace
}  // namespace chunkserve::parallel
