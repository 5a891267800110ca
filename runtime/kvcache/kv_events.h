// KV events: which full-chunk hashes a prefix tree holds, reported as they come and go.
//
// These become the KV events a worker sends to the router (runtime/README.md "wire/"): the router's
// prefix index learns which worker holds which prefixes from them. Hashes are the chained chunk
// hashes of runtime/kvcache/chunk_hash.h.
//
// Semantics, per hash (not per chunk): the same full chunk can exist several times in one tree
// (appended tokens never merge with an existing sibling, so two sequences that generate the same
// text under the same prefix hold two copies). The tree counts copies per hash and reports
//  - OnChunkStored when the count goes 0 -> 1 (the first copy of that prefix exists), and
//  - OnChunkEvicted when it goes 1 -> 0 (the last copy is gone),
// so a subscriber never sees a hash evicted while a copy remains, and sees stored/evicted strictly
// alternate for each hash. Because eviction takes leaves first, a child hash is always evicted
// before its parent's last copy; a stored hash's parent is stored.
//
// A reconnecting subscriber asks the tree for a snapshot (PrefixTree::StoredHashes) and then
// follows the events.
//
// Thread safety: callbacks run synchronously on the tree's thread, inside the tree operation that
// caused them (Append stores, eviction inside Insert/Append evicts). They must not call back into
// the tree and should be cheap (append to a buffer).
#ifndef CHUNKSERVE_RUNTIME_KVCACHE_KV_EVENTS_H_
#define CHUNKSERVE_RUNTIME_KVCACHE_KV_EVENTS_H_

#include <cstdint>

namespace chunkserve::kv {

// One full chunk's identity: its chained hash and the hash it was chained from (the chain seed
// h_{-1} for a sequence's first chunk).
struct StoredChunkHash {
  uint64_t hash = 0;
  uint64_t parent_hash = 0;

  friend bool operator==(const StoredChunkHash&, const StoredChunkHash&) = default;
};

class KvEventObserver {
 public:
  virtual ~KvEventObserver() = default;

  // The first full chunk with this hash now exists in the tree (its K/V is written in the same
  // engine step as the Append that filled it).
  virtual void OnChunkStored(uint64_t hash, uint64_t parent_hash) = 0;

  // The last full chunk with this hash left the tree (evicted).
  virtual void OnChunkEvicted(uint64_t hash) = 0;
};

}  // namespace chunkserve::kv

#endif  // CHUNKSERVE_RUNTIME_KVCACHE_KV_EVENTS_H_
