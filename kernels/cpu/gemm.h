// The GEMM of a Linear layer on the CPU, y (+)= x W^T (+ bias), with W packed once at load time and
// kept in its checkpoint dtype (fp32, fp16 or bf16): half-precision weights are widened to fp32
// in registers as they are read, never into a resident fp32 copy, and every product and sum is
// fp32. x and y are fp32.
//
// Why our own: Debian 12's OpenBLAS (0.3.21) takes the Zen 5 CPUs these servers run on for
// Haswell and runs its AVX2 kernel (about half of what the AVX-512 units do), it has no GEMM with
// half-precision weights and fp32 activations, and its layout cannot be used in place of the packed
// one below. This is one register-tiled kernel, not a BLAS: no K blocking, no packing of x.
//
// Packed layout. W is [n, k] row-major (Hugging Face's Linear weight [out, in]). PackWeights
// stores it as ceil(n / kGemmPanel) panels of kGemmPanel rows of W; panel p holds rows
// [p * kGemmPanel, p * kGemmPanel + kGemmPanel), k-major: element (row p * kGemmPanel + j, col i)
// is at p * kGemmPanel * k + i * kGemmPanel + j. Rows past n are zero. A k-step of the kernel then
// reads kGemmPanel consecutive weights, which it multiplies by one broadcast x element per row of
// its register tile (12 rows x 32 columns with AVX-512, 6 x 16 with AVX2).
//
// ISA: CpuIsa::kAuto takes $CHUNKSERVE_CPU_ISA or the best the CPU has (AVX-512 F/BW/VL/DQ, else
// AVX2 + FMA + F16C, else the portable path); all three give the same results up to the rounding
// of fused vs unfused multiply-add. Threads: the columns are split in whole panels over the pool.
// Nothing is allocated per call. Errors: kInvalidArgument for null pointers or bad shapes,
// kUnsupported for an ISA the CPU lacks; nothing is written then.
#ifndef CHUNKSERVE_KERNELS_CPU_GEMM_H_
#define CHUNKSERVE_KERNELS_CPU_GEMM_H_

#include <cstdint>

#include "kernels/attention_params.h"
#include "kernels/cpu/common.h"
#include "kernels/cpu/thread_pool.h"

namespace chunkserve::kernels::cpu {

inline constexpr int32_t kGemmPanel = 32;

// Elements of W [n, k] packed: ceil(n / kGemmPanel) * kGemmPanel * k (0 for a bad shape).
int64_t PackedWeightElements(int64_t n, int64_t k);

// Packs W [n, k] (`src`, dtype `src_dtype`) into `dst` (PackedWeightElements(n, k) elements of
// `dst_dtype`). dst_dtype is src_dtype, or kF32 (widening); narrowing is refused.
KernelStatus PackWeights(const void* src, DType src_dtype, int64_t n, int64_t k, DType dst_dtype,
                         void* dst);

// Row `row` of a packed W [n, k] widened to fp32: out[0, k). (An embedding lookup in a table
// that is also the LM head.)
KernelStatus UnpackWeightRow(const void* packed, DType dtype, int64_t n, int64_t k, int64_t row,
                             float* out);

struct GemmParams {
  const float* x = nullptr;  // [m, k], row stride ldx
  int64_t ldx = 0;
  const void* w = nullptr;  // PackWeights' output for W [n, k]
  DType w_dtype = DType::kF32;
  const float* bias = nullptr;  // [n] or null
  float* y = nullptr;           // [m, n], row stride ldy
  int64_t ldy = 0;
  int64_t m = 0, n = 0, k = 0;
  bool accumulate = false;  // y += x W^T (+ bias) instead of y = x W^T (+ bias)
  ThreadPool* pool = nullptr;
  int32_t num_threads = 0;  // 0: all of the pool's threads
  CpuIsa isa = CpuIsa::kAuto;
};

KernelStatus Gemm(const GemmParams& params);

}  // namespace chunkserve::kernels::cpu

#endif  // CHUNKSERVE_KERNELS_CPU_GEMM_H_
