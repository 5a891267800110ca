// Run-time instruction-set selection for the CPU kernels.
//
// The library is built for baseline x86-64; the AVX2 and AVX-512 kernels live in their own
// translation units compiled under `#pragma GCC target(...)` and are entered only after
// __builtin_cpu_supports says the CPU has every feature they were built for. $CHUNKSERVE_CPU_ISA
// ("scalar", "avx2" or "avx512") overrides the detection for every call that asks for
// CpuIsa::kAuto; it is read once per process.
//
// Thread safety: all functions are safe to call from any thread.
#ifndef CHUNKSERVE_KERNELS_CPU_CPU_ISA_H_
#define CHUNKSERVE_KERNELS_CPU_CPU_ISA_H_

#include "kernels/cpu/common.h"

namespace chunkserve::kernels::cpu {

// The best ISA this CPU supports (kAvx512, kAvx2 or kScalar), ignoring the environment.
CpuIsa DetectCpuIsa();

// Whether this CPU runs `isa` (kScalar and kAuto: always).
bool CpuSupports(CpuIsa isa);

// "scalar" -> kScalar, "avx2" -> kAvx2, "avx512" -> kAvx512, "auto" or "" or null -> kAuto;
// anything else -> kAuto and *ok = false (when ok is not null).
CpuIsa ParseCpuIsa(const char* text, bool* ok = nullptr);

// "auto", "scalar", "avx2", "avx512".
const char* CpuIsaName(CpuIsa isa);

// What a call asking for `requested` runs on: kAuto becomes $CHUNKSERVE_CPU_ISA or DetectCpuIsa();
// an explicit request is returned as is. Returns kUnsupported in *status (and kScalar) when the
// CPU does not support the result; *status is kOk otherwise.
CpuIsa ResolveCpuIsa(CpuIsa requested, KernelStatus* status);

// The throughput of 512-bit FMAs over 256-bit ones on this core, in FLOPs, measured once per
// process on the first call (about 0.2 ms of register-only FMA chains, best of several passes):
// ~2 where the core has two 512-bit FMA pipes (Zen 5, most Xeons), ~1 where it splits a 512-bit
// FMA into two 256-bit halves (Zen 4) or has one 512-bit pipe. 0 without AVX-512.
double WideFmaSpeedup();

// Where WideFmaSpeedup() reaches this, AVX-512 attention kernels pay (kernels/README.md, "ISA
// choice"): their 32 registers hold larger tiles and the streaming units' accumulators, so they
// are faster wherever 512-bit FMAs are not slower than 256-bit ones (Zen 4's split FMAs included);
// below it (a core that lowers its clock for 512-bit work) they are not.
inline constexpr double kWideFmaPays = 0.9;

// ResolveCpuIsa for the attention and KV-append kernels: the same, except that a kAuto request left
// to detection (no $CHUNKSERVE_CPU_ISA) runs AVX2 on an AVX-512 CPU whose WideFmaSpeedup() is below
// kWideFmaPays: there the AVX-512 build is slower, and the choice should not depend on a flag.
CpuIsa ResolveAttentionIsa(CpuIsa requested, KernelStatus* status);

}  // namespace chunkserve::kernels::cpu

#endif  // CHUNKSERVE_KERNELS_CPU_CPU_ISA_H_
