// chunkserve-bench attention: decode attention, naive vs paged vs TPP, on one synthetic batch
// (the paper's Table 3 / Figure 4 workload), with floors from this machine's measured limits.
//
// Workload (paper section 4.1): `batch` sequences, each with np context tokens of which the leading
// ns are a prefix shared by the whole batch (physically one copy of their chunks); one query token
// per sequence and head. The shared chunks are the plan's shared list (one row range: the batch);
// the other np - ns tokens of each sequence are its private chunks. The paged baseline reads every
// sequence's whole block list (shared blocks included), the naive reference a contiguous copy.
//
// Floors: bytes = shared KV once + private KV + q + o; flops = 4 * batch * np * heads * head_dim
// (QK^T and PV, 2 per multiply-add); floor = max(bytes / measured read bandwidth, flops / measured
// FMA peak). efficiency = floor / median, with the best bandwidth and FMA peak of the whole run;
// eff_local / efficiency_local holds each timed iteration against the bandwidth sampled right
// before and after its round instead (LocalEfficiency). Caches are flushed between timed
// iterations unless --warm (cold is what a real decode step sees: the previous layer evicted this
// one's KV).
//
// --device cuda runs the same workload, flags and JSON fields on the CUDA kernels instead
// (attention_cuda.cc; built with CUDA only).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/dtype.h"
#include "kernels/cpu/reference.h"
#include "kernels/cpu/thread_pool.h"
#include "tests/bench/attention_layout.h"
#include "tests/bench/bench.h"
#include "tests/bench/machine_peaks.h"
#if CHUNKSERVE_BENCH_CUDA
#include "tests/bench/attention_cuda.h"
#endif

