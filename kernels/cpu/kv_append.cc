#include "kernels/cpu/kv_append.h"

#include <cstring>

#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/isa_kernels.h"

namespace chunkserve::kernels::cpu {
namespace {

bool ValidLayer(const KvArenaLayer& kv) {
  return kv.k != nullptr && kv.v != nullptr &&
         (kv.dtype == DType::kF32 || kv.dtype == DType::kF16 || kv.dtype == DType::kBF16) &&
         kv.num_slots >= 1 && kv.num_kv_heads >= 1 && kv.chunk_size >= kMinChunkSize &&
         kv.chunk_size <= kMaxChunkSize && kv.head_dim >= 1 && kv.head_dim <= kMaxHeadDim;
}

}  // namespace

KernelStatus KvAppend(const KvAppendParams& p) {
  if (!ValidLayer(p.kv) || p.num_tokens < 0) return KernelStatus::kInvalidArgument;
  if (p.num_tokens > 0 &&
      (p.k == nullptr || p.v == nullptr || p.slot == nullptr || p.offset == nullptr)) {
    return KernelStatus::kInvalidArgument;
  }
  for (int32_t i = 0; i < p.num_tokens; ++i) {
    if (p.slot[i] < 0 || p.slot[i] >= p.kv.num_slots || p.offset[i] < 0 ||
        p.offset[i] >= p.kv.chunk_size) {
      return KernelStatus::kInvalidArgument;
    }
  }
  KernelStatus status;
  const CpuIsa isa = ResolveAttentionIsa(p.isa, &status);
  if (status != KernelStatus::kOk) return status;
  if (isa == CpuIsa::kAvx512) {
    avx512::KvAppend(p);
  } else if (isa == CpuIsa::kAvx2) {
    avx2::KvAppend(p);
  } else {
    scalar::KvAppend(p);
  }
  return KernelStatus::kOk;
}

KernelStatus KvCopy(const KvArenaLayer& kv, int32_t src_slot, int32_t dst_slot,
                    int32_t num_tokens) {
  if (!ValidLayer(kv) || src_slot < 0 || src_slot >= kv.num_slots || dst_slot < 0 ||
      dst_slot >= kv.num_slots || src_slot == dst_slot || num_tokens < 0 ||
      num_tokens > kv.chunk_size) {
    return KernelStatus::kInvalidArgument;
  }
  const size_t elem = DTypeSize(kv.dtype);
  const size_t block = static_cast<size_t>(kv.chunk_size) * kv.head_dim * elem;
  const size_t bytes = static_cast<size_t>(num_tokens) * kv.head_dim * elem;
  for (void* base : {kv.k, kv.v}) {
    auto* arena = static_cast<unsigned char*>(base);
    for (int32_t h = 0; h < kv.num_kv_heads; ++h) {
      const size_t src = (static_cast<size_t>(src_slot) * kv.num_kv_heads + h) * block;
      const size_t dst = (static_cast<size_t>(dst_slot) * kv.num_kv_heads + h) * block;
      std::memcpy(arena + dst, arena + src, bytes);
    }
  }
  return KernelStatus::kOk;
}

}  // namespace chunkserve::kernels::cpu
