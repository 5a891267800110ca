// Shared vocabulary of the CPU kernels: the status they return, the instruction sets they can run
// on and the shape limits they accept.
//
// CPU kernels never throw, print or abort: every entry point validates its params struct first and
// returns a KernelStatus; on anything but kOk it has written nothing. The runtime turns the code
// into a Status, with context, at the backend boundary.
#ifndef CHUNKSERVE_KERNELS_CPU_COMMON_H_
#define CHUNKSERVE_KERNELS_CPU_COMMON_H_

#include <cstdint>

namespace chunkserve::kernels::cpu {

enum class KernelStatus : int32_t {
  kOk = 0,
  kInvalidArgument = 1,  // a null pointer, a shape or an index out of range, a bad plan
  kUnsupported = 2,      // valid in principle but not built here (e.g. AVX2 asked on a CPU without)
  kResourceExhausted = 3,  // the caller's workspace or the pool's per-thread scratch is too small
};

// "ok", "invalid argument", ...; never null.
const char* KernelStatusName(KernelStatus status);

// Instruction set a kernel call runs on. kAuto takes $CHUNKSERVE_CPU_ISA when set ("scalar",
// "avx2" or "avx512"), else the best the CPU supports. kAvx2 means AVX2 + FMA + F16C; kAvx512
// means that plus AVX-512 F/BW/VL/DQ. kScalar is portable C++ (the compiler may still use the SSE2
// every x86-64 has); it exists for old CPUs and so that tests exercise every path. The GEMM has an
// AVX-512 build; the attention and KV kernels run their AVX2 build when asked for kAvx512.
enum class CpuIsa : int32_t { kAuto = 0, kScalar = 1, kAvx2 = 2, kAvx512 = 3 };

// Shape limits shared by every CPU attention kernel.
inline constexpr int32_t kMinChunkSize = 16;
inline constexpr int32_t kMaxChunkSize = 256;
inline constexpr int32_t kMaxHeadDim = 256;
// Query heads per KV head handled in one pass of the sequence-first kernels; larger GQA groups are
// handled in several passes over the KV.
inline constexpr int32_t kMaxRowsPerPass = 8;

}  // namespace chunkserve::kernels::cpu

#endif  // CHUNKSERVE_KERNELS_CPU_COMMON_H_
