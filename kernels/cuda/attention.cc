// Host launchers of the attention kernels: validate, fill AttendArgs, pick the dtype's launch.
#include "kernels/cuda/attention.h"

#include <cmath>

#include "kernels/cuda/attention_launch.h"
#include "kernels/cuda/shapes.h"

namespace chunkserve::kernels::cuda {
namespace {

using detail::AttendArgs;
using detail::AttendMode;

constexpr float kLog2e = 1.4426950408889634f;

AttendArgs BaseArgs(const void* q, void* o, const KvCacheView& kv, int32_t num_qo_heads,
                    float sm_scale, AttendMode mode) {
  AttendArgs a{};
  a.q = q;
  a.o = o;
  a.k = kv.k;
  a.v = kv.v;
  a.num_slots = kv.num_slots;
  a.num_kv_heads = kv.num_kv_heads;
  a.chunk_size = kv.chunk_size;
  a.num_qo_heads = num_qo_heads;
  a.group = num_qo_heads / kv.num_kv_heads;
  a.scale_log2 = sm_scale * kLog2e;
  a.mode = mode;
  return a;
}

const char* CheckCommon(const void* q, const void* o, const KvCacheView& kv, int32_t num_qo_heads,
                        float sm_scale) {
  if (const char* e = CheckAttentionShape(ShapeOf(kv, num_qo_heads))) return e;
  if (const char* e = CheckAttentionPointers(q, o, kv)) return e;
  if (!std::isfinite(sm_scale)) return "sm_scale must be finite";
  return nullptr;
}

cudaError_t LaunchAttend(DType dtype, const AttendArgs& a, int32_t head_dim, dim3 grid,
                         cudaStream_t stream) {
  const size_t smem = detail::AttendSmem(head_dim, a.chunk_size);
  return dtype == DType::kF16 ? detail::LaunchAttendF16(a, head_dim, grid, smem, stream)
                              : detail::LaunchAttendBf16(a, head_dim, grid, smem, stream);
}

}  // namespace

size_t AttendSmemBytes(int32_t head_dim, int32_t chunk_size) {
  return detail::AttendSmem(head_dim, chunk_size);
}

cudaError_t TppDecode(const TppDecodeParams& p, cudaStream_t stream) {
  if (CheckCommon(p.q, p.o, p.kv, p.num_qo_heads, p.sm_scale) != nullptr) {
    return cudaErrorInvalidValue;
  }
  if (p.plan == nullptr || !p.plan->ready()) return cudaErrorInvalidValue;
  const TppDeviceSchedule s = p.plan->view();
  if (s.shape.num_qo_heads != p.num_qo_heads || s.shape.num_kv_heads != p.kv.num_kv_heads ||
      s.shape.chunk_size != p.kv.chunk_size || s.shape.num_slots != p.kv.num_slots) {
    return cudaErrorInvalidValue;  // the plan was built (and validated) for another shape
  }
  const size_t need = p.plan->WorkspaceBytes(p.kv.head_dim);
  if (p.workspace_bytes < need ||
      (need > 0 && (p.workspace == nullptr || !Aligned16(p.workspace)))) {
    return cudaErrorInvalidValue;
  }
  if (s.num_seqs == 0) return cudaSuccess;
  float* part_o = static_cast<float*>(p.workspace);
  float* part_ml = part_o == nullptr
                       ? nullptr
                       : part_o + static_cast<size_t>(s.num_partial_entries) * p.kv.head_dim;

  if (s.num_tasks > 0) {
    AttendArgs a = BaseArgs(p.q, p.o, p.kv, p.num_qo_heads, p.sm_scale, AttendMode::kTpp);
    a.tasks = s.tasks;
    a.chunk_slot = s.chunk_slot;
    a.chunk_len = s.chunk_len;
    a.part_o = part_o;
    a.part_ml = part_ml;
    const dim3 grid(static_cast<unsigned>(s.num_tasks), static_cast<unsigned>(p.kv.num_kv_heads));
    const cudaError_t err = LaunchAttend(p.kv.dtype, a, p.kv.head_dim, grid, stream);
    if (err != cudaSuccess) return err;
  }
  if (s.num_merge > 0) {
    detail::MergeArgs m{};
    m.merge_seq = s.merge_seq;
    m.merge_indptr = s.merge_indptr;
    m.merge_entry = s.merge_entry;
    m.part_o = part_o;
    m.part_ml = part_ml;
    m.o = p.o;
    m.num_merge = s.num_merge;
    m.num_qo_heads = p.num_qo_heads;
    return p.kv.dtype == DType::kF16 ? detail::LaunchMergeF16(m, p.kv.head_dim, stream)
                                     : detail::LaunchMergeBf16(m, p.kv.head_dim, stream);
  }
  return cudaSuccess;
}

cudaError_t PagedDecode(const PagedDecodeParams& p, cudaStream_t stream) {
  if (CheckCommon(p.q, p.o, p.kv, p.num_qo_heads, p.sm_scale) != nullptr) {
    return cudaErrorInvalidValue;
  }
  if (p.num_seqs < 0) return cudaErrorInvalidValue;
  if (p.num_seqs == 0) return cudaSuccess;
  if (p.block_indptr == nullptr || p.block_slot == nullptr || p.block_len == nullptr) {
    return cudaErrorInvalidValue;
  }
  const int32_t group = p.num_qo_heads / p.kv.num_kv_heads;
  const int64_t row_blocks = (group + kRowsPerTask - 1) / kRowsPerTask;
  const int64_t blocks = int64_t{p.num_seqs} * row_blocks * p.kv.num_kv_heads;
  if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
  AttendArgs a = BaseArgs(p.q, p.o, p.kv, p.num_qo_heads, p.sm_scale, AttendMode::kPaged);
  a.chunk_indptr = p.block_indptr;
  a.chunk_slot = p.block_slot;
  a.chunk_len = p.block_len;
  a.row_blocks = static_cast<int32_t>(row_blocks);
  return LaunchAttend(p.kv.dtype, a, p.kv.head_dim, dim3(static_cast<unsigned>(blocks)), stream);
}

cudaError_t PrefillAttention(const PrefillAttentionParams& p, cudaStream_t stream) {
  if (CheckCommon(p.q, p.o, p.kv, p.num_qo_heads, p.sm_scale) != nullptr) {
    return cudaErrorInvalidValue;
  }
  if (p.num_seqs < 0 || p.max_q_per_seq < 0) return cudaErrorInvalidValue;
  if (p.num_seqs == 0 || p.max_q_per_seq == 0) return cudaSuccess;
  if (p.q_indptr == nullptr || p.q_pos == nullptr || p.chunk_indptr == nullptr ||
      p.chunk_slot == nullptr || p.chunk_len == nullptr) {
    return cudaErrorInvalidValue;
  }
  const int32_t group = p.num_qo_heads / p.kv.num_kv_heads;
  const int64_t blocks_per_seq =
      (int64_t{p.max_q_per_seq} * group + kRowsPerTask - 1) / kRowsPerTask;
  const int64_t blocks = blocks_per_seq * p.num_seqs;
  if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
  AttendArgs a = BaseArgs(p.q, p.o, p.kv, p.num_qo_heads, p.sm_scale, AttendMode::kPrefill);
  a.chunk_indptr = p.chunk_indptr;
  a.chunk_slot = p.chunk_slot;
  a.chunk_len = p.chunk_len;
  a.q_indptr = p.q_indptr;
  a.q_pos = p.q_pos;
  a.row_blocks = static_cast<int32_t>(blocks_per_seq);
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(p.kv.num_kv_heads));
  return LaunchAttend(p.kv.dtype, a, p.kv.head_dim, grid, stream);
}

}  // namespace chunkserve::kernels::cuda
