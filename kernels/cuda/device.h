// Host-side device helpers for the CUDA backend, its tests and its benchmarks.
//
// Every function returns cudaError_t and never aborts or prints; callers turn codes into Status
// at the backend boundary. Safe to call on a machine without a GPU or driver: DeviceCount reports
// zero devices there.
#ifndef CHUNKSERVE_KERNELS_CUDA_DEVICE_H_
#define CHUNKSERVE_KERNELS_CUDA_DEVICE_H_

#include <cuda_runtime_api.h>

#include <cstddef>

namespace chunkserve::kernels::cuda {

// Number of usable CUDA devices. Writes 0 and returns cudaSuccess when the machine has no device
// or no driver (cudaErrorNoDevice / cudaErrorInsufficientDriver), so "no GPU" is not an error.
cudaError_t DeviceCount(int* count);

// Overwrites `bytes` bytes of `scratch` (device memory) with `pattern` repeated as 32-bit words,
// on `stream`. With `bytes` larger than the L2 cache this evicts everything a previous iteration
// left there, which is how benchmarks report cold-cache numbers. `bytes` must be a multiple of 4.
cudaError_t FillWords(void* scratch, size_t bytes, unsigned pattern, cudaStream_t stream);

// Reads `bytes` bytes of `scratch` (a multiple of 16, 16-byte aligned) and writes nothing but,
// should the words' XOR equal `never` (callers pass a value that cannot occur), one word to
// `sink`. With `bytes` larger than the L2 cache this evicts a previous iteration's data and
// leaves L2 holding clean lines: a cold cache without the write-back of dirty lines that a
// FillWords flush would leave for the timed kernel to pay.
cudaError_t ReadWords(const void* scratch, size_t bytes, unsigned never, unsigned* sink,
                      cudaStream_t stream);

// Copies `bytes` bytes (a multiple of 16; both pointers 16-byte aligned, not overlapping) with a
// grid-stride kernel of 16-byte loads and stores: what benchmarks time to measure the device's
// achievable bandwidth (bytes read + bytes written, divided by the time).
cudaError_t CopyBytes(void* dst, const void* src, size_t bytes, cudaStream_t stream);

// Fills n 16-bit values (fp16 if !bf16, else bf16) with pseudo-random values uniform in [-1, 1)
// derived from (seed, index): benchmark data that is neither zeros nor a constant.
cudaError_t FillRandom16(void* data, size_t n, bool bf16, unsigned long long seed,
                         cudaStream_t stream);

}  // namespace chunkserve::kernels::cuda

#endif  // CHUNKSERVE_KERNELS_CUDA_DEVICE_H_
