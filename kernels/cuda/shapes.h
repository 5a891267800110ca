// Host-side shape checks of the CUDA kernels, in plain C++ (g++ compiles this file too, so the
// checks are unit-tested on machines without a GPU: tests/kernels/cuda_host_test.cc).
//
// Every check returns nullptr when the shape is accepted, else a static, human-readable reason.
// The CUDA launchers (kernels/cuda/attention.h, model_ops.h, sampling.h) run these first and
// return cudaErrorInvalidValue on a reason, before touching the device; they never abort.
//
// Limits (what the device code is instantiated for; adding a head dim is one `case` in
// attention_impl.cuh's LaunchAttendT / LaunchMergeT plus a line in CheckAttentionShape):
//   KV / query / output dtype: fp16 or bf16 (tensor-core operands; accumulation is fp32).
//   head_dim: 64 or 128 (any multiple of 16 up to 128 compiles: add the instantiation).
//   chunk_size: 16..128, a multiple of 16 (a 16-token MMA tile never straddles two chunks).
//   GQA: num_qo_heads a positive multiple of num_kv_heads, any ratio.
#ifndef CHUNKSERVE_KERNELS_CUDA_SHAPES_H_
#define CHUNKSERVE_KERNELS_CUDA_SHAPES_H_

#include <cstddef>
#include <cstdint>

#include "kernels/attention_params.h"

namespace chunkserve::kernels::cuda {

inline constexpr int32_t kMinChunkSize = 16;
inline constexpr int32_t kMaxChunkSize = 128;
inline constexpr int32_t kChunkSizeMultiple = 16;
// Rows (sequence x query head pairs, or query token x head pairs in prefill) of one thread block.
inline constexpr int32_t kRowsPerTask = 64;
// Grid-dimension limits the launchers rely on (gridDim.y / gridDim.z are 16-bit).
inline constexpr int32_t kMaxGridY = 65535;

// The shape every attention kernel checks on its KvCacheView plus its query head count.
struct AttentionShape {
  DType dtype = DType::kF16;
  int32_t num_qo_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t chunk_size = 0;
  int32_t num_slots = 0;
};

inline AttentionShape ShapeOf(const KvCacheView& kv, int32_t num_qo_heads) {
  AttentionShape s;
  s.dtype = kv.dtype;
  s.num_qo_heads = num_qo_heads;
  s.num_kv_heads = kv.num_kv_heads;
  s.head_dim = kv.head_dim;
  s.chunk_size = kv.chunk_size;
  s.num_slots = kv.num_slots;
  return s;
}

// dtype fp16/bf16, head_dim 64/128, chunk size 16..128 multiple of 16, num_slots >= 1,
// num_kv_heads in [1, kMaxGridY], num_qo_heads a positive multiple of num_kv_heads.
const char* CheckAttentionShape(const AttentionShape& shape);

// Every device pointer the kernels dereference must be 16-byte aligned (they move 16-byte pieces).
inline bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Checks q/o/k/v pointers: non-null, 16-byte aligned, o distinct from q.
const char* CheckAttentionPointers(const void* q, const void* o, const KvCacheView& kv);

// Paged decode (block lists given as host arrays; the launcher itself cannot read device arrays,
// so this is the check a caller runs on the host copy before uploading). block_indptr has
// num_seqs + 1 entries starting at 0 and non-decreasing; every slot in [0, num_slots), every
// length in [1, chunk_size].
const char* CheckBlockLists(int32_t num_seqs, const int32_t* block_indptr,
                            const int32_t* block_slot, const int32_t* block_len, int32_t num_slots,
                            int32_t chunk_size);

// Prefill (host copies of the device arrays): q_indptr / chunk_indptr as above, chunk lists as
// above, and every query position in [0, path length of its sequence). `max_q_per_seq` must be at
// least the largest q_indptr[s + 1] - q_indptr[s].
const char* CheckPrefillLists(int32_t num_seqs, const int32_t* q_indptr, const int32_t* q_pos,
                              const int32_t* chunk_indptr, const int32_t* chunk_slot,
                              const int32_t* chunk_len, int32_t num_slots, int32_t chunk_size,
                              int32_t max_q_per_seq);

// Model ops: a head_dim for RoPE must be even and <= 1024; generic sizes must be positive and
// rows * dim must fit the kernels' 64-bit index math (always true for int32 inputs).
const char* CheckRmsNormShape(int64_t rows, int32_t dim);
const char* CheckRopeShape(int64_t rows, int32_t num_heads, int32_t head_dim);
// KV append / copy: the arena shape (any head_dim that is a multiple of 8, up to 256; fp16/bf16).
const char* CheckKvArenaShape(DType dtype, int32_t num_slots, int32_t num_kv_heads,
                              int32_t chunk_size, int32_t head_dim);

// Sampling: kMaxTopK is the largest top_k the device sampler sorts (one thread block per row).
inline constexpr int32_t kMaxTopK = 1024;
const char* CheckSamplingShape(int32_t rows, int32_t vocab);

}  // namespace chunkserve::kernels::cuda

#endif  // CHUNKSERVE_KERNELS_CUDA_SHAPES_H_
