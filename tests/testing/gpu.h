// GPU test support. GPU tests derive from GpuTest (or call SkipWithoutGpu()) and skip cleanly,
// with a message, on machines without a CUDA device or without a CUDA build.
#ifndef CHUNKSERVE_TESTS_TESTING_GPU_H_
#define CHUNKSERVE_TESTS_TESTING_GPU_H_

#include <gtest/gtest.h>

namespace chunkserve::testing {

// Number of CUDA devices this process can use; 0 without a CUDA build, driver or device.
int CudaDeviceCount();

class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() < 1) GTEST_SKIP() << "no CUDA device on this machine";
  }
};

class MultiGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() < 2) GTEST_SKIP() << "fewer than two CUDA devices on this machine";
  }
};

}  // namespace chunkserve::testing

#endif  // CHUNKSERVE_TESTS_TESTING_GPU_H_
