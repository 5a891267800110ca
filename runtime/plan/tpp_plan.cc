#include "runtime/plan/tpp_plan.h"

#include <algorithm>

namespace chunkserve::plan {

void TppPlan::Clear() {
  tree_ = nullptr;
  rows_.clear();
  last_input_.clear();
  row_state_.clear();
  shared_chunk_.clear();
  shared_slot_.clear();
  shared_len_.clear();
  shared_seq_begin_.clear();
  shared_seq_end_.clear();
  shared_partial_offset_.clear();
  num_partial_rows_ = 0;
  seq_shared_indptr_.assign(1, 0);
  seq_shared_ids_.clear();
  private_chunk_.clear();
  private_indptr_.assign(1, 0);
  private_slot_.clear();
  private_len_.clear();
}

Status TppPlan::Build(const kv::PrefixTree& tree, std::span<const SeqId> batch) {
  Status status = Rebuild(tree, batch);
  if (!status.ok()) Clear();
  return status;
}

Status TppPlan::Rebuild(const kv::PrefixTree& tree, std::span<const SeqId> batch) {
  last_update_ = UpdateKind::kRebuild;
  CHUNKSERVE_RETURN_IF_ERROR(tree.GroupBatch(batch, &rows_, &groups_));
  tree_ = &tree;
  last_input_.assign(batch.begin(), batch.end());
  const size_t b = rows_.size();
  infos_.resize(b);
  for (size_t i = 0; i < b; ++i) {
    CHUNKSERVE_ASSIGN_OR_RETURN(infos_[i], tree.Seq(rows_[i]));
  }

  // Phase 1 list, in GroupBatch's pre-order.
  const size_t num_shared = groups_.size();
  shared_chunk_.resize(num_shared);
  shared_slot_.resize(num_shared);
  shared_len_.resize(num_shared);
  shared_seq_begin_.resize(num_shared);
  shared_seq_end_.resize(num_shared);
  shared_partial_offset_.resize(num_shared);
  row_state_.assign(b, RowState());
  num_partial_rows_ = 0;
  for (size_t g = 0; g < num_shared; ++g) {
    const kv::BatchGroup& group = groups_[g];
    shared_chunk_[g] = group.chunk;
    shared_slot_[g] = static_cast<int32_t>(tree.ChunkSlot(group.chunk).value());
    shared_len_[g] = tree.ChunkLen(group.chunk);
    shared_seq_begin_[g] = group.begin;
    shared_seq_end_[g] = group.end;
    shared_partial_offset_[g] = num_partial_rows_;
    num_partial_rows_ += group.end - group.begin;
    for (int32_t s = group.begin; s < group.end; ++s) {
      row_state_[s].shared_depth = std::max(row_state_[s].shared_depth, group.depth + 1);
    }
  }

  // Per row, its shared chunks root first: the group at depth d goes to slot indptr[s] + d.
  seq_shared_indptr_.resize(b + 1);
  seq_shared_indptr_[0] = 0;
  for (size_t s = 0; s < b; ++s) {
    seq_shared_indptr_[s + 1] = seq_shared_indptr_[s] + row_state_[s].shared_depth;
  }
  seq_shared_ids_.resize(static_cast<size_t>(seq_shared_indptr_[b]));
  for (size_t g = 0; g < num_shared; ++g) {
    const kv::BatchGroup& group = groups_[g];
    for (int32_t s = group.begin; s < group.end; ++s) {
      seq_shared_ids_[seq_shared_indptr_[s] + group.depth] = static_cast<int32_t>(g);
    }
  }
  FillPrivate(tree, infos_);
  return Status::Ok();
}

void TppPlan::FillPrivate(const kv::PrefixTree& tree, std::span<const kv::SeqInfo> infos) {
  private_indptr_.resize(rows_.size() + 1);
  private_indptr_[0] = 0;
  private_chunk_.clear();
  private_slot_.clear();
  private_len_.clear();
  for (size_t s = 0; s < rows_.size(); ++s) {
    const kv::SeqInfo& info = infos[s];
    RowState& row = row_state_[s];
    row.layout_version = info.layout_version;
    row.path_size = static_cast<int32_t>(info.path.size());
    for (size_t k = static_cast<size_t>(row.shared_depth); k < info.path.size(); ++k) {
      private_chunk_.push_back(info.path[k]);
      private_slot_.push_back(static_cast<int32_t>(tree.ChunkSlot(info.path[k]).value()));
      private_len_.push_back(tree.ChunkLen(info.path[k]));
    }
    private_indptr_[s + 1] = static_cast<int32_t>(private_chunk_.size());
  }
}

bool TppPlan::SameSet(std::span<const SeqId> batch) {
  if (batch.size() != rows_.size()) return false;
  if (std::equal(batch.begin(), batch.end(), rows_.begin())) return true;
  if (std::equal(batch.begin(), batch.end(), last_input_.begin())) return true;
  sorted_a_.assign(batch.begin(), batch.end());
  sorted_b_.assign(rows_.begin(), rows_.end());
  std::sort(sorted_a_.begin(), sorted_a_.end());
  std::sort(sorted_b_.begin(), sorted_b_.end());
  if (sorted_a_ != sorted_b_) return false;
  last_input_.assign(batch.begin(), batch.end());
  return true;
}

Status TppPlan::Update(const kv::PrefixTree& tree, std::span<const SeqId> batch) {
  if (tree_ != &tree || !SameSet(batch)) return Build(tree, batch);
  const size_t b = rows_.size();
  infos_.resize(b);
  bool grew = false;
  for (size_t s = 0; s < b; ++s) {
    Result<kv::SeqInfo> info = tree.Seq(rows_[s]);
    if (!info.ok()) {
      Clear();
      return info.status();
    }
    infos_[s] = *info;
    const RowState& row = row_state_[s];
    const int32_t path_size = static_cast<int32_t>(info->path.size());
    if (info->layout_version != row.layout_version || path_size < row.path_size) {
      return Build(tree, batch);
    }
    grew |= path_size != row.path_size;
  }
  if (grew) {
    FillPrivate(tree, infos_);
    last_update_ = UpdateKind::kPrivateLists;
    return Status::Ok();
  }
  for (size_t s = 0; s < b; ++s) {
    if (private_indptr_[s + 1] > private_indptr_[s]) {
      private_len_[private_indptr_[s + 1] - 1] = tree.ChunkLen(infos_[s].path.back());
    }
  }
  last_update_ = UpdateKind::kLengths;
  return Status::Ok();
}

kernels::TppPlanView TppPlan::view() const {
  kernels::TppPlanView v;
  v.num_seqs = static_cast<int32_t>(rows_.size());
  v.num_shared = static_cast<int32_t>(shared_chunk_.size());
  v.shared_slot = shared_slot_.data();
  v.shared_len = shared_len_.data();
  v.shared_seq_begin = shared_seq_begin_.data();
  v.shared_seq_end = shared_seq_end_.data();
  v.shared_partial_offset = shared_partial_offset_.data();
  v.num_partial_rows = num_partial_rows_;
  v.seq_shared_indptr = seq_shared_indptr_.data();
  v.seq_shared_ids = seq_shared_ids_.data();
  v.private_indptr = private_indptr_.data();
  v.private_slot = private_slot_.data();
  v.private_len = private_len_.data();
  return v;
}

}  // namespace chunkserve::plan
