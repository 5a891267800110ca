#include "kernels/cuda/shapes.h"

namespace chunkserve::kernels::cuda {

const char* CheckAttentionShape(const AttentionShape& s) {
  if (s.dtype != DType::kF16 && s.dtype != DType::kBF16) {
    return "CUDA attention supports fp16 and bf16 KV/query/output only";
  }
  if (s.head_dim != 64 && s.head_dim != 128) return "CUDA attention supports head_dim 64 and 128";
  if (s.chunk_size < kMinChunkSize || s.chunk_size > kMaxChunkSize ||
      s.chunk_size % kChunkSizeMultiple != 0) {
    return "CUDA attention needs chunk_size in [16, 128], a multiple of 16";
  }
  if (s.num_slots < 1) return "num_slots must be >= 1";
  if (s.num_kv_heads < 1 || s.num_kv_heads > kMaxGridY) return "num_kv_heads out of range";
  if (s.num_qo_heads < 1 || s.num_qo_heads % s.num_kv_heads != 0) {
    return "num_qo_heads must be a positive multiple of num_kv_heads";
  }
  return nullptr;
}

const char* CheckAttentionPointers(const void* q, const void* o, const KvCacheView& kv) {
  if (q == nullptr || o == nullptr || kv.k == nullptr || kv.v == nullptr) return "null pointer";
  if (!Aligned16(q) || !Aligned16(o) || !Aligned16(kv.k) || !Aligned16(kv.v)) {
    return "q, o, k and v must be 16-byte aligned";
  }
  if (q == o) return "o must not alias q";
  return nullptr;
}

namespace {

const char* CheckIndptr(int32_t n, const int32_t* indptr) {
  if (indptr == nullptr) return "null indptr";
  if (indptr[0] != 0) return "indptr[0] must be 0";
  for (int32_t i = 0; i < n; ++i) {
    if (indptr[i + 1] < indptr[i]) return "indptr must be non-decreasing";
  }
  return nullptr;
}

const char* CheckChunkList(int32_t n, const int32_t* slot, const int32_t* len, int32_t num_slots,
                           int32_t chunk_size) {
  if (n > 0 && (slot == nullptr || len == nullptr)) return "null chunk list";
  for (int32_t j = 0; j < n; ++j) {
    if (slot[j] < 0 || slot[j] >= num_slots) return "chunk slot out of range";
    if (len[j] < 1 || len[j] > chunk_size) return "chunk length out of [1, chunk_size]";
  }
  return nullptr;
}

}  // namespace

const char* CheckBlockLists(int32_t num_seqs, const int32_t* block_indptr,
                            const int32_t* block_slot, const int32_t* block_len, int32_t num_slots,
                            int32_t chunk_size) {
  if (num_seqs < 0 || num_seqs > kMaxGridY) return "num_seqs out of range";
  if (const char* e = CheckIndptr(num_seqs, block_indptr)) return e;
  return CheckChunkList(block_indptr[num_seqs], block_slot, block_len, num_slots, chunk_size);
}

const char* CheckPrefillLists(int32_t num_seqs, const int32_t* q_indptr, const int32_t* q_pos,
                              const int32_t* chunk_indptr, const int32_t* chunk_slot,
                              const int32_t* chunk_len, int32_t num_slots, int32_t chunk_size,
                              int32_t max_q_per_seq) {
  if (num_seqs < 0) return "num_seqs out of range";
  if (const char* e = CheckIndptr(num_seqs, q_indptr)) return e;
  if (const char* e = CheckIndptr(num_seqs, chunk_indptr)) return e;
  if (const char* e =
          CheckChunkList(chunk_indptr[num_seqs], chunk_slot, chunk_len, num_slots, chunk_size)) {
    return e;
  }
  if (q_indptr[num_seqs] > 0 && q_pos == nullptr) return "null q_pos";
  for (int32_t s = 0; s < num_seqs; ++s) {
    if (q_indptr[s + 1] - q_indptr[s] > max_q_per_seq) return "max_q_per_seq is too small";
    int64_t path = 0;
    const int32_t last = chunk_indptr[s + 1];
    if (last > chunk_indptr[s]) {
      // Chunk k covers [k * chunk_size, k * chunk_size + len): the path ends at the last one's end.
      path = int64_t{last - 1 - chunk_indptr[s]} * chunk_size + chunk_len[last - 1];
    }
    for (int32_t i = q_indptr[s]; i < q_indptr[s + 1]; ++i) {
      if (q_pos[i] < 0 || q_pos[i] >= path) return "query position outside its sequence's path";
    }
  }
  return nullptr;
}

const char* CheckRmsNormShape(int64_t rows, int32_t dim) {
  if (rows < 0 || dim < 1) return "rows must be >= 0 and dim >= 1";
  return nullptr;
}

const char* CheckRopeShape(int64_t rows, int32_t num_heads, int32_t head_dim) {
  if (rows < 0 || num_heads < 1) return "rows must be >= 0 and num_heads >= 1";
  if (head_dim < 2 || head_dim % 2 != 0 || head_dim > 1024) {
    return "RoPE needs an even head_dim in [2, 1024]";
  }
  return nullptr;
}

const char* CheckKvArenaShape(DType dtype, int32_t num_slots, int32_t num_kv_heads,
                              int32_t chunk_size, int32_t head_dim) {
  if (dtype != DType::kF16 && dtype != DType::kBF16) return "CUDA KV arena is fp16 or bf16";
  if (num_slots < 1 || num_kv_heads < 1 || chunk_size < 1) return "arena sizes must be >= 1";
  if (head_dim < 8 || head_dim > 256 || head_dim % 8 != 0) {
    return "KV append needs head_dim a multiple of 8 in [8, 256]";
  }
  return nullptr;
}

const char* CheckSamplingShape(int32_t rows, int32_t vocab) {
  if (rows < 0 || vocab < 1) return "rows must be >= 0 and vocab >= 1";
  return nullptr;
}

}  // namespace chunkserve::kernels::cuda
