// Internal: the argument block of the attend kernel and the per-dtype launch entry points that
// attention_f16.cu / attention_bf16.cu define (one dtype per translation unit, so the two compile
// in parallel). Host-only, plain C++; included by attention.cc and the .cu files.
#ifndef CHUNKSERVE_KERNELS_CUDA_ATTENTION_LAUNCH_H_
#define CHUNKSERVE_KERNELS_CUDA_ATTENTION_LAUNCH_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/tpp_schedule.h"

namespace chunkserve::kernels::cuda::detail {

enum class AttendMode : int32_t { kTpp = 0, kPaged = 1, kPrefill = 2 };

// Passed by value to the kernel (its size is far below the 4 KB parameter limit).
struct AttendArgs {
  const void* q;
  void* o;
  const void* k;
  const void* v;
  int32_t num_slots;
  int32_t num_kv_heads;
  int32_t chunk_size;
  int32_t num_qo_heads;
  int32_t group;     // num_qo_heads / num_kv_heads
  float scale_log2;  // sm_scale * log2(e)
  AttendMode mode;
  // Chunk lists: kTpp the schedule's chunk_slot/len, kPaged the block lists, kPrefill the paths.
  const int32_t* chunk_slot;
  const int32_t* chunk_len;
  // kTpp: grid (num_tasks, num_kv_heads).
  const TppTask* tasks;
  float* part_o;   // [entries, head_dim]
  float* part_ml;  // [entries, 2]
  // kPaged: grid (num_seqs * row_blocks * num_kv_heads); kPrefill: grid (num_seqs *
  // blocks_per_seq, num_kv_heads).
  const int32_t* chunk_indptr;  // block_indptr (paged) / chunk_indptr (prefill)
  int32_t row_blocks;           // paged: row blocks per sequence; prefill: blocks per sequence
  const int32_t* q_indptr;      // prefill
  const int32_t* q_pos;         // prefill
};

struct MergeArgs {
  const int32_t* merge_seq;
  const int32_t* merge_indptr;
  const int32_t* merge_entry;
  const float* part_o;
  const float* part_ml;
  void* o;
  int32_t num_merge;
  int32_t num_qo_heads;
};

inline constexpr int kAttendThreads = 128;

// Shared memory of the attend kernel: two stages of K and V (the Q tile aliases the second,
// which holds at least 64 rows: cap >= 48 and 2 * cap >= 64), lengths and positions.
inline size_t AttendSmem(int32_t head_dim, int32_t chunk_size) {
  const size_t chunks_per_stage = chunk_size >= 64 ? 1 : static_cast<size_t>(64 / chunk_size);
  const size_t cap = chunks_per_stage * static_cast<size_t>(chunk_size);
  const size_t stride = static_cast<size_t>(head_dim) + 8;
  return 4 * cap * stride * 2 + (8 + 64) * sizeof(int32_t);
}

// Defined in attention_f16.cu (is_bf16 false) and attention_bf16.cu (true); head_dim 64 or 128.
cudaError_t LaunchAttendF16(const AttendArgs& args, int32_t head_dim, dim3 grid, size_t smem,
                            cudaStream_t stream);
cudaError_t LaunchAttendBf16(const AttendArgs& args, int32_t head_dim, dim3 grid, size_t smem,
                             cudaStream_t stream);
cudaError_t LaunchMergeF16(const MergeArgs& args, int32_t head_dim, cudaStream_t stream);
cudaError_t LaunchMergeBf16(const MergeArgs& args, int32_t head_dim, cudaStream_t stream);

}  // namespace chunkserve::kernels::cuda::detail

#endif  // CHUNKSERVE_KERNELS_CUDA_ATTENTION_LAUNCH_H_
