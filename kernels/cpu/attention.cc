// Validation, workspace layout and ISA dispatch for the attention kernels; the kernels themselves
// are in attention_impl.h.
#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/isa_kernels.h"

namespace chunkserve::kernels::cpu {
namespace {

constexpr size_t kAlign = 64;

size_t AlignUp(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

bool ValidKv(const KvCacheView& kv, int32_t num_qo_heads) {
  return kv.k != nullptr && kv.v != nullptr &&
         (kv.dtype == DType::kF32 || kv.dtype == DType::kF16 || kv.dtype == DType::kBF16) &&
         kv.num_slots >= 1 && kv.num_kv_heads >= 1 && kv.chunk_size >= kMinChunkSize &&
         kv.chunk_size <= kMaxChunkSize && kv.head_dim >= 1 && kv.head_dim <= kMaxHeadDim &&
         num_qo_heads >= 1 && num_qo_heads % kv.num_kv_heads == 0;
}

bool ValidChunk(const KvCacheView& kv, int32_t slot, int32_t len) {
  return slot >= 0 && slot < kv.num_slots && len >= 1 && len <= kv.chunk_size;
}

// indptr[0] == 0, non-decreasing, n + 1 entries.
bool ValidIndptr(const int32_t* indptr, int32_t n) {
  if (indptr == nullptr || indptr[0] != 0) return false;
  for (int32_t i = 0; i < n; ++i) {
    if (indptr[i + 1] < indptr[i]) return false;
  }
  return true;
}

// A CSR list of chunks (slots and lengths), as the paged and prefill kernels take it.
bool ValidChunkList(const KvCacheView& kv, int32_t n, const int32_t* indptr, const int32_t* slot,
                    const int32_t* len) {
  if (!ValidIndptr(indptr, n)) return false;
  const int32_t total = indptr[n];
  if (total > 0 && (slot == nullptr || len == nullptr)) return false;
  for (int32_t j = 0; j < total; ++j) {
    if (!ValidChunk(kv, slot[j], len[j])) return false;
  }
  return true;
}

bool ValidPlan(const TppPlanView& plan, const KvCacheView& kv) {
  if (plan.num_seqs < 0 || plan.num_shared < 0 || plan.num_partial_rows < 0) return false;
  if (plan.num_shared > 0 && (plan.shared_slot == nullptr || plan.shared_len == nullptr ||
                              plan.shared_seq_begin == nullptr || plan.shared_seq_end == nullptr ||
                              plan.shared_partial_offset == nullptr)) {
    return false;
  }
  for (int32_t i = 0; i < plan.num_shared; ++i) {
    const int32_t begin = plan.shared_seq_begin[i];
    const int32_t end = plan.shared_seq_end[i];
    const int32_t offset = plan.shared_partial_offset[i];
    if (!ValidChunk(kv, plan.shared_slot[i], plan.shared_len[i]) || begin < 0 ||
        end > plan.num_seqs || end - begin < 2 || offset < 0 ||
        static_cast<int64_t>(offset) + (end - begin) > plan.num_partial_rows) {
      return false;
    }
  }
  if (!ValidIndptr(plan.seq_shared_indptr, plan.num_seqs)) return false;
  const int32_t num_refs = plan.seq_shared_indptr[plan.num_seqs];
  if (num_refs > 0 && plan.seq_shared_ids == nullptr) return false;
  for (int32_t s = 0; s < plan.num_seqs; ++s) {
    for (int32_t j = plan.seq_shared_indptr[s]; j < plan.seq_shared_indptr[s + 1]; ++j) {
      const int32_t i = plan.seq_shared_ids[j];
      if (i < 0 || i >= plan.num_shared || s < plan.shared_seq_begin[i] ||
          s >= plan.shared_seq_end[i]) {
        return false;
      }
    }
  }
  return ValidChunkList(kv, plan.num_seqs, plan.private_indptr, plan.private_slot,
                        plan.private_len);
}

// Threads a call runs on.
int32_t Threads(const ThreadPool& pool, int32_t requested) {
  return requested > 0 && requested < pool.num_threads() ? requested : pool.num_threads();
}

// The workspace's pieces, from a (possibly unaligned) base pointer.
struct WorkspaceLayout {
  size_t o_part = 0, m_part = 0, l_part = 0, seq_o = 0, seq_m = 0, seq_l = 0, seg_begin = 0,
         seg_task_begin = 0, seg_first = 0, seq_direct = 0, total = 0;
};

WorkspaceLayout LayoutFor(const TppPlanView& plan, int32_t num_qo_heads, int32_t head_dim) {
  WorkspaceLayout w;
  if (plan.num_shared <= 0) return w;
  const size_t rows =
      static_cast<size_t>(plan.num_partial_rows) * static_cast<size_t>(num_qo_heads);
  const size_t ints = static_cast<size_t>(plan.num_shared) + 1;
  size_t at = 0;
  w.o_part = at;
  at += AlignUp(rows * static_cast<size_t>(PaddedHeadDim(head_dim)) * sizeof(float));
  w.m_part = at;
  at += AlignUp(rows * sizeof(float));
  w.l_part = at;
  at += AlignUp(rows * sizeof(float));
  const size_t seq_rows = static_cast<size_t>(plan.num_seqs) * static_cast<size_t>(num_qo_heads);
  w.seq_o = at;
  at += AlignUp(seq_rows * static_cast<size_t>(PaddedHeadDim(head_dim)) * sizeof(float));
  w.seq_m = at;
  at += AlignUp(seq_rows * sizeof(float));
  w.seq_l = at;
  at += AlignUp(seq_rows * sizeof(float));
  w.seg_begin = at;
  at += AlignUp(ints * sizeof(int32_t));
  w.seg_task_begin = at;
  at += AlignUp(ints * sizeof(int32_t));
  w.seg_first = at;
  at += AlignUp(static_cast<size_t>(plan.num_shared));
  w.seq_direct = at;
  at += AlignUp(static_cast<size_t>(plan.num_seqs));
  w.total = at + kAlign;  // slack to align the caller's pointer
  return w;
}

// Plans the chunk-first tasks. A task walks a segment (a run of consecutive shared chunks with the
// same row range: one online softmax, one partial per row instead of one per chunk), a block of
// rows, and one KV head, or, for runs with at most kStreamRows rows (streaming, memory-bound), a
// range of KV heads, whose blocks are adjacent in the arena. Segments are as long as the balance
// allows: about kTasksPerThread tasks per thread.
void BuildSegments(const TppPlanView& plan, int32_t num_kv_heads, int32_t group, int32_t head_dim,
                   size_t scratch_bytes, int32_t threads, TppWorkspace* ws) {
  constexpr int64_t kTasksPerThread = 8;
  auto rows = [&](int32_t i) {
    return static_cast<int64_t>(plan.shared_seq_end[i] - plan.shared_seq_begin[i]) * group;
  };
  auto streams = [&](int32_t i) { return rows(i) <= kStreamRows; };
  auto blocks = [&](int32_t i) { return (rows(i) + kBlockRows - 1) / kBlockRows; };
  const int64_t target = kTasksPerThread * threads;

  // Streaming runs: KV heads per task, as many as the scratch holds (within a quarter of L2) and
  // the balance allows.
  int64_t stream_units = 0;
  for (int32_t i = 0; i < plan.num_shared; ++i) stream_units += streams(i) ? num_kv_heads : 0;
  constexpr int64_t kHeadStateBudgetFloats = (256 << 10) / sizeof(float);
  const int64_t unit_floats = SequenceUnitFloats(head_dim);
  const int64_t fit = std::max<int64_t>(
      1, std::min(static_cast<int64_t>(scratch_bytes / sizeof(float)), kHeadStateBudgetFloats) /
             unit_floats);
  int64_t heads =
      std::clamp<int64_t>(stream_units / target, 1, std::min<int64_t>(fit, num_kv_heads));
  const int64_t head_blocks = (num_kv_heads + heads - 1) / heads;
  heads = (num_kv_heads + head_blocks - 1) / head_blocks;  // balanced ranges

  auto tasks_of = [&](int32_t i) { return streams(i) ? head_blocks : blocks(i) * num_kv_heads; };
  int64_t one_chunk_tasks = 0;
  for (int32_t i = 0; i < plan.num_shared; ++i) one_chunk_tasks += tasks_of(i);
  const int64_t max_chunks = one_chunk_tasks <= target ? 1 : one_chunk_tasks / target;

  int32_t num_segments = 0;
  int64_t tasks = 0;
  for (int32_t i = 0; i < plan.num_shared;) {
    int32_t j = i + 1;
    while (j < plan.num_shared && plan.shared_seq_begin[j] == plan.shared_seq_begin[i] &&
           plan.shared_seq_end[j] == plan.shared_seq_end[i]) {
      ++j;
    }
    const int64_t run = j - i;
    const int64_t pieces = (run + max_chunks - 1) / max_chunks;
    for (int32_t c = i; c < j; ++c) ws->seg_first[c] = 0;
    for (int64_t k = 0; k < pieces; ++k) {
      ws->seg_begin[num_segments] = static_cast<int32_t>(i + run * k / pieces);
      ws->seg_first[ws->seg_begin[num_segments]] = 1;
      ws->seg_task_begin[num_segments] = static_cast<int32_t>(tasks);
      tasks += tasks_of(i);
      ++num_segments;
    }
    i = j;
  }
  ws->seg_begin[num_segments] = plan.num_shared;
  ws->seg_task_begin[num_segments] = static_cast<int32_t>(tasks);
  ws->num_segments = num_segments;
  for (int32_t s = 0; s < plan.num_seqs; ++s) {
    int32_t segments = 0;
    for (int32_t j = plan.seq_shared_indptr[s]; j < plan.seq_shared_indptr[s + 1]; ++j) {
      segments += ws->seg_first[plan.seq_shared_ids[j]];
    }
    ws->seq_direct[s] = segments == 1 && plan.private_indptr[s + 1] == plan.private_indptr[s];
  }
  ws->stream_heads_per_task = static_cast<int32_t>(heads);
}

}  // namespace

size_t TppDecodeWorkspaceBytes(const TppPlanView& plan, int32_t num_qo_heads, int32_t head_dim) {
  if (num_qo_heads <= 0 || head_dim <= 0) return 0;
  return LayoutFor(plan, num_qo_heads, head_dim).total;
}

KernelStatus TppDecode(const TppDecodeParams& p) {
  if (p.q == nullptr || p.o == nullptr || p.pool == nullptr || !ValidKv(p.kv, p.num_qo_heads) ||
      !ValidPlan(p.plan, p.kv)) {
    return KernelStatus::kInvalidArgument;
  }
  KernelStatus status;
  const CpuIsa isa = ResolveAttentionIsa(p.isa, &status);
  if (status != KernelStatus::kOk) return status;

  TppWorkspace ws;
  const int32_t threads = Threads(*p.pool, p.num_threads);
  const int32_t group = p.num_qo_heads / p.kv.num_kv_heads;
  if (p.pool->scratch_bytes() < SequenceScratchBytes(p.kv.head_dim, group) ||
      (SequenceUsesBlocks(group) &&
       p.pool->scratch_bytes() < BlockScratchBytes(p.kv.head_dim, p.kv.chunk_size))) {
    return KernelStatus::kResourceExhausted;
  }
  if (p.plan.num_shared > 0) {
    const WorkspaceLayout layout = LayoutFor(p.plan, p.num_qo_heads, p.kv.head_dim);
    if (p.workspace == nullptr || p.workspace_bytes < layout.total ||
        p.pool->scratch_bytes() < BlockScratchBytes(p.kv.head_dim, p.kv.chunk_size)) {
      return KernelStatus::kResourceExhausted;
    }
    const uintptr_t raw = reinterpret_cast<uintptr_t>(p.workspace);
    unsigned char* base = reinterpret_cast<unsigned char*>((raw + kAlign - 1) / kAlign * kAlign);
    ws.o_part = reinterpret_cast<float*>(base + layout.o_part);
    ws.m_part = reinterpret_cast<float*>(base + layout.m_part);
    ws.l_part = reinterpret_cast<float*>(base + layout.l_part);
    ws.seq_o = reinterpret_cast<float*>(base + layout.seq_o);
    ws.seq_m = reinterpret_cast<float*>(base + layout.seq_m);
    ws.seq_l = reinterpret_cast<float*>(base + layout.seq_l);
    ws.seg_begin = reinterpret_cast<int32_t*>(base + layout.seg_begin);
    ws.seg_task_begin = reinterpret_cast<int32_t*>(base + layout.seg_task_begin);
    ws.seg_first = base + layout.seg_first;
    ws.seq_direct = base + layout.seq_direct;
    BuildSegments(p.plan, p.kv.num_kv_heads, p.num_qo_heads / p.kv.num_kv_heads, p.kv.head_dim,
                  p.pool->scratch_bytes(), threads, &ws);
  }
  if (isa == CpuIsa::kAvx512) {
    avx512::TppDecode(p, ws, threads);
  } else if (isa == CpuIsa::kAvx2) {
    avx2::TppDecode(p, ws, threads);
  } else {
    scalar::TppDecode(p, ws, threads);
  }
  return KernelStatus::kOk;
}

KernelStatus PagedDecode(const PagedDecodeParams& p) {
  if (p.q == nullptr || p.o == nullptr || p.pool == nullptr || p.num_seqs < 0 ||
      !ValidKv(p.kv, p.num_qo_heads) ||
      !ValidChunkList(p.kv, p.num_seqs, p.block_indptr, p.block_slot, p.block_len) ||
      (p.order != PagedTaskOrder::kSequenceMajor && p.order != PagedTaskOrder::kHeadMajor)) {
    return KernelStatus::kInvalidArgument;
  }
  KernelStatus status;
  const CpuIsa isa = ResolveAttentionIsa(p.isa, &status);
  if (status != KernelStatus::kOk) return status;
  if (p.pool->scratch_bytes() <
      SequenceScratchBytes(p.kv.head_dim, p.num_qo_heads / p.kv.num_kv_heads)) {
    return KernelStatus::kResourceExhausted;
  }
  const int32_t threads = Threads(*p.pool, p.num_threads);
  if (isa == CpuIsa::kAvx512) {
    avx512::PagedDecode(p, threads);
  } else if (isa == CpuIsa::kAvx2) {
    avx2::PagedDecode(p, threads);
  } else {
    scalar::PagedDecode(p, threads);
  }
  return KernelStatus::kOk;
}

KernelStatus PrefillAttention(const PrefillAttentionParams& p) {
  if (p.q == nullptr || p.o == nullptr || p.pool == nullptr || p.num_seqs < 0 ||
      !ValidKv(p.kv, p.num_qo_heads) || !ValidIndptr(p.q_indptr, p.num_seqs) ||
      !ValidChunkList(p.kv, p.num_seqs, p.chunk_indptr, p.chunk_slot, p.chunk_len)) {
    return KernelStatus::kInvalidArgument;
  }
  if (p.q_indptr[p.num_seqs] > 0 && p.q_pos == nullptr) return KernelStatus::kInvalidArgument;
  for (int32_t s = 0; s < p.num_seqs; ++s) {
    const int32_t first = p.chunk_indptr[s];
    const int32_t last = p.chunk_indptr[s + 1];
    const int64_t path_len =
        last == first
            ? 0
            : static_cast<int64_t>(last - first - 1) * p.kv.chunk_size + p.chunk_len[last - 1];
    for (int32_t i = p.q_indptr[s]; i < p.q_indptr[s + 1]; ++i) {
      if (p.q_pos[i] < 0 || p.q_pos[i] >= path_len) return KernelStatus::kInvalidArgument;
    }
  }
  KernelStatus status;
  const CpuIsa isa = ResolveAttentionIsa(p.isa, &status);
  if (status != KernelStatus::kOk) return status;
  if (p.q_indptr[p.num_seqs] > 0 &&
      p.pool->scratch_bytes() < BlockScratchBytes(p.kv.head_dim, p.kv.chunk_size)) {
    return KernelStatus::kResourceExhausted;
  }
  const int32_t threads = Threads(*p.pool, p.num_threads);
  if (isa == CpuIsa::kAvx512) {
    avx512::PrefillAttention(p, threads);
  } else if (isa == CpuIsa::kAvx2) {
    avx2::PrefillAttention(p, threads);
  } else {
    scalar::PrefillAttention(p, threads);
  }
  return KernelStatus::kOk;
}

}  // namespace chunkserve::kernels::cpu
