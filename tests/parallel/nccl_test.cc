// The NCCL communicator (GPU ranks), one rank; skipped without a device (GpuTest): all-reduce
// and broadcast of host and device buffers, the all-reduce of device memory on a caller's stream,
// barrier, abort; and the tensor-parallel leader on the CUDA backend, whose all-reduces run
// through NCCL on the backend's stream, with tp = 1 gives exactly the one-rank model's tokens and
// logits. The two-device case is nccl_multigpu_test.cc.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

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

  // Device memory on a caller's stream (the CUDA backend's path): ordered after the stream's work.
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  float* dev2 = nullptr;
  ASSERT_EQ(cudaMalloc(&dev2, 3 * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(dev2, host.data(), 3 * sizeof(float), cudaMemcpyHostToDevice, stream),
            cudaSuccess);
  ASSERT_OK(comm->AllReduceSumOnStream(std::span<float>(dev2, 3), stream, Deadline::After(60s)));
  std::vector<float> back2(3);
  ASSERT_EQ(cudaMemcpy(back2.data(), dev2, 3 * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(dev2);
  cudaStreamDestroy(stream);
  EXPECT_EQ(back2, host);

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

TEST_F(NcclSingleRankTest, LeaderOnTheCudaBackendOverNcclMatchesOneRank) {
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
  ASSERT_OK_AND_ASSIGN(auto comm,
                       NcclCommunicator::Create(
                           {.rank = 0, .size = 1, .device = 0, .unique_id = id, .timeout = 60s}));
  ASSERT_OK_AND_ASSIGN(auto leader, TpLeaderRunner::Create(m, cuda, comm.get(), TpOptions{}));
  EXPECT_EQ(leader->name(), "cuda-tp1");
  const tp_testing::RunResult nccl = tp_testing::RunAll(m, std::move(leader));
  EXPECT_EQ(nccl.tokens, reference.tokens);
  EXPECT_EQ(nccl.logits, reference.logits);  // one rank: the same arithmetic, bit for bit
}

}  // namespace
}  // namespace chunkserve::parallel
