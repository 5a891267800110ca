// The prefill a worker reports as queued (LoadReport.queuedPrefillTokens): the prompt tokens the
// engine will actually compute for the requests that have not had their first event yet.
//
// A request counts the leading chunks of its prompt that are neither stored in the engine's
// cache (mirrored from its KV events) nor in the chain of a request that joined before it and
// still waits: the engine prefills a shared prefix once and admits the requests behind it with
// it cached, so counting the prefix once per waiting request would make a worker that holds (or
// is computing) a 100k-token document look several documents deep, and routers would move its
// requests to a cold worker to prefill the document again. Counted once, when the request joins;
// its tail past the last full chunk always counts.
#ifndef CHUNKSERVE_WORKER_QUEUED_PREFILL_H_
#define CHUNKSERVE_WORKER_QUEUED_PREFILL_H_

#include <cstdint>
#include <mutex>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "runtime/base/ids.h"

namespace chunkserve::worker {

class QueuedPrefill {
 public:
  // `hash_seed` and `chunk_size`: the engine's chain (kv::ChunkHashSeed of its model).
  QueuedPrefill(uint64_t hash_seed, int32_t chunk_size);

  // The engine's cache, from its KV events and snapshots (any thread).
  void Stored(uint64_t hash);
  void Evicted(uint64_t hash);

  // A request joins the queue: the tokens it adds to the queued prefill (also added to
  // tokens()). `key` names it for Remove; keys are the caller's and unique while waiting.
  int64_t Add(uint64_t key, std::span<const TokenId> prompt);
  // Its first event (or its end): its tokens leave the queued prefill. Unknown keys: nothing.
  void Remove(uint64_t key);

  int64_t tokens() const;
  // Cached chunk hashes known (tests, metrics).
  size_t stored_chunks() const;

 private:
  struct Waiting {
    std::vector<uint64_t> chain;
    int64_t tokens = 0;
  };
  const uint64_t seed_;
  const int32_t chunk_size_;
  mutable std::mutex mu_;
  std::unordered_set<uint64_t> stored_;            // guarded by mu_
  std::unordered_map<uint64_t, int32_t> queued_;   // chain chunk -> requests; guarded by mu_
  std::unordered_map<uint64_t, Waiting> waiting_;  // guarded by mu_
  int64_t tokens_ = 0;                             // guarded by mu_
};

}  // namespace chunkserve::worker

#endif  // CHUNKSERVE_WORKER_QUEUED_PREFILL_H_
