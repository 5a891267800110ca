#include "worker/queued_prefill.h"

#include <algorithm>
#include <utility>

#include "runtime/kvcache/chunk_hash.h"

namespace chunkserve::worker {

QueuedPrefill::QueuedPrefill(uint64_t hash_seed, int32_t chunk_size)
    : seed_(hash_seed), chunk_size_(std::max(1, chunk_size)) {}

void QueuedPrefill::Stored(uint64_t hash) {
  std::lock_guard<std::mutex> lock(mu_);
  stored_.insert(hash);
}

void QueuedPrefill::Evicted(uint64_t hash) {
  std::lock_guard<std::mutex> lock(mu_);
  stored_.erase(hash);
}

int64_t QueuedPrefill::Add(uint64_t key, std::span<const TokenId> prompt) {
  const auto prompt_tokens = static_cast<int64_t>(prompt.size());
  // Hashing needs no lock; chunk_size_ >= 1, so this cannot fail.
  std::vector<uint64_t> chain = kv::FullChunkHashes(seed_, chunk_size_, prompt).value();
  std::lock_guard<std::mutex> lock(mu_);
  int64_t known = 0;
  for (uint64_t h : chain) {
    if (!stored_.count(h) && !queued_.count(h)) break;
    ++known;
  }
  // The last prompt token is always computed (its logits give the first token).
  const int64_t cached = std::min(known * chunk_size_, std::max<int64_t>(0, prompt_tokens - 1));
  const int64_t tokens = prompt_tokens - cached;
  for (uint64_t h : chain) ++queued_[h];
  auto [it, inserted] = waiting_.try_emplace(key);
  if (!inserted) {  // a reused key: the old entry leaves first
    for (uint64_t h : it->second.chain) {
      if (auto q = queued_.find(h); q != queued_.end() && --q->second == 0) queued_.erase(q);
    }
    tokens_ -= it->second.tokens;
  }
  it->second = Waiting{std::move(chain), tokens};
  tokens_ += tokens;
  return tokens;
}

void QueuedPrefill::Remove(uint64_t key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = waiting_.find(key);
  if (it == waiting_.end()) return;
  for (uint64_t h : it->second.chain) {
    if (auto q = queued_.find(h); q != queued_.end() && --q->second == 0) queued_.erase(q);
  }
  tokens_ -= it->second.tokens;
  waiting_.erase(it);
}

int64_t QueuedPrefill::tokens() const {
  std::lock_guard<std::mutex> lock(mu_);
  return tokens_;
}

size_t QueuedPrefill::stored_chunks() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stored_.size();
}

}  // namespace chunkserve::worker