namespace chunkserve::bench {
namespace {

namespace kc = ::chunkserve::kernels::cpu;
using ::chunkserve::kernels::DType;
using ::chunkserve::kernels::KvCacheView;
using ::chunkserve::kernels::TppPlanView;
using Clock = std::chrono::steady_clock;

struct Options {
  int64_t np = 2048;
  int64_t ns = 2048;
  int32_t batch = 32;
  int32_t heads = 32;
  int32_t kv_heads = 0;  // 0: = heads
  int32_t head_dim = 128;
  int32_t chunk = 64;
  DType kv_dtype = DType::kF32;
  int32_t threads = 0;  // 0: hardware concurrency
  int32_t iters = 10;
  int32_t naive_iters = 2;
  bool json = false;
  bool naive = true;
  bool grid = false;
  bool warm = false;
  bool paged_head_major = false;
  bool isa_compare = false;  // also time tpp on every vector ISA the CPU has
  kc::CpuIsa isa = kc::CpuIsa::kAuto;
  std::vector<int32_t> sweep_batches = {1, 2, 4, 8, 16, 32, 64};
  bool cuda = false;            // --device cuda: the CUDA kernels (attention_cuda.cc)
  int32_t ctas_per_sm = 4;      // --ctas-per-sm: the CUDA TPP schedule's split target
  bool kv_dtype_given = false;  // the CUDA run defaults to f16 (it has no fp32 KV)
};

void Usage() {
  std::cout
      << "usage: chunkserve-bench attention [flags]\n"
         "  --np N           context tokens per sequence (2048)\n"
         "  --ns N           leading tokens shared by the whole batch, <= np (2048)\n"
         "  --batch B        sequences (32)\n"
         "  --heads H        query heads (32)\n"
         "  --kv-heads K     KV heads (= heads)\n"
         "  --head-dim D     (128)\n"
         "  --chunk C        tokens per chunk (64)\n"
         "  --kv-dtype T     f32 | f16 | bf16 (f32)\n"
         "  --threads T      (hardware concurrency)\n"
         "  --iters I        timed iterations per implementation (10); naive: --naive-iters (2)\n"
         "  --isa I          auto | avx2 | scalar (auto; $CHUNKSERVE_CPU_ISA also works)\n"
         "  --json           one JSON object per line per implementation\n"
         "  --no-naive       skip the naive reference\n"
         "  --warm           do not flush caches between iterations\n"
         "  --paged-head-major  also time the paged kernel with head-major task order\n"
         "  --isa-compare    also time tpp on each vector ISA the CPU has (tpp_avx2, tpp_avx512)\n"
         "  --device D       cpu | cuda (cpu); cuda: KV f16 (default) or bf16, no naive line,\n"
         "                   exits 77 with \"no CUDA device\" on a machine without one\n"
         "  --ctas-per-sm N  cuda: thread blocks per SM the TPP schedule splits work for (4)\n"
         "  --grid           the paper's Table 3 grid (np 1024/2048/4096 x ns 0, np/2, 3np/4, np)\n"
         "                   and the Figure 4 batch sweep (at --np/--ns; --sweep 1,2,4,...)\n";
}

// Returns 0 on success, 1 for --help, 2 on a bad flag.
int ParseFlags(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* name) -> const char* {
      if (i + 1 >= argc) {
        std::cerr << "attention: " << name << " needs a value\n";
        return nullptr;
      }
      return argv[++i];
    };
    auto int_flag = [&](const char* name, auto* out) {
      const char* v = value(name);
      if (v == nullptr) return false;
      char* end = nullptr;
      const long long x = std::strtoll(v, &end, 10);
      if (end == v || *end != '\0') {
        std::cerr << "attention: bad value for " << name << ": " << v << "\n";
        return false;
      }
      *out = static_cast<std::remove_pointer_t<decltype(out)>>(x);
      return true;
    };
    bool ok = true;
    if (a == "--help" || a == "-h") {
      Usage();
      return 1;
    } else if (a == "--np")
      ok = int_flag("--np", &o->np);
    else if (a == "--ns")
      ok = int_flag("--ns", &o->ns);
    else if (a == "--batch")
      ok = int_flag("--batch", &o->batch);
    else if (a == "--heads")
      ok = int_flag("--heads", &o->heads);
    else if (a == "--kv-heads")
      ok = int_flag("--kv-heads", &o->kv_heads);
    else if (a == "--head-dim")
      ok = int_flag("--head-dim", &o->head_dim);
    else if (a == "--chunk")
      ok = int_flag("--chunk", &o->chunk);
    else if (a == "--threads")
      ok = int_flag("--threads", &o->threads);
    else if (a == "--iters")
      ok = int_flag("--iters", &o->iters);
    else if (a == "--ctas-per-sm")
      ok = int_flag("--ctas-per-sm", &o->ctas_per_sm) && o->ctas_per_sm >= 1;
    else if (a == "--naive-iters")
      ok = int_flag("--naive-iters", &o->naive_iters);
    else if (a == "--kv-dtype") {
      const char* v = value("--kv-dtype");
      ok = v != nullptr && ParseDType(v, &o->kv_dtype);
      if (v != nullptr && !ok) std::cerr << "attention: --kv-dtype is f32, f16 or bf16\n";
      o->kv_dtype_given = ok;
    } else if (a == "--device") {
      const char* v = value("--device");
      ok = v != nullptr && (std::strcmp(v, "cpu") == 0 || std::strcmp(v, "cuda") == 0);
      if (ok) o->cuda = std::strcmp(v, "cuda") == 0;
      if (v != nullptr && !ok) std::cerr << "attention: --device is cpu or cuda\n";
    } else if (a == "--isa") {
      const char* v = value("--isa");
      bool parsed = false;
      if (v != nullptr) o->isa = kc::ParseCpuIsa(v, &parsed);
      ok = v != nullptr && parsed;
    } else if (a == "--sweep") {
      const char* v = value("--sweep");
      ok = v != nullptr;
      if (ok) {
        o->sweep_batches.clear();
        std::string s = v;
        for (size_t at = 0; at <= s.size();) {
          const size_t comma = std::min(s.find(',', at), s.size());
          o->sweep_batches.push_back(std::atoi(s.substr(at, comma - at).c_str()));
          at = comma + 1;
        }
      }
    } else if (a == "--json")
      o->json = true;
    else if (a == "--no-naive")
      o->naive = false;
    else if (a == "--grid")
      o->grid = true;
    else if (a == "--warm")
      o->warm = true;
    else if (a == "--paged-head-major")
      o->paged_head_major = true;
    else if (a == "--isa-compare")
      o->isa_compare = true;
    else {
      std::cerr << "attention: unknown flag " << a << " (--help)\n";
      return 2;
    }
    if (!ok) return 2;
  }
  if (o->kv_heads <= 0) o->kv_heads = o->heads;
  if (o->threads <= 0)
    o->threads = static_cast<int32_t>(std::max(1u, std::thread::hardware_concurrency()));
  if (o->np < 1 || o->ns < 0 || o->ns > o->np || o->batch < 1 || o->heads < 1 || o->kv_heads < 1 ||
      o->heads % o->kv_heads != 0 || o->head_dim < 1 || o->head_dim > kc::kMaxHeadDim ||
      o->chunk < kc::kMinChunkSize || o->chunk > kc::kMaxChunkSize || o->iters < 1) {
    std::cerr << "attention: invalid shape (need 0 <= ns <= np, heads % kv-heads == 0, head-dim <= "
              << kc::kMaxHeadDim << ", chunk in [" << kc::kMinChunkSize << ", " << kc::kMaxChunkSize
              << "])\n";
    return 2;
  }
  return 0;
}

// ------------------------------------------------------------------------------------------------

