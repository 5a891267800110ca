// chunkserve-bench kvcache: prefix tree operations and TPP plan building at serving scale.
//
// Scenario (per repetition, on a fresh tree, chunk_size 64 by default):
//  1. `retained` chunks of unrelated history: sequences of 20 random chunks are inserted,
//     prefilled and released, so their chunks stay retained (evictable) in the pool.
//  2. `live` sequences arrive: each prompt is one of 100 system prompts (16 chunks, computed by
//     one earlier sequence each) plus a 200-token user message. Timed: Insert (match + path) of
//     every arrival, then the prefill Append of each one's uncached rest.
//  3. Decode: every live sequence appends one token per step, in batches of `batch`, for 64 steps.
//     The pool is sized with little headroom, so new chunks evict retained ones.
//  4. Plans: a random batch of `batch` live sequences; full Build, and Update after each of 64
//     decode steps of that batch (lengths only, or a rewrite of the private lists when a tail
//     crossed a chunk boundary).
//  5. Release of every live sequence.
// Reported: medians over repetitions (ops/s) and over calls (plan microseconds).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "runtime/kvcache/prefix_tree.h"
#include "runtime/plan/tpp_plan.h"
#include "tests/bench/bench.h"

namespace chunkserve::bench {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}


struct Config {
  int32_t chunk_size = 64;
  int32_t live = 10000;
  int32_t retained = 100000;
  int32_t batch = 256;
  int32_t reps = 5;
  bool json = false;
};

// One row of the result table: a metric and its samples.
struct Metric {
  std::string name;
  std::string unit;
  std::vector<double> samples;
};

class Runner {
 public:
  explicit Runner(const Config& cfg) : cfg_(cfg), rng_(12345) {}

