#include "kernels/cuda/device.h"

#include <cstdint>

namespace chunkserve::kernels::cuda {
namespace {

__global__ void FillWordsKernel(uint32_t* __restrict__ out, size_t n, uint32_t pattern) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    out[i] = pattern;
  }
}

}  // namespace

cudaError_t DeviceCount(int* count) {
  if (count == nullptr) return cudaErrorInvalidValue;
  *count = 0;
  const cudaError_t err = cudaGetDeviceCount(count);
  if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver) {
    *count = 0;
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return cudaSuccess;
  }
  return err;
}

cudaError_t FillWords(void* scratch, size_t bytes, unsigned pattern, cudaStream_t stream) {
  if (scratch == nullptr || bytes % 4 != 0) return cudaErrorInvalidValue;
  const size_t n = bytes / 4;
  if (n == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  const size_t blocks_needed = (n + kThreads - 1) / kThreads;
  const int blocks = static_cast<int>(blocks_needed < 4096 ? blocks_needed : 4096);
  FillWordsKernel<<<blocks, kThreads, 0, stream>>>(static_cast<uint32_t*>(scratch), n, pattern);
  return cudaGetLastError();
}

}  // namespace chunkserve::kernels::cuda
