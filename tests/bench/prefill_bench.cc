// chunkserve-bench prefill: PrefillAttention (new prompt tokens over a chunked path, causal) per
// CPU instruction set, side by side in one run, on prompts whose leading part is already cached.
//
// Workload: `batch` sequences, each a path of `prompt` tokens in chunks of `chunk`; the first
// cached-percent of them are a cached prefix (their K/V are in the arena, as after a prefix-tree
// hit), the rest are the new tokens this call attends for (their K/V appended, as the engine does
// before attention). Query token at position p attends to positions 0..p. FLOPs = sum over new
// tokens of 4 * (p + 1) * heads * head_dim (QK^T and PV, 2 per multiply-add); efficiency = FLOPs /
// measured FMA peak of the best ISA / median time. Every ISA's output is checked against the first
// one's before timing (max |diff| <= 1e-4); the ISAs' iterations are interleaved. Caches are
// flushed before every timed iteration unless --warm.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <memory>
#include <new>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/dtype.h"
#include "kernels/cpu/thread_pool.h"
#include "tests/bench/bench.h"
#include "tests/bench/machine_peaks.h"

namespace chunkserve::bench {
namespace {

namespace kc = ::chunkserve::kernels::cpu;
using ::chunkserve::kernels::DType;
using Clock = std::chrono::steady_clock;

struct Options {
  std::vector<int64_t> prompts = {1024, 4096};
  int32_t cached_percent = 50;
  int32_t batch = 1;
  int32_t heads = 32;
  int32_t kv_heads = 0;  // 0: = heads
  int32_t head_dim = 128;
  int32_t chunk = 64;
  DType kv_dtype = DType::kF32;
  int32_t threads = 0;
  int32_t iters = 7;
  std::vector<kc::CpuIsa> isas;  // empty: every vector ISA this CPU has
  bool warm = false;
  bool json = false;
};

void Usage() {
  std::cout << "usage: chunkserve-bench prefill [flags]\n"
               "  --prompts L,...        prompt tokens per sequence (1024,4096)\n"
               "  --cached-percent P     leading part of the prompt already cached, 0..99 (50)\n"
               "  --batch B              sequences prefilled together (1)\n"
               "  --heads H --kv-heads K --head-dim D --chunk C   (32, = heads, 128, 64)\n"
               "  --kv-dtype T           f32 | f16 | bf16 (f32)\n"
               "  --threads T            (hardware concurrency)\n"
               "  --iters I              timed iterations per ISA (7)\n"
               "  --isa I,...            scalar | avx2 | avx512 (every vector ISA the CPU has)\n"
               "  --warm                 do not flush caches between iterations\n"
               "  --json                 one JSON object per line per (prompt, ISA)\n";
}

// Returns 0 on success, 1 for --help, 2 on a bad flag.
int ParseFlags(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    auto int_flag = [&](int64_t lo, int64_t hi, auto* out) {
      std::vector<int64_t> v;
      if (!has_value || !ParseIntList(argv[++i], lo, hi, &v) || v.size() != 1) return false;
      *out = static_cast<std::remove_pointer_t<decltype(out)>>(v[0]);
      return true;
    };
    bool ok = true;
    if (a == "--help" || a == "-h") {
      Usage();
      return 1;
    } else if (a == "--prompts") {
      ok = has_value && ParseIntList(argv[++i], 2, int64_t{1} << 20, &o->prompts);
    } else if (a == "--cached-percent") {
      ok = int_flag(0, 99, &o->cached_percent);
    } else if (a == "--batch") {
      ok = int_flag(1, 4096, &o->batch);
    } else if (a == "--heads") {
      ok = int_flag(1, 1024, &o->heads);
    } else if (a == "--kv-heads") {
      ok = int_flag(1, 1024, &o->kv_heads);
    } else if (a == "--head-dim") {
      ok = int_flag(1, kc::kMaxHeadDim, &o->head_dim);
    } else if (a == "--chunk") {
      ok = int_flag(kc::kMinChunkSize, kc::kMaxChunkSize, &o->chunk);
    } else if (a == "--kv-dtype") {
      ok = has_value && ParseDType(argv[++i], &o->kv_dtype);
    } else if (a == "--threads") {
      ok = int_flag(0, 1024, &o->threads);
    } else if (a == "--iters") {
      ok = int_flag(1, 100000, &o->iters);
    } else if (a == "--isa") {
      ok = has_value;
      if (ok) {
        std::string list = argv[++i];
        for (size_t at = 0; ok && at <= list.size();) {
          const size_t comma = std::min(list.find(',', at), list.size());
          bool known = false;
          const kc::CpuIsa isa = kc::ParseCpuIsa(list.substr(at, comma - at).c_str(), &known);
          ok = known && isa != kc::CpuIsa::kAuto;
          if (ok) o->isas.push_back(isa);
          at = comma + 1;
        }
      }
    } else if (a == "--warm") {
      o->warm = true;
    } else if (a == "--json") {
      o->json = true;
    } else {
      std::cerr << "prefill: unknown flag " << a << "\n";
      return 2;
    }
    if (!ok) {
      std::cerr << "prefill: bad or missing value for " << a << "\n";
      return 2;
    }
  }
  if (o->kv_heads == 0) o->kv_heads = o->heads;
  if (o->heads % o->kv_heads != 0) {
    std::cerr << "prefill: --heads must be a multiple of --kv-heads\n";
    return 2;
  }
  if (o->isas.empty()) {
    for (const kc::CpuIsa isa : {kc::CpuIsa::kAvx2, kc::CpuIsa::kAvx512}) {
      if (kc::CpuSupports(isa)) o->isas.push_back(isa);
    }
    if (o->isas.empty()) o->isas.push_back(kc::CpuIsa::kScalar);
  }
  for (const kc::CpuIsa isa : o->isas) {
    if (!kc::CpuSupports(isa)) {
      std::cerr << "prefill: this CPU has no " << kc::CpuIsaName(isa) << "\n";
      return 2;
    }
  }
  return 0;
}

void FillRandom(std::vector<float>* v, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (float& x : *v) x = dist(rng);
}

// One prompt length: returns false when an ISA's output disagrees or a kernel fails.
bool RunPrompt(const Options& o, int64_t prompt, kc::ThreadPool& pool, MachinePeaks& peaks) {
  const int64_t cached = prompt * o.cached_percent / 100;
  const int64_t fresh = prompt - cached;
  const int32_t chunks_per_seq = static_cast<int32_t>((prompt + o.chunk - 1) / o.chunk);
  const int32_t num_slots = chunks_per_seq * o.batch;
  const size_t elem = kernels::DTypeSize(o.kv_dtype);
  const size_t arena_elems = static_cast<size_t>(num_slots) * o.kv_heads * o.chunk * o.head_dim;

  // K/V: random fp32 converted to the KV dtype; slots handed out in a shuffled order.
  std::unique_ptr<void, decltype(&std::free)> k(AllocateLarge(arena_elems * elem), &std::free);
  std::unique_ptr<void, decltype(&std::free)> v(AllocateLarge(arena_elems * elem), &std::free);
  if (k == nullptr || v == nullptr) {
    std::cerr << "prefill: cannot allocate the KV arena\n";
    return false;
  }
  {
    std::vector<float> tmp(arena_elems);
    FillRandom(&tmp, 1);
    kc::ConvertFromFloat(o.kv_dtype, tmp.data(), k.get(), arena_elems);
    FillRandom(&tmp, 2);
    kc::ConvertFromFloat(o.kv_dtype, tmp.data(), v.get(), arena_elems);
  }
  std::vector<int32_t> slots(num_slots);
  for (int32_t i = 0; i < num_slots; ++i) slots[i] = i;
  std::shuffle(slots.begin(), slots.end(), std::mt19937(7));

  std::vector<int32_t> chunk_indptr{0}, chunk_len, q_indptr{0}, q_pos;
  for (int32_t s = 0; s < o.batch; ++s) {
    for (int32_t c = 0; c < chunks_per_seq; ++c) {
      chunk_len.push_back(static_cast<int32_t>(std::min<int64_t>(o.chunk, prompt - c * o.chunk)));
    }
    chunk_indptr.push_back(chunk_indptr.back() + chunks_per_seq);
    for (int64_t p = cached; p < prompt; ++p) q_pos.push_back(static_cast<int32_t>(p));
    q_indptr.push_back(static_cast<int32_t>(q_indptr.back() + fresh));
  }
  const size_t qn = static_cast<size_t>(q_pos.size()) * o.heads * o.head_dim;
  std::vector<float> q(qn);
  FillRandom(&q, 3);

  kc::PrefillAttentionParams p;
  p.q = q.data();
  p.kv.k = k.get();
  p.kv.v = v.get();
  p.kv.dtype = o.kv_dtype;
  p.kv.num_slots = num_slots;
  p.kv.num_kv_heads = o.kv_heads;
  p.kv.chunk_size = o.chunk;
  p.kv.head_dim = o.head_dim;
  p.num_seqs = o.batch;
  p.num_qo_heads = o.heads;
  p.q_indptr = q_indptr.data();
  p.q_pos = q_pos.data();
  p.chunk_indptr = chunk_indptr.data();
  p.chunk_slot = slots.data();
  p.chunk_len = chunk_len.data();
  p.sm_scale = 1.0f / std::sqrt(static_cast<float>(o.head_dim));
  p.pool = &pool;
  p.num_threads = o.threads;

  // Check: every ISA against the first.
  std::vector<std::vector<float>> out(o.isas.size(), std::vector<float>(qn));
  for (size_t i = 0; i < o.isas.size(); ++i) {
    kc::PrefillAttentionParams pi = p;
    pi.o = out[i].data();
    pi.isa = o.isas[i];
    const kc::KernelStatus status = kc::PrefillAttention(pi);
    if (status != kc::KernelStatus::kOk) {
      std::cerr << "prefill: " << kc::CpuIsaName(o.isas[i]) << ": " << kc::KernelStatusName(status)
                << "\n";
      return false;
    }
    double worst = 0.0;
    for (size_t j = 0; j < qn; ++j) {
      const double d = std::abs(static_cast<double>(out[i][j]) - out[0][j]);
      worst = std::isnan(d) ? INFINITY : std::max(worst, d);
    }
    if (!(worst <= 1e-4)) {
      std::cerr << "prefill: " << kc::CpuIsaName(o.isas[i]) << " differs from "
                << kc::CpuIsaName(o.isas[0]) << " by " << worst << "\n";
      return false;
    }
  }

  // Time, the ISAs' iterations interleaved.
  std::vector<std::vector<double>> ms(o.isas.size());
  for (int32_t it = 0; it < o.iters; ++it) {
    for (size_t i = 0; i < o.isas.size(); ++i) {
      kc::PrefillAttentionParams pi = p;
      pi.o = out[i].data();
      pi.isa = o.isas[i];
      if (!o.warm) FlushCaches(pool);
      const auto start = Clock::now();
      kc::PrefillAttention(pi);
      ms[i].push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
    }
  }
  RemeasureMachinePeaks(&peaks);

  double flops = 0.0;
  for (int64_t pos = cached; pos < prompt; ++pos) flops += 4.0 * (pos + 1);
  flops *= static_cast<double>(o.batch) * o.heads * o.head_dim;
  const double new_tokens = static_cast<double>(fresh) * o.batch;
  const double first_ms = Median(ms[0]);
  for (size_t i = 0; i < o.isas.size(); ++i) {
    const double med = Median(ms[i]);
    const double gflops = flops / (med * 1e6);
    const double eff = gflops / peaks.fma_gflops;
    if (o.json) {
      nlohmann::json j;
      j["bench"] = "prefill";
      j["prompt"] = prompt;
      j["cached"] = cached;
      j["new_tokens"] = fresh;
      j["batch"] = o.batch;
      j["heads"] = o.heads;
      j["kv_heads"] = o.kv_heads;
      j["head_dim"] = o.head_dim;
      j["chunk"] = o.chunk;
      j["kv_dtype"] = DTypeName(o.kv_dtype);
      j["threads"] = pool.num_threads();
      j["isa"] = kc::CpuIsaName(o.isas[i]);
      j["cache"] = o.warm ? "warm" : "cold";
      j["median_ms"] = med;
      j["min_ms"] = *std::min_element(ms[i].begin(), ms[i].end());
      j["tokens_per_s"] = new_tokens / (med / 1e3);
      j["gflops"] = gflops;
      j["fma_gflops"] = peaks.fma_gflops;
      j["fma_isa"] = FmaIsaName(peaks.fma_isa);
      j["efficiency"] = eff;
      j["speedup_vs_first"] = first_ms / med;
      std::cout << j.dump() << "\n";
    } else {
      std::printf("%7lld %7lld %7lld  %-7s %10.2f %12.0f %9.1f %7.2f %8.2fx\n",
                  static_cast<long long>(prompt), static_cast<long long>(cached),
                  static_cast<long long>(fresh), kc::CpuIsaName(o.isas[i]), med,
                  new_tokens / (med / 1e3), gflops, eff, first_ms / med);
    }
  }
  return true;
}

int PrefillMain(int argc, char** argv) {
  Options o;
  const int parsed = ParseFlags(argc, argv, &o);
  if (parsed != 0) return parsed == 1 ? 0 : 2;
  kc::ThreadPool pool(o.threads);
  MachinePeaks peaks = MeasureMachinePeaks(pool.num_threads());
  if (!o.json) {
    std::printf(
        "machine: %d threads; FMA peak %.1f GFLOP/s (%s); 512-bit / 256-bit FMA throughput "
        "%.2f\n",
        pool.num_threads(), peaks.fma_gflops, FmaIsaName(peaks.fma_isa), kc::WideFmaSpeedup());
    std::printf("batch %d, heads %d, kv heads %d, head dim %d, chunk %d, KV %s; caches %s\n",
                o.batch, o.heads, o.kv_heads, o.head_dim, o.chunk, DTypeName(o.kv_dtype),
                o.warm ? "warm" : "flushed before every timed iteration");
    std::printf("%7s %7s %7s  %-7s %10s %12s %9s %7s %9s\n", "prompt", "cached", "new", "isa",
                "median_ms", "new_tok/s", "GFLOP/s", "effic.", "vs first");
  }
  for (const int64_t prompt : o.prompts) {
    try {
      if (!RunPrompt(o, prompt, pool, peaks)) return 1;
    } catch (const std::bad_alloc&) {  // --prompts x --batch too large for this machine
      std::cerr << "prefill: not enough memory for " << prompt << "-token prompts x " << o.batch
                << "\n";
      return 1;
    }
  }
  return 0;
}

}  // namespace

CHUNKSERVE_REGISTER_BENCH(prefill, "prefill attention over a cached prefix, per CPU ISA",
                          PrefillMain);

}  // namespace chunkserve::bench
