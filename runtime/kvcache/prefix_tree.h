// PrefixTree indexes an engine's KV cache: a trie whose nodes are chunks of up to chunk_size
// tokens, over a fixed pool of KV slots. Sequences whose prompts share a prefix share the chunks
// on that path, and with them the K/V the engine stores in each chunk's slot (one slot holds a
// chunk's K and V for every layer; runtime/README.md "kvcache/", kernels/attention_params.h).
//
// Vocabulary. A *sequence* (SeqId) is a live request (or one sample of it after Fork); its *path*
// is the list of chunks from the root that spell its tokens. A chunk is *full* when it holds
// chunk_size tokens, *partial* otherwise. A chunk is *referenced* when at least one live sequence's
// path passes through it and *retained* when none does: retained chunks keep their K/V so a later
// prompt with the same prefix can reuse it, until eviction takes their slot.
//
// Invariants (CheckInvariants verifies all of them):
//  (1) Alignment: every chunk on a path except the last is full, and chunk k of a path covers
//      token positions [k * chunk_size, k * chunk_size + len). Hence partial chunks are leaves.
//  (2) ref_count(c) == number of live sequences whose path passes through c. ref_count never
//      increases down a path, so the retained chunks form whole subtrees.
//  (3) A chunk with ref_count > 1 is never written. Appending to a sequence whose last chunk is
//      partial and shared first copies that chunk (copy-on-write, reported as a KvCopy).
//  (4) Every token in the tree has its K/V written: Insert only puts cached chunks on a new path,
//      and the engine writes a token's K/V in the same step as the Append that adds it.
//  (5) Every full chunk carries its chained hash (chunk_hash.h); partial chunks carry none.
//  (6) Each chunk owns one slot for its lifetime; used slots == referenced + retained chunks,
//      free slots + used slots == num_slots.
//  (7) Retained chunks sit in one LRU list in the order they became unreferenced (ties: children
//      before parents). Every retained chunk comes after all of its descendants, so the head of
//      the list is always an unreferenced leaf: eviction pops it, least recently released first,
//      and a parent whose last child was evicted becomes evictable in turn.
//
// Design choices:
//  - Matching is token-granular and exact: Match finds the longest prefix of the prompt that any
//    path in the tree spells. Full chunks are matched through the chained-hash index (so duplicate
//    sibling copies of a chunk never hide a longer match), the last, partially matched chunk
//    through a (parent, first token) index of children.
//  - When a match ends inside a chunk (the prompt diverges or ends inside it), Insert does not
//    split that chunk: the new sequence gets a new private chunk holding the matched tokens, and
//    the engine copies their K/V (a KvCopy). Splitting would renumber the positions other
//    sequences' chunks cover; a copy of at most chunk_size - 1 tokens is cheap.
//  - When the prompt covers a chunk exactly (full or partial), the sequence shares it. For a
//    retained partial chunk that means adopting it in place: the new sequence is its only user, so
//    Append writes into it with no copy.
//  - Appended tokens never look for an existing child with the same tokens: they go to the
//    sequence's private tail, so duplicate siblings can exist (and are handled by the hash count
//    in kv_events.h).
//  - Insert, Append and Fork are all-or-nothing: they compute the slots they need first (counting
//    retained chunks they would not touch as evictable) and return ResourceExhausted with no state
//    change, no eviction included, when the pool cannot provide them.
//  - Sequence ids are allocated by the tree. A SeqId is a stable handle: index bits plus a
//    generation that changes when the index is reused (indices are reused first-in first-out), so
//    a stale id is answered with NotFound (unless its index was reused 1024 times since).
//
// Costs (c = chunk_size, n = tokens involved): Match and Insert O(n + (d + b) * c) where d is the
// number of copies of the deepest matched full chunk (1 unless generated text was duplicated) and b
// the number of children under them that start with the prompt's next token; Append O(tokens
// appended + new chunks); Release and Fork O(path length) per sequence; GroupBatch O(batch + sum
// of the shared-prefix lengths); Stats O(1). Node storage, the slot free list, the LRU list and
// both indexes are preallocated for num_slots chunks: steady-state operation does not allocate
// (sequence paths and result vectors keep their capacity).
//
// Thread safety: none. Owned by one Engine and used only from its step thread. Const methods use
// internal scratch buffers too, so no two calls may overlap, const or not.
#ifndef CHUNKSERVE_RUNTIME_KVCACHE_PREFIX_TREE_H_
#define CHUNKSERVE_RUNTIME_KVCACHE_PREFIX_TREE_H_

