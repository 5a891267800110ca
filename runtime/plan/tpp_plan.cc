#include "runtime/plan/tpp_plan.h"

#include <algorithm>

namespace chunkserve::plan {

void TppPlan::Clear() {
  tree_ = nullptr;
  rows_.clear();
  last_input_.clear();
  row_state_.clear();
  shared_chunk_.clear();
  arrays_.shared_slot.clear();
  arrays_.shared_len.clear();
  arrays_.shared_seq_begin.clear();
  arrays_.shared_seq_end.clear();
  arrays_.shared_partial_offset.clear();
  arrays_.num_partial_rows = 0;
  arrays_.seq_shared_indptr.assign(1, 0);
  arrays_.seq_shared_ids.clear();
  private_chunk_.clear();
  arrays_.private_indptr.assign(1, 0);
  arrays_.private_slot.clear();
  arrays_.private_len.clear();
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
  arrays_.shared_slot.resize(num_shared);
  arrays_.shared_len.resize(num_shared);
  arrays_.shared_seq_begin.resize(num_shared);
  arrays_.shared_seq_end.resize(num_shared);
  arrays_.shared_partial_offset.resize(num_shared);
  row_state_.assign(b, RowState());
  arrays_.num_partial_rows = 0;
  for (size_t g = 0; g < num_shared; ++g) {
    const kv::BatchGroup& group = groups_[g];
    shared_chunk_[g] = group.chunk;
    arrays_.shared_slot[g] = static_cast<int32_t>(tree.ChunkSlot(group.chunk).value());
    arrays_.shared_len[g] = tree.ChunkLen(group.chunk);
    arrays_.shared_seq_begin[g] = group.begin;
    arrays_.shared_seq_end[g] = group.end;
    arrays_.shared_partial_offset[g] = arrays_.num_partial_rows;
    arrays_.num_partial_rows += group.end - group.begin;
    for (int32_t s = group.begin; s < group.end; ++s) {
      row_state_[s].shared_depth = std::max(row_state_[s].shared_depth, group.depth + 1);
    }
  }

  // Per row, its shared chunks root first: the group at depth d goes to slot indptr[s] + d.
  arrays_.seq_shared_indptr.resize(b + 1);
  arrays_.seq_shared_indptr[0] = 0;
  for (size_t s = 0; s < b; ++s) {
    arrays_.seq_shared_indptr[s + 1] = arrays_.seq_shared_indptr[s] + row_state_[s].shared_depth;
  }
  arrays_.seq_shared_ids.resize(static_cast<size_t>(arrays_.seq_shared_indptr[b]));
  for (size_t g = 0; g < num_shared; ++g) {
    const kv::BatchGroup& group = groups_[g];
    for (int32_t s = group.begin; s < group.end; ++s) {
      arrays_.seq_shared_ids[arrays_.seq_shared_indptr[s] + group.depth] = static_cast<int32_t>(g);
    }
  }
  FillPrivate(tree, infos_);
  return Status::Ok();
}

void TppPlan::FillPrivate(const kv::PrefixTree& tree, std::span<const kv::SeqInfo> infos) {
  arrays_.private_indptr.resize(rows_.size() + 1);
  arrays_.private_indptr[0] = 0;
  private_chunk_.clear();
  arrays_.private_slot.clear();
  arrays_.private_len.clear();
  for (size_t s = 0; s < rows_.size(); ++s) {
    const kv::SeqInfo& info = infos[s];
    RowState& row = row_state_[s];
    row.layout_version = info.layout_version;
    row.path_size = static_cast<int32_t>(info.path.size());
    for (size_t k = static_cast<size_t>(row.shared_depth); k < info.path.size(); ++k) {
      private_chunk_.push_back(info.path[k]);
      arrays_.private_slot.push_back(static_cast<int32_t>(tree.ChunkSlot(info.path[k]).value()));
      arrays_.private_len.push_back(tree.ChunkLen(info.path[k]));
    }
    arrays_.private_indptr[s + 1] = static_cast<int32_t>(private_chunk_.size());
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
    if (arrays_.private_indptr[s + 1] > arrays_.private_indptr[s]) {
      arrays_.private_len[arrays_.private_indptr[s + 1] - 1] = tree.ChunkLen(infos_[s].path.back());
    }
  }
  last_update_ = UpdateKind::kLengths;
  return Status::Ok();
}

kernels::TppPlanView TppPlan::view() const {
  kernels::TppPlanView v = arrays_.View();
  v.num_seqs = num_seqs();
  v.num_shared = num_shared();
  return v;
}

}  // namespace chunkserve::plan
