// The GEMM built for AVX2 + FMA + F16C; see attention_avx2.cc for why the pragma comes after the
// standard and project headers. Entered only after cpu_isa.h's check.
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <utility>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/isa_kernels.h"

// clang-format off
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

#define CHUNKSERVE_CPU_ISA avx2
#include "kernels/cpu/simd_avx2.h"
#include "kernels/cpu/gemm_impl.h"
#undef CHUNKSERVE_CPU_ISA

#pragma GCC pop_options
// clang-format on