#include <cstdint>
#include <deque>
#include <optional>
#include <span>
#include <vector>

#include "runtime/base/ids.h"
#include "runtime/base/logging.h"
#include "runtime/base/status.h"
#include "runtime/kvcache/chunk_hash.h"
#include "runtime/kvcache/flat_index.h"
#include "runtime/kvcache/kv_events.h"

namespace chunkserve::kv {

// The chained chunk hash (chunk_hash.h: ChainChunkHash).
using ChunkHashFn = uint64_t (*)(uint64_t prev_hash, std::span<const TokenId> tokens);

struct PrefixTreeOptions {
  int32_t chunk_size = 64;         // tokens per chunk, >= 1
  int32_t num_slots = 0;           // KV slots in the pool, >= 1; fixed for the tree's lifetime
  uint64_t slot_bytes = 0;         // bytes of K and V one slot holds (all layers); accounting only
  uint64_t model_fingerprint = 0;  // seeds the chunk hash chain (chunk_hash.h)
  // Test seam: another chain hash (null: ChainChunkHash). Tests pass a weak one to force the
  // 64-bit collisions that the token-by-token verification must catch; production never sets it.
  ChunkHashFn chunk_hash = nullptr;
};

// Copy the K/V of token positions [0, num_tokens) of chunk slot `src` into slot `dst`, for every
// layer and KV head. The engine runs a step's copies in the order the tree returned them (across
// Insert and Append calls) and all of them before the step's K/V writes: a copy's source slot can
// be evicted and reused later in the same step (as another copy's destination or for new tokens),
// never earlier.
struct KvCopy {
  SlotId src;
  SlotId dst;
  int32_t num_tokens = 0;

  friend bool operator==(const KvCopy&, const KvCopy&) = default;
};

// Where one appended token's K/V goes: `offset` within the chunk in `slot`; `position` is the
// token's position in its sequence (offset == position % chunk_size).
struct KvWrite {
  SlotId slot;
  int32_t offset = 0;
  int32_t position = 0;

  friend bool operator==(const KvWrite&, const KvWrite&) = default;
};

// What Insert would reuse for a prompt (Match is a read-only probe).
struct MatchResult {
  int32_t num_tokens = 0;         // longest prefix of the prompt held in the tree
  int32_t num_copied_tokens = 0;  // how many of those Insert would copy into a new private chunk
                                  // (the match ends inside a chunk); the rest are shared in place
};

struct InsertResult {
  SeqId seq;
  int32_t num_cached_tokens = 0;  // prompt tokens on the new path: K/V present, no prefill needed
  std::optional<KvCopy> copy;     // set when the last matched chunk was copied; run it first
};

// New tokens for one live sequence.
struct SeqTokens {
  SeqId seq;
  std::span<const TokenId> tokens;
};

// Output of Append; reuse one object across steps so its vectors keep their capacity.
struct AppendResult {
  std::vector<KvCopy> copies;  // copy-on-write of shared partial tails; execute before the writes
  // One entry per appended token: request i's tokens are writes[write_indptr[i] ..
  // write_indptr[i + 1]), in the order given.
  std::vector<KvWrite> writes;
  std::vector<int32_t> write_indptr;  // [num_requests + 1]

