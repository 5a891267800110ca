// The CPU attention kernels built for AVX-512 (F, BW, VL, DQ) + FMA + F16C: attention_impl.h over
// simd_avx512.h, whose 8-lane half compiles with EVEX encodings (32 registers) and whose WideOps
// give the GEMM-shaped tiles 16 lanes. See attention_avx2.cc for why the pragma comes after the
// standard and project headers. Entered only after cpu_isa.h's check, and by default only where
// 512-bit FMAs measure faster than 256-bit ones (ResolveAttentionIsa).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "kernels/attention_params.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/dtype.h"
#include "kernels/cpu/isa_kernels.h"
#include "kernels/cpu/kv_append.h"
#include "kernels/cpu/thread_pool.h"

// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*(), which -Wmaybe-uninitialized takes
// for a read of an uninitialized value (GCC bug 105593); nothing here is.
// clang-format off
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")

#define CHUNKSERVE_CPU_ISA avx512
#include "kernels/cpu/simd_avx512.h"
#include "kernels/cpu/attention_impl.h"
#undef CHUNKSERVE_CPU_ISA

#pragma GCC pop_options
#pragma GCC diagnostic pop
// clang-format on
