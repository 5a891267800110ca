// CPU decode and prefill attention over the chunked KV arena (kernels/README.md).
//
// Three kernels read the arena described in kernels/attention_params.h (one layer's KvCacheView):
//
//  * TppDecode: ChunkAttention's two-phase-partition decode. Phase 1 (chunk-first) handles the
//    plan's shared chunks: the queries of every sequence that shares a chunk, times every query
//    head of the GQA group, form one matrix multiplied against the chunk's K (online softmax) and
//    V, so shared K/V are read once per batch. A task walks a run of consecutive shared chunks with
//    the same rows (one partial per row for the run), a block of <= 64 rows and a KV head; runs of
//    at most 4 rows use the streaming kernel of phase 2 instead. Phase 2 (sequence-first) runs one
//    task per (sequence, range of KV heads): it merges the phase-1 partials of the sequence's
//    shared chunks and walks its private chunks, reading each chunk's (slot, head) blocks of the
//    range in address order (they are adjacent in the arena).
//  * PagedDecode: the baseline the paper calls PagedAttn*: every task walks its sequence's whole
//    block list; blocks may be physically shared but nothing exploits it beyond what the hardware
//    caches happen to keep. It is TPP's phase-2 code: same SIMD, memory order, threading, dtypes.
//  * PrefillAttention: new query tokens of one or more sequences attend to their sequence's whole
//    path of chunks (cached prefix and the new tokens, whose K/V KvAppend has already written),
//    with a causal mask by absolute position.
//
// Numerics: queries, outputs and all accumulation are fp32; K/V are fp32, fp16 or bf16 in the
// arena and widened on load. Softmax runs in base 2 (scores are pre-multiplied by
// sm_scale * log2(e)); the exponential is a degree-5 polynomial with ~2 ulp error, and values
// below 2^-126 flush to zero, which a softmax never notices because its largest term is 1.
//
// Threads and memory: every kernel runs on the given ThreadPool (required; a pool of 1 thread runs
// on the caller) with at most num_threads threads (0: all of the pool's). Nothing is allocated per
// call: TPP's partial results live in the caller's workspace, per-task state and tiles in the
// pool's per-thread scratch (ThreadPool::kDefaultScratchBytes covers every accepted shape) or on
// the stack.
//
// Errors: each kernel validates its params (pointers, shapes, plan indices and lengths) and
// returns kInvalidArgument without writing anything when they are wrong; kUnsupported when
// an ISA the CPU lacks is asked for; kResourceExhausted when the workspace
// or the pool's scratch is too small.
//
// Thread safety: kernels only read their inputs and write their outputs and workspace; concurrent
// calls on different outputs are safe (calls sharing a pool are serialized by it).
#ifndef CHUNKSERVE_KERNELS_CPU_ATTENTION_H_
#define CHUNKSERVE_KERNELS_CPU_ATTENTION_H_

#include <cstddef>
#include <cstdint>

#include "kernels/attention_params.h"
#include "kernels/cpu/common.h"
#include "kernels/cpu/thread_pool.h"