  void Clear() {
    copies.clear();
    writes.clear();
    write_indptr.clear();
  }
};

// A live sequence. The span stays valid until the next non-const call on the tree.
struct SeqInfo {
  std::span<const ChunkId> path;  // root to tail; ceil(num_tokens / chunk_size) chunks
  int32_t num_tokens = 0;
  // Changes whenever a chunk on the path is replaced (copy-on-write) and is unique across the
  // tree's sequences; appending chunks at the end of the path leaves it unchanged. TppPlan uses it
  // to tell "the path only grew" from "rebuild".
  uint64_t layout_version = 0;
};

// A chunk in the tree. `tokens` stays valid until the next non-const call on the tree.
struct ChunkInfo {
  SlotId slot;
  ChunkId parent;     // invalid for a chunk at depth 0
  int32_t depth = 0;  // k: the chunk covers positions [k * chunk_size, k * chunk_size + len)
  int32_t len = 0;
  int32_t ref_count = 0;
  int32_t num_children = 0;
  bool full = false;
  uint64_t hash = 0;  // chained hash when full, 0 otherwise
  std::span<const TokenId> tokens;
};

// A chunk used by at least two sequences of a batch, and the contiguous range of batch rows (in
// GroupBatch's order) whose paths pass through it. depth is its index on those paths.
struct BatchGroup {
  ChunkId chunk;
  int32_t depth = 0;
  int32_t begin = 0;
  int32_t end = 0;  // end - begin >= 2
};

// Memory accounting. A shared chunk is counted once in used/referenced figures; the "unshared"
// figures count what the live sequences would need with no sharing at all.
struct KvCacheStats {
  int32_t num_slots = 0;
  int32_t free_slots = 0;
  int32_t used_slots = 0;         // == referenced_chunks + retained_chunks
  int32_t referenced_chunks = 0;  // on some live sequence's path
  int32_t retained_chunks = 0;    // unreferenced, kept for reuse, evictable
  int32_t shared_chunks = 0;      // referenced by two or more live sequences
  int32_t live_seqs = 0;
  int64_t live_tokens = 0;         // sum of live sequences' lengths
  int64_t unshared_chunks = 0;     // sum over live sequences of ceil(len / chunk_size)
  uint64_t bytes_used = 0;         // used_slots * slot_bytes
  uint64_t bytes_referenced = 0;   // referenced_chunks * slot_bytes
  uint64_t bytes_if_unshared = 0;  // unshared_chunks * slot_bytes
  // unshared_chunks / referenced_chunks: how many times over the live sequences' KV would fill
  // the slots they use if nothing were shared (1.0 with no sharing or no live sequence).
  double sharing_ratio = 1.0;

  // Cumulative counters since construction.
  uint64_t evictions = 0;      // chunks evicted
  uint64_t insert_copies = 0;  // Insert copied the partially matched chunk
  uint64_t cow_copies = 0;     // Append copied a shared partial tail
  uint64_t cached_tokens = 0;  // prompt tokens Insert found cached
};

class PrefixTree {
 public:
  // InvalidArgument for chunk_size < 1, num_slots < 1, or a pool too large to index
  // (num_slots * chunk_size tokens must fit in int32).
  static Result<PrefixTree> Create(const PrefixTreeOptions& options);

  PrefixTree(PrefixTree&&) = default;
  PrefixTree& operator=(PrefixTree&&) = default;
  PrefixTree(const PrefixTree&) = delete;
  PrefixTree& operator=(const PrefixTree&) = delete;

  const PrefixTreeOptions& options() const { return options_; }
  int32_t chunk_size() const { return options_.chunk_size; }
  int32_t num_slots() const { return options_.num_slots; }
  uint64_t hash_seed() const { return hash_seed_; }  // h_{-1} for this tree's chains

  // ---- Operations ----

  // The longest prefix of `prompt` held in the tree and how Insert would reuse it. Read-only:
  // it does not touch the LRU order. An empty prompt matches nothing.
  MatchResult Match(std::span<const TokenId> prompt) const;

  // Creates a sequence whose path is the longest cached prefix of prompt[0, min(max_cached_tokens,
  // prompt.size())). The engine passes prompt.size() - 1 so that the last prompt token is always
  // computed (it yields the first logits). The caller then Appends the remaining prompt tokens as
  // prefill proceeds. Retained chunks put on the path leave the LRU list.
  //
  // Invariant (4) holds between engine steps: the tokens a step Appends get their K/V only when
  // that step runs. So the engine Inserts a step's new sequences before that step's Appends;
  // otherwise a match could reuse (or copy) tokens whose K/V is not written yet.
  //
  // Errors: InvalidArgument for an empty prompt or max_cached_tokens < 0; ResourceExhausted when
  // the partially matched chunk must be copied and no slot can be freed (nothing changes), or when
  // 2^22 - 1 sequences are live.
  Result<InsertResult> Insert(std::span<const TokenId> prompt, int32_t max_cached_tokens);

  // Appends tokens to any subset of live sequences, any number each (not lock-step). For each
  // token it reports where its K/V goes; copy-on-write copies come first in `out->copies`. A full
  // last chunk (or an empty path) grows a new private child chunk; a partial private tail is filled
  // in place; a partial tail shared with other live sequences is copied first. When several
  // requests append to the same shared partial chunk, they are served in the order given and the
  // last one left holding it writes in place.
  //
  // Errors (and then nothing changes, `out` is cleared): NotFound for an unknown sequence,
  // InvalidArgument for a sequence listed twice, OutOfRange when a sequence would pass 2^31 - 1
  // tokens, ResourceExhausted when the free slots plus the retained chunks are fewer than the new
  // chunks needed.
  Status Append(std::span<const SeqTokens> batch, AppendResult* out);

