#include "kernels/cuda/gemm.h"

#include <cublas_v2.h>

namespace chunkserve::kernels::cuda {
namespace {

cudaError_t FromCublas(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS:
      return cudaSuccess;
    case CUBLAS_STATUS_INVALID_VALUE:
      return cudaErrorInvalidValue;
    case CUBLAS_STATUS_ALLOC_FAILED:
      return cudaErrorMemoryAllocation;
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return cudaErrorInitializationError;
    case CUBLAS_STATUS_ARCH_MISMATCH:
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return cudaErrorNotSupported;
    default:
      return cudaErrorUnknown;
  }
}

bool ToCuda(DType t, cudaDataType_t* out) {
  switch (t) {
    case DType::kF16:
      *out = CUDA_R_16F;
      return true;
    case DType::kBF16:
      *out = CUDA_R_16BF;
      return true;
    case DType::kF32:
      *out = CUDA_R_32F;
      return true;
  }
  return false;
}

}  // namespace

GemmRunner::~GemmRunner() {
  if (handle_ != nullptr) cublasDestroy(static_cast<cublasHandle_t>(handle_));
}

cudaError_t GemmRunner::Init() {
  if (handle_ != nullptr) return cudaSuccess;
  cublasHandle_t h = nullptr;
  const cublasStatus_t s = cublasCreate(&h);
  last_status_ = static_cast<int>(s);
  if (s != CUBLAS_STATUS_SUCCESS) return FromCublas(s);
  handle_ = h;
  return cudaSuccess;
}

cudaError_t GemmRunner::Linear(DType in_dtype, DType out_dtype, const void* x, const void* w,
                               void* y, int32_t m, int32_t n, int32_t k, cudaStream_t stream,
                               float alpha, float beta) {
  if (in_dtype == DType::kF32 || (out_dtype != in_dtype && out_dtype != DType::kF32)) {
    return cudaErrorInvalidValue;
  }
  if (m < 0 || n < 0 || k < 0) return cudaErrorInvalidValue;
  if (m == 0 || n == 0) return cudaSuccess;
  if (x == nullptr || w == nullptr || y == nullptr) return cudaErrorInvalidValue;
  if (const cudaError_t err = Init(); err != cudaSuccess) return err;
  cudaDataType_t in_t, out_t;
  if (!ToCuda(in_dtype, &in_t) || !ToCuda(out_dtype, &out_t)) return cudaErrorInvalidValue;
  cublasHandle_t h = static_cast<cublasHandle_t>(handle_);
  cublasStatus_t s = cublasSetStream(h, stream);
  if (s == CUBLAS_STATUS_SUCCESS) {
    // Row-major Y[m, n] is column-major Y^T [n, m] (ld n) = W X^T: the row-major W [n, k] is a
    // column-major [k, n] matrix (ld k), transposed; the row-major X [m, k] is a column-major
    // [k, m] matrix (ld k), used as is.
    s = cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha, w, in_t, k, x, in_t, k, &beta, y,
                     out_t, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  }
  last_status_ = static_cast<int>(s);
  return FromCublas(s);
}

}  // namespace chunkserve::kernels::cuda
