// GPU smoke tests for the CUDA build itself: a device is found and a kernel of ours runs.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <vector>

#include "kernels/cuda/device.h"
#include "tests/testing/gpu.h"

namespace chunkserve::kernels::cuda {
namespace {

using CudaDeviceTest = ::chunkserve::testing::GpuTest;

TEST(CudaDeviceCountTest, NullPointerIsAnError) {
  EXPECT_EQ(DeviceCount(nullptr), cudaErrorInvalidValue);
}

TEST_F(CudaDeviceTest, FillWordsWritesEveryWordAndNothingPast) {
  constexpr size_t kWords = (1 << 20) + 3;  // not a multiple of the block size
  uint32_t* buf = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&buf), (kWords + 1) * 4), cudaSuccess);
  ASSERT_EQ(cudaMemset(buf, 0, (kWords + 1) * 4), cudaSuccess);
  ASSERT_EQ(FillWords(buf, kWords * 4, 0xdeadbeefu, nullptr), cudaSuccess);
  std::vector<uint32_t> host(kWords + 1);
  ASSERT_EQ(cudaMemcpy(host.data(), buf, host.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(buf);
  for (size_t i = 0; i < kWords; ++i) ASSERT_EQ(host[i], 0xdeadbeefu) << "word " << i;
  EXPECT_EQ(host[kWords], 0u);
}

TEST_F(CudaDeviceTest, FillWordsRejectsUnalignedSize) {
  void* buf = nullptr;
  ASSERT_EQ(cudaMalloc(&buf, 16), cudaSuccess);
  EXPECT_EQ(FillWords(buf, 7, 1, nullptr), cudaErrorInvalidValue);
  cudaFree(buf);
}

}  // namespace
}  // namespace chunkserve::kernels::cuda
