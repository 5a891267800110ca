// Plain data shared by the CPU and CUDA attention kernels and by runtime/plan, which produces it.
//
// KV cache layout (one engine-wide arena; runtime/README.md "kvcache/"):
//   K and V each: [num_layers][num_slots][num_kv_heads][chunk_size][head_dim] in kv dtype.
// A slot holds one chunk of the prefix tree for every layer; one (slot, kv_head) block of one
// layer is contiguous, chunk_size * head_dim elements. Chunk k of a sequence's path covers token
// positions [k * chunk_size, k * chunk_size + len), so positions follow from the path.
//
// This header is C++17 and free of runtime types: nvcc compiles it too.
#ifndef CHUNKSERVE_KERNELS_ATTENTION_PARAMS_H_
#define CHUNKSERVE_KERNELS_ATTENTION_PARAMS_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace chunkserve::kernels {

// Storage type of K/V (queries, outputs and accumulation are always fp32 on the CPU).
enum class DType : int32_t { kF32 = 0, kF16 = 1, kBF16 = 2 };

constexpr size_t DTypeSize(DType t) { return t == DType::kF32 ? 4 : 2; }

// One layer's view of the KV arena.
struct KvCacheView {
  const void* k = nullptr;  // [num_slots, num_kv_heads, chunk_size, head_dim]
  const void* v = nullptr;  // [num_slots, num_kv_heads, chunk_size, head_dim]
  DType dtype = DType::kF32;
  int32_t num_slots = 0;
  int32_t num_kv_heads = 0;
  int32_t chunk_size = 0;
  int32_t head_dim = 0;
};

// The two-phase-partition work lists for one decode batch of num_seqs sequences, each with one
// query token. Batch rows are in the prefix tree's DFS order, so every chunk shared inside the
// batch covers a contiguous row range. Produced by runtime/plan::TppPlan.
//
// Phase 1 (chunk-first): for each shared chunk i and each KV head, the query rows
//   [shared_seq_begin[i], shared_seq_end[i]) x (query heads of the GQA group) attend to the
// chunk's shared_len[i] tokens in slot shared_slot[i]. The partial result (o[head_dim], m, l) of
// row s, query head h is partial row
//   (shared_partial_offset[i] + (s - shared_seq_begin[i])) * num_qo_heads + h.
// Phase 2 (sequence-first): row s merges the partials of the shared chunks
//   seq_shared_ids[seq_shared_indptr[s] .. seq_shared_indptr[s + 1])  (indices into phase 1's list)
// and attends to its private chunks
//   private_slot[j], private_len[j] for j in [private_indptr[s], private_indptr[s + 1]).
// Every token of a row's path is covered exactly once, by a shared or a private chunk. A chunk is
// "shared" when at least two rows of this batch use it; a chunk only one row uses is private to
// that row here even if sequences outside the batch hold it too.
struct TppPlanView {
  int32_t num_seqs = 0;

  int32_t num_shared = 0;
  const int32_t* shared_slot = nullptr;            // [num_shared]
  const int32_t* shared_len = nullptr;             // [num_shared], 1..chunk_size
  const int32_t* shared_seq_begin = nullptr;       // [num_shared]
  const int32_t* shared_seq_end = nullptr;         // [num_shared], end - begin >= 2
  const int32_t* shared_partial_offset = nullptr;  // [num_shared], in rows (see above)
  int32_t num_partial_rows = 0;                    // sum of (end - begin) over shared chunks

  const int32_t* seq_shared_indptr = nullptr;  // [num_seqs + 1]
  const int32_t* seq_shared_ids = nullptr;     // [seq_shared_indptr[num_seqs]]

  const int32_t* private_indptr = nullptr;  // [num_seqs + 1]
  const int32_t* private_slot = nullptr;    // [private_indptr[num_seqs]]
  const int32_t* private_len = nullptr;     // [private_indptr[num_seqs]], 1..chunk_size
};

// Owning storage of a TppPlanView: the arrays it points into. runtime/plan's TppPlan keeps one
// (built from the prefix tree); tests and benchmarks fill their own.
struct TppPlanArrays {
  int32_t num_seqs = 0;
  std::vector<int32_t> shared_slot, shared_len, shared_seq_begin, shared_seq_end,
      shared_partial_offset;
  int32_t num_partial_rows = 0;
  std::vector<int32_t> seq_shared_indptr{0}, seq_shared_ids;
  std::vector<int32_t> private_indptr{0}, private_slot, private_len;

  // The view of these arrays; valid until they change.
  TppPlanView View() const {
    TppPlanView v;
    v.num_seqs = num_seqs;
    v.num_shared = static_cast<int32_t>(shared_slot.size());
    v.shared_slot = shared_slot.data();
    v.shared_len = shared_len.data();
    v.shared_seq_begin = shared_seq_begin.data();
    v.shared_seq_end = shared_seq_end.data();
    v.shared_partial_offset = shared_partial_offset.data();
    v.num_partial_rows = num_partial_rows;
    v.seq_shared_indptr = seq_shared_indptr.data();
    v.seq_shared_ids = seq_shared_ids.data();
    v.private_indptr = private_indptr.data();
    v.private_slot = private_slot.data();
    v.private_len = private_len.data();
    return v;
  }
};

}  // namespace chunkserve::kernels

#endif  // CHUNKSERVE_KERNELS_ATTENTION_PARAMS_H_
