// PrefixIndex::Impl, lookups and decisions: the longest match of a chunk-hash chain per worker
// (the index and this router's recent decisions together), and the short-lived decision records
// (index.h has the data structures; index.cc the rest).
#include <algorithm>
#include <utility>
#include <vector>

#include "router/index.h"

namespace chunkserve::router {

// --- lookups and decisions --------------------------------------------------------------------

std::vector<WorkerMatch> PrefixIndex::Impl::LongestMatch(std::span<const uint64_t> chain,
                                                         RouterTime now) {
  ExpireDecisions(now);
  std::vector<WorkerMatch> out;
  const size_t n = std::min(chain.size(), static_cast<size_t>(options_.max_depth));
  if (n == 0) return out;
  if (++stamp_ == 0) {  // wrapped: old stamps could collide
    std::fill(scratch_stamp_.begin(), scratch_stamp_.end(), 0);
    std::fill(scratch_decision_stamp_.begin(), scratch_decision_stamp_.end(), 0);
    stamp_ = 1;
  }
  touched_.clear();

  // Index: the workers still matching after depth i are A_i = A_{i-1} & holders(chain[i]). A
  // worker holding a chunk holds its parent (kv_events.h), so holder sets usually shrink along
  // the chain and are often identical from one depth to the next: compare those wholesale
  // (memcmp) and intersect only where they differ. Cost: O(holders of chain[0] + changes).
  uint32_t first_node = kNone;
  int32_t reached = 0;
  active_.clear();
  for (size_t i = 0; i < n; ++i) {
    auto it = by_hash_.find(chain[i]);
    if (it == by_hash_.end()) break;
    const std::vector<uint32_t>& h = nodes_[it->second].holders;
    touched_.push_back(it->second);
    if (i == 0) {
      first_node = it->second;
      active_.assign(h.begin(), h.end());
      for (uint32_t s : h) {
        scratch_stamp_[s] = stamp_;
        scratch_index_run_[s] = 0;
      }
      reached = 1;
      continue;
    }
    if (h.size() == active_.size() && std::equal(h.begin(), h.end(), active_.begin())) {
      reached = static_cast<int32_t>(i) + 1;
      continue;
    }
    next_active_.clear();
    auto hp = h.begin();
    for (uint32_t s : active_) {
      while (hp != h.end() && *hp < s) ++hp;
      if (hp != h.end() && *hp == s) {
        next_active_.push_back(s);
      } else {
        scratch_index_run_[s] = static_cast<int32_t>(i);
      }
    }
    active_.swap(next_active_);
    if (active_.empty()) break;
    reached = static_cast<int32_t>(i) + 1;
  }
  for (uint32_t s : active_) scratch_index_run_[s] = reached;

  // Decisions: few holders per hash; the plain consecutive-run walk.
  decision_slots_.clear();
  if (!decision_holders_.empty()) {
    for (size_t i = 0; i < n; ++i) {
      auto it = decision_holders_.find(chain[i]);
      if (it == decision_holders_.end()) break;
      const auto depth = static_cast<int32_t>(i);
      bool advanced = false;
      for (const DecisionHolder& d : it->second) {
        if (d.expiry <= now || !workers_[d.slot].known) continue;
        const uint32_t s = d.slot;
        if (i == 0 && scratch_decision_stamp_[s] != stamp_) {
          scratch_decision_stamp_[s] = stamp_;
          scratch_decision_run_[s] = 0;
          decision_slots_.push_back(s);
        }
        if (scratch_decision_stamp_[s] == stamp_ && scratch_decision_run_[s] == depth) {
          scratch_decision_run_[s] = depth + 1;
          advanced = true;
        }
      }
      if (!advanced) break;
    }
  }

  // Every matching worker holds chain[0] (in the index or by decision): emit those, in slot
  // order, merging the two runs. A worker's index run and decision run are both prefixes of the
  // chain, so their union is the longer one.
  auto decision_run = [&](uint32_t s) {
    return scratch_decision_stamp_[s] == stamp_ ? scratch_decision_run_[s] : 0;
  };
  if (first_node != kNone) {
    const std::vector<uint32_t>& h0 = nodes_[first_node].holders;
    out.reserve(h0.size() + decision_slots_.size());
    for (uint32_t s : h0) {
      const int32_t ir = scratch_index_run_[s], dr = decision_run(s);
      out.push_back(WorkerMatch{
          .worker = workers_[s].id, .matched_chunks = std::max(ir, dr), .from_decision = dr > ir});
    }
  }
  const size_t sorted_prefix = out.size();
  for (uint32_t s : decision_slots_) {
    const int32_t dr = decision_run(s);
    if (dr <= 0 || scratch_stamp_[s] == stamp_) continue;  // none, or merged above
    out.push_back(
        WorkerMatch{.worker = workers_[s].id, .matched_chunks = dr, .from_decision = true});
  }
  auto by_worker = [](const WorkerMatch& a, const WorkerMatch& b) { return a.worker < b.worker; };
  if (!slots_by_id_) {
    std::sort(out.begin(), out.end(), by_worker);
  } else if (out.size() > sorted_prefix) {
    std::sort(out.begin() + static_cast<ptrdiff_t>(sorted_prefix), out.end(), by_worker);
    std::inplace_merge(out.begin(), out.begin() + static_cast<ptrdiff_t>(sorted_prefix), out.end(),
                       by_worker);
  }
  // Deepest first, so the chain's root ends up the most recently used.
  for (auto it = touched_.rbegin(); it != touched_.rend(); ++it) Touch(*it);
  return out;
}

void PrefixIndex::Impl::RecordDecision(WorkerId worker, std::span<const uint64_t> chain,
                                       RouterTime now, RouterTime extra) {
  if (!worker.valid()) return;
  ExpireDecisions(now);
  const size_t n = std::min(chain.size(), static_cast<size_t>(options_.max_depth));
  if (n == 0) return;
  const uint32_t slot = SlotOf(worker);
  workers_[slot].known = true;
  // Expiries are not monotonic when `extra` varies: a long one at the front of decisions_ only
  // delays the pruning of later ones (PopDecision keeps a holder entry a later, longer decision
  // extended), and max_decisions bounds them all.
  const RouterTime expiry =
      now + options_.decision_ttl + std::clamp(extra, RouterTime(0), RouterTime(std::chrono::seconds(60)));
  for (size_t i = 0; i < n; ++i) {
    auto& v = decision_holders_[chain[i]];
    auto it =
        std::find_if(v.begin(), v.end(), [&](const DecisionHolder& h) { return h.slot == slot; });
    if (it != v.end()) {
      it->expiry = std::max(it->expiry, expiry);
    } else {
      v.push_back(DecisionHolder{slot, expiry});
      ++decision_entries_;
    }
  }
  decisions_.push_back(DecisionRecord{slot, expiry, {chain.begin(), chain.begin() + n}});
  decision_chain_hashes_ += n;
  while (decisions_.size() > static_cast<size_t>(options_.max_decisions)) PopDecision();
}

void PrefixIndex::Impl::PopDecision() {
  const DecisionRecord& rec = decisions_.front();
  for (uint64_t h : rec.chain) {
    auto it = decision_holders_.find(h);
    if (it == decision_holders_.end()) continue;
    auto& v = it->second;
    const size_t before = v.size();
    // A later decision for the same worker and hash extended the expiry: keep that one.
    std::erase_if(
        v, [&](const DecisionHolder& d) { return d.slot == rec.slot && d.expiry <= rec.expiry; });
    decision_entries_ -= before - v.size();
    if (v.empty()) decision_holders_.erase(it);
  }
  decision_chain_hashes_ -= rec.chain.size();
  decisions_.pop_front();
}

void PrefixIndex::Impl::ExpireDecisions(RouterTime now) {
  while (!decisions_.empty() && decisions_.front().expiry <= now) PopDecision();
}

}  // namespace chunkserve::router
