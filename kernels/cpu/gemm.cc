#include "kernels/cpu/gemm.h"

#include <algorithm>
#include <cstring>

#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/dtype.h"
#include "kernels/cpu/isa_kernels.h"

namespace chunkserve::kernels::cpu {
namespace {

bool ValidDType(DType d) { return d == DType::kF32 || d == DType::kF16 || d == DType::kBF16; }

float WidenOne(const void* src, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kF16:
      return HalfToFloat(static_cast<const uint16_t*>(src)[i]);
    case DType::kBF16:
      return Bf16ToFloat(static_cast<const uint16_t*>(src)[i]);
    default:
      return static_cast<const float*>(src)[i];
  }
}

// Panels of W [n, k]; the shape is valid.
int64_t PanelsOf(int64_t n) { return (n + kGemmPanel - 1) / kGemmPanel; }

}  // namespace

int64_t PackedWeightElements(int64_t n, int64_t k) {
  if (n < 1 || k < 1 || n > (int64_t{1} << 31) || k > (int64_t{1} << 31)) return 0;
  return PanelsOf(n) * kGemmPanel * k;
}

KernelStatus PackWeights(const void* src, DType src_dtype, int64_t n, int64_t k, DType dst_dtype,
                         void* dst) {
  if (src == nullptr || dst == nullptr || PackedWeightElements(n, k) == 0 ||
      !ValidDType(src_dtype) || !ValidDType(dst_dtype) ||
      (dst_dtype != src_dtype && dst_dtype != DType::kF32)) {
    return KernelStatus::kInvalidArgument;
  }
  const size_t es = DTypeSize(dst_dtype);
  auto* out = static_cast<unsigned char*>(dst);
  // Rows are copied one element at a time into their panel's column: a one-time cost at load,
  // so plain loops.
  for (int64_t p = 0; p < PanelsOf(n); ++p) {
    unsigned char* panel = out + static_cast<size_t>(p * kGemmPanel * k) * es;
    for (int32_t j = 0; j < kGemmPanel; ++j) {
      const int64_t row = p * kGemmPanel + j;
      for (int64_t i = 0; i < k; ++i) {
        unsigned char* d = panel + static_cast<size_t>(i * kGemmPanel + j) * es;
        if (row >= n) {
          std::memset(d, 0, es);
        } else if (dst_dtype == DType::kF32) {
          const float v = WidenOne(src, src_dtype, row * k + i);
          std::memcpy(d, &v, es);
        } else {
          std::memcpy(d, static_cast<const unsigned char*>(src) + static_cast<size_t>(row * k + i) * es,
                      es);
        }
      }
    }
  }
  return KernelStatus::kOk;
}

KernelStatus UnpackWeightRow(const void* packed, DType dtype, int64_t n, int64_t k, int64_t row,
                             float* out) {
  if (packed == nullptr || out == nullptr || PackedWeightElements(n, k) == 0 ||
      !ValidDType(dtype) || row < 0 || row >= n) {
    return KernelStatus::kInvalidArgument;
  }
  const int64_t base = row / kGemmPanel * kGemmPanel * k + row % kGemmPanel;
  for (int64_t i = 0; i < k; ++i) out[i] = WidenOne(packed, dtype, base + i * kGemmPanel);
  return KernelStatus::kOk;
}

KernelStatus Gemm(const GemmParams& p) {
  if (p.x == nullptr || p.w == nullptr || p.y == nullptr || p.m < 0 ||
      PackedWeightElements(p.n, p.k) == 0 || p.ldx < p.k || p.ldy < p.n || !ValidDType(p.w_dtype) ||
      p.num_threads < 0) {
    return KernelStatus::kInvalidArgument;
  }
  KernelStatus status = KernelStatus::kOk;
  const CpuIsa isa = ResolveCpuIsa(p.isa, &status);
  if (status != KernelStatus::kOk) return status;
  if (p.m == 0) return KernelStatus::kOk;
  using Fn = void (*)(const GemmParams&, int64_t, int64_t);
  const Fn run = isa == CpuIsa::kAvx512 ? &avx512::zmm::GemmPanels
                 : isa == CpuIsa::kAvx2 ? &avx2::GemmPanels
                                        : &scalar::GemmPanels;
  const int64_t panels = PanelsOf(p.n);
  int64_t threads = p.pool == nullptr ? 1 : p.pool->num_threads();
  if (p.num_threads > 0) threads = std::min<int64_t>(threads, p.num_threads);
  // Each extra thread gets at least kMinMacsPerThread multiply-adds (a few microseconds): a
  // step's GEMMs come back to back, so the pool's threads are still spinning and join within a
  // microsecond or two. Measured on SmolLM2 decode with 5 sequences (chunkserve-bench engine
  // --np 100 --nc 200 --requests 5): 2^16 gave bf16 weights 8-12% more tokens/s than 2^21 (which
  // kept the attention projections on one thread), 2^18 half of that.
  constexpr double kMinMacsPerThread = double{1 << 16};
  const double macs = static_cast<double>(p.m) * static_cast<double>(p.n) * static_cast<double>(p.k);
  const int64_t by_work = static_cast<int64_t>(std::min(macs / kMinMacsPerThread, 1e6));
  const int64_t parts = std::min({threads, panels, std::max<int64_t>(1, by_work)});
  if (parts <= 1) {
    run(p, 0, panels);
    return KernelStatus::kOk;
  }
  // Contiguous panel ranges, one per thread: each thread reads its share of the weights once.
  auto part = [&](int64_t begin, int64_t end, int32_t) {
    for (int64_t i = begin; i < end; ++i) run(p, panels * i / parts, panels * (i + 1) / parts);
  };
  p.pool->ParallelFor(parts, 1, static_cast<int32_t>(parts), part);
  return KernelStatus::kOk;
}

}  // namespace chunkserve::kernels::cpu
