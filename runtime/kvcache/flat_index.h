// FlatIndex: a fixed-capacity hash map from uint64 keys to uint32 values, for the prefix tree's
// indexes (chunk hash -> chunks, (parent, first token) -> children).
//
// Open addressing with linear probing and backward-shift deletion (no tombstones, so lookups stay
// short however many inserts and erases happen). The table is allocated once, at construction,
// with a power-of-two capacity of at least twice max_entries; no later operation allocates.
//
// Invariants: size() <= max_entries(); a slot is empty iff its value is kEmpty, so kEmpty is not a
// storable value. Holding more than max_entries() keys is a bug in the owner (CHECK).
//
// Thread safety: none; const methods may run concurrently with each other.
#ifndef CHUNKSERVE_RUNTIME_KVCACHE_FLAT_INDEX_H_
#define CHUNKSERVE_RUNTIME_KVCACHE_FLAT_INDEX_H_

#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "runtime/base/logging.h"

namespace chunkserve::kv::internal {

class FlatIndex {
 public:
  static constexpr uint32_t kEmpty = std::numeric_limits<uint32_t>::max();

  FlatIndex() = default;
  explicit FlatIndex(size_t max_entries) : max_entries_(max_entries) {
    size_t capacity = 16;
    while (capacity < 2 * max_entries) capacity *= 2;
    keys_.assign(capacity, 0);
    values_.assign(capacity, kEmpty);
    mask_ = capacity - 1;
  }

  size_t size() const { return size_; }
  size_t max_entries() const { return max_entries_; }

  // The value stored under `key`, or kEmpty.
  uint32_t Find(uint64_t key) const {
    if (values_.empty()) return kEmpty;
    for (size_t i = Home(key);; i = (i + 1) & mask_) {
      if (values_[i] == kEmpty) return kEmpty;
      if (keys_[i] == key) return values_[i];
    }
  }

  // Inserts `key` or overwrites its value. `value` must not be kEmpty.
  void Set(uint64_t key, uint32_t value) {
    CHECK_NE(value, kEmpty);
    CHECK(!values_.empty());
    size_t i = Home(key);
    for (; values_[i] != kEmpty; i = (i + 1) & mask_) {
      if (keys_[i] == key) {
        values_[i] = value;
        return;
      }
    }
    CHECK_LT(size_, max_entries_) << "FlatIndex over capacity";
    keys_[i] = key;
    values_[i] = value;
    ++size_;
  }

  // Removes `key`; returns whether it was present.
  bool Erase(uint64_t key) {
    if (values_.empty()) return false;
    size_t i = Home(key);
    for (;; i = (i + 1) & mask_) {
      if (values_[i] == kEmpty) return false;
      if (keys_[i] == key) break;
    }
    // Backward shift: pull later entries of the probe run into the hole when their home slot does
    // not lie cyclically in (hole, j], so every remaining key stays reachable from its home.
    size_t hole = i;
    for (size_t j = (hole + 1) & mask_; values_[j] != kEmpty; j = (j + 1) & mask_) {
      const size_t home = Home(keys_[j]);
      const bool home_in_range =
          hole <= j ? (hole < home && home <= j) : (hole < home || home <= j);
      if (home_in_range) continue;
      keys_[hole] = keys_[j];
      values_[hole] = values_[j];
      hole = j;
    }
    values_[hole] = kEmpty;
    --size_;
    return true;
  }

  // Calls f(key, value) for every entry, in table order.
  template <typename F>
  void ForEach(F&& f) const {
    for (size_t i = 0; i < values_.size(); ++i) {
      if (values_[i] != kEmpty) f(keys_[i], values_[i]);
    }
  }

 private:
  // MurmurHash3's 64-bit finalizer: keys such as (parent << 32 | token) are far from uniform.
  size_t Home(uint64_t k) const {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ULL;
    k ^= k >> 33;
    return static_cast<size_t>(k) & mask_;
  }

  std::vector<uint64_t> keys_;
  std::vector<uint32_t> values_;  // kEmpty marks an empty slot
  size_t mask_ = 0;
  size_t size_ = 0;
  size_t max_entries_ = 0;
};

}  // namespace chunkserve::kv::internal

#endif  // CHUNKSERVE_RUNTIME_KVCACHE_FLAT_INDEX_H_