  // Slots Append(batch) would take from the pool (free or by eviction), or its error.
  Result<int32_t> AppendSlotsNeeded(std::span<const SeqTokens> batch) const;

  // n new sequences sharing the whole history of `seq` (for n > 1 samples). Needs no slots: a
  // shared partial tail is copied on its next Append. Errors: NotFound, InvalidArgument for n < 0,
  // ResourceExhausted when the sequence table is full.
  Result<std::vector<SeqId>> Fork(SeqId seq, int32_t n);

  // Ends a sequence: drops its references; chunks left unreferenced are retained (most recently
  // released last in eviction order). NotFound for an unknown sequence.
  Status Release(SeqId seq);

  // Attaches the KV event observer (borrowed; nullptr detaches). See kv_events.h.
  void SetObserver(KvEventObserver* observer) { observer_ = observer; }

  // ---- Batches ----

  // Orders `batch` so that every chunk used by two or more of its sequences covers a contiguous
  // range of rows (the tree's DFS order restricted to the batch), and lists those chunks as
  // BatchGroups in pre-order (by begin, then depth). Within a group, sequences whose path ends
  // there come first; otherwise the given order is kept. `shared` may be null.
  // Errors: NotFound for an unknown sequence, InvalidArgument for a duplicate; outputs cleared.
  Status GroupBatch(std::span<const SeqId> batch, std::vector<SeqId>* order,
                    std::vector<BatchGroup>* shared) const;
  Status DfsOrder(std::span<const SeqId> batch, std::vector<SeqId>* order) const {
    return GroupBatch(batch, order, nullptr);
  }

  // ---- Introspection ----

  Result<SeqInfo> Seq(SeqId seq) const;
  // NotFound for an id out of range or a free chunk.
  Result<ChunkInfo> Chunk(ChunkId chunk) const;
  // Cheap accessors for chunks on a live path (TppPlan's hot path). Precondition: `chunk` is in
  // use (DCHECKed).
  int32_t ChunkLen(ChunkId chunk) const {
    DCHECK(chunk.value() < root_ && nodes_[chunk.value()].in_use);
    return nodes_[chunk.value()].len;
  }
  SlotId ChunkSlot(ChunkId chunk) const {
    DCHECK(chunk.value() < root_ && nodes_[chunk.value()].in_use);
    return SlotId(chunk.value());
  }

  int32_t num_live_seqs() const { return num_live_seqs_; }
  int32_t free_slots() const { return static_cast<int32_t>(free_nodes_.size()); }
  int32_t retained_chunks() const { return num_retained_; }
  // Slots an operation could get: free plus evictable (every retained chunk is, by cascade).
  int32_t available_slots() const { return free_slots() + num_retained_; }
  KvCacheStats Stats() const;

  // Retained chunks, next to be evicted first.
  std::vector<ChunkId> EvictionOrder() const;
  // Every full-chunk hash held now (one entry per hash, however many copies): the snapshot a
  // reconnecting KV-event subscriber starts from.
  std::vector<StoredChunkHash> StoredHashes() const;
  // How many full chunks with this hash the tree holds.
  int32_t HashCopies(uint64_t hash) const;

  // Verifies invariants (1)-(7), the indexes and the accounting from scratch: O(tree + paths).
  // Internal error describing the first violation. For tests and debugging.
  Status CheckInvariants() const;

 private:
  static constexpr uint32_t kNil = 0xffffffffu;

  struct Node {
    uint32_t parent = kNil;
    uint32_t bucket_prev = kNil, bucket_next = kNil;  // children of parent with this first token
    uint32_t hash_prev = kNil, hash_next = kNil;      // full chunks with the same hash
    uint32_t lru_prev = kNil, lru_next = kNil;        // retained list
    int32_t depth = 0;
    int32_t len = 0;
    int32_t ref_count = 0;
    int32_t num_children = 0;
    uint64_t hash = 0;
    bool in_use = false;
  };

  struct SeqState {
    uint32_t generation = 0;
    bool live = false;
    int32_t num_tokens = 0;
    uint64_t layout_version = 0;
    std::vector<ChunkId> path;
  };