// Fast deterministic fill: values in [-1, 1) from a per-thread xorshift, stored in the dtype.
void FillRandom(void* data, size_t n, DType dtype, uint64_t seed, kc::ThreadPool& pool) {
  auto fill = [&](int64_t begin, int64_t end, int32_t) {
    for (int64_t part = begin; part < end; ++part) {
      const size_t lo = n * static_cast<size_t>(part) / 64;
      const size_t hi = n * static_cast<size_t>(part + 1) / 64;
      uint64_t x =
          seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(part) * 0xbf58476d1ce4e5b9ull + 1;
      for (size_t i = lo; i < hi; ++i) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        const float f = static_cast<float>(x >> 40) * (2.0f / 16777216.0f) - 1.0f;
        if (dtype == DType::kF32) {
          static_cast<float*>(data)[i] = f;
        } else if (dtype == DType::kF16) {
          static_cast<uint16_t*>(data)[i] = kc::FloatToHalf(f);
        } else {
          static_cast<uint16_t*>(data)[i] = kc::FloatToBf16(f);
        }
      }
    }
  };
  pool.ParallelFor(64, 1, 0, fill);
}

struct Timing {
  double median_ms = 0.0;
  double min_ms = 0.0;
  int32_t iters = 0;
  // Per timed iteration (cold runs of TimeInterleaved only): its time and the read bandwidth the
  // machine gave around it, the better of the probes just before and just after its round.
  std::vector<double> ms;
  std::vector<double> local_gbs;
};

template <typename F>
Timing Time(int32_t iters, bool warm, kc::ThreadPool& pool, F run) {
  std::vector<double> ms;
  for (int32_t i = 0; i < iters; ++i) {
    if (!warm) FlushCaches(pool);
    const auto start = Clock::now();
    run();
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
  }
  return {Median(ms), *std::min_element(ms.begin(), ms.end()), iters, ms, {}};
}

// Times several implementations with their iterations interleaved (a, b, c, a, b, c, ...), so that
// on a machine whose available bandwidth drifts (shared hosts do) they all see the same conditions.
// Cold runs also sample the read bandwidth before every round and after the last (`probe`), so that
// each iteration can be held against the bandwidth of its own moment (Timing::local_gbs).
std::vector<Timing> TimeInterleaved(int32_t iters, bool warm, kc::ThreadPool& pool,
                                    ReadBandwidthProbe* probe,
                                    const std::vector<std::function<void()>>& runs) {
  std::vector<std::vector<double>> ms(runs.size());
  std::vector<double> round_gbs;
  for (int32_t i = 0; i < iters; ++i) {
    if (!warm) round_gbs.push_back(probe->Pass());
    for (size_t k = 0; k < runs.size(); ++k) {
      if (!warm) FlushCaches(pool);
      const auto start = Clock::now();
      runs[k]();
      ms[k].push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
    }
  }
  if (!warm) round_gbs.push_back(probe->Pass());
  // A probe without its buffer reads 0: then there are no local samples at all.
  const bool sampled = !warm && *std::min_element(round_gbs.begin(), round_gbs.end()) > 0.0;
  std::vector<Timing> out;
  for (const auto& v : ms) {
    Timing t{Median(v), *std::min_element(v.begin(), v.end()), iters, v, {}};
    if (sampled) {
      for (int32_t i = 0; i < iters; ++i) {
        t.local_gbs.push_back(std::max(round_gbs[i], round_gbs[i + 1]));
      }
    }
    out.push_back(std::move(t));
  }
  return out;
}

double MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::abs(static_cast<double>(a[i]) - b[i]);
    if (!(d <= worst)) worst = std::isnan(d) ? INFINITY : d;
  }
  return worst;
}

struct Result {
  std::string impl;
  Timing timing;
  bool ran = false;
};

struct Config {
  int64_t np, ns;
  int32_t batch;
};

