#include "tests/bench/attention_layout.h"

#include <algorithm>
#include <numeric>
#include <random>

namespace chunkserve::bench {

BenchLayout BuildBenchLayout(int32_t batch, int32_t chunk, int64_t np, int64_t ns) {
  BenchLayout l;
  l.num_seqs = batch;
  const bool share = batch >= 2;  // a lone sequence has nobody to share with: all private
  const int64_t shared = share ? ns : 0;
  const int64_t priv = np - shared;
  const int32_t shared_chunks = static_cast<int32_t>((shared + chunk - 1) / chunk);
  const int32_t private_chunks = static_cast<int32_t>((priv + chunk - 1) / chunk);
  l.num_slots = std::max(1, shared_chunks + batch * private_chunks);
  // Slots in a shuffled order, as a free list hands them out after some churn.
  std::vector<int32_t> slots(static_cast<size_t>(l.num_slots));
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), std::mt19937(1234));
  size_t next = 0;
  for (int32_t i = 0; i < shared_chunks; ++i) {
    const int32_t len = static_cast<int32_t>(std::min<int64_t>(chunk, shared - int64_t{i} * chunk));
    l.shared_slot.push_back(slots[next++]);
    l.shared_len.push_back(len);
    l.shared_seq_begin.push_back(0);
    l.shared_seq_end.push_back(batch);
    l.shared_partial_offset.push_back(l.num_partial_rows);
    l.num_partial_rows += batch;
    l.shared_tokens += len;
  }
  for (int32_t s = 0; s < batch; ++s) {
    for (int32_t i = 0; i < shared_chunks; ++i) {
      l.seq_shared_ids.push_back(i);
      l.block_slot.push_back(l.shared_slot[i]);
      l.block_len.push_back(l.shared_len[i]);
    }
    for (int32_t i = 0; i < private_chunks; ++i) {
      const int32_t len = static_cast<int32_t>(std::min<int64_t>(chunk, priv - int64_t{i} * chunk));
      l.private_slot.push_back(slots[next++]);
      l.private_len.push_back(len);
      l.block_slot.push_back(l.private_slot.back());
      l.block_len.push_back(len);
      l.private_tokens += len;
    }
    l.seq_shared_indptr.push_back(static_cast<int32_t>(l.seq_shared_ids.size()));
    l.private_indptr.push_back(static_cast<int32_t>(l.private_slot.size()));
    l.block_indptr.push_back(static_cast<int32_t>(l.block_slot.size()));
  }
  return l;
}

}  // namespace chunkserve::bench
