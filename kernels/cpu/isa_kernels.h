// Internal: the per-ISA entry points behind attention.h, kv_append.h and gemm.h, and the sizes both
// sides agree on. attention_impl.h defines them once per ISA namespace (avx512, avx2, scalar),
// gemm_impl.h once per vector (avx512::zmm, avx2, scalar); attention.cc, kv_append.cc and gemm.cc
// validate params, resolve the ISA and call one of them. Nothing here validates.
#ifndef CHUNKSERVE_KERNELS_CPU_ISA_KERNELS_H_
#define CHUNKSERVE_KERNELS_CPU_ISA_KERNELS_H_

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/kv_append.h"

namespace chunkserve::kernels::cpu {

// Query rows per chunk-first / prefill tile: the Q^T tile, the score tile and the output tile of
// one task are [head_dim x 64], [chunk_size x 64] and [64 x head_dim] floats, which stay in L2.
inline constexpr int32_t kBlockRows = 64;

// Chunk-first runs with at most this many query rows (sequences x GQA group) take the streaming
// path: GEMM tiles would mostly multiply padding, and so few rows make the work memory-bound.
inline constexpr int32_t kStreamRows = 4;

// TPP's sequence-first phase may run a GQA group of at least this many query heads per KV head
// (and at most kBlockRows) through the GEMM-shaped block tiles instead of streaming units: the
// streaming kernel's per-token reductions and accumulator traffic make it compute-bound there
// (kernels/README.md, "TPP decode"). The AVX-512 build at head dims 64 and 128, whose streaming
// units keep their P V accumulators in registers, takes the tiles only from kBlockGroupMinWide.
inline constexpr int32_t kBlockGroupMin = 4;
inline constexpr int32_t kBlockGroupMinWide = 12;
inline bool SequenceUsesBlocks(int32_t group) {
  return group >= kBlockGroupMin && group <= kBlockRows;
}

inline int32_t PaddedHeadDim(int32_t head_dim) { return (head_dim + 7) & ~7; }

// Scratch of a chunk-first / prefill task (see attention_impl.h's BlockTemps and BlockHead): the
// temporaries shared by its KV heads, and the state of one KV head for blocks of `rows` rows.
inline int64_t BlockTempFloats(int32_t head_dim, int32_t chunk_size) {
  const int64_t dp = PaddedHeadDim(head_dim);
  return int64_t{chunk_size} * kBlockRows + 2 * int64_t{chunk_size} * dp + 3 * int64_t{kBlockRows};
}
inline int64_t BlockHeadFloats(int32_t head_dim, int32_t rows) {
  const int64_t rp = (rows + 7) & ~7;
  return int64_t{head_dim} * rp + rp * PaddedHeadDim(head_dim) + 2 * rp;
}
// The least per-thread scratch that runs any chunk-first / prefill task (one head, full rows).
inline size_t BlockScratchBytes(int32_t head_dim, int32_t chunk_size) {
  return static_cast<size_t>(BlockTempFloats(head_dim, chunk_size) +
                             BlockHeadFloats(head_dim, kBlockRows)) *
         sizeof(float);
}
// Floats of one sequence-first unit (up to kMaxRowsPerPass query heads of one sequence): scaled
// queries and accumulators of padded head_dim each, running max and sum.
inline int64_t SequenceUnitFloats(int32_t head_dim) {
  return 2 * int64_t{kMaxRowsPerPass} * PaddedHeadDim(head_dim) + 2 * int64_t{kMaxRowsPerPass};
}

// Per-thread scratch a sequence-first task needs at least: the units of one KV head.
inline size_t SequenceScratchBytes(int32_t head_dim, int32_t group) {
  const int64_t passes = (group + kMaxRowsPerPass - 1) / kMaxRowsPerPass;
  return static_cast<size_t>(passes * SequenceUnitFloats(head_dim)) * sizeof(float);
}

// TppDecode's workspace, carved by attention.cc. Partial row i (see TppPlanView) is
// o_part[i * padded_head_dim ...], m_part[i], l_part[i]; m is natural-log based. Row
// seq * num_qo_heads + head of seq_o / seq_m / seq_l is that query head's state over its private
// chunks (unnormalized output, running max in base 2, running sum), which the merge pass combines
// with the partials once both phases are done. The chunk-first
// tasks are runs of shared chunks with the same row range ("segments"): segment g covers shared
// chunks [seg_begin[g], seg_begin[g + 1]) and tasks [seg_task_begin[g], seg_task_begin[g + 1]),
// one per (KV head, block of kBlockRows rows), head major, or for segments of at most
// kStreamRows rows, one per range of stream_heads_per_task KV heads.
struct TppWorkspace {
  float* o_part = nullptr;
  float* m_part = nullptr;
  float* l_part = nullptr;
  float* seq_o = nullptr;
  float* seq_m = nullptr;
  float* seq_l = nullptr;
  int32_t* seg_begin = nullptr;       // [num_segments + 1]
  int32_t* seg_task_begin = nullptr;  // [num_segments + 1]
  // [num_shared]: 1 where a shared chunk begins a segment (its partial rows hold the segment's
  // partial); the partial rows of the segment's other chunks are never written nor read.
  uint8_t* seg_first = nullptr;
  // [num_seqs]: 1 where one segment is all of a sequence (no private chunks, no other segment):
  // that segment's tasks write its output rows, and nothing else touches the sequence.
  uint8_t* seq_direct = nullptr;
  int32_t num_segments = 0;
  int32_t stream_heads_per_task = 1;
};

#define CHUNKSERVE_DECLARE_ISA_KERNELS(isa)                                               \
  namespace isa {                                                                         \
  void TppDecode(const TppDecodeParams& params, const TppWorkspace& ws, int32_t threads); \
  void PagedDecode(const PagedDecodeParams& params, int32_t threads);                     \
  void PrefillAttention(const PrefillAttentionParams& params, int32_t threads);           \
  void KvAppend(const KvAppendParams& params);                                            \
  }
CHUNKSERVE_DECLARE_ISA_KERNELS(avx512)
CHUNKSERVE_DECLARE_ISA_KERNELS(avx2)
CHUNKSERVE_DECLARE_ISA_KERNELS(scalar)
#undef CHUNKSERVE_DECLARE_ISA_KERNELS

// gemm_impl.h: output panels [panel_begin, panel_end) of a validated GemmParams, on the calling
// thread.
#define CHUNKSERVE_DECLARE_ISA_GEMM(isa)                                             \
  namespace isa {                                                                    \
  void GemmPanels(const GemmParams& params, int64_t panel_begin, int64_t panel_end); \
  }
CHUNKSERVE_DECLARE_ISA_GEMM(avx512::zmm)
CHUNKSERVE_DECLARE_ISA_GEMM(avx2)
CHUNKSERVE_DECLARE_ISA_GEMM(scalar)
#undef CHUNKSERVE_DECLARE_ISA_GEMM

}  // namespace chunkserve::kernels::cpu

#endif  // CHUNKSERVE_KERNELS_CPU_ISA_KERNELS_H_