// One configuration: builds the data, checks the implementations agree, times them.
// Returns false when the implementations disagree or a kernel fails.
bool RunConfig(const Options& o, const Config& cfg, MachinePeaks& peaks, kc::ThreadPool& pool,
               ReadBandwidthProbe& probe, bool run_naive, std::vector<Result>* results) {
  const BenchLayout layout = BuildBenchLayout(cfg.batch, o.chunk, cfg.np, cfg.ns);
  const size_t elem = kernels::DTypeSize(o.kv_dtype);
  const size_t block_elems = static_cast<size_t>(o.chunk) * o.head_dim;
  const size_t arena_elems = static_cast<size_t>(layout.num_slots) * o.kv_heads * block_elems;
  std::unique_ptr<void, decltype(&std::free)> k(AllocateLarge(arena_elems * elem), &std::free);
  std::unique_ptr<void, decltype(&std::free)> v(AllocateLarge(arena_elems * elem), &std::free);
  if (k == nullptr || v == nullptr) {
    std::cerr << "attention: cannot allocate the KV arena (" << 2 * arena_elems * elem / (1 << 20)
              << " MiB)\n";
    return false;
  }
  FillRandom(k.get(), arena_elems, o.kv_dtype, 1, pool);
  FillRandom(v.get(), arena_elems, o.kv_dtype, 2, pool);

  KvCacheView kv;
  kv.k = k.get();
  kv.v = v.get();
  kv.dtype = o.kv_dtype;
  kv.num_slots = layout.num_slots;
  kv.num_kv_heads = o.kv_heads;
  kv.chunk_size = o.chunk;
  kv.head_dim = o.head_dim;

  const size_t qn = static_cast<size_t>(cfg.batch) * o.heads * o.head_dim;
  std::vector<float> q(qn);
  FillRandom(q.data(), qn, DType::kF32, 3, pool);
  for (float& x : q) x *= 2.0f;
  const float sm_scale = 1.0f / std::sqrt(static_cast<float>(o.head_dim));

  const TppPlanView plan = layout.Plan();
  std::vector<unsigned char> workspace(kc::TppDecodeWorkspaceBytes(plan, o.heads, o.head_dim));
  std::vector<float> o_tpp(qn), o_paged(qn), o_paged_hm(qn), o_naive(qn);

  kc::TppDecodeParams tp;
  tp.q = q.data();
  tp.o = o_tpp.data();
  tp.kv = kv;
  tp.plan = plan;
  tp.num_qo_heads = o.heads;
  tp.sm_scale = sm_scale;
  tp.workspace = workspace.data();
  tp.workspace_bytes = workspace.size();
  tp.pool = &pool;
  tp.num_threads = o.threads;
  tp.isa = o.isa;

  kc::PagedDecodeParams pp;
  pp.q = q.data();
  pp.o = o_paged.data();
  pp.kv = kv;
  pp.num_seqs = cfg.batch;
  pp.num_qo_heads = o.heads;
  pp.block_indptr = layout.block_indptr.data();
  pp.block_slot = layout.block_slot.data();
  pp.block_len = layout.block_len.data();
  pp.sm_scale = sm_scale;
  pp.pool = &pool;
  pp.num_threads = o.threads;
  pp.isa = o.isa;
  kc::PagedDecodeParams pp_hm = pp;
  pp_hm.o = o_paged_hm.data();
  pp_hm.order = kc::PagedTaskOrder::kHeadMajor;

  kc::KernelStatus st = kc::TppDecode(tp);
  if (st == kc::KernelStatus::kOk) st = kc::PagedDecode(pp);
  if (st == kc::KernelStatus::kOk && o.paged_head_major) st = kc::PagedDecode(pp_hm);
  if (st != kc::KernelStatus::kOk) {
    std::cerr << "attention: kernel failed: " << kc::KernelStatusName(st) << "\n";
    return false;
  }
  // fp32 accumulation in different orders: agreement to ~1e-5 on outputs of magnitude <= 1.
  constexpr double kAgree = 2e-4;
  const double tpp_vs_paged = MaxAbsDiff(o_tpp, o_paged);
  if (!(tpp_vs_paged <= kAgree)) {
    std::cerr << "attention: tpp and paged disagree: max |diff| = " << tpp_vs_paged << "\n";
    return false;
  }

  std::vector<int64_t> kv_begin, kv_end;
  std::vector<unsigned char> ck, cv;
  kc::NaiveAttentionParams np;
  if (run_naive) {
    // The naive reference reads contiguous per-sequence K/V: [tokens, kv_heads, head_dim].
    const size_t row = static_cast<size_t>(o.head_dim) * elem;
    const size_t total_tokens = static_cast<size_t>(cfg.batch) * cfg.np;
    ck.resize(total_tokens * o.kv_heads * row);
    cv.resize(total_tokens * o.kv_heads * row);
    size_t at = 0;
    for (int32_t s = 0; s < cfg.batch; ++s) {
      kv_begin.push_back(static_cast<int64_t>(at / (o.kv_heads * row)));
      for (int32_t j = layout.block_indptr[s]; j < layout.block_indptr[s + 1]; ++j) {
        for (int32_t t = 0; t < layout.block_len[j]; ++t) {
          for (int32_t h = 0; h < o.kv_heads; ++h) {
            const size_t src =
                ((static_cast<size_t>(layout.block_slot[j]) * o.kv_heads + h) * o.chunk + t) * row;
            std::memcpy(&ck[at], static_cast<const unsigned char*>(kv.k) + src, row);
            std::memcpy(&cv[at], static_cast<const unsigned char*>(kv.v) + src, row);
            at += row;
          }
        }
      }
      kv_end.push_back(static_cast<int64_t>(at / (o.kv_heads * row)));
    }
    np.q = q.data();
    np.o = o_naive.data();
    np.k = ck.data();
    np.v = cv.data();
    np.dtype = o.kv_dtype;
    np.num_kv_tokens = static_cast<int64_t>(total_tokens);
    np.kv_begin = kv_begin.data();
    np.kv_end = kv_end.data();
    np.num_queries = cfg.batch;
    np.num_qo_heads = o.heads;
    np.num_kv_heads = o.kv_heads;
    np.head_dim = o.head_dim;
    np.sm_scale = sm_scale;
    np.pool = &pool;
    np.num_threads = o.threads;
  }

  results->clear();
  RemeasureMachinePeaks(&peaks);
  if (run_naive) {
    Result r{"naive",
             Time(std::max(1, std::min(o.naive_iters, o.iters)), o.warm, pool,
                  [&] { (void)kc::NaiveAttention(np); }),
             true};
    const double diff = MaxAbsDiff(o_tpp, o_naive);
    if (!(diff <= kAgree)) {
      std::cerr << "attention: tpp and naive disagree: max |diff| = " << diff << "\n";
      return false;
    }
    results->push_back(r);
  }
  std::vector<std::string> names = {"paged", "tpp"};
  std::vector<std::function<void()>> runs = {[&] { (void)kc::PagedDecode(pp); },
                                             [&] { (void)kc::TppDecode(tp); }};
  if (o.paged_head_major) {
    names.insert(names.begin() + 1, "paged_hm");
    runs.insert(runs.begin() + 1, [&] { (void)kc::PagedDecode(pp_hm); });
  }
  // The same TPP call on each vector ISA, each checked against the auto-dispatched output.
  std::vector<kc::TppDecodeParams> isa_params;
  std::vector<std::vector<float>> isa_out;
  if (o.isa_compare) {
    for (const kc::CpuIsa isa : {kc::CpuIsa::kAvx2, kc::CpuIsa::kAvx512}) {
      if (!kc::CpuSupports(isa)) continue;
      isa_out.emplace_back(qn);
      isa_params.push_back(tp);
      isa_params.back().isa = isa;
      isa_params.back().o = isa_out.back().data();
      names.push_back(std::string("tpp_") + kc::CpuIsaName(isa));
    }
    for (size_t i = 0; i < isa_params.size(); ++i) {
      if (kc::TppDecode(isa_params[i]) != kc::KernelStatus::kOk ||
          !(MaxAbsDiff(isa_out[i], o_tpp) <= kAgree)) {
        std::cerr << "attention: " << names[names.size() - isa_params.size() + i]
                  << " disagrees with tpp\n";
        return false;
      }
      runs.push_back([&, i] { (void)kc::TppDecode(isa_params[i]); });
    }
  }
  const std::vector<Timing> timings = TimeInterleaved(o.iters, o.warm, pool, &probe, runs);
  for (size_t k = 0; k < names.size(); ++k) results->push_back({names[k], timings[k], true});
  RemeasureMachinePeaks(&peaks);
  return true;
}

