// The GEMM built for AVX-512 (F, BW, VL, DQ) + FMA + F16C; see attention_avx2.cc for why the
// pragma comes after the standard and project headers. Entered only after cpu_isa.h's check. It
// is compiled inside namespace avx512::zmm, where simd_avx512.h's 16-lane names are found first.
#include <algorithm>
#include <array>
#include <cstdint>
#include <utility>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/isa_kernels.h"

// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*(), which -Wmaybe-uninitialized takes
// for a read of an uninitialized value (GCC bug 105593); nothing here is.
// clang-format off
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")

#define CHUNKSERVE_CPU_ISA avx512::zmm
#include "kernels/cpu/simd_avx512.h"
#include "kernels/cpu/gemm_impl.h"
#undef CHUNKSERVE_CPU_ISA

#pragma GCC pop_options
#pragma GCC diagnostic pop
// clang-format on
