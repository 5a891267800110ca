// Writing into the KV arena: KvAppend stores new tokens' K and V (fp32 in, converted to the storage
// dtype with round-to-nearest-even), KvCopy copies the first tokens of a slot into another slot
// (the prefix tree's copy-on-write when a sequence diverges inside a shared, partly used chunk).
//
// Both work on one layer, through a mutable view of the same layout as KvCacheView
// (kernels/attention_params.h): K and V each [num_slots, num_kv_heads, chunk_size, head_dim].
//
// Thread safety: calls that write different (slot, offset) cells may run concurrently.
#ifndef CHUNKSERVE_KERNELS_CPU_KV_APPEND_H_
#define CHUNKSERVE_KERNELS_CPU_KV_APPEND_H_

#include <cstdint>

#include "kernels/attention_params.h"
#include "kernels/cpu/common.h"

namespace chunkserve::kernels::cpu {

// One layer of the arena, writable.
struct KvArenaLayer {
  void* k = nullptr;  // [num_slots, num_kv_heads, chunk_size, head_dim]
  void* v = nullptr;  // [num_slots, num_kv_heads, chunk_size, head_dim]
  DType dtype = DType::kF32;
  int32_t num_slots = 0;
  int32_t num_kv_heads = 0;
  int32_t chunk_size = 0;
  int32_t head_dim = 0;

  KvCacheView View() const {
    KvCacheView view;
    view.k = k;
    view.v = v;
    view.dtype = dtype;
    view.num_slots = num_slots;
    view.num_kv_heads = num_kv_heads;
    view.chunk_size = chunk_size;
    view.head_dim = head_dim;
    return view;
  }
};

struct KvAppendParams {
  KvArenaLayer kv;
  const float* k = nullptr;  // [num_tokens, num_kv_heads, head_dim]
  const float* v = nullptr;  // [num_tokens, num_kv_heads, head_dim]
  // Token i goes to position offset[i] (0 .. chunk_size - 1) of slot slot[i] (0 .. num_slots - 1).
  const int32_t* slot = nullptr;    // [num_tokens]
  const int32_t* offset = nullptr;  // [num_tokens]
  int32_t num_tokens = 0;
  CpuIsa isa = CpuIsa::kAuto;
};

KernelStatus KvAppend(const KvAppendParams& params);

// Copies token positions [0, num_tokens) of every KV head, K and V, from src_slot to dst_slot.
// src_slot != dst_slot; num_tokens in [0, chunk_size].
KernelStatus KvCopy(const KvArenaLayer& kv, int32_t src_slot, int32_t dst_slot, int32_t num_tokens);

}  // namespace chunkserve::kernels::cpu

#endif  // CHUNKSERVE_KERNELS_CPU_KV_APPEND_H_