// Minimal bytes and FLOPs of a configuration (the same for every implementation).
struct Work {
  double bytes;
  double flops;
};

Work WorkOf(const Options& o, const Config& cfg) {
  const BenchLayout layout = BuildBenchLayout(cfg.batch, o.chunk, cfg.np, cfg.ns);
  const double kv_row =
      2.0 * o.kv_heads * o.head_dim * static_cast<double>(kernels::DTypeSize(o.kv_dtype));
  const double qo = 2.0 * cfg.batch * o.heads * o.head_dim * sizeof(float);
  return {static_cast<double>(layout.shared_tokens + layout.private_tokens) * kv_row + qo,
          4.0 * cfg.batch * static_cast<double>(cfg.np) * o.heads * o.head_dim};
}

double FloorMs(const Work& w, double read_gbs, double fma_gflops) {
  return 1e3 * std::max(w.bytes / (read_gbs * 1e9), w.flops / (fma_gflops * 1e9));
}

double FloorMs(const Work& w, const MachinePeaks& peaks) {
  return FloorMs(w, peaks.read_gbs, peaks.fma_gflops);
}

// Efficiency against the bandwidth of each iteration's own moment: the median over iterations of
// floor(local bandwidth, the run's FMA peak) / time. The run's floor uses the best bandwidth the
// run ever saw, which on a host whose bandwidth swings (here 28-60 GB/s within one run) holds a
// memory-bound kernel against a rate it was never given; this one holds it against what the
// machine gave while it ran. NaN without local samples (--warm).
double LocalEfficiency(const Work& w, const MachinePeaks& peaks, const Timing& t) {
  if (t.local_gbs.empty()) return std::nan("");
  std::vector<double> eff;
  for (size_t i = 0; i < t.ms.size(); ++i) {
    eff.push_back(FloorMs(w, t.local_gbs[i], peaks.fma_gflops) / t.ms[i]);
  }
  return Median(eff);
}

double LocalGbs(const Timing& t) {
  return t.local_gbs.empty() ? std::nan("") : Median(t.local_gbs);
}

