// A thin cuBLAS wrapper for the model's linear layers: Y = X W^T (+ beta Y), row-major, with
// X [m, k], W [n, k] (Hugging Face Linear layout: one row per output feature), Y [m, n].
// Inputs fp16 or bf16, output the same dtype or fp32 (logits), fp32 accumulation
// (CUBLAS_COMPUTE_32F), cuBLAS's default algorithm selection (tensor cores on sm_80/sm_90).
//
// Errors: bad shapes / null pointers give cudaErrorInvalidValue before any call; cuBLAS statuses
// map to cudaErrorInvalidValue (invalid value), cudaErrorMemoryAllocation (alloc failed),
// cudaErrorInitializationError (not initialized), cudaErrorNotSupported (arch mismatch / not
// supported) and cudaErrorUnknown (anything else); last_cublas_status() keeps the raw code.
//
// Thread safety: one GemmRunner per stream / thread (it owns a cublasHandle_t).
#ifndef CHUNKSERVE_KERNELS_CUDA_GEMM_H_
#define CHUNKSERVE_KERNELS_CUDA_GEMM_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/attention_params.h"

namespace chunkserve::kernels::cuda {

class GemmRunner {
 public:
  GemmRunner() = default;
  ~GemmRunner();
  GemmRunner(const GemmRunner&) = delete;
  GemmRunner& operator=(const GemmRunner&) = delete;

  // Creates the cuBLAS handle on the current device (idempotent).
  cudaError_t Init();

  // Y = alpha * X W^T + beta * Y on `stream`. `in_dtype` fp16/bf16 for X and W; `out_dtype`
  // in_dtype or kF32.
  cudaError_t Linear(DType in_dtype, DType out_dtype, const void* x, const void* w, void* y,
                     int32_t m, int32_t n, int32_t k, cudaStream_t stream, float alpha = 1.0f,
                     float beta = 0.0f);

  int last_cublas_status() const { return last_status_; }

 private:
  void* handle_ = nullptr;  // cublasHandle_t (kept opaque so this header needs no cuBLAS)
  int last_status_ = 0;
};

}  // namespace chunkserve::kernels::cuda

#endif  // CHUNKSERVE_KERNELS_CUDA_GEMM_H_