  // Returns false (after printing why) when an operation fails.
  bool RunOnce(std::map<std::string, Metric>* metrics) {
    const int32_t c = cfg_.chunk_size;
    constexpr int kHistoryChunks = 20, kSystemChunks = 16, kUserTokens = 200, kDecodeSteps = 64;
    const int32_t history_seqs = (cfg_.retained + kHistoryChunks - 1) / kHistoryChunks;
    const int64_t live_chunks =
        100LL * (kSystemChunks + 1) + static_cast<int64_t>(cfg_.live) * ((kUserTokens + c - 1) / c);
    const int64_t slots = static_cast<int64_t>(history_seqs) * kHistoryChunks + live_chunks + 1000;
    Result<kv::PrefixTree> created = kv::PrefixTree::Create(
        {.chunk_size = c, .num_slots = static_cast<int32_t>(slots), .slot_bytes = 1});
    if (!created.ok()) return Fail(created.status());
    kv::PrefixTree tree = std::move(*created);
    kv::AppendResult out;

    // 1. Retained history.
    for (int32_t i = 0; i < history_seqs; ++i) {
      const std::vector<TokenId> prompt = RandomTokens(static_cast<size_t>(kHistoryChunks) * c);
      Result<SeqId> seq = AddSequence(tree, prompt, &out);
      if (!seq.ok()) return Fail(seq.status());
      if (Status s = tree.Release(*seq); !s.ok()) return Fail(s);
    }

    // 2. Live sequences: Insert, then prefill Append.
    std::vector<std::vector<TokenId>> systems(100);
    for (auto& s : systems) s = RandomTokens(static_cast<size_t>(kSystemChunks) * c);
    std::vector<std::vector<TokenId>> prompts(static_cast<size_t>(cfg_.live));
    for (auto& p : prompts) {
      p = systems[rng_() % systems.size()];
      const std::vector<TokenId> user = RandomTokens(kUserTokens);
      p.insert(p.end(), user.begin(), user.end());
    }
    std::vector<SeqId> live(prompts.size());
    std::vector<int32_t> cached(prompts.size());
    // The first sequence of each system prompt computes it (untimed); the timed arrivals find it.
    std::vector<SeqId> warm;
    for (const std::vector<TokenId>& system : systems) {
      std::vector<TokenId> p = system;
      p.push_back(1);
      Result<SeqId> seq = AddSequence(tree, p, &out);
      if (!seq.ok()) return Fail(seq.status());
      warm.push_back(*seq);
    }
    auto t0 = Clock::now();
    for (size_t i = 0; i < prompts.size(); ++i) {
      Result<kv::InsertResult> r =
          tree.Insert(prompts[i], static_cast<int32_t>(prompts[i].size()) - 1);
      if (!r.ok()) return Fail(r.status());
      live[i] = r->seq;
      cached[i] = r->num_cached_tokens;
    }
    auto t1 = Clock::now();
    int64_t prefill_tokens = 0;
    for (size_t i = 0; i < prompts.size(); ++i) {
      const kv::SeqTokens req{
          live[i], std::span<const TokenId>(prompts[i]).subspan(static_cast<size_t>(cached[i]))};
      prefill_tokens += static_cast<int64_t>(req.tokens.size());
      if (Status s = tree.Append(std::span<const kv::SeqTokens>(&req, 1), &out); !s.ok()) {
        return Fail(s);
      }
    }
    auto t2 = Clock::now();
    Add(metrics, "insert", "ops/s", cfg_.live / Seconds(t0, t1));
    Add(metrics, "append_prefill", "ops/s", cfg_.live / Seconds(t1, t2));
    Add(metrics, "append_prefill_tokens", "tokens/s", prefill_tokens / Seconds(t1, t2));

    // 3. Decode steps over every live sequence.
    std::vector<TokenId> one_token(live.size());
    std::vector<kv::SeqTokens> reqs;
    const uint64_t evictions_before = tree.Stats().evictions;
    t0 = Clock::now();
    for (int step = 0; step < kDecodeSteps; ++step) {
      for (size_t begin = 0; begin < live.size(); begin += static_cast<size_t>(cfg_.batch)) {
        const size_t end = std::min(live.size(), begin + static_cast<size_t>(cfg_.batch));
        reqs.clear();
        for (size_t i = begin; i < end; ++i) {
          one_token[i] = static_cast<TokenId>(rng_() % 32000);
          reqs.push_back({live[i], std::span<const TokenId>(&one_token[i], 1)});
        }
        if (Status s = tree.Append(reqs, &out); !s.ok()) return Fail(s);
      }
    }
    t1 = Clock::now();
    Add(metrics, "append_decode", "tokens/s",
        static_cast<double>(live.size()) * kDecodeSteps / Seconds(t0, t1));
    Add(metrics, "decode_evictions", "chunks",
        static_cast<double>(tree.Stats().evictions - evictions_before));

    // 4. Plans for one batch.
    std::vector<SeqId> batch = live;
    std::shuffle(batch.begin(), batch.end(), rng_);
    batch.resize(std::min(batch.size(), static_cast<size_t>(cfg_.batch)));
    std::vector<SeqId> order;
    std::vector<kv::BatchGroup> groups;
    for (int i = 0; i < 50; ++i) {
      t0 = Clock::now();
      if (Status s = tree.GroupBatch(batch, &order, &groups); !s.ok()) return Fail(s);
      t1 = Clock::now();
      Add(metrics, "group_batch", "us", 1e6 * Seconds(t0, t1));
    }
    plan::TppPlan plan;
    for (int i = 0; i < 50; ++i) {
      t0 = Clock::now();
      if (Status s = plan.Build(tree, batch); !s.ok()) return Fail(s);
      t1 = Clock::now();
      Add(metrics, "plan_build", "us", 1e6 * Seconds(t0, t1));
    }
    Add(metrics, "plan_shared_chunks", "chunks", plan.num_shared());
    Add(metrics, "plan_private_chunks", "chunks", plan.num_private());
    std::vector<TokenId> batch_tokens(batch.size());
    for (int step = 0; step < kDecodeSteps; ++step) {
      reqs.clear();
      for (size_t i = 0; i < batch.size(); ++i) {
        batch_tokens[i] = static_cast<TokenId>(rng_() % 32000);
        reqs.push_back({batch[i], std::span<const TokenId>(&batch_tokens[i], 1)});
      }
      if (Status s = tree.Append(reqs, &out); !s.ok()) return Fail(s);
      t0 = Clock::now();
      if (Status s = plan.Update(tree, batch); !s.ok()) return Fail(s);
      t1 = Clock::now();
      const char* name =
          plan.last_update() == plan::TppPlan::UpdateKind::kLengths        ? "plan_update_lengths"
          : plan.last_update() == plan::TppPlan::UpdateKind::kPrivateLists ? "plan_update_private"
                                                                           : "plan_update_rebuild";
      Add(metrics, name, "us", 1e6 * Seconds(t0, t1));
    }

    const kv::KvCacheStats stats = tree.Stats();
    Add(metrics, "live_seqs", "seqs", stats.live_seqs);
    Add(metrics, "retained_chunks", "chunks", stats.retained_chunks);
    Add(metrics, "sharing_ratio", "x", stats.sharing_ratio);

    // 5. Release.
    for (const SeqId seq : warm) {
      if (Status s = tree.Release(seq); !s.ok()) return Fail(s);
    }
    t0 = Clock::now();
    for (const SeqId seq : live) {
      if (Status s = tree.Release(seq); !s.ok()) return Fail(s);
    }
    t1 = Clock::now();
    Add(metrics, "release", "ops/s", cfg_.live / Seconds(t0, t1));
    return true;
  }

