#include "router/index.h"

#include <algorithm>
#include <string>
#include <unordered_set>
#include <utility>

namespace chunkserve::router {

namespace {

// glibc malloc: a request of n bytes takes max(32, round_up(n + 8, 16)) bytes of heap.
size_t MallocBytes(size_t n) {
  if (n == 0) return 0;
  return std::max<size_t>(32, (n + 8 + 15) & ~size_t{15});
}

// One std::unordered_map<uint64_t, uint32_t> entry: a heap node (next pointer + key + value) and
// one bucket pointer at load factor <= 1.
constexpr size_t kMapNodePayload = sizeof(void*) + sizeof(uint64_t) + sizeof(uint64_t);

}  // namespace

// --- accounting -------------------------------------------------------------------------------

size_t PrefixIndex::Impl::NodeBytes() {
  return sizeof(Node) + MallocBytes(kMapNodePayload) + sizeof(void*);
}

size_t PrefixIndex::Impl::HolderVectorBytes(size_t capacity) {
  return MallocBytes(capacity * sizeof(uint32_t));
}

PrefixIndex::Impl::Impl(const PrefixIndexOptions& options) : options_(options) {}

// --- workers ----------------------------------------------------------------------------------

uint32_t PrefixIndex::Impl::SlotOf(WorkerId worker) {
  auto it = slot_of_.find(worker);
  if (it != slot_of_.end()) return it->second;
  const auto slot = static_cast<uint32_t>(workers_.size());
  if (!workers_.empty() && worker < workers_.back().id) slots_by_id_ = false;
  workers_.push_back(WorkerEntry{.id = worker});
  slot_of_.emplace(worker, slot);
  scratch_stamp_.push_back(0);
  scratch_decision_stamp_.push_back(0);
  scratch_index_run_.push_back(0);
  scratch_decision_run_.push_back(0);
  return slot;
}

uint32_t PrefixIndex::Impl::FindSlot(WorkerId worker) const {
  auto it = slot_of_.find(worker);
  return it == slot_of_.end() ? kNone : it->second;
}

bool PrefixIndex::Impl::IsRoot(uint64_t parent_hash) const {
  if (parent_hash == 0) return true;
  return std::find(seeds_.begin(), seeds_.end(), parent_hash) != seeds_.end();
}

void PrefixIndex::Impl::SetChainSeeds(std::span<const uint64_t> seeds) {
  seeds_.assign(seeds.begin(), seeds.end());
}

bool PrefixIndex::Impl::IsUsable(WorkerId worker) const {
  const uint32_t slot = FindSlot(worker);
  return slot != kNone && workers_[slot].known && workers_[slot].usable;
}

void PrefixIndex::Impl::DropWorker(WorkerId worker) {
  const uint32_t slot = FindSlot(worker);
  if (slot == kNone) return;
  ClearWorker(slot);
  // Decisions: remove the worker's holder entries; its FIFO records then find nothing to remove.
  for (auto it = decision_holders_.begin(); it != decision_holders_.end();) {
    auto& v = it->second;
    const size_t before = v.size();
    std::erase_if(v, [&](const DecisionHolder& h) { return h.slot == slot; });
    decision_entries_ -= before - v.size();
    it = v.empty() ? decision_holders_.erase(it) : std::next(it);
  }
  WorkerEntry& w = workers_[slot];
  w.known = false;
  w.has_generation = false;
  w.usable = false;
  w.last_sequence = 0;
}

void PrefixIndex::Impl::ClearWorker(uint32_t slot) {
  if (workers_[slot].held == 0) return;
  for (uint32_t idx = 0; idx < nodes_.size(); ++idx) {
    Node& n = nodes_[idx];
    if (n.depth == 0) continue;
    auto it = std::lower_bound(n.holders.begin(), n.holders.end(), slot);
    if (it == n.holders.end() || *it != slot) continue;
    n.holders.erase(it);
    --holder_entries_;
    --workers_[slot].held;
    if (n.holders.empty()) FreeNode(idx);
    if (workers_[slot].held == 0) break;
  }
}

// --- KV events --------------------------------------------------------------------------------

Result<KvApplyOutcome> PrefixIndex::Impl::ApplyKvEvents(WorkerId worker,
                                                        const KvEventBatch& batch) {
  if (!worker.valid()) return Status::InvalidArgument("kv events for an invalid worker id");
  if (batch.snapshot && !batch.evicted.empty()) {
    return Status::InvalidArgument("kv snapshot with " + std::to_string(batch.evicted.size()) +
                                   " evicted hashes (a snapshot lists held hashes only)");
  }
  const uint32_t slot = SlotOf(worker);
  workers_[slot].known = true;

  if (!workers_[slot].has_generation || workers_[slot].generation != batch.generation) {
    const bool first = !workers_[slot].has_generation;
    ClearWorker(slot);
    WorkerEntry& w = workers_[slot];
    w.has_generation = true;
    w.generation = batch.generation;
    w.usable = false;
    w.last_sequence = 0;
    if (!batch.snapshot) return KvApplyOutcome::kNeedSnapshot;
    ApplyChanges(slot, batch.stored, {});
    workers_[slot].usable = true;
    workers_[slot].last_sequence = batch.sequence;
    return first ? KvApplyOutcome::kApplied : KvApplyOutcome::kNewGeneration;
  }

  if (batch.snapshot) {
    ClearWorker(slot);
    ApplyChanges(slot, batch.stored, {});
    workers_[slot].usable = true;
    workers_[slot].last_sequence = batch.sequence;
    return KvApplyOutcome::kApplied;
  }

  if (!workers_[slot].usable) return KvApplyOutcome::kNeedSnapshot;
  const uint64_t changes = batch.stored.size() + batch.evicted.size();
  const uint64_t last = workers_[slot].last_sequence;
  if (changes == 0 && batch.sequence == last) return KvApplyOutcome::kApplied;
  if (batch.sequence <= last) return KvApplyOutcome::kStaleIgnored;
  if (batch.sequence != last + changes) {
    // Events were lost (or the batch overlaps what we have): nothing we hold for this worker
    // can be trusted any more.
    ++gaps_;
    ClearWorker(slot);
    workers_[slot].usable = false;
    return KvApplyOutcome::kNeedSnapshot;
  }
  ApplyChanges(slot, batch.stored, batch.evicted);
  workers_[slot].last_sequence = batch.sequence;
  return KvApplyOutcome::kApplied;
}

void PrefixIndex::Impl::ApplyChanges(uint32_t slot, const std::vector<kv::StoredChunkHash>& stored,
                                     const std::vector<uint64_t>& evicted) {
  // Net count per hash (the wire loses the order of stores and evictions inside one batch; see
  // routing.h). Only needed when both lists are non-empty.
  std::unordered_map<uint64_t, int> net;
  if (!stored.empty() && !evicted.empty()) {
    for (const auto& s : stored) ++net[s.hash];
    for (uint64_t h : evicted) --net[h];
  }
  auto net_of = [&](uint64_t h, int fallback) {
    if (net.empty()) return fallback;
    auto it = net.find(h);
    return it == net.end() ? fallback : it->second;
  };

  for (uint64_t h : evicted) {
    if (net_of(h, -1) < 0) RemoveHolder(slot, h);
  }
  if (stored.empty()) return;

  // Depth of each stored hash: from a root, an indexed node, or another stored hash of this batch
  // (snapshots list chunks in any order).
  std::unordered_map<uint64_t, uint64_t> parent_in_batch;
  parent_in_batch.reserve(stored.size());
  for (const auto& s : stored) {
    if (net_of(s.hash, 1) > 0) parent_in_batch.emplace(s.hash, s.parent_hash);
  }
  std::unordered_map<uint64_t, int32_t> depth;  // 0: unknown parent; -1: being resolved
  depth.reserve(parent_in_batch.size());
  std::vector<uint64_t> stack;
  for (const auto& [hash, parent_unused] : parent_in_batch) {
    if (depth.count(hash)) continue;
    stack.push_back(hash);
    while (!stack.empty()) {
      const uint64_t h = stack.back();
      const uint64_t p = parent_in_batch.at(h);
      int32_t d = -2;  // -2: not decided yet
      if (IsRoot(p)) {
        d = 1;
      } else if (auto pd = depth.find(p); pd != depth.end()) {
        d = pd->second == -1 ? 0 : (pd->second > 0 ? pd->second + 1 : 0);  // -1: a cycle
      } else if (parent_in_batch.count(p)) {
        depth[h] = -1;
        stack.push_back(p);
        continue;
      } else if (auto node = by_hash_.find(p); node != by_hash_.end()) {
        d = nodes_[node->second].depth + 1;
      } else {
        d = 0;
      }
      depth[h] = d;
      stack.pop_back();
    }
  }

  // Deepest first, so a chain's first chunks end up most recently used (the LRU then drops
  // leaves before the roots that every lookup passes through).
  std::vector<std::pair<int32_t, uint64_t>> order;
  order.reserve(depth.size());
  for (const auto& [h, d] : depth) {
    if (d <= 0) {
      ++orphaned_;
    } else if (d > options_.max_depth) {
      ++depth_limited_;
    } else {
      order.emplace_back(d, h);
    }
  }
  std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  for (const auto& [d, h] : order) AddHolder(slot, h, d);
}

// --- chunk nodes ------------------------------------------------------------------------------

uint32_t PrefixIndex::Impl::AllocNode(uint64_t hash, int32_t depth) {
  uint32_t idx;
  if (!free_nodes_.empty()) {
    idx = free_nodes_.back();
    free_nodes_.pop_back();
  } else {
    idx = static_cast<uint32_t>(nodes_.size());
    nodes_.emplace_back();
  }
  Node& n = nodes_[idx];
  n.hash = hash;
  n.depth = depth;
  by_hash_.emplace(hash, idx);
  LruPushFront(idx);
  bytes_used_ += NodeBytes();
  return idx;
}

void PrefixIndex::Impl::FreeNode(uint32_t idx) {
  Node& n = nodes_[idx];
  for (uint32_t s : n.holders) --workers_[s].held;
  holder_entries_ -= n.holders.size();
  bytes_used_ -= NodeBytes() + HolderVectorBytes(n.holders.capacity());
  std::vector<uint32_t>().swap(n.holders);
  LruUnlink(idx);
  by_hash_.erase(n.hash);
  n.depth = 0;
  n.hash = 0;
  free_nodes_.push_back(idx);
}

void PrefixIndex::Impl::AddHolder(uint32_t slot, uint64_t hash, int32_t depth) {
  auto it = by_hash_.find(hash);
  const uint32_t idx = it != by_hash_.end() ? it->second : AllocNode(hash, depth);
  Node& n = nodes_[idx];
  auto pos = std::lower_bound(n.holders.begin(), n.holders.end(), slot);
  if (pos == n.holders.end() || *pos != slot) {
    const size_t before = HolderVectorBytes(n.holders.capacity());
    n.holders.insert(pos, slot);
    bytes_used_ += HolderVectorBytes(n.holders.capacity()) - before;
    ++holder_entries_;
    ++workers_[slot].held;
  }
  Touch(idx);
  EnforceBudget(idx);
}

void PrefixIndex::Impl::RemoveHolder(uint32_t slot, uint64_t hash) {
  auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return;  // never indexed, or dropped by the LRU
  const uint32_t idx = it->second;
  Node& n = nodes_[idx];
  auto pos = std::lower_bound(n.holders.begin(), n.holders.end(), slot);
  if (pos == n.holders.end() || *pos != slot) return;
  n.holders.erase(pos);
  --holder_entries_;
  --workers_[slot].held;
  if (n.holders.empty()) FreeNode(idx);
}

void PrefixIndex::Impl::LruUnlink(uint32_t idx) {
  Node& n = nodes_[idx];
  if (n.lru_prev != kNone)
    nodes_[n.lru_prev].lru_next = n.lru_next;
  else
    lru_head_ = n.lru_next;
  if (n.lru_next != kNone)
    nodes_[n.lru_next].lru_prev = n.lru_prev;
  else
    lru_tail_ = n.lru_prev;
  n.lru_prev = n.lru_next = kNone;
}

void PrefixIndex::Impl::LruPushFront(uint32_t idx) {
  Node& n = nodes_[idx];
  n.lru_stamp = ++lru_clock_;
  n.lru_prev = kNone;
  n.lru_next = lru_head_;
  if (lru_head_ != kNone) nodes_[lru_head_].lru_prev = idx;
  lru_head_ = idx;
  if (lru_tail_ == kNone) lru_tail_ = idx;
}

void PrefixIndex::Impl::Touch(uint32_t idx) {
  // Approximate LRU: a node moved to the head fewer than nodes/16 moves ago is still among the
  // newest 1/16 of the list, so moving it again would change nothing that matters for eviction
  // and costs three cache misses (lookups touch up to max_depth nodes each).
  const uint32_t window = static_cast<uint32_t>(by_hash_.size() / 16);
  if (lru_head_ == idx || lru_clock_ - nodes_[idx].lru_stamp < window) return;
  LruUnlink(idx);
  LruPushFront(idx);
}

void PrefixIndex::Impl::EnforceBudget(uint32_t protect) {
  while (bytes_used_ > options_.byte_budget && lru_tail_ != kNone && lru_tail_ != protect) {
    FreeNode(lru_tail_);
    ++lru_evictions_;
  }
}

bool PrefixIndex::Impl::AnyUsable() const {
  return std::any_of(workers_.begin(), workers_.end(),
                     [](const WorkerEntry& w) { return w.known && w.usable; });
}

PrefixIndexStats PrefixIndex::Impl::Stats() const {
  PrefixIndexStats s;
  s.bytes_used = bytes_used_;
  s.decision_bytes = decisions_.size() * sizeof(DecisionRecord) +
                     decision_chain_hashes_ * sizeof(uint64_t) +
                     decision_holders_.size() * (MallocBytes(kMapNodePayload + 16) + 8) +
                     decision_entries_ * sizeof(DecisionHolder);
  s.chunk_nodes = by_hash_.size();
  s.holder_entries = holder_entries_;
  for (const WorkerEntry& w : workers_) {
    s.workers += w.known;
    s.usable_workers += w.known && w.usable;
  }
  s.decisions = decisions_.size();
  s.lru_evictions = lru_evictions_;
  s.gaps = gaps_;
  s.depth_limited = depth_limited_;
  s.orphaned = orphaned_;
  return s;
}

// --- PrefixIndex (pimpl forwarding) ------------------------------------------------------------

Result<std::unique_ptr<PrefixIndex>> PrefixIndex::Create(const PrefixIndexOptions& options) {
  if (options.byte_budget < 4096) {
    return Status::InvalidArgument("prefix index byte_budget " +
                                   std::to_string(options.byte_budget) + " < 4096");
  }
  if (options.max_depth < 1) {
    return Status::InvalidArgument("prefix index max_depth " + std::to_string(options.max_depth) +
                                   " < 1");
  }
  if (options.max_decisions < 1) {
    return Status::InvalidArgument("prefix index max_decisions " +
                                   std::to_string(options.max_decisions) + " < 1");
  }
  if (options.decision_ttl.count() < 0) {
    return Status::InvalidArgument("prefix index decision_ttl is negative");
  }
  return std::unique_ptr<PrefixIndex>(new PrefixIndex(std::make_unique<Impl>(options)));
}

PrefixIndex::PrefixIndex(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
PrefixIndex::~PrefixIndex() = default;

Result<KvApplyOutcome> PrefixIndex::ApplyKvEvents(WorkerId worker, const KvEventBatch& batch) {
  return impl_->ApplyKvEvents(worker, batch);
}
void PrefixIndex::SetChainSeeds(std::span<const uint64_t> seeds) { impl_->SetChainSeeds(seeds); }
void PrefixIndex::DropWorker(WorkerId worker) { impl_->DropWorker(worker); }
bool PrefixIndex::IsUsable(WorkerId worker) const { return impl_->IsUsable(worker); }
std::vector<WorkerMatch> PrefixIndex::LongestMatch(std::span<const uint64_t> chain,
                                                   RouterTime now) {
  return impl_->LongestMatch(chain, now);
}
void PrefixIndex::RecordDecision(WorkerId worker, std::span<const uint64_t> chain, RouterTime now,
                                 RouterTime extra) {
  impl_->RecordDecision(worker, chain, now, extra);
}
void PrefixIndex::ExpireDecisions(RouterTime now) { impl_->ExpireDecisions(now); }
PrefixIndexStats PrefixIndex::Stats() const { return impl_->Stats(); }
bool PrefixIndex::AnyUsable() const { return impl_->AnyUsable(); }
size_t PrefixIndex::BytesPerNode() { return Impl::NodeBytes(); }
size_t PrefixIndex::BytesPerHolder() { return sizeof(uint32_t); }

std::string_view KvApplyOutcomeName(KvApplyOutcome outcome) {
  switch (outcome) {
    case KvApplyOutcome::kApplied:
      return "applied";
    case KvApplyOutcome::kNeedSnapshot:
      return "need_snapshot";
    case KvApplyOutcome::kStaleIgnored:
      return "stale_ignored";
    case KvApplyOutcome::kNewGeneration:
      return "new_generation";
  }
  return "unknown";
}

}  // namespace chunkserve::router
