// NCCL tensor parallelism with tp = 2, one rank per device, the ranks as threads of this
// process; skipped with fewer than two devices (MultiGpuTest). Greedy tokens equal tp = 1 and
// logits are within 1e-4 of the logit scale, as in the Gloo tests.
#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "runtime/model/model.h"
#include "runtime/model/tiny_model.h"
#include "runtime/parallel/nccl_communicator.h"
#include "runtime/parallel/tp_backend.h"
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
  ASSERT_OK_AND_ASSIGN(auto plain, backend::CpuBackend::Create(m, tp_testing::BackendOptions()));
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
    Result<std::unique_ptr<TpLeaderBackend>> leader =
        TpLeaderBackend::Create(m, tp_testing::BackendOptions(), comms[0].get(), TpOptions{});
    EXPECT_OK(leader.status());
    if (leader.ok()) tp = tp_testing::RunAll(m, std::move(leader).value());
    if (!leader.ok()) comms[0]->Abort(leader.status());
  }  // the leader's destructor sends shutdown
  rank1.join();
  EXPECT_OK(follower);
  EXPECT_EQ(tp.tokens, reference.tokens);
  ASSERT_EQ(tp.logits.size(), reference.logits.size());
  const auto [max_diff, scale] = tp_testing::LogitDiff(tp.logits, reference.logits);
  EXPECT_LE(max_diff, 1e-4f * scale);
}

}  // namespace
}  // namespace chunkserve::parallel
