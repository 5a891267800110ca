// CUDA decode and prefill attention over the chunked KV arena (kernels/README.md).
//
// The arena layout is kernels/attention_params.h's (one layer: K and V each
// [num_slots, num_kv_heads, chunk_size, head_dim]), in device memory. Queries and outputs are in
// the KV dtype (fp16 or bf16: they are tensor-core operands); scores, softmax state and every sum
// are fp32. Softmax runs in base 2 (scores pre-multiplied by sm_scale * log2 e).
//
//  * TppDecode: ChunkAttention's two-phase partition, both phases in one launch of the attend
//    kernel (grid: task x KV head; tasks from DevicePlan, see tpp_schedule.h), then a merge
//    kernel for the rows whose result is split over several partials. A task streams its chunks
//    through shared memory (cp.async, double-buffered) and computes S = Q K^T and O += P V with
//    mma.sync m16n8k16 on the task's rows only: the sharing sequences x the GQA group's query
//    heads for a shared chunk, the group's heads for a private one. Rows past the task's last are
//    zero-filled in shared memory, never read from the query tensor.
//  * PagedDecode: the baseline (vLLM PagedAttention's schedule, the paper's PagedAttn*): one
//    thread block per (sequence, KV head) walking the sequence's whole block list, shared blocks
//    included. It runs the same inner loop as TPP, so the comparison isolates the schedule.
//  * PrefillAttention: new tokens attend to their sequence's path of chunks (cached prefix plus
//    the new tokens, written first with KvAppend), causal by absolute position.
//
// Errors: every launcher validates what it can see on the host (shapes, pointers, alignment; the
// TPP plan is validated by DevicePlan::Update) and returns cudaErrorInvalidValue without
// launching; otherwise it returns cudaGetLastError() after the launch. Device-side index arrays
// that the host cannot see (paged block lists, prefill lists) are range-checked by the kernels:
// an entry with a slot outside [0, num_slots) or a length outside [1, chunk_size] contributes
// nothing instead of reading out of bounds (check them on the host with shapes.h to get an error).
//
// Thread safety: launches only read their inputs and write o and the workspace.
#ifndef CHUNKSERVE_KERNELS_CUDA_ATTENTION_H_
#define CHUNKSERVE_KERNELS_CUDA_ATTENTION_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/attention_params.h"
#include "kernels/cuda/device_plan.h"

namespace chunkserve::kernels::cuda {

struct TppDecodeParams {
  const void* q = nullptr;  // [num_seqs, num_qo_heads, head_dim], kv.dtype
  void* o = nullptr;        // [num_seqs, num_qo_heads, head_dim], kv.dtype; must not alias q
  KvCacheView kv;           // one layer, device pointers
  int32_t num_qo_heads = 0;
  float sm_scale = 0.0f;
  const DevicePlan* plan = nullptr;  // Update()d for this batch and shape, on the same stream
  void* workspace = nullptr;         // plan->WorkspaceBytes(head_dim) bytes, 16-byte aligned
  size_t workspace_bytes = 0;        //   (may be null when that is 0)
};

cudaError_t TppDecode(const TppDecodeParams& params, cudaStream_t stream);

struct PagedDecodeParams {
  const void* q = nullptr;  // [num_seqs, num_qo_heads, head_dim]
  void* o = nullptr;        // [num_seqs, num_qo_heads, head_dim]
  KvCacheView kv;
  int32_t num_seqs = 0;  // <= 65535
  int32_t num_qo_heads = 0;
  // Device arrays: sequence s reads blocks [block_indptr[s], block_indptr[s + 1]) (slot, length).
  // A sequence with no blocks gets zeros.
  const int32_t* block_indptr = nullptr;  // [num_seqs + 1]
  const int32_t* block_slot = nullptr;
  const int32_t* block_len = nullptr;
  float sm_scale = 0.0f;
};

cudaError_t PagedDecode(const PagedDecodeParams& params, cudaStream_t stream);

// Sequence s owns query tokens [q_indptr[s], q_indptr[s + 1]) and the path of chunks
// [chunk_indptr[s], chunk_indptr[s + 1]); the k-th chunk of the path covers positions
// [k * chunk_size, k * chunk_size + len). Query token i (absolute position q_pos[i]) attends to
// every key at a position <= q_pos[i]. A query that sees no key gets zeros.
struct PrefillAttentionParams {
  const void* q = nullptr;  // [q_indptr[num_seqs], num_qo_heads, head_dim]
  void* o = nullptr;        // [q_indptr[num_seqs], num_qo_heads, head_dim]
  KvCacheView kv;
  int32_t num_seqs = 0;
  int32_t num_qo_heads = 0;
  // Device arrays (host copies can be checked with CheckPrefillLists).
  const int32_t* q_indptr = nullptr;      // [num_seqs + 1]
  const int32_t* q_pos = nullptr;         // [q_indptr[num_seqs]]
  const int32_t* chunk_indptr = nullptr;  // [num_seqs + 1]
  const int32_t* chunk_slot = nullptr;
  const int32_t* chunk_len = nullptr;
  // Host value: at least the largest number of query tokens of one sequence (sizes the grid;
  // blocks past a sequence's tokens exit at once).
  int32_t max_q_per_seq = 0;
  float sm_scale = 0.0f;
};

cudaError_t PrefillAttention(const PrefillAttentionParams& params, cudaStream_t stream);

// Dynamic shared memory the attend kernel uses for a shape (for reports and tests).
size_t AttendSmemBytes(int32_t head_dim, int32_t chunk_size);

}  // namespace chunkserve::kernels::cuda

#endif  // CHUNKSERVE_KERNELS_CUDA_ATTENTION_H_
