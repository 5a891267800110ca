#include "runtime/kvcache/prefix_tree.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "runtime/base/logging.h"
#include "runtime/kvcache/chunk_hash.h"

namespace chunkserve::kv {
namespace {

constexpr int kSeqIndexBits = 22;
constexpr uint32_t kSeqIndexMask = (1u << kSeqIndexBits) - 1;
constexpr uint32_t kSeqGenerationMask = (1u << (32 - kSeqIndexBits)) - 1;
// Index kSeqIndexMask with the last generation would spell SeqId::Invalid(); never hand it out.
constexpr uint32_t kMaxSeqs = kSeqIndexMask;

uint64_t ChildKey(uint32_t parent, TokenId first_token) {
  return (static_cast<uint64_t>(parent) << 32) | static_cast<uint32_t>(first_token);
}

int32_t CeilDiv(int64_t a, int32_t b) { return static_cast<int32_t>((a + b - 1) / b); }

std::string Str(int64_t v) { return std::to_string(v); }

// Mark arrays (per node, per sequence index) hold the epoch of the call that last wrote them, so no
// call has to clear them. Returns a fresh epoch e; this call may use the values e and e + 1.
uint32_t NextEpoch(uint32_t* epoch, std::vector<uint32_t>* a, std::vector<uint32_t>* b) {
  if (*epoch >= 0xfffffff0u) {
    std::fill(a->begin(), a->end(), 0);
    std::fill(b->begin(), b->end(), 0);
    *epoch = 0;
  }
  *epoch += 2;
  return *epoch;
}

}  // namespace

// ---- Construction ----

Result<PrefixTree> PrefixTree::Create(const PrefixTreeOptions& options) {
  if (options.chunk_size < 1) {
    return Status::InvalidArgument("chunk size " + Str(options.chunk_size) + " < 1");
  }
  if (options.num_slots < 1) {
    return Status::InvalidArgument("num_slots " + Str(options.num_slots) + " < 1");
  }
  if (static_cast<int64_t>(options.num_slots) * options.chunk_size > INT32_MAX) {
    return Status::InvalidArgument("num_slots " + Str(options.num_slots) + " * chunk size " +
                                   Str(options.chunk_size) + " exceeds 2^31 tokens");
  }
  return PrefixTree(options);
}

PrefixTree::PrefixTree(const PrefixTreeOptions& options)
    : options_(options),
      hash_seed_(ChunkHashSeed(options.model_fingerprint, options.chunk_size)),
      root_(static_cast<uint32_t>(options.num_slots)),
      nodes_(static_cast<size_t>(options.num_slots) + 1),
      tokens_(static_cast<size_t>(options.num_slots) * options.chunk_size),
      hash_index_(static_cast<size_t>(options.num_slots)),
      child_index_(static_cast<size_t>(options.num_slots)),
      mark_(static_cast<size_t>(options.num_slots) + 1, 0),
      scratch_ref_(static_cast<size_t>(options.num_slots) + 1, 0),
      scratch_group_of_(static_cast<size_t>(options.num_slots) + 1, 0) {
  nodes_[root_].in_use = true;
  nodes_[root_].depth = -1;
  nodes_[root_].len = options.chunk_size;  // the root behaves as a full parent
  // Pop order: slot 0 first.
  free_nodes_.reserve(static_cast<size_t>(options.num_slots));
  for (uint32_t i = root_; i-- > 0;) free_nodes_.push_back(i);
}

// ---- Sequences ----

SeqId PrefixTree::MakeSeqId(uint32_t index) const {
  return SeqId((seqs_[index].generation << kSeqIndexBits) | index);
}

Result<uint32_t> PrefixTree::SeqIndex(SeqId seq) const {
  const uint32_t index = seq.value() & kSeqIndexMask;
  if (!seq.valid() || index >= seqs_.size() || !seqs_[index].live ||
      seqs_[index].generation != (seq.value() >> kSeqIndexBits)) {
    return Status::NotFound("unknown sequence SeqId(" + std::to_string(seq.value()) + ")");
  }
  return index;
}

Status PrefixTree::ReserveSeqs(int32_t n) const {
  if (static_cast<int64_t>(num_live_seqs_) + n > kMaxSeqs) {
    return Status::ResourceExhausted("sequence table full: " + Str(num_live_seqs_) + " live, " +
                                     Str(n) + " more requested, limit " + Str(kMaxSeqs));
  }
  return Status::Ok();
}

uint32_t PrefixTree::NewSeq() {
  uint32_t index;
  if (!free_seqs_.empty()) {
    index = free_seqs_.front();
    free_seqs_.pop_front();
  } else {
    index = static_cast<uint32_t>(seqs_.size());
    seqs_.emplace_back();
  }
  SeqState& s = seqs_[index];
  CHECK(!s.live);
  s.live = true;
  s.num_tokens = 0;
  s.layout_version = next_layout_version_++;
  s.path.clear();
  ++num_live_seqs_;
  return index;
}

Result<SeqInfo> PrefixTree::Seq(SeqId seq) const {
  CHUNKSERVE_ASSIGN_OR_RETURN(const uint32_t index, SeqIndex(seq));
  const SeqState& s = seqs_[index];
  return SeqInfo{std::span<const ChunkId>(s.path), s.num_tokens, s.layout_version};
}

// ---- Chunks ----

void PrefixTree::LruPushBack(uint32_t n) {
  Node& node = nodes_[n];
  node.lru_prev = lru_tail_;
  node.lru_next = kNil;
  if (lru_tail_ != kNil) {
    nodes_[lru_tail_].lru_next = n;
  } else {
    lru_head_ = n;
  }
  lru_tail_ = n;
  ++num_retained_;
}

void PrefixTree::LruRemove(uint32_t n) {
  Node& node = nodes_[n];
  if (node.lru_prev != kNil) {
    nodes_[node.lru_prev].lru_next = node.lru_next;
  } else {
    lru_head_ = node.lru_next;
  }
  if (node.lru_next != kNil) {
    nodes_[node.lru_next].lru_prev = node.lru_prev;
  } else {
    lru_tail_ = node.lru_prev;
  }
  node.lru_prev = node.lru_next = kNil;
  --num_retained_;
}

void PrefixTree::AddRef(uint32_t n, int32_t count) {
  Node& node = nodes_[n];
  if (node.ref_count == 0) LruRemove(n);
  if (node.ref_count < 2 && node.ref_count + count >= 2) ++num_shared_;
  node.ref_count += count;
}

void PrefixTree::DropRef(uint32_t n) {
  Node& node = nodes_[n];
  DCHECK_GT(node.ref_count, 0);
  if (node.ref_count == 2) --num_shared_;
  if (--node.ref_count == 0) LruPushBack(n);
}

uint32_t PrefixTree::NewChunk(uint32_t parent, std::span<const TokenId> tokens) {
  DCHECK(!tokens.empty() && static_cast<int32_t>(tokens.size()) <= options_.chunk_size);
  DCHECK_EQ(nodes_[parent].len, options_.chunk_size);
  if (free_nodes_.empty()) EvictOne();
  const uint32_t n = free_nodes_.back();
  free_nodes_.pop_back();
  Node& node = nodes_[n];
  node = Node();
  node.in_use = true;
  node.parent = parent;
  node.depth = nodes_[parent].depth + 1;
  ++nodes_[parent].num_children;
  // Newest child first in its bucket.
  const uint64_t key = ChildKey(parent, tokens[0]);
  const uint32_t head = child_index_.Find(key);
  node.bucket_next = head == internal::FlatIndex::kEmpty ? kNil : head;
  if (node.bucket_next != kNil) nodes_[node.bucket_next].bucket_prev = n;
  child_index_.Set(key, n);
  Fill(n, tokens);
  return n;
}

void PrefixTree::Fill(uint32_t n, std::span<const TokenId> tokens) {
  Node& node = nodes_[n];
  DCHECK_LE(node.len + static_cast<int32_t>(tokens.size()), options_.chunk_size);
  std::memcpy(TokensOf(n) + node.len, tokens.data(), tokens.size_bytes());
  node.len += static_cast<int32_t>(tokens.size());
  if (node.len == options_.chunk_size) OnFull(n);
}

void PrefixTree::OnFull(uint32_t n) {
  Node& node = nodes_[n];
  const uint64_t parent_hash = HashOf(node.parent);
  node.hash = Chain(
      parent_hash, std::span<const TokenId>(TokensOf(n), static_cast<size_t>(options_.chunk_size)));
  const uint32_t head = hash_index_.Find(node.hash);
  node.hash_prev = kNil;
  node.hash_next = head == internal::FlatIndex::kEmpty ? kNil : head;
  if (node.hash_next != kNil) nodes_[node.hash_next].hash_prev = n;
  hash_index_.Set(node.hash, n);
  if (head == internal::FlatIndex::kEmpty && observer_ != nullptr) {
    observer_->OnChunkStored(node.hash, parent_hash);
  }
}

void PrefixTree::EvictOne() {
  const uint32_t n = lru_head_;
  CHECK_NE(n, kNil) << "eviction with no retained chunk: capacity check missed";
  Node& node = nodes_[n];
  CHECK(node.ref_count == 0 && node.num_children == 0) << "LRU head is not an unreferenced leaf";
  LruRemove(n);
  // Child bucket.
  if (node.bucket_prev != kNil) {
    nodes_[node.bucket_prev].bucket_next = node.bucket_next;
  } else {
    const uint64_t key = ChildKey(node.parent, TokensOf(n)[0]);
    if (node.bucket_next != kNil) {
      child_index_.Set(key, node.bucket_next);
    } else {
      child_index_.Erase(key);
    }
  }
  if (node.bucket_next != kNil) nodes_[node.bucket_next].bucket_prev = node.bucket_prev;
  // Hash list.
  if (node.len == options_.chunk_size) {
    if (node.hash_prev != kNil) {
      nodes_[node.hash_prev].hash_next = node.hash_next;
    } else if (node.hash_next != kNil) {
      hash_index_.Set(node.hash, node.hash_next);
    } else {
      hash_index_.Erase(node.hash);
      if (observer_ != nullptr) observer_->OnChunkEvicted(node.hash);
    }
    if (node.hash_next != kNil) nodes_[node.hash_next].hash_prev = node.hash_prev;
  }
  --nodes_[node.parent].num_children;
  node = Node();
  free_nodes_.push_back(n);
  ++evictions_;
}

Result<ChunkInfo> PrefixTree::Chunk(ChunkId chunk) const {
  if (!chunk.valid() || chunk.value() >= root_ || !nodes_[chunk.value()].in_use) {
    return Status::NotFound("no chunk ChunkId(" + std::to_string(chunk.value()) + ")");
  }
  const uint32_t n = chunk.value();
  const Node& node = nodes_[n];
  ChunkInfo info;
  info.slot = SlotId(n);
  info.parent = node.parent == root_ ? ChunkId::Invalid() : ChunkId(node.parent);
  info.depth = node.depth;
  info.len = node.len;
  info.ref_count = node.ref_count;
  info.num_children = node.num_children;
  info.full = node.len == options_.chunk_size;
  info.hash = info.full ? node.hash : 0;
  info.tokens = std::span<const TokenId>(TokensOf(n), static_cast<size_t>(node.len));
  return info;
}

// ---- Match ----

// True when `node` (a full chunk) and all its ancestors spell prompt[0, (depth + 1) * c). Results
// are memoized per Match call in mark_: epoch e == verified, e + 1 == mismatch.
bool PrefixTree::VerifyFullPath(uint32_t node, std::span<const TokenId> prompt) const {
  const uint32_t good = mark_epoch_, bad = mark_epoch_ + 1;
  const size_t c = static_cast<size_t>(options_.chunk_size);
  scratch_path_.clear();
  bool ok = true;
  for (uint32_t x = node; x != root_; x = nodes_[x].parent) {
    if (mark_[x] == good) break;
    const Node& n = nodes_[x];
    const size_t begin = static_cast<size_t>(n.depth) * c;
    if (mark_[x] == bad || n.len != options_.chunk_size || begin + c > prompt.size() ||
        !std::equal(TokensOf(x), TokensOf(x) + c, prompt.begin() + begin)) {
      mark_[x] = bad;
      ok = false;
      break;
    }
    scratch_path_.push_back(x);
  }
  for (const uint32_t x : scratch_path_) mark_[x] = ok ? good : bad;
  return ok;
}

void PrefixTree::MatchInternal(std::span<const TokenId> prompt, MatchPlan* plan) const {
  *plan = MatchPlan();
  plan->anchor = root_;
  if (prompt.empty()) return;
  const size_t c = static_cast<size_t>(options_.chunk_size);
  NextEpoch(&mark_epoch_, &mark_, &seq_mark_);

  // Full chunks: follow the hash chain while some chunk carries the prompt's next hash. The chain
  // names whole prefixes, so this finds the deepest full match whichever duplicate holds it.
  scratch_hashes_.clear();
  uint64_t h = hash_seed_;
  for (size_t begin = 0; begin + c <= prompt.size(); begin += c) {
    h = Chain(h, prompt.subspan(begin, c));
    if (hash_index_.Find(h) == internal::FlatIndex::kEmpty) break;
    scratch_hashes_.push_back(h);
  }

  // Candidate anchors: every copy of the deepest matched chunk that verifies token by token (a
  // 64-bit collision must not alias K/V; on a mismatch, back off a chunk), or the root. Under each,
  // the children that start with the prompt's next token may extend the match. Best = most tokens;
  // then an exact cover (share, no copy); then an anchor other sequences use (sharing live chunks
  // keeps fewer copies alive). Ties keep the first found.
  struct Score {
    int32_t tokens;
    bool exact;
    bool live;
    bool operator>(const Score& o) const {
      return std::tie(tokens, exact, live) > std::tie(o.tokens, o.exact, o.live);
    }
  };
  Score best{-1, false, false};
  size_t depth = scratch_hashes_.size();
  const auto consider_anchor = [&](uint32_t anchor) {
    const bool live = anchor != root_ && nodes_[anchor].ref_count > 0;
    if (Score{0, false, live} > best) {
      best = Score{0, false, live};
      plan->anchor = anchor;
      plan->tail = kNil;
      plan->tail_tokens = 0;
      plan->tail_shared = false;
    }
    const std::span<const TokenId> rest = prompt.subspan(depth * c);
    if (rest.empty()) return;
    const uint32_t head = child_index_.Find(ChildKey(anchor, rest[0]));
    if (head == internal::FlatIndex::kEmpty) return;
    for (uint32_t x = head; x != kNil; x = nodes_[x].bucket_next) {
      const Node& n = nodes_[x];
      const size_t limit = std::min(static_cast<size_t>(n.len), rest.size());
      const TokenId* t = TokensOf(x);
      const int32_t tokens =
          static_cast<int32_t>(std::mismatch(t, t + limit, rest.begin()).first - t);
      const Score score{tokens, tokens == n.len, live};
      if (score > best) {
        best = score;
        plan->anchor = anchor;
        plan->tail = x;
        plan->tail_tokens = tokens;
        plan->tail_shared = score.exact;
      }
    }
  };
  for (; depth > 0; --depth) {
    for (uint32_t x = hash_index_.Find(scratch_hashes_[depth - 1]); x != kNil;
         x = nodes_[x].hash_next) {
      if (nodes_[x].depth == static_cast<int32_t>(depth) - 1 && VerifyFullPath(x, prompt)) {
        consider_anchor(x);
      }
    }
    if (best.tokens >= 0) break;
  }
  if (depth == 0) consider_anchor(root_);
  plan->full_chunks = static_cast<int32_t>(depth);
}

MatchResult PrefixTree::Match(std::span<const TokenId> prompt) const {
  MatchPlan plan;
  MatchInternal(prompt, &plan);
  MatchResult r;
  r.num_tokens = plan.full_chunks * options_.chunk_size + plan.tail_tokens;
  r.num_copied_tokens = plan.tail != kNil && !plan.tail_shared ? plan.tail_tokens : 0;
  return r;
}

// ---- Insert / Fork / Release ----

Result<InsertResult> PrefixTree::Insert(std::span<const TokenId> prompt,
                                        int32_t max_cached_tokens) {
  if (prompt.empty()) return Status::InvalidArgument("empty prompt");
  if (max_cached_tokens < 0) {
    return Status::InvalidArgument("max_cached_tokens " + Str(max_cached_tokens) + " < 0");
  }
  CHUNKSERVE_RETURN_IF_ERROR(ReserveSeqs(1));
  const std::span<const TokenId> cacheable =
      prompt.first(std::min(prompt.size(), static_cast<size_t>(max_cached_tokens)));
  MatchPlan plan;
  MatchInternal(cacheable, &plan);

  // The matched path, root first.
  scratch_path_.clear();
  for (uint32_t x = plan.anchor; x != root_; x = nodes_[x].parent) scratch_path_.push_back(x);
  std::reverse(scratch_path_.begin(), scratch_path_.end());
  const bool copy = plan.tail != kNil && !plan.tail_shared;
  if (copy) {
    // Retained chunks this Insert references (the path) or reads (the copy source) cannot be
    // evicted to make room; every other retained chunk can, by cascade.
    int32_t pinned = nodes_[plan.tail].ref_count == 0 ? 1 : 0;
    for (const uint32_t x : scratch_path_) pinned += nodes_[x].ref_count == 0 ? 1 : 0;
    if (available_slots() - pinned < 1) {
      return Status::ResourceExhausted("no KV slot for the " + Str(plan.tail_tokens) +
                                       " matched tokens to copy: " + Str(free_slots()) + " free, " +
                                       Str(num_retained_ - pinned) + " evictable");
    }
  }

  const uint32_t index = NewSeq();
  SeqState& s = seqs_[index];
  for (const uint32_t x : scratch_path_) {
    AddRef(x);
    s.path.push_back(ChunkId(x));
  }
  InsertResult result;
  if (plan.tail != kNil && plan.tail_shared) {
    AddRef(plan.tail);
    s.path.push_back(ChunkId(plan.tail));
  } else if (copy) {
    AddRef(plan.tail);  // pin the source while a slot is found
    const uint32_t y = NewChunk(
        plan.anchor,
        std::span<const TokenId>(TokensOf(plan.tail), static_cast<size_t>(plan.tail_tokens)));
    nodes_[y].ref_count = 1;
    DropRef(plan.tail);
    s.path.push_back(ChunkId(y));
    result.copy = KvCopy{SlotId(plan.tail), SlotId(y), plan.tail_tokens};
    ++insert_copies_;
  }
  s.num_tokens = plan.full_chunks * options_.chunk_size + plan.tail_tokens;
  live_tokens_ += s.num_tokens;
  unshared_chunks_ += static_cast<int64_t>(s.path.size());
  cached_tokens_ += static_cast<uint64_t>(s.num_tokens);
  result.seq = MakeSeqId(index);
  result.num_cached_tokens = s.num_tokens;
  return result;
}

Result<std::vector<SeqId>> PrefixTree::Fork(SeqId seq, int32_t n) {
  CHUNKSERVE_ASSIGN_OR_RETURN(const uint32_t index, SeqIndex(seq));
  if (n < 0) return Status::InvalidArgument("fork count " + Str(n) + " < 0");
  CHUNKSERVE_RETURN_IF_ERROR(ReserveSeqs(n));
  std::vector<SeqId> out;
  out.reserve(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) {
    const uint32_t child = NewSeq();  // may grow seqs_: index the table again below
    seqs_[child].path = seqs_[index].path;
    seqs_[child].num_tokens = seqs_[index].num_tokens;
    out.push_back(MakeSeqId(child));
  }
  for (const ChunkId x : seqs_[index].path) AddRef(x.value(), n);
  live_tokens_ += static_cast<int64_t>(n) * seqs_[index].num_tokens;
  unshared_chunks_ += static_cast<int64_t>(n) * static_cast<int64_t>(seqs_[index].path.size());
  return out;
}

Status PrefixTree::Release(SeqId seq) {
  CHUNKSERVE_ASSIGN_OR_RETURN(const uint32_t index, SeqIndex(seq));
  SeqState& s = seqs_[index];
  // Leaf to root, so that children enter the LRU list before their parents (invariant 7).
  for (auto it = s.path.rbegin(); it != s.path.rend(); ++it) DropRef(it->value());
  live_tokens_ -= s.num_tokens;
  unshared_chunks_ -= static_cast<int64_t>(s.path.size());
  s.path.clear();
  s.live = false;
  s.generation = (s.generation + 1) & kSeqGenerationMask;
  --num_live_seqs_;
  free_seqs_.push_back(index);
  return Status::Ok();
}

// ---- Append ----

Status PrefixTree::CheckAppend(std::span<const SeqTokens> batch, int32_t* slots_needed) const {
  *slots_needed = 0;
  if (seq_mark_.size() < seqs_.size()) seq_mark_.resize(seqs_.size(), 0);
  const uint32_t epoch = NextEpoch(&mark_epoch_, &mark_, &seq_mark_);
  const int32_t c = options_.chunk_size;
  int64_t need = 0;
  for (const SeqTokens& req : batch) {
    CHUNKSERVE_ASSIGN_OR_RETURN(const uint32_t index, SeqIndex(req.seq));
    if (seq_mark_[index] == epoch) {
      return Status::InvalidArgument("sequence SeqId(" + std::to_string(req.seq.value()) +
                                     ") appears twice in one append");
    }
    seq_mark_[index] = epoch;
    const int64_t m = static_cast<int64_t>(req.tokens.size());
    if (m == 0) continue;
    const SeqState& s = seqs_[index];
    if (static_cast<int64_t>(s.num_tokens) + m > INT32_MAX) {
      return Status::OutOfRange("sequence length would exceed 2^31 - 1 tokens");
    }
    int64_t room = 0;
    if (!s.path.empty()) {
      const uint32_t last = s.path.back().value();
      const Node& node = nodes_[last];
      room = c - node.len;
      if (room > 0) {
        // Simulate the reference moves of earlier requests on the same shared tail.
        if (mark_[last] != epoch) {
          mark_[last] = epoch;
          scratch_ref_[last] = node.ref_count;
        }
        if (scratch_ref_[last] > 1) {
          --scratch_ref_[last];
          need += 1;  // copy-on-write
        }
      }
    }
    if (m > room) need += CeilDiv(m - room, c);
  }
  if (need > INT32_MAX) return Status::ResourceExhausted("append needs more than 2^31 slots");
  *slots_needed = static_cast<int32_t>(need);
  return Status::Ok();
}

Result<int32_t> PrefixTree::AppendSlotsNeeded(std::span<const SeqTokens> batch) const {
  int32_t need = 0;
  CHUNKSERVE_RETURN_IF_ERROR(CheckAppend(batch, &need));
  return need;
}

Status PrefixTree::Append(std::span<const SeqTokens> batch, AppendResult* out) {
  out->Clear();
  int32_t need = 0;
  CHUNKSERVE_RETURN_IF_ERROR(CheckAppend(batch, &need));
  if (need > available_slots()) {
    return Status::ResourceExhausted("append needs " + Str(need) + " KV slots, " +
                                     Str(available_slots()) + " available (" + Str(free_slots()) +
                                     " free, " + Str(num_retained_) + " retained)");
  }
  const int32_t c = options_.chunk_size;
  out->write_indptr.push_back(0);
  for (const SeqTokens& req : batch) {
    const uint32_t index = req.seq.value() & kSeqIndexMask;  // validated by CheckAppend
    SeqState& s = seqs_[index];
    std::span<const TokenId> tokens = req.tokens;
    if (!tokens.empty() && !s.path.empty()) {
      const uint32_t last = s.path.back().value();
      const Node& node = nodes_[last];
      if (node.len < c && node.ref_count > 1) {
        const uint32_t y = NewChunk(
            node.parent, std::span<const TokenId>(TokensOf(last), static_cast<size_t>(node.len)));
        nodes_[y].ref_count = 1;
        DropRef(last);
        s.path.back() = ChunkId(y);
        s.layout_version = next_layout_version_++;
        out->copies.push_back(KvCopy{SlotId(last), SlotId(y), nodes_[y].len});
        ++cow_copies_;
      }
    }
    int32_t position = s.num_tokens;
    while (!tokens.empty()) {
      uint32_t tail = s.path.empty() ? root_ : s.path.back().value();
      int32_t offset = nodes_[tail].len;
      size_t take = std::min(tokens.size(), static_cast<size_t>(c - offset));
      if (offset == c) {  // full tail or empty path: grow a private chunk
        take = std::min(tokens.size(), static_cast<size_t>(c));
        tail = NewChunk(tail, tokens.first(take));
        nodes_[tail].ref_count = 1;
        s.path.push_back(ChunkId(tail));
        ++unshared_chunks_;
        offset = 0;
      } else {
        Fill(tail, tokens.first(take));
      }
      for (size_t i = 0; i < take; ++i) {
        out->writes.push_back(KvWrite{SlotId(tail), offset + static_cast<int32_t>(i), position++});
      }
      tokens = tokens.subspan(take);
    }
    live_tokens_ += position - s.num_tokens;
    s.num_tokens = position;
    out->write_indptr.push_back(static_cast<int32_t>(out->writes.size()));
  }
  return Status::Ok();
}

// ---- Batches ----

Status PrefixTree::GroupBatch(std::span<const SeqId> batch, std::vector<SeqId>* order,
                              std::vector<BatchGroup>* shared) const {
  order->clear();
  if (shared != nullptr) shared->clear();
  if (seq_mark_.size() < seqs_.size()) seq_mark_.resize(seqs_.size(), 0);
  const uint32_t epoch = NextEpoch(&mark_epoch_, &mark_, &seq_mark_);
  const int32_t b = static_cast<int32_t>(batch.size());
  scratch_paths_.resize(batch.size());
  for (int32_t i = 0; i < b; ++i) {
    CHUNKSERVE_ASSIGN_OR_RETURN(const uint32_t index, SeqIndex(batch[i]));
    if (seq_mark_[index] == epoch) {
      return Status::InvalidArgument("sequence SeqId(" + std::to_string(batch[i].value()) +
                                     ") appears twice in one batch");
    }
    seq_mark_[index] = epoch;
    scratch_paths_[i] = seqs_[index].path;
  }

  // MSD radix grouping: split each range of rows by the chunk at `depth`; groups of two or more
  // rows are shared chunks and are split again one level down. A row takes part at depth d only
  // while it shares its first d chunks with another row, so the work is O(b + sum of shared
  // prefix lengths). A chunk determines its ancestors, so it occurs in a single range and its
  // group index (scratch_group_of_, valid while mark_ == epoch) needs no reset.
  scratch_rows_.resize(batch.size());
  scratch_tmp_.resize(batch.size());
  for (int32_t i = 0; i < b; ++i) scratch_rows_[i] = i;
  scratch_stack_.clear();
  scratch_stack_.push_back(Range{0, b, 0, kNil});
  while (!scratch_stack_.empty()) {
    const Range r = scratch_stack_.back();
    scratch_stack_.pop_back();
    if (r.chunk != kNil && shared != nullptr) {
      shared->push_back(BatchGroup{ChunkId(r.chunk), r.depth - 1, r.begin, r.end});
    }
    if (r.end - r.begin < 2) continue;
    // Fast path: every row continues through the same chunk (a long shared prompt), so the range
    // is that chunk's group as it stands.
    const std::span<const ChunkId> first_path = scratch_paths_[scratch_rows_[r.begin]];
    bool uniform = static_cast<int32_t>(first_path.size()) > r.depth;
    for (int32_t i = r.begin + 1; uniform && i < r.end; ++i) {
      const std::span<const ChunkId> p = scratch_paths_[scratch_rows_[i]];
      uniform = static_cast<int32_t>(p.size()) > r.depth && p[r.depth] == first_path[r.depth];
    }
    if (uniform) {
      scratch_stack_.push_back(Range{r.begin, r.end, r.depth + 1, first_path[r.depth].value()});
      continue;
    }
    // Rows whose path ends at this depth go first.
    int32_t out_pos = r.begin;
    for (int32_t i = r.begin; i < r.end; ++i) {
      const int32_t row = scratch_rows_[i];
      if (static_cast<int32_t>(scratch_paths_[row].size()) == r.depth)
        scratch_tmp_[out_pos++] = row;
    }
    const int32_t first_grouped = out_pos;
    scratch_keys_.clear();
    scratch_counts_.clear();
    for (int32_t i = r.begin; i < r.end; ++i) {
      const int32_t row = scratch_rows_[i];
      if (static_cast<int32_t>(scratch_paths_[row].size()) == r.depth) continue;
      const uint32_t x = scratch_paths_[row][r.depth].value();
      if (mark_[x] != epoch) {
        mark_[x] = epoch;
        scratch_group_of_[x] = static_cast<int32_t>(scratch_keys_.size());
        scratch_keys_.push_back(x);
        scratch_counts_.push_back(0);
      }
      ++scratch_counts_[scratch_group_of_[x]];
    }
    // Exclusive prefix sums turn counts into write positions.
    const size_t num_groups = scratch_keys_.size();
    for (size_t g = 0, pos = static_cast<size_t>(first_grouped); g < num_groups; ++g) {
      const int32_t count = scratch_counts_[g];
      scratch_counts_[g] = static_cast<int32_t>(pos);
      pos += static_cast<size_t>(count);
    }
    for (int32_t i = r.begin; i < r.end; ++i) {
      const int32_t row = scratch_rows_[i];
      if (static_cast<int32_t>(scratch_paths_[row].size()) == r.depth) continue;
      const int32_t g = scratch_group_of_[scratch_paths_[row][r.depth].value()];
      scratch_tmp_[scratch_counts_[g]++] = row;
    }
    std::copy(scratch_tmp_.begin() + r.begin, scratch_tmp_.begin() + r.end,
              scratch_rows_.begin() + r.begin);
    // After the scatter, scratch_counts_[g] is group g's end. Push in reverse for pre-order.
    for (size_t g = num_groups; g-- > 0;) {
      const int32_t end = scratch_counts_[g];
      const int32_t begin = g == 0 ? first_grouped : scratch_counts_[g - 1];
      if (end - begin >= 2)
        scratch_stack_.push_back(Range{begin, end, r.depth + 1, scratch_keys_[g]});
    }
  }
  order->reserve(batch.size());
  for (int32_t i = 0; i < b; ++i) order->push_back(batch[scratch_rows_[i]]);
  return Status::Ok();
}

// ---- Accounting and introspection ----

KvCacheStats PrefixTree::Stats() const {
  KvCacheStats s;
  s.num_slots = options_.num_slots;
  s.free_slots = free_slots();
  s.used_slots = s.num_slots - s.free_slots;
  s.retained_chunks = num_retained_;
  s.referenced_chunks = s.used_slots - s.retained_chunks;
  s.shared_chunks = num_shared_;
  s.live_seqs = num_live_seqs_;
  s.live_tokens = live_tokens_;
  s.unshared_chunks = unshared_chunks_;
  s.bytes_used = static_cast<uint64_t>(s.used_slots) * options_.slot_bytes;
  s.bytes_referenced = static_cast<uint64_t>(s.referenced_chunks) * options_.slot_bytes;
  s.bytes_if_unshared = static_cast<uint64_t>(s.unshared_chunks) * options_.slot_bytes;
  s.sharing_ratio = s.referenced_chunks > 0 ? static_cast<double>(s.unshared_chunks) /
                                                  static_cast<double>(s.referenced_chunks)
                                            : 1.0;
  s.evictions = evictions_;
  s.insert_copies = insert_copies_;
  s.cow_copies = cow_copies_;
  s.cached_tokens = cached_tokens_;
  return s;
}

std::vector<ChunkId> PrefixTree::EvictionOrder() const {
  std::vector<ChunkId> out;
  out.reserve(static_cast<size_t>(num_retained_));
  for (uint32_t x = lru_head_; x != kNil; x = nodes_[x].lru_next) out.push_back(ChunkId(x));
  return out;
}

std::vector<StoredChunkHash> PrefixTree::StoredHashes() const {
  std::vector<StoredChunkHash> out;
  out.reserve(hash_index_.size());
  hash_index_.ForEach([&](uint64_t hash, uint32_t head) {
    out.push_back(StoredChunkHash{hash, HashOf(nodes_[head].parent)});
  });
  return out;
}

int32_t PrefixTree::HashCopies(uint64_t hash) const {
  int32_t n = 0;
  const uint32_t head = hash_index_.Find(hash);
  if (head == internal::FlatIndex::kEmpty) return 0;
  for (uint32_t x = head; x != kNil; x = nodes_[x].hash_next) ++n;
  return n;
}

Status PrefixTree::CheckInvariants() const {
  const int32_t c = options_.chunk_size;
  const auto fail = [](const std::string& what) { return Status::Internal(what); };
  const size_t num_nodes = nodes_.size();
  std::vector<int32_t> refs(num_nodes, 0), children(num_nodes, 0);
  // (2) references recomputed from the live paths; (1) alignment.
  int32_t live = 0;
  int64_t tokens = 0, unshared = 0;
  for (size_t i = 0; i < seqs_.size(); ++i) {
    const SeqState& s = seqs_[i];
    if (!s.live) continue;
    ++live;
    tokens += s.num_tokens;
    unshared += static_cast<int64_t>(s.path.size());
    int64_t sum = 0;
    uint32_t parent = root_;
    for (size_t k = 0; k < s.path.size(); ++k) {
      const uint32_t x = s.path[k].value();
      if (x >= root_ || !nodes_[x].in_use) return fail("sequence " + Str(i) + " uses a free chunk");
      if (nodes_[x].parent != parent) return fail("sequence " + Str(i) + " path is not a path");
      if (nodes_[x].depth != static_cast<int32_t>(k)) return fail("chunk depth mismatch");
      if (k + 1 < s.path.size() && nodes_[x].len != c) {
        return fail("sequence " + Str(i) + " has a partial chunk before its tail");
      }
      ++refs[x];
      sum += nodes_[x].len;
      parent = x;
    }
    if (sum != s.num_tokens) return fail("sequence " + Str(i) + " length != sum of its chunks");
    if (s.num_tokens != 0 && CeilDiv(s.num_tokens, c) != static_cast<int32_t>(s.path.size())) {
      return fail("sequence " + Str(i) + " path length != ceil(len / c)");
    }
  }
  if (live != num_live_seqs_) return fail("live sequence count");
  if (tokens != live_tokens_) return fail("live token count");
  if (unshared != unshared_chunks_) return fail("unshared chunk count");

  int32_t used = 0, retained = 0, shared = 0;
  size_t full = 0;
  for (uint32_t x = 0; x < root_; ++x) {
    const Node& n = nodes_[x];
    if (!n.in_use) continue;
    ++used;
    if (n.parent == kNil || !nodes_[n.parent].in_use) return fail("chunk with a free parent");
    if (nodes_[n.parent].len != c) return fail("chunk under a partial parent");
    if (n.depth != nodes_[n.parent].depth + 1) return fail("depth is not parent depth + 1");
    ++children[n.parent];
    if (n.len < 1 || n.len > c) return fail("chunk length out of range");
    if (n.ref_count != refs[x]) {
      return fail("chunk " + Str(x) + " ref_count " + Str(n.ref_count) + " != " + Str(refs[x]) +
                  " live sequences through it");
    }
    if (n.ref_count == 0) ++retained;
    if (n.ref_count >= 2) ++shared;
    if (n.ref_count > nodes_[n.parent].ref_count && n.parent != root_) {
      return fail("ref_count increases down a path");
    }
    if (n.len == c) {
      ++full;
      const uint64_t h = Chain(
          HashOf(n.parent), std::span<const TokenId>(TokensOf(x), static_cast<size_t>(c)));
      if (h != n.hash) return fail("chunk " + Str(x) + " carries a wrong hash");
      bool listed = false;
      const uint32_t head = hash_index_.Find(n.hash);
      if (head == internal::FlatIndex::kEmpty || nodes_[head].hash_prev != kNil) {
        return fail("hash index head");
      }
      for (uint32_t y = head; y != kNil; y = nodes_[y].hash_next) listed |= y == x;
      if (!listed) return fail("full chunk missing from the hash index");
    }
    bool in_bucket = false;
    const uint32_t head = child_index_.Find(ChildKey(n.parent, TokensOf(x)[0]));
    if (head == internal::FlatIndex::kEmpty || nodes_[head].bucket_prev != kNil) {
      return fail("child index head");
    }
    for (uint32_t y = head; y != kNil; y = nodes_[y].bucket_next) {
      if (nodes_[y].parent != n.parent || TokensOf(y)[0] != TokensOf(x)[0]) {
        return fail("child bucket holds a foreign chunk");
      }
      in_bucket |= y == x;
    }
    if (!in_bucket) return fail("chunk missing from its child bucket");
  }
  for (uint32_t x = 0; x <= root_; ++x) {
    if (nodes_[x].in_use && nodes_[x].num_children != children[x]) return fail("child count");
  }
  if (used + free_slots() != options_.num_slots) return fail("free + used != num_slots");
  if (retained != num_retained_) return fail("retained count");
  if (shared != num_shared_) return fail("shared count " + Str(num_shared_) + " != " + Str(shared));
  // Every list reachable from the indexes holds exactly the live chunks filed under its key.
  size_t listed_full = 0, listed_children = 0;
  bool lists_ok = true;
  hash_index_.ForEach([&](uint64_t hash, uint32_t head) {
    for (uint32_t y = head, prev = kNil; y != kNil; prev = y, y = nodes_[y].hash_next) {
      lists_ok &= y < root_ && nodes_[y].in_use && nodes_[y].len == c && nodes_[y].hash == hash &&
                  nodes_[y].hash_prev == prev;
      if (!lists_ok || ++listed_full > full) return;
    }
  });
  child_index_.ForEach([&](uint64_t key, uint32_t head) {
    for (uint32_t y = head, prev = kNil; y != kNil; prev = y, y = nodes_[y].bucket_next) {
      lists_ok &= y < root_ && nodes_[y].in_use &&
                  ChildKey(nodes_[y].parent, TokensOf(y)[0]) == key &&
                  nodes_[y].bucket_prev == prev;
      if (!lists_ok || ++listed_children > static_cast<size_t>(used)) return;
    }
  });
  if (!lists_ok || listed_full != full || listed_children != static_cast<size_t>(used)) {
    return fail("an index lists a stale or foreign chunk");
  }
  // (7) LRU order: exactly the retained chunks, each after all of its retained descendants, which
  // holds iff each chunk comes after its children (descendants of a retained chunk are retained).
  std::vector<int32_t> lru_pos(num_nodes, -1);
  int32_t pos = 0;
  uint32_t prev = kNil;
  for (uint32_t x = lru_head_; x != kNil; prev = x, x = nodes_[x].lru_next) {
    if (nodes_[x].lru_prev != prev) return fail("LRU back link");
    if (!nodes_[x].in_use || nodes_[x].ref_count != 0) return fail("LRU holds a referenced chunk");
    if (pos > num_retained_) return fail("LRU cycle");
    lru_pos[x] = pos++;
  }
  if (prev != lru_tail_) return fail("LRU tail");
  if (pos != num_retained_) return fail("LRU length != retained chunks");
  for (uint32_t x = 0; x < root_; ++x) {
    const Node& n = nodes_[x];
    if (!n.in_use || n.ref_count != 0 || n.parent == root_) continue;
    if (lru_pos[n.parent] >= 0 && lru_pos[n.parent] < lru_pos[x]) {
      return fail("retained chunk " + Str(n.parent) + " precedes its child " + Str(x) +
                  " in eviction order");
    }
  }
  return Status::Ok();
}

}  // namespace chunkserve::kv
