// Independent checks of a TppPlan against the prefix tree it was built from, shared by the plan
// unit tests and the randomized model test.
#ifndef CHUNKSERVE_TESTS_TESTING_PLAN_CHECK_H_
#define CHUNKSERVE_TESTS_TESTING_PLAN_CHECK_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <span>
#include <sstream>
#include <utility>
#include <vector>

#include "runtime/kvcache/prefix_tree.h"
#include "runtime/plan/tpp_plan.h"

namespace chunkserve::plan::testing {

// What a plan says about one sequence, independent of row order: its shared chunks (root first)
// with the set of sequences each is shared with, and its private chunks with their lengths.
struct RowPlan {
  std::vector<std::pair<ChunkId, std::set<SeqId>>> shared;
  std::vector<std::pair<ChunkId, int32_t>> privates;
  friend bool operator==(const RowPlan&, const RowPlan&) = default;
};

inline std::map<SeqId, RowPlan> Canonical(const TppPlan& plan) {
  const kernels::TppPlanView v = plan.view();
  std::map<SeqId, RowPlan> out;
  for (int32_t r = 0; r < v.num_seqs; ++r) {
    RowPlan& row = out[plan.rows()[r]];
    for (int32_t i = v.seq_shared_indptr[r]; i < v.seq_shared_indptr[r + 1]; ++i) {
      const int32_t g = v.seq_shared_ids[i];
      std::set<SeqId> users(plan.rows().begin() + v.shared_seq_begin[g],
                            plan.rows().begin() + v.shared_seq_end[g]);
      row.shared.emplace_back(plan.shared_chunks()[g], std::move(users));
    }
    for (int32_t j = v.private_indptr[r]; j < v.private_indptr[r + 1]; ++j) {
      row.privates.emplace_back(plan.private_chunks()[j], v.private_len[j]);
    }
  }
  return out;
}

// Checks every promise of kernels::TppPlanView for `plan` over `batch`, from the tree's paths.
inline ::testing::AssertionResult PlanIsValid(const kv::PrefixTree& tree, const TppPlan& plan,
                                              std::span<const SeqId> batch) {
  const auto fail = [](const std::string& what) { return ::testing::AssertionFailure() << what; };
  const kernels::TppPlanView v = plan.view();
  if (v.num_seqs != static_cast<int32_t>(batch.size())) return fail("num_seqs != batch size");
  std::vector<SeqId> a(batch.begin(), batch.end()), b(plan.rows().begin(), plan.rows().end());
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  if (a != b) return fail("rows are not a permutation of the batch");

  // Which rows use each chunk, from the tree.
  std::vector<std::vector<ChunkId>> paths(batch.size());
  std::vector<int32_t> lengths(batch.size());
  std::map<ChunkId, std::vector<int32_t>> users;
  for (int32_t r = 0; r < v.num_seqs; ++r) {
    Result<kv::SeqInfo> info = tree.Seq(plan.rows()[r]);
    if (!info.ok()) return fail("row sequence unknown to the tree");
    paths[r].assign(info->path.begin(), info->path.end());
    lengths[r] = info->num_tokens;
    for (const ChunkId c : paths[r]) users[c].push_back(r);
  }

  if (v.seq_shared_indptr[0] != 0 || v.private_indptr[0] != 0) return fail("indptr[0] != 0");
  int32_t partial_rows = 0;
  for (int32_t g = 0; g < v.num_shared; ++g) {
    const int32_t begin = v.shared_seq_begin[g], end = v.shared_seq_end[g];
    if (end - begin < 2 || begin < 0 || end > v.num_seqs) return fail("bad shared range");
    const std::vector<int32_t>& u = users[plan.shared_chunks()[g]];
    if (static_cast<int32_t>(u.size()) != end - begin || u.front() != begin ||
        u.back() != end - 1) {
      std::ostringstream m;
      m << "shared chunk " << g << " range [" << begin << ", " << end
        << ") is not exactly its users";
      return fail(m.str());
    }
    if (v.shared_slot[g] != static_cast<int32_t>(tree.ChunkSlot(plan.shared_chunks()[g]).value()) ||
        v.shared_len[g] != tree.ChunkLen(plan.shared_chunks()[g])) {
      return fail("shared slot or length");
    }
    if (v.shared_partial_offset[g] != partial_rows) return fail("partial offsets not cumulative");
    partial_rows += end - begin;
  }
  if (partial_rows != v.num_partial_rows || partial_rows != plan.num_partial_rows()) {
    return fail("num_partial_rows");
  }

  for (int32_t r = 0; r < v.num_seqs; ++r) {
    // Each chunk of the path exactly once: shared ones first, in path order, then private ones.
    size_t k = 0;
    int64_t covered = 0;
    for (int32_t i = v.seq_shared_indptr[r]; i < v.seq_shared_indptr[r + 1]; ++i, ++k) {
      const int32_t g = v.seq_shared_ids[i];
      if (g < 0 || g >= v.num_shared) return fail("shared id out of range");
      if (r < v.shared_seq_begin[g] || r >= v.shared_seq_end[g]) return fail("row outside range");
      if (k >= paths[r].size() || plan.shared_chunks()[g] != paths[r][k]) {
        return fail("shared chunks are not the path's prefix");
      }
      covered += v.shared_len[g];
    }
    for (int32_t j = v.private_indptr[r]; j < v.private_indptr[r + 1]; ++j, ++k) {
      if (k >= paths[r].size() || plan.private_chunks()[j] != paths[r][k]) {
        return fail("private chunks are not the rest of the path");
      }
      if (users[paths[r][k]].size() != 1) return fail("a chunk two rows use is private");
      if (v.private_slot[j] != static_cast<int32_t>(tree.ChunkSlot(paths[r][k]).value()) ||
          v.private_len[j] != tree.ChunkLen(paths[r][k]) || v.private_len[j] < 1) {
        return fail("private slot or length");
      }
      covered += v.private_len[j];
    }
    if (k != paths[r].size()) return fail("plan misses chunks of the path");
    if (covered != lengths[r]) {
      std::ostringstream m;
      m << "row " << r << " covers " << covered << " tokens, has " << lengths[r];
      return fail(m.str());
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace chunkserve::plan::testing

#endif  // CHUNKSERVE_TESTS_TESTING_PLAN_CHECK_H_
