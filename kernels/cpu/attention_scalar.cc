// The CPU kernels built for baseline x86-64 (and any other target): the portable fallback.
// The simd header must come before the kernels.
// clang-format off
#define CHUNKSERVE_CPU_ISA scalar
#include "kernels/cpu/simd_scalar.h"
#include "kernels/cpu/attention_impl.h"
#undef CHUNKSERVE_CPU_ISA
// clang-format on