void EmitJson(const Options& o, const Config& cfg, const MachinePeaks& peaks, const Result& r,
              const char* section) {
  const Work w = WorkOf(o, cfg);
  const double floor_ms = FloorMs(w, peaks);
  nlohmann::json j;
  j["bench"] = "attention";
  j["section"] = section;
  j["impl"] = r.impl;
  j["np"] = cfg.np;
  j["ns"] = cfg.ns;
  j["batch"] = cfg.batch;
  j["heads"] = o.heads;
  j["kv_heads"] = o.kv_heads;
  j["head_dim"] = o.head_dim;
  j["chunk"] = o.chunk;
  j["kv_dtype"] = DTypeName(o.kv_dtype);
  j["threads"] = o.threads;
  kc::KernelStatus isa_status;
  j["isa"] = kc::CpuIsaName(kc::ResolveAttentionIsa(o.isa, &isa_status));
  j["wide_fma_speedup"] = kc::WideFmaSpeedup();
  j["iters"] = r.timing.iters;
  j["cache"] = o.warm ? "warm" : "cold";
  j["median_ms"] = r.timing.median_ms;
  j["min_ms"] = r.timing.min_ms;
  j["floor_ms"] = floor_ms;
  j["efficiency"] = floor_ms / r.timing.median_ms;
  const double local_eff = LocalEfficiency(w, peaks, r.timing);
  if (!std::isnan(local_eff)) {
    j["efficiency_local"] = local_eff;
    j["local_bandwidth_gbs"] = LocalGbs(r.timing);
  }
  j["bytes"] = w.bytes;
  j["flops"] = w.flops;
  j["bandwidth_gbs"] = peaks.read_gbs;
  j["bandwidth_low_gbs"] = peaks.read_gbs_low;
  j["fma_gflops"] = peaks.fma_gflops;
  j["fma_isa"] = FmaIsaName(peaks.fma_isa);
  j["achieved_gbs"] = w.bytes / (r.timing.median_ms * 1e6);
  j["achieved_gflops"] = w.flops / (r.timing.median_ms * 1e6);
  j["tokens_per_s"] = cfg.batch / (r.timing.median_ms * 1e-3);
  std::cout << j.dump() << std::endl;
}

const Result* Find(const std::vector<Result>& rs, const char* impl) {
  for (const Result& r : rs) {
    if (r.impl == impl) return &r;
  }
  return nullptr;
}

// One measured configuration; printed once everything has run, so that every floor uses the
// best bandwidth and FMA peak the machine showed during the whole run.
struct Measured {
  const char* section;  // "single", "table3", "figure4"
  Config cfg;
  std::vector<Result> results;
};

void PrintHeader(const Options& o, const MachinePeaks& peaks) {
  kc::KernelStatus isa_status;
  const kc::CpuIsa isa = kc::ResolveAttentionIsa(o.isa, &isa_status);
  std::printf(
      "machine: %d threads; read bandwidth %.1f GB/s (best pass of the run; lowest %.1f), "
      "FMA peak %.1f GFLOP/s (%s; avx2 %.1f)\n",
      peaks.threads, peaks.read_gbs, peaks.read_gbs_low, peaks.fma_gflops,
      FmaIsaName(peaks.fma_isa), peaks.fma_gflops_by_isa[static_cast<int>(FmaIsa::kAvx2)]);
  std::printf(
      "kernels: %s (512-bit / 256-bit FMA throughput %.2f; AVX-512 by default from %.1f); KV %s; "
      "heads %d, kv heads %d, head dim %d, chunk %d; caches %s\n",
      kc::CpuIsaName(isa), kc::WideFmaSpeedup(), kc::kWideFmaPays, DTypeName(o.kv_dtype), o.heads,
      o.kv_heads, o.head_dim, o.chunk, o.warm ? "warm" : "flushed before every timed iteration");
}

void PrintSingle(const Options& o, const MachinePeaks& peaks, const Measured& m) {
  const Work w = WorkOf(o, m.cfg);
  const double floor_ms = FloorMs(w, peaks);
  std::printf("np %lld, ns %lld, batch %d: minimal %.1f MB, %.3f GFLOP, floor %.3f ms (%s-bound)\n",
              static_cast<long long>(m.cfg.np), static_cast<long long>(m.cfg.ns), m.cfg.batch,
              w.bytes / 1e6, w.flops / 1e9, floor_ms,
              w.bytes / (peaks.read_gbs * 1e9) >= w.flops / (peaks.fma_gflops * 1e9) ? "memory"
                                                                                     : "compute");
  std::printf("%-9s %10s %10s %10s %8s %9s %9s %9s %9s\n", "impl", "median_ms", "min_ms",
              "floor_ms", "effic.", "GB/s", "GFLOP/s", "local_GB/s", "eff_local");
  for (const Result& r : m.results) {
    std::printf("%-9s %10.3f %10.3f %10.3f %8.3f %9.1f %9.1f %10.1f %9.3f\n", r.impl.c_str(),
                r.timing.median_ms, r.timing.min_ms, floor_ms, floor_ms / r.timing.median_ms,
                w.bytes / (r.timing.median_ms * 1e6), w.flops / (r.timing.median_ms * 1e6),
                LocalGbs(r.timing), LocalEfficiency(w, peaks, r.timing));
  }
  const Result* paged = Find(m.results, "paged");
  const Result* tpp = Find(m.results, "tpp");
  if (paged != nullptr && tpp != nullptr) {
    std::printf("tpp speedup over paged: %.2fx\n", paged->timing.median_ms / tpp->timing.median_ms);
  }
}

