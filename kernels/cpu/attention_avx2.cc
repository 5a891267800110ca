// The CPU kernels built for AVX2 + FMA + F16C. Everything from the target pragma on is compiled for
// that ISA; the standard and project headers above it are not, so their inline functions stay
// baseline x86-64 wherever the linker picks them. Entered only after cpu_isa.h's run-time check.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

#include "kernels/attention_params.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/dtype.h"
#include "kernels/cpu/isa_kernels.h"
#include "kernels/cpu/kv_append.h"
#include "kernels/cpu/thread_pool.h"

// The order below is the point: the simd header, then the kernels, inside the pragma.
// clang-format off
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

#define CHUNKSERVE_CPU_ISA avx2
#include "kernels/cpu/simd_avx2.h"
#include "kernels/cpu/attention_impl.h"
#undef CHUNKSERVE_CPU_ISA

#pragma GCC pop_options
// clang-format on