namespace chunkserve::kernels::cpu {

// Shapes every kernel checks on its KvCacheView: k and v non-null, num_slots >= 1,
// num_kv_heads >= 1, chunk_size in [kMinChunkSize, kMaxChunkSize], head_dim in [1, kMaxHeadDim],
// and num_qo_heads a positive multiple of num_kv_heads.

struct TppDecodeParams {
  const float* q = nullptr;  // [plan.num_seqs, num_qo_heads, head_dim]
  float* o = nullptr;        // [plan.num_seqs, num_qo_heads, head_dim]; must not alias q
  KvCacheView kv;            // one layer of the arena
  TppPlanView plan;          // see kernels/attention_params.h; validated on every call
  int32_t num_qo_heads = 0;
  float sm_scale = 0.0f;       // usually 1 / sqrt(head_dim)
  void* workspace = nullptr;   // TppDecodeWorkspaceBytes(plan, num_qo_heads, head_dim) bytes, any
  size_t workspace_bytes = 0;  //   alignment; may be null when that is 0 (no shared chunks)
  ThreadPool* pool = nullptr;
  int32_t num_threads = 0;  // 0: all of the pool's threads
  CpuIsa isa = CpuIsa::kAuto;
};

// Workspace for one TppDecode call: the phase-1 partial rows (num_partial_rows * num_qo_heads of
// head_dim floats plus m and l) and the per-call task table. 0 when the plan has no shared chunks.
size_t TppDecodeWorkspaceBytes(const TppPlanView& plan, int32_t num_qo_heads, int32_t head_dim);

KernelStatus TppDecode(const TppDecodeParams& params);

// The order in which PagedDecode hands (sequence, KV head) tasks to threads. kSequenceMajor is
// vLLM's (its grid runs the heads of one sequence next to each other; here one task takes a
// sequence and a range of its KV heads, as TPP's phase 2 does); kHeadMajor runs every sequence of
// one KV head back to back, one task per (KV head, sequence), which lets the CPU caches keep a
// physically shared prefix between sequences but reads each block as a separate 32 KB piece.
enum class PagedTaskOrder : int32_t { kSequenceMajor = 0, kHeadMajor = 1 };

struct PagedDecodeParams {
  const float* q = nullptr;  // [num_seqs, num_qo_heads, head_dim]
  float* o = nullptr;        // [num_seqs, num_qo_heads, head_dim]
  KvCacheView kv;
  int32_t num_seqs = 0;
  int32_t num_qo_heads = 0;
  // Sequence s reads blocks j in [block_indptr[s], block_indptr[s + 1]): slot block_slot[j],
  // block_len[j] tokens (1 .. chunk_size). A sequence with no blocks gets zeros.
  const int32_t* block_indptr = nullptr;  // [num_seqs + 1], non-decreasing, block_indptr[0] == 0
  const int32_t* block_slot = nullptr;    // [block_indptr[num_seqs]]
  const int32_t* block_len = nullptr;     // [block_indptr[num_seqs]]
  float sm_scale = 0.0f;
  PagedTaskOrder order = PagedTaskOrder::kSequenceMajor;
  ThreadPool* pool = nullptr;
  int32_t num_threads = 0;
  CpuIsa isa = CpuIsa::kAuto;
};

KernelStatus PagedDecode(const PagedDecodeParams& params);

// Prefill: the new tokens of num_seqs sequences. Sequence s owns query tokens
// [q_indptr[s], q_indptr[s + 1]) and the path of chunks j in [chunk_indptr[s], chunk_indptr[s +
// 1]); the k-th chunk of the path covers absolute positions [k * chunk_size, k * chunk_size +
// chunk_len[j]). Query token i sits at absolute position q_pos[i] and attends to every key at a
// position <= q_pos[i] (causal). q_pos must lie in [0, path length) where path length is the last
// chunk's end position; the new tokens' K/V must already be in the arena (KvAppend).
struct PrefillAttentionParams {
  const float* q = nullptr;  // [q_indptr[num_seqs], num_qo_heads, head_dim]
  float* o = nullptr;        // [q_indptr[num_seqs], num_qo_heads, head_dim]
  KvCacheView kv;
  int32_t num_seqs = 0;
  int32_t num_qo_heads = 0;
  const int32_t* q_indptr = nullptr;      // [num_seqs + 1], non-decreasing, q_indptr[0] == 0
  const int32_t* q_pos = nullptr;         // [q_indptr[num_seqs]]
  const int32_t* chunk_indptr = nullptr;  // [num_seqs + 1], non-decreasing, chunk_indptr[0] == 0
  const int32_t* chunk_slot = nullptr;    // [chunk_indptr[num_seqs]]
  const int32_t* chunk_len = nullptr;     // [chunk_indptr[num_seqs]], 1 .. chunk_size
  float sm_scale = 0.0f;
  ThreadPool* pool = nullptr;
  int32_t num_threads = 0;
  CpuIsa isa = CpuIsa::kAuto;
};

KernelStatus PrefillAttention(const PrefillAttentionParams& params);

}  // namespace chunkserve::kernels::cpu

#endif  // CHUNKSERVE_KERNELS_CPU_ATTENTION_H_