void PrintTable3(const Options& o, const MachinePeaks& peaks, const std::vector<Measured>& all) {
  std::printf(
      "\nTable 3: latency (ms, median of %d; naive: of %d), batch %d; efficiency = floor / "
      "median\n",
      o.iters, std::max(1, std::min(o.naive_iters, o.iters)), o.batch);
  std::printf("%6s %6s %10s %10s%s %10s %9s %9s %8s %9s %10s %8s\n", "np", "ns", "naive", "paged",
              o.paged_head_major ? "   paged_hm" : "", "tpp", "tpp/paged", "floor_ms", "tpp_eff",
              "paged_eff", "local_GB/s", "tpp_loc");
  for (const Measured& m : all) {
    if (std::strcmp(m.section, "table3") != 0) continue;
    const Work w = WorkOf(o, m.cfg);
    const double floor_ms = FloorMs(w, peaks);
    const Result* naive = Find(m.results, "naive");
    const Result* paged = Find(m.results, "paged");
    const Result* paged_hm = Find(m.results, "paged_hm");
    const Result* tpp = Find(m.results, "tpp");
    char naive_s[32] = "-";
    if (naive != nullptr) std::snprintf(naive_s, sizeof(naive_s), "%.2f", naive->timing.median_ms);
    char hm_s[32] = "";
    if (paged_hm != nullptr)
      std::snprintf(hm_s, sizeof(hm_s), " %10.2f", paged_hm->timing.median_ms);
    std::printf("%6lld %6lld %10s %10.2f%s %10.2f %8.2fx %9.2f %8.2f %9.2f %10.1f %8.2f\n",
                static_cast<long long>(m.cfg.np), static_cast<long long>(m.cfg.ns), naive_s,
                paged->timing.median_ms, hm_s, tpp->timing.median_ms,
                paged->timing.median_ms / tpp->timing.median_ms, floor_ms,
                floor_ms / tpp->timing.median_ms, floor_ms / paged->timing.median_ms,
                LocalGbs(tpp->timing), LocalEfficiency(w, peaks, tpp->timing));
  }
}

// --isa-compare: TPP per ISA beside the one auto-dispatch picks.
void PrintIsaTable(const Options& o, const MachinePeaks& peaks, const std::vector<Measured>& all) {
  kc::KernelStatus status;
  std::printf(
      "\nISA comparison (tpp ms, median of %d; auto picks %s: 512-bit / 256-bit FMA throughput "
      "%.2f, AVX-512 from %.1f)\n",
      o.iters, kc::CpuIsaName(kc::ResolveAttentionIsa(kc::CpuIsa::kAuto, &status)),
      kc::WideFmaSpeedup(), kc::kWideFmaPays);
  std::printf("%-8s %6s %6s %6s %10s %10s %12s %9s %9s %9s %9s\n", "section", "np", "ns", "batch",
              "tpp_avx2", "tpp_avx512", "avx512/avx2", "eff_avx2", "eff_avx512", "loc_avx2",
              "loc_avx512");
  for (const Measured& m : all) {
    const Result* a2 = Find(m.results, "tpp_avx2");
    const Result* a5 = Find(m.results, "tpp_avx512");
    if (a2 == nullptr || a5 == nullptr) continue;
    const Work w = WorkOf(o, m.cfg);
    const double floor_ms = FloorMs(w, peaks);
    std::printf("%-8s %6lld %6lld %6d %10.2f %10.2f %11.2fx %9.2f %9.2f %9.2f %9.2f\n", m.section,
                static_cast<long long>(m.cfg.np), static_cast<long long>(m.cfg.ns), m.cfg.batch,
                a2->timing.median_ms, a5->timing.median_ms,
                a2->timing.median_ms / a5->timing.median_ms, floor_ms / a2->timing.median_ms,
                floor_ms / a5->timing.median_ms, LocalEfficiency(w, peaks, a2->timing),
                LocalEfficiency(w, peaks, a5->timing));
  }
}

