// PrefixIndex::Impl: the data structures behind the router's prefix index (routing.h has the
// contract; this header is internal to router/ and may change freely).
//
// Layout. Chunk nodes live in one pool (`nodes_`, reused through a free list) and are found by
// hash through `by_hash_`. A node holds the sorted worker slots that hold its hash; nodes with no
// holder are freed at once. Workers get a dense slot on first sight (slots are never reused, so
// a stale slot can never be mistaken for another worker). The LRU list threads through the nodes
// by pool index; the most recently used node is at the head.
//
// Why no per-worker list of held hashes: it would roughly double the bytes per entry, and it is
// only needed to forget a worker (generation change, gap, snapshot, death), which is rare; those
// scan the pool instead (O(indexed nodes)).
//
// Decisions live apart from the chunk nodes: a FIFO of records (TTL is constant, so FIFO order
// is expiry order) and a hash -> (slot, expiry) map used by LongestMatch.
//
// Thread safety: none (see routing.h).
#ifndef CHUNKSERVE_ROUTER_INDEX_H_
#define CHUNKSERVE_ROUTER_INDEX_H_

#include <cstdint>
#include <deque>
#include <unordered_map>
#include <vector>

#include "router/routing.h"

namespace chunkserve::router {

class PrefixIndex::Impl {
 public:
  explicit Impl(const PrefixIndexOptions& options);

  Result<KvApplyOutcome> ApplyKvEvents(WorkerId worker, const KvEventBatch& batch);
  void SetChainSeeds(std::span<const uint64_t> seeds);
  void DropWorker(WorkerId worker);
  bool IsUsable(WorkerId worker) const;
  std::vector<WorkerMatch> LongestMatch(std::span<const uint64_t> chain, RouterTime now);
  void RecordDecision(WorkerId worker, std::span<const uint64_t> chain, RouterTime now,
                      RouterTime extra);
  void ExpireDecisions(RouterTime now);
  PrefixIndexStats Stats() const;
  bool AnyUsable() const;

  // Accounting constants (see index.cc for how they were derived).
  static size_t NodeBytes();
  static size_t HolderVectorBytes(size_t capacity);

 private:
  static constexpr uint32_t kNone = 0xffffffffu;

  struct Node {
    uint64_t hash = 0;
    uint32_t lru_prev = kNone;      // towards the head (more recent)
    uint32_t lru_next = kNone;      // towards the tail (less recent)
    int32_t depth = 0;              // 1 for a chain's first chunk; 0 marks a free pool entry
    uint32_t lru_stamp = 0;         // lru_clock_ when last moved to the head
    std::vector<uint32_t> holders;  // worker slots, sorted ascending; only usable workers
  };

  struct WorkerEntry {
    WorkerId id;
    bool known = false;  // false after DropWorker (until events arrive again)
    bool has_generation = false;
    bool usable = false;  // snapshot seen and no gap since
    uint64_t generation = 0;
    uint64_t last_sequence = 0;
    size_t held = 0;  // holder entries of this worker in the pool
  };

  struct DecisionHolder {
    uint32_t slot;
    RouterTime expiry;
  };
  struct DecisionRecord {
    uint32_t slot;
    RouterTime expiry;
    std::vector<uint64_t> chain;
  };

  uint32_t SlotOf(WorkerId worker);          // creates
  uint32_t FindSlot(WorkerId worker) const;  // kNone when unknown
  bool IsRoot(uint64_t parent_hash) const;

  // Removes every holder entry of `slot` (scan).
  void ClearWorker(uint32_t slot);
  // Applies stored (with in-batch parent resolution) and evicted hashes for `slot`.
  void ApplyChanges(uint32_t slot, const std::vector<kv::StoredChunkHash>& stored,
                    const std::vector<uint64_t>& evicted);
  void AddHolder(uint32_t slot, uint64_t hash, int32_t depth);
  void RemoveHolder(uint32_t slot, uint64_t hash);

  uint32_t AllocNode(uint64_t hash, int32_t depth);
  void FreeNode(uint32_t idx);
  void LruUnlink(uint32_t idx);
  void LruPushFront(uint32_t idx);
  void Touch(uint32_t idx);
  void EnforceBudget(uint32_t protect);

  void PopDecision();

  PrefixIndexOptions options_;
  std::vector<uint64_t> seeds_;

  std::vector<Node> nodes_;
  std::vector<uint32_t> free_nodes_;
  std::unordered_map<uint64_t, uint32_t> by_hash_;
  uint32_t lru_head_ = kNone, lru_tail_ = kNone;

  std::vector<WorkerEntry> workers_;
  std::unordered_map<WorkerId, uint32_t> slot_of_;

  std::deque<DecisionRecord> decisions_;
  std::unordered_map<uint64_t, std::vector<DecisionHolder>> decision_holders_;
  size_t decision_entries_ = 0;

  size_t bytes_used_ = 0;
  size_t holder_entries_ = 0;
  size_t decision_chain_hashes_ = 0;
  uint64_t lru_evictions_ = 0, gaps_ = 0, depth_limited_ = 0, orphaned_ = 0;

  uint32_t lru_clock_ = 0;   // moves to the LRU head so far (wraps; only differences matter)
  bool slots_by_id_ = true;  // slot order == worker id order (LongestMatch then needs no sort)

  // LongestMatch scratch, indexed by slot; an entry is valid only where its stamp equals stamp_
  // (avoids clearing per call). index_run: consecutive chunks held per the index (0 while still
  // matching); decision_run: the same from recorded decisions.
  std::vector<uint32_t> scratch_stamp_, scratch_decision_stamp_;
  std::vector<int32_t> scratch_index_run_, scratch_decision_run_;
  std::vector<uint32_t> active_, next_active_, decision_slots_;
  std::vector<uint32_t> touched_;
  uint32_t stamp_ = 0;
};

}  // namespace chunkserve::router

#endif  // CHUNKSERVE_ROUTER_INDEX_H_
