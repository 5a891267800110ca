#include "tests/testing/gpu.h"

#if CHUNKSERVE_HAVE_CUDA
#include "kernels/cuda/device.h"
#endif

namespace chunkserve::testing {

int CudaDeviceCount() {
#if CHUNKSERVE_HAVE_CUDA
  int count = 0;
  if (kernels::cuda::DeviceCount(&count) != cudaSuccess) return 0;
  return count;
#else
  return 0;
#endif
}

}  // namespace chunkserve::testing
