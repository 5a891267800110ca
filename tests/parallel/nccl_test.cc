// The NCCL communicator (GPU ranks), one rank; skipped without a device (GpuTest): all-reduce
// and broadcast of host and device buffers, barrier, abort; and the tensor-parallel leader
// backend running its steps over NCCL with tp = 1 gives exactly the plain CPU backend's tokens
// and logits. The two-device case is nccl_multigpu_test.cc.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

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

class NcclSingleRankTest : public chunkserve::testing::GpuTest {};

TEST_F(NcclSingleRankTest, CollectivesOnHostAndDeviceBuffers) {
  ASSERT_OK_AND_ASSIGN(std::vector<char> id, NewNcclUniqueId());
  ASSERT_OK_AND_ASSIGN(auto comm,
                       NcclCommunicator::Create(
                           {.rank = 0, .size = 1, .device = 0, .unique_id = id, .timeout = 60s}));
  std::vector<float> host = {1.5f, -2.0f, 3.25f};
  ASSERT_OK(comm->AllReduceSum(host, Deadline::After(60s)));
  EXPECT_EQ(host, (std::vector<float>{1.5f, -2.0f, 3.25f}));  // a sum over one rank

  float* dev = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, 3 * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dev, host.data(), 3 * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_OK(comm->AllReduceSum(std::span<float>(dev, 3), Deadline::After(60s)));
  std::vector<float> back(3);
  ASSERT_EQ(cudaMemcpy(back.data(), dev, 3 * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(dev);
  EXPECT_EQ(back, host);

  std::vector<std::byte> bytes(5000, std::byte{7});
  ASSERT_OK(comm->Broadcast(bytes, 0, Deadline::After(60s)));
  EXPECT_EQ(bytes[4999], std::byte{7});
  ASSERT_OK(comm->Barrier(Deadline::After(60s)));
  comm->Abort(Status::Unavailable("test abort"));
  EXPECT_EQ(comm->Barrier(Deadline::After(60s)).code(), StatusCode::kUnavailable);
}

TEST_F(NcclSingleRankTest, BadUniqueIdIsInvalidArgument) {
  EXPECT_EQ(NcclCommunicator::Create(
                {.rank = 0, .size = 1, .device = 0, .unique_id = {1, 2}, .timeout = 1s})
                .status()
                .code(),
            StatusCode::kInvalidArgument);
}

TEST_F(NcclSingleRankTest, LeaderBackendOverNcclMatchesThePlainBackend) {
  chunkserve::testing::TempDir dir;
  model::TinyModelOptions t;
  t.num_kv_heads = 4;
  ASSERT_OK(model::WriteTinyModel(dir.path(), t));
  ASSERT_OK_AND_ASSIGN(model::LoadedModel m, model::LoadedModel::Load(dir.path()));
  ASSERT_OK_AND_ASSIGN(auto plain, backend::CpuBackend::Create(m, tp_testing::BackendOptions()));
  const tp_testing::RunResult reference = tp_testing::RunAll(m, std::move(plain));

  ASSERT_OK_AND_ASSIGN(std::vector<char> id, NewNcclUniqueId());
  ASSERT_OK_AND_ASSIGN(auto comm,
                       NcclCommunicator::Create(
                           {.rank = 0, .size = 1, .device = 0, .unique_id = id, .timeout = 60s}));
  ASSERT_OK_AND_ASSIGN(auto leader, TpLeaderBackend::Create(m, tp_testing::BackendOptions(),
                                                            comm.get(), TpOptions{}));
  const tp_testing::RunResult nccl = tp_testing::RunAll(m, std::move(leader));
  EXPECT_EQ(nccl.tokens, reference.tokens);
  EXPECT_EQ(nccl.logits, reference.logits);  // one rank: the same arithmetic, bit for bit
}

}  // namespace
}  // namespace chunkserve::parallel
