// The 8-lane fp32 vector the CPU kernels are written against, AVX2 + FMA + F16C version.
//
// Include only from a translation unit that compiles this header, and everything that uses it,
// under `#pragma GCC target("avx2,fma,f16c")` (see attention_avx2.cc), and call into it only after
// a run-time check (cpu_isa.h). simd_scalar.h has the same interface in namespace `scalar`; the
// kernels in attention_impl.h are written once against it and compiled once per ISA.
#ifndef CHUNKSERVE_KERNELS_CPU_SIMD_AVX2_H_
#define CHUNKSERVE_KERNELS_CPU_SIMD_AVX2_H_

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/cpu/exp2_poly.h"

namespace chunkserve::kernels::cpu::avx2 {

#include "kernels/cpu/simd_ymm.h"  // F8 and its operations

using Vec = F8;  // the GEMM's vector (gemm_impl.h)
inline constexpr int kLanes = 8;

}  // namespace chunkserve::kernels::cpu::avx2

#endif  // CHUNKSERVE_KERNELS_CPU_SIMD_AVX2_H_
