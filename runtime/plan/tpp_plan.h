// TppPlan: the two-phase-partition work lists of one decode batch (kernels/README.md), built
// from the prefix tree and handed to the kernels as a kernels::TppPlanView.
//
// Rows. The plan orders the batch itself, in the tree's DFS order (PrefixTree::GroupBatch), so
// that every chunk two or more rows use covers a contiguous row range. Row i of the view is
// rows()[i]; the engine lays out queries and reads outputs in that order.
//
// Contents (exactly kernels::TppPlanView; see kernels/attention_params.h):
//  - shared chunks: chunks used by >= 2 rows *of this batch*, each with its row range, length and
//    partial-result offset (in pre-order: by first row, then depth). A chunk that sequences
//    outside the batch also use, but only one row here, is private to that row in this plan.
//  - per row, the CSR list of its shared chunks (indices into the shared list, root first) and of
//    its private chunks (slot, length). The shared chunks of a row are a prefix of its path (a
//    chunk's ancestors are used by at least the same rows), the private ones the rest, so each
//    token of the row's path is covered exactly once.
//  - num_partial_rows: sum over shared chunks of their row counts, for workspace sizing.
//
// Updating. Call Update(tree, batch) every step; it does the least work that yields the same plan
// as Build, knowing that between calls
//  (a) a shared chunk is never written (ref_count > 1), so only a row's last, private chunk can
//      grow: O(batch), reading one length per row (UpdateKind::kLengths);
//  (b) a row whose path only grew (its tail filled and a new private chunk followed) changes its
//      private list and nothing else: the private CSR is rewritten, O(batch + private chunks)
//      (kPrivateLists);
//  (c) anything else - the batch is a different set, a row's path had a chunk replaced
//      (copy-on-write, seen through SeqInfo::layout_version), another tree - rebuilds: O(batch +
//      sum of path lengths) (kRebuild).
// The batch passed to Update may be in any order; passing rows() or the same order as last time is
// recognised in O(batch), another order of the same set costs a sort.
//
// Ownership: the view's pointers point into this object and stay valid until the next Build,
// Update or destruction. The plan does not keep the tree alive; it remembers its address only to
// detect a different tree.
//
// Errors: NotFound for a sequence the tree does not know, InvalidArgument for a duplicate. On
// error the plan is left empty (num_seqs == 0), never stale.
//
// Thread safety: none; one plan per engine step thread.
#ifndef CHUNKSERVE_RUNTIME_PLAN_TPP_PLAN_H_
#define CHUNKSERVE_RUNTIME_PLAN_TPP_PLAN_H_

#include <cstdint>
#include <span>
#include <vector>

#include "kernels/attention_params.h"
#include "runtime/base/ids.h"
#include "runtime/base/status.h"
#include "runtime/kvcache/prefix_tree.h"

namespace chunkserve::plan {

class TppPlan {
 public:
  enum class UpdateKind { kNone, kLengths, kPrivateLists, kRebuild };

  TppPlan() = default;

  // Builds from scratch for `batch` (any order, no duplicates).
  Status Build(const kv::PrefixTree& tree, std::span<const SeqId> batch);
  // Brings the plan up to date for `batch` with the cheapest of the paths above.
  Status Update(const kv::PrefixTree& tree, std::span<const SeqId> batch);

  kernels::TppPlanView view() const;
  // Batch order: row i is rows()[i].
  std::span<const SeqId> rows() const { return rows_; }
  int32_t num_seqs() const { return static_cast<int32_t>(rows_.size()); }
  int32_t num_shared() const { return static_cast<int32_t>(shared_chunk_.size()); }
  int32_t num_private() const { return static_cast<int32_t>(private_chunk_.size()); }
  int32_t num_partial_rows() const { return arrays_.num_partial_rows; }
  // Tree chunk ids parallel to the view's shared and private arrays (tests, debugging).
  std::span<const ChunkId> shared_chunks() const { return shared_chunk_; }
  std::span<const ChunkId> private_chunks() const { return private_chunk_; }
  // What the last Build/Update did.
  UpdateKind last_update() const { return last_update_; }

 private:
  struct RowState {
    uint64_t layout_version = 0;
    int32_t path_size = 0;
    int32_t shared_depth = 0;  // the first shared_depth chunks of the path are shared
  };

  void Clear();
  Status Rebuild(const kv::PrefixTree& tree, std::span<const SeqId> batch);
  bool SameSet(std::span<const SeqId> batch);
  void FillPrivate(const kv::PrefixTree& tree, std::span<const kv::SeqInfo> infos);

  const kv::PrefixTree* tree_ = nullptr;
  std::vector<SeqId> rows_;
  std::vector<SeqId> last_input_;  // the batch as last passed, to recognise it cheaply
  std::vector<RowState> row_state_;

  std::vector<ChunkId> shared_chunk_;
  std::vector<ChunkId> private_chunk_;
  kernels::TppPlanArrays arrays_;  // what view() points into
  UpdateKind last_update_ = UpdateKind::kNone;

  // Scratch.
  std::vector<kv::BatchGroup> groups_;
  std::vector<kv::SeqInfo> infos_;
  std::vector<SeqId> sorted_a_, sorted_b_;
};

}  // namespace chunkserve::plan

#endif  // CHUNKSERVE_RUNTIME_PLAN_TPP_PLAN_H_