void PrintFigure4(const Options& o, const MachinePeaks& peaks, const std::vector<Measured>& all) {
  std::printf(
      "\nFigure 4: batch sweep at np %lld, ns %lld (latency ms, tokens/s = batch / latency)\n",
      static_cast<long long>(o.np), static_cast<long long>(o.ns));
  std::printf("%6s %10s %10s %12s %12s %9s %8s %8s\n", "batch", "paged_ms", "tpp_ms", "paged_tok/s",
              "tpp_tok/s", "tpp/paged", "tpp_eff", "tpp_loc");
  for (const Measured& m : all) {
    if (std::strcmp(m.section, "figure4") != 0) continue;
    const Result* paged = Find(m.results, "paged");
    const Result* tpp = Find(m.results, "tpp");
    const Work w = WorkOf(o, m.cfg);
    const double floor_ms = FloorMs(w, peaks);
    std::printf("%6d %10.2f %10.2f %12.0f %12.0f %8.2fx %8.2f %8.2f\n", m.cfg.batch,
                paged->timing.median_ms, tpp->timing.median_ms,
                m.cfg.batch / (paged->timing.median_ms * 1e-3),
                m.cfg.batch / (tpp->timing.median_ms * 1e-3),
                paged->timing.median_ms / tpp->timing.median_ms, floor_ms / tpp->timing.median_ms,
                LocalEfficiency(w, peaks, tpp->timing));
  }
}

// Runs the configurations of the mode; false when one fails (the error is printed).
bool RunAll(const Options& o, kc::ThreadPool& pool, MachinePeaks& peaks, ReadBandwidthProbe& probe,
            std::vector<Measured>* all) {
  auto run = [&](const char* section, const Config& cfg, bool naive) {
    Measured m{section, cfg, {}};
    if (!o.json) {
      std::fprintf(stderr, "attention: %s np %lld ns %lld batch %d...\n", section,
                   static_cast<long long>(cfg.np), static_cast<long long>(cfg.ns), cfg.batch);
    }
    if (!RunConfig(o, cfg, peaks, pool, probe, naive, &m.results)) return false;
    all->push_back(std::move(m));
    return true;
  };
  if (!o.grid) return run("single", Config{o.np, o.ns, o.batch}, o.naive);
  for (int64_t np : {1024, 2048, 4096}) {
    for (int64_t ns : {int64_t{0}, np / 2, 3 * np / 4, np}) {
      if (!run("table3", Config{np, ns, o.batch}, o.naive)) return false;
    }
  }
  for (int32_t batch : o.sweep_batches) {
    if (batch >= 1 && !run("figure4", Config{o.np, o.ns, batch}, false)) return false;
  }
  return true;
}

int AttentionMain(int argc, char** argv) {
  Options o;
  const int parsed = ParseFlags(argc, argv, &o);
  if (parsed != 0) return parsed == 1 ? 0 : 2;
  if (o.cuda) {
#if CHUNKSERVE_BENCH_CUDA
    CudaAttentionOptions co;
    co.np = o.np;
    co.ns = o.ns;
    co.batch = o.batch;
    co.heads = o.heads;
    co.kv_heads = o.kv_heads;
    co.head_dim = o.head_dim;
    co.chunk = o.chunk;
    co.kv_dtype = o.kv_dtype_given ? o.kv_dtype : DType::kF16;
    co.iters = o.iters;
    co.json = o.json;
    co.warm = o.warm;
    co.grid = o.grid;
    co.sweep_batches = o.sweep_batches;
    co.ctas_per_sm = o.ctas_per_sm;
    return RunCudaAttentionBench(co);
#else
    std::cerr << "attention: no CUDA device: this build has no CUDA backend (--device cuda)\n";
    return 77;
#endif
  }
  kc::KernelStatus isa_status;
  kc::ResolveCpuIsa(o.isa, &isa_status);
  if (isa_status != kc::KernelStatus::kOk) {
    std::cerr << "attention: --isa " << kc::CpuIsaName(o.isa) << " is not supported on this CPU\n";
    return 2;
  }
  kc::ThreadPool pool(o.threads);
  MachinePeaks peaks = MeasureMachinePeaks(o.threads);
  ReadBandwidthProbe probe(o.threads);
  std::vector<Measured> all;
  const bool ok = RunAll(o, pool, peaks, probe, &all);
  if (o.json) {
    for (const Measured& m : all) {
      for (const Result& r : m.results) EmitJson(o, m.cfg, peaks, r, m.section);
    }
  } else {
    PrintHeader(o, peaks);
    for (const Measured& m : all) {
      if (std::strcmp(m.section, "single") == 0) PrintSingle(o, peaks, m);
    }
    if (o.grid) {
      PrintTable3(o, peaks, all);
      PrintFigure4(o, peaks, all);
    }
    if (o.isa_compare) PrintIsaTable(o, peaks, all);
  }
  return ok ? 0 : 1;
}

}  // namespace

CHUNKSERVE_REGISTER_BENCH(attention,
                          "decode attention: naive vs paged vs tpp (paper Table 3, Figure 4)",
                          AttentionMain);

}  // namespace chunkserve::bench