  // What Match found: full chunks matched through the hash index, then an optional tail chunk.
  struct MatchPlan {
    uint32_t anchor = kNil;   // deepest fully matched chunk (root when none)
    int32_t full_chunks = 0;  // chunks from the root to anchor inclusive
    uint32_t tail = kNil;     // chunk under anchor matched for tail_tokens > 0 tokens
    int32_t tail_tokens = 0;
    bool tail_shared = false;  // tail_tokens == tail's len: share it instead of copying
  };

  explicit PrefixTree(const PrefixTreeOptions& options);

  void MatchInternal(std::span<const TokenId> prompt, MatchPlan* plan) const;
  bool VerifyFullPath(uint32_t node, std::span<const TokenId> prompt) const;
  Status CheckAppend(std::span<const SeqTokens> batch, int32_t* slots_needed) const;

  // Sequence table.
  Result<uint32_t> SeqIndex(SeqId seq) const;
  Status ReserveSeqs(int32_t n) const;
  uint32_t NewSeq();
  SeqId MakeSeqId(uint32_t index) const;

  // Chunks.
  TokenId* TokensOf(uint32_t node) {
    return tokens_.data() + static_cast<size_t>(node) * options_.chunk_size;
  }
  const TokenId* TokensOf(uint32_t node) const {
    return tokens_.data() + static_cast<size_t>(node) * options_.chunk_size;
  }
  uint64_t HashOf(uint32_t node) const { return node == root_ ? hash_seed_ : nodes_[node].hash; }
  uint64_t Chain(uint64_t prev, std::span<const TokenId> tokens) const {
    return options_.chunk_hash != nullptr ? options_.chunk_hash(prev, tokens)
                                          : ChainChunkHash(prev, tokens);
  }
  uint32_t NewChunk(uint32_t parent, std::span<const TokenId> tokens);
  void Fill(uint32_t node, std::span<const TokenId> tokens);
  void OnFull(uint32_t node);
  void EvictOne();
  void AddRef(uint32_t node, int32_t n = 1);
  void DropRef(uint32_t node);
  void LruPushBack(uint32_t node);
  void LruRemove(uint32_t node);

  PrefixTreeOptions options_;
  uint64_t hash_seed_ = 0;
  uint32_t root_ = 0;                 // == num_slots; not a chunk and owns no slot
  std::vector<Node> nodes_;           // [num_slots + 1]; node i owns slot i
  std::vector<TokenId> tokens_;       // [num_slots][chunk_size]
  std::vector<uint32_t> free_nodes_;  // stack of free nodes
  uint32_t lru_head_ = kNil, lru_tail_ = kNil;
  int32_t num_retained_ = 0;
  int32_t num_shared_ = 0;             // chunks with ref_count >= 2
  internal::FlatIndex hash_index_;   // chunk hash -> first chunk of its hash list
  internal::FlatIndex child_index_;  // (parent << 32 | first token) -> first child of bucket

  std::vector<SeqState> seqs_;
  std::deque<uint32_t> free_seqs_;  // FIFO, so an index rests long before reuse
  int32_t num_live_seqs_ = 0;
  int64_t live_tokens_ = 0;
  int64_t unshared_chunks_ = 0;
  uint64_t next_layout_version_ = 1;

  KvEventObserver* observer_ = nullptr;
  uint64_t evictions_ = 0, insert_copies_ = 0, cow_copies_ = 0, cached_tokens_ = 0;

  // Scratch for const methods (see thread safety above).
  mutable std::vector<uint64_t> scratch_hashes_;
  mutable std::vector<uint32_t> scratch_path_;
  mutable std::vector<uint32_t> mark_;  // per node / per sequence index, compared with mark_epoch_
  mutable std::vector<uint32_t> seq_mark_;
  mutable std::vector<int32_t> scratch_ref_;
  mutable uint32_t mark_epoch_ = 0;
  mutable std::vector<std::span<const ChunkId>> scratch_paths_;
  mutable std::vector<int32_t> scratch_rows_, scratch_tmp_, scratch_group_of_;
  mutable std::vector<uint32_t> scratch_keys_;
  mutable std::vector<int32_t> scratch_counts_;
  struct Range {
    int32_t begin, end, depth;
    uint32_t chunk;
  };
  mutable std::vector<Range> scratch_stack_;
};

}  // namespace chunkserve::kv

#endif  // CHUNKSERVE_RUNTIME_KVCACHE_PREFIX_TREE_H_
