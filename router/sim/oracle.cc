// Reference hit rates (simulator.h, ComputeOracles): an infinite single cache and perfect
// affinity over per-worker LRU caches of the simulated capacity.
#include <algorithm>
#include <list>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "router/sim/simulator.h"
#include "runtime/kvcache/chunk_hash.h"

namespace chunkserve::router::sim {
namespace {

uint64_t Mix(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// One worker's chunk cache: hash -> position in the LRU list (front = least recent).
struct LruCache {
  std::list<uint64_t> order;
  std::unordered_map<uint64_t, std::list<uint64_t>::iterator> where;
};

}  // namespace

Result<OracleReport> ComputeOracles(const SimOptions& o, workload::WorkloadSource& source,
                                    double affinity_slack) {
  if (o.num_workers < 1 || o.chunk_size < 1 || o.worker.kv_capacity_chunks < 1 ||
      !(affinity_slack >= 1)) {
    return Status::InvalidArgument("oracle: bad options");
  }
  const uint64_t seed = kv::ChunkHashSeed(o.model_fingerprint, o.chunk_size);
  const auto capacity = static_cast<size_t>(o.worker.kv_capacity_chunks);
  const auto n = static_cast<size_t>(o.num_workers);
  OracleReport rep;
  std::unordered_set<uint64_t> seen;  // the infinite cache
  std::vector<LruCache> caches(n);
  std::vector<double> work(n, 0);  // uncached prompt tokens served, per worker
  double total_work = 0;
  while (std::optional<workload::WorkloadRequest> req = source.Next()) {
    const int64_t prompt = workload::PromptLength(*req);
    if (prompt < 1) continue;
    CHUNKSERVE_ASSIGN_OR_RETURN(std::vector<uint64_t> chain,
                                RequestChain(*req, seed, o.chunk_size));
    rep.prompt_tokens += static_cast<uint64_t>(prompt);
    auto cached = [&](size_t chunks) {
      return static_cast<uint64_t>(
          std::min<int64_t>(static_cast<int64_t>(chunks) * o.chunk_size, prompt - 1));
    };
    // Infinite single cache.
    size_t k = 0;
    while (k < chain.size() && seen.count(chain[k])) ++k;
    rep.infinite_cached_tokens += cached(k);
    seen.insert(chain.begin(), chain.end());
    if (chain.empty()) {
      // Nothing cacheable; the work still lands somewhere (the least loaded worker).
      const size_t w = static_cast<size_t>(std::min_element(work.begin(), work.end()) -
                                           work.begin());
      work[w] += static_cast<double>(prompt);
      total_work += static_cast<double>(prompt);
      continue;
    }
    // Perfect affinity.
    const double limit =
        affinity_slack * total_work / static_cast<double>(n) + static_cast<double>(prompt);
    size_t best = n, best_match = 0;
    uint64_t best_score = 0;
    for (size_t w = 0; w < n; ++w) {
      if (work[w] > limit) continue;
      size_t m = 0;
      const LruCache& c = caches[w];
      while (m < chain.size() && c.where.count(chain[m])) ++m;
      const uint64_t score = Mix(chain[0] ^ Mix(w + 1));
      if (best == n || m > best_match || (m == best_match && score > best_score)) {
        best = w;
        best_match = m;
        best_score = score;
      }
    }
    if (best == n) {  // cannot happen (the least loaded worker is always under the limit)
      best = static_cast<size_t>(std::min_element(work.begin(), work.end()) - work.begin());
      best_match = 0;
    }
    const uint64_t hit = cached(best_match);
    rep.affinity_cached_tokens += hit;
    work[best] += static_cast<double>(static_cast<uint64_t>(prompt) - hit);
    total_work += static_cast<double>(static_cast<uint64_t>(prompt) - hit);
    LruCache& c = caches[best];
    // Deepest first, so the root ends most recent (leaves are evicted first).
    for (size_t i = chain.size(); i-- > 0;) {
      auto it = c.where.find(chain[i]);
      if (it != c.where.end()) {
        c.order.splice(c.order.end(), c.order, it->second);
      } else {
        c.where.emplace(chain[i], c.order.insert(c.order.end(), chain[i]));
      }
    }
    while (c.order.size() > capacity) {
      c.where.erase(c.order.front());
      c.order.pop_front();
    }
  }
  if (rep.prompt_tokens > 0) {
    rep.infinite_hit_rate =
        static_cast<double>(rep.infinite_cached_tokens) / static_cast<double>(rep.prompt_tokens);
    rep.affinity_hit_rate =
        static_cast<double>(rep.affinity_cached_tokens) / static_cast<double>(rep.prompt_tokens);
  }
  return rep;
}

}  // namespace chunkserve::router::sim
