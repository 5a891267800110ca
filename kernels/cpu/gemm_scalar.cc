// The GEMM built for baseline x86-64 (and any other target): the portable fallback.
// clang-format off
#include "kernels/cpu/isa_kernels.h"
#define CHUNKSERVE_CPU_ISA scalar
#include "kernels/cpu/simd_scalar.h"
#include "kernels/cpu/gemm_impl.h"
#undef CHUNKSERVE_CPU_ISA
// clang-format on