 private:
  std::vector<TokenId> RandomTokens(size_t n) {
    std::vector<TokenId> v(n);
    for (TokenId& t : v) t = static_cast<TokenId>(rng_() % 32000);
    return v;
  }

  Result<SeqId> AddSequence(kv::PrefixTree& tree, const std::vector<TokenId>& prompt,
                            kv::AppendResult* out) {
    CHUNKSERVE_ASSIGN_OR_RETURN(kv::InsertResult r,
                                tree.Insert(prompt, static_cast<int32_t>(prompt.size()) - 1));
    const kv::SeqTokens req{
        r.seq, std::span<const TokenId>(prompt).subspan(static_cast<size_t>(r.num_cached_tokens))};
    CHUNKSERVE_RETURN_IF_ERROR(tree.Append(std::span<const kv::SeqTokens>(&req, 1), out));
    return r.seq;
  }

  static void Add(std::map<std::string, Metric>* metrics, const std::string& name,
                  const std::string& unit, double value) {
    Metric& m = (*metrics)[name];
    m.name = name;
    m.unit = unit;
    m.samples.push_back(value);
  }

  static bool Fail(const Status& s) {
    std::cerr << "chunkserve-bench kvcache: " << s << "\n";
    return false;
  }

  Config cfg_;
  std::mt19937_64 rng_;
};

void Usage() {
  std::cout << "usage: chunkserve-bench kvcache [--json] [--reps N] [--live N] [--retained N]\n"
               "                                [--batch N] [--chunk-size N]\n";
}

int KvcacheMain(int argc, char** argv) {
  Config cfg;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto int_flag = [&](const char* name, int32_t* value) {
      if (arg != name || i + 1 >= argc) return false;
      *value = static_cast<int32_t>(std::strtol(argv[++i], nullptr, 10));
      return true;
    };
    if (arg == "--json") {
      cfg.json = true;
    } else if (arg == "--help" || arg == "-h") {
      Usage();
      return 0;
    } else if (!int_flag("--reps", &cfg.reps) && !int_flag("--live", &cfg.live) &&
               !int_flag("--retained", &cfg.retained) && !int_flag("--batch", &cfg.batch) &&
               !int_flag("--chunk-size", &cfg.chunk_size)) {
      std::cerr << "chunkserve-bench kvcache: unknown or incomplete flag '" << arg << "'\n";
      Usage();
      return 2;
    }
  }
  if (cfg.reps < 1 || cfg.live < 1 || cfg.retained < 0 || cfg.batch < 1 || cfg.chunk_size < 1) {
    std::cerr << "chunkserve-bench kvcache: flags must be positive\n";
    return 2;
  }

  std::map<std::string, Metric> metrics;
  Runner runner(cfg);
  for (int r = 0; r < cfg.reps; ++r) {
    if (!runner.RunOnce(&metrics)) return 1;
  }

  const char* const order[] = {"insert",
                               "append_prefill",
                               "append_prefill_tokens",
                               "append_decode",
                               "decode_evictions",
                               "release",
                               "group_batch",
                               "plan_build",
                               "plan_update_lengths",
                               "plan_update_private",
                               "plan_update_rebuild",
                               "plan_shared_chunks",
                               "plan_private_chunks",
                               "live_seqs",
                               "retained_chunks",
                               "sharing_ratio"};
  if (cfg.json) {
    for (const char* name : order) {
      const auto it = metrics.find(name);
      if (it == metrics.end()) continue;
      nlohmann::json j = {{"bench", "kvcache"},
                          {"metric", name},
                          {"median", Median(it->second.samples)},
                          {"unit", it->second.unit},
                          {"samples", it->second.samples.size()},
                          {"chunk_size", cfg.chunk_size},
                          {"live", cfg.live},
                          {"retained", cfg.retained},
                          {"batch", cfg.batch},
                          {"reps", cfg.reps}};
      std::cout << j.dump() << "\n";
    }
    return 0;
  }
  std::printf("kvcache: chunk_size=%d live=%d retained=%d batch=%d reps=%d (medians)\n",
              cfg.chunk_size, cfg.live, cfg.retained, cfg.batch, cfg.reps);
  std::printf("%-24s %14s  %-9s %8s\n", "metric", "median", "unit", "samples");
  for (const char* name : order) {
    const auto it = metrics.find(name);
    if (it == metrics.end()) continue;
    std::printf("%-24s %14.1f  %-9s %8zu\n", name, Median(it->second.samples),
                it->second.unit.c_str(), it->second.samples.size());
  }
  return 0;
}

}  // namespace

CHUNKSERVE_REGISTER_BENCH(kvcache, "prefix tree ops/s and TPP plan build/update at scale",
                          KvcacheMain);

}  // namespace chunkserve::bench
