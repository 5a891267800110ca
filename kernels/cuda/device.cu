#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/cuda/device.h"

namespace chunkserve::kernels::cuda {
namespace {

__global__ void FillWordsKernel(uint32_t* __restrict__ out, size_t n, uint32_t pattern) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    out[i] = pattern;
  }
}

__global__ void ReadWordsKernel(const uint4* __restrict__ in, size_t n, uint32_t never,
                                uint32_t* sink) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  uint32_t x = 0;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const uint4 v = in[i];
    x ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (x == never) *sink = x;  // keeps the loads; never taken for the callers' `never`
}

__global__ void CopyKernel(uint4* __restrict__ dst, const uint4* __restrict__ src, size_t n) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    dst[i] = src[i];
  }
}

__global__ void FillRandom16Kernel(uint16_t* out, size_t n, bool bf16, unsigned long long seed) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    // splitmix64 of (seed, i): independent values without state.
    unsigned long long z = seed * 0x9e3779b97f4a7c15ull + i + 1;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    const float f = static_cast<float>(z >> 40) * (2.0f / 16777216.0f) - 1.0f;
    if (bf16) {
      const __nv_bfloat16 b = __float2bfloat16_rn(f);
      out[i] = *reinterpret_cast<const uint16_t*>(&b);
    } else {
      const __half h = __float2half_rn(f);
      out[i] = *reinterpret_cast<const uint16_t*>(&h);
    }
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

cudaError_t ReadWords(const void* scratch, size_t bytes, unsigned never, unsigned* sink,
                      cudaStream_t stream) {
  if (scratch == nullptr || sink == nullptr || bytes % 16 != 0 ||
      (reinterpret_cast<uintptr_t>(scratch) & 15u) != 0) {
    return cudaErrorInvalidValue;
  }
  const size_t n = bytes / 16;
  if (n == 0) return cudaSuccess;
  constexpr int kThreads = 512;
  const size_t blocks_needed = (n + kThreads - 1) / kThreads;
  const int blocks = static_cast<int>(blocks_needed < 2048 ? blocks_needed : 2048);
  ReadWordsKernel<<<blocks, kThreads, 0, stream>>>(static_cast<const uint4*>(scratch), n, never,
                                                   static_cast<uint32_t*>(sink));
  return cudaGetLastError();
}

cudaError_t CopyBytes(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  if (dst == nullptr || src == nullptr || bytes % 16 != 0) return cudaErrorInvalidValue;
  if ((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) & 15u) {
    return cudaErrorInvalidValue;
  }
  const size_t n = bytes / 16;
  if (n == 0) return cudaSuccess;
  int device = 0, sms = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess)
    err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (err != cudaSuccess) return err;
  // A few resident blocks per SM with many 16-byte loads each keeps enough bytes in flight.
  constexpr int kThreads = 512;
  const size_t blocks_needed = (n + kThreads - 1) / kThreads;
  const size_t max_blocks = static_cast<size_t>(sms) * 4;
  const int blocks = static_cast<int>(blocks_needed < max_blocks ? blocks_needed : max_blocks);
  CopyKernel<<<blocks, kThreads, 0, stream>>>(static_cast<uint4*>(dst),
                                              static_cast<const uint4*>(src), n);
  return cudaGetLastError();
}

cudaError_t FillRandom16(void* data, size_t n, bool bf16, unsigned long long seed,
                         cudaStream_t stream) {
  if (data == nullptr) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  const size_t blocks_needed = (n + kThreads - 1) / kThreads;
  const int blocks = static_cast<int>(blocks_needed < 8192 ? blocks_needed : 8192);
  FillRandom16Kernel<<<blocks, kThreads, 0, stream>>>(static_cast<uint16_t*>(data), n, bf16, seed);
  return cudaGetLastError();
}

}  // namespace chunkserve::kernels::cuda
