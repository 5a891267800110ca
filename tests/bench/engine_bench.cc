// chunkserve-bench engine: end-to-end decode throughput, latency and peak KV memory of the
// in-process engine on the ChunkAttention paper's Table 4 shapes, scaled to a CPU: prompts of n_p
// tokens of which the first n_s are one shared system prompt (n_s = 0: nothing shared; n_s = n_p:
// identical prompts), n_c completion tokens each, Poisson arrivals. Each shape runs twice in the
// same process: "chunkserve" (prefix sharing on) and "unshared" (sharing off: every request keeps
// its own KV, like a paged cache without prefix reuse).
#include <algorithm>
#include <cstdio>
#include <thread>
#include <cstdlib>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/base/logging.h"
#include "runtime/base/process_memory.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/workload_runner.h"
#include "runtime/workload/workload.h"
#include "tests/bench/bench.h"
#include "tests/bench/machine_peaks.h"

namespace chunkserve::bench {
namespace {

struct EngineBenchFlags {
  std::vector<int32_t> np = {512, 1024, 2048};
  int32_t nc = 64;
  int32_t requests = 32;
  double rate = 4.0;
  int32_t kv_cache_mb = 512;
  int32_t threads = 0;
  int32_t chunk = 64;
  int32_t budget = 512;
  engine::BackendKind backend = engine::BackendKind::kCpu;
  kernels::DType kv_dtype = kernels::DType::kF32;
  bool kv_dtype_set = false;
  kernels::DType gguf_dtype = kernels::DType::kF32;
  std::string model_dir;  // empty: the built-in tiny model
  bool json = false;
};

int EngineMain(int argc, char** argv) {
  EngineBenchFlags f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    auto int_flag = [&](int32_t* out) {
      if (!has_value) return false;
      char* end = nullptr;
      const long v = std::strtol(argv[++i], &end, 10);
      if (*end != '\0' || v < 0) return false;
      *out = static_cast<int32_t>(v);
      return true;
    };
    bool ok = true;
    if (a == "--np") ok = has_value && ParseIntList(argv[++i], 1, 1 << 20, &f.np);
    else if (a == "--nc") ok = int_flag(&f.nc);
    else if (a == "--requests") ok = int_flag(&f.requests);
    else if (a == "--rate") ok = has_value && (f.rate = std::strtod(argv[++i], nullptr)) > 0;
    else if (a == "--kv-cache-mb") ok = int_flag(&f.kv_cache_mb);
    else if (a == "--threads") ok = int_flag(&f.threads);
    else if (a == "--chunk") ok = int_flag(&f.chunk);
    else if (a == "--budget") ok = int_flag(&f.budget);
    else if (a == "--backend" && has_value) {
      const std::string b = argv[++i];
      ok = b == "cpu" || b == "cuda";
      f.backend = b == "cuda" ? engine::BackendKind::kCuda : engine::BackendKind::kCpu;
    } else if (a == "--kv-dtype") ok = has_value && (f.kv_dtype_set = ParseDType(argv[++i], &f.kv_dtype));
    else if (a == "--gguf-dtype") ok = has_value && ParseDType(argv[++i], &f.gguf_dtype);
    else if (a == "--model") ok = has_value && !(f.model_dir = argv[++i]).empty();
    else if (a == "--json") f.json = true;
    else if (a == "--help") {
      std::cout << "chunkserve-bench engine [--np 512,1024,2048] [--nc 64] [--requests 32]\n"
                   "    [--rate 4] [--kv-cache-mb 512] [--threads N] [--chunk 64] [--budget 512]\n"
                   "    [--backend cpu|cuda] [--kv-dtype f32|f16|bf16] [--model DIR|FILE.gguf]\n"
                   "    [--gguf-dtype f32|f16|bf16] [--json]\n"
                   "The CUDA backend needs f16 or bf16 KV (its default: f16); --model serves a\n"
                   "checkpoint (a directory, e.g. one written by chunkserve-make-tiny-model, or a\n"
                   ".gguf file) instead of the\n"
                   "built-in tiny model. proj GF/s: tokens through the projections (prefill and\n"
                   "decode) x their FLOPs per second, and its fraction of the FMA peak measured at\n"
                   "the start (best ISA); wts / eng MiB: the engine's resident weights, and the\n"
                   "process's resident memory after the run less what it held before any engine\n"
                   "(code and libraries).\n";
      return 0;
    } else ok = false;
    if (!ok) {
      std::cerr << "chunkserve-bench engine: bad or unknown flag " << a << "\n";
      return 2;
    }
  }
  if (f.backend == engine::BackendKind::kCuda && !f.kv_dtype_set) f.kv_dtype = kernels::DType::kF16;
  InitLogging({.program_name = "chunkserve-bench", .min_level = 1});
  // What the process holds before any engine (code, libraries' data): subtracted to give the
  // engine's own resident memory.
  const uint64_t baseline_rss = ResidentBytes();
  const char* backend_name = f.backend == engine::BackendKind::kCuda ? "cuda" : "cpu";
  const int32_t peak_threads =
      f.threads > 0 ? f.threads : static_cast<int32_t>(std::thread::hardware_concurrency());
  const double fma_peak = std::max({MeasureFmaPeak(peak_threads, FmaIsa::kAvx512),
                                    MeasureFmaPeak(peak_threads, FmaIsa::kAvx2),
                                    MeasureFmaPeak(peak_threads, FmaIsa::kPortable)});
  std::printf("FMA peak %.1f GFLOP/s with %d threads; weights %s\n", fma_peak, peak_threads,
              f.model_dir.empty() ? "tiny model (f32)" : DTypeName(f.gguf_dtype));
  std::printf("%6s %6s %5s %6s %-11s %9s %9s %9s %11s %10s %6s %9s %6s %8s %8s\n", "n_p", "n_s",
              "n_c", "rate", "system", "tok/s", "ms/tok", "TTFT p50", "peak KV MiB", "KV saved",
              "batch", "proj GF/s", "of_pk", "wts MiB", "eng MiB");
  int failures = 0;
  for (int32_t np : f.np) {
    for (int32_t ns : {0, np}) {
      double unshared_kv = 0;
      for (bool sharing : {false, true}) {
        engine::EngineOptions o;
        o.num_threads = f.threads;
        o.chunk_size = f.chunk;
        o.kv_cache_bytes = static_cast<uint64_t>(f.kv_cache_mb) << 20;
        o.prefill_token_budget = f.budget;
        o.enable_prefix_sharing = sharing;
        o.backend = f.backend;
        o.kv_dtype = f.kv_dtype;
        o.model_dir = f.model_dir;
        o.gguf_dtype = f.gguf_dtype;
        o.tiny_model = f.model_dir.empty();  // this bench's documented default
        auto eng = engine::Engine::Create(o);
        if (!eng.ok()) {
          std::cerr << "engine: " << eng.status() << "\n";
          return 1;
        }
        workload::WorkloadOptions w = workload::ForSharedPrefix(np, ns, f.nc);
        w.num_requests = f.requests;
        w.arrival_rate = f.rate;
        w.vocab_size = (*eng)->vocab_size();
        auto requests = workload::GenerateWorkload(w);
        if (!requests.ok()) {
          std::cerr << "chunkserve-bench engine: " << requests.status() << "\n";
          return 2;
        }
        auto report = engine::RunWorkload(**eng, *requests);
        (*eng)->Shutdown(engine::ShutdownMode::kDrain);
        if (!report.ok()) {
          std::cerr << "run: " << report.status() << "\n";
          return 1;
        }
        const engine::WorkloadReport& r = *report;
        failures += r.failed;
        const double kv_mib = static_cast<double>(r.kv_bytes_peak) / (1 << 20);
        if (!sharing) unshared_kv = kv_mib;
        const double saved = sharing && unshared_kv > 0 ? 100.0 * (1 - kv_mib / unshared_kv) : 0;
        const char* system = sharing ? "chunkserve" : "unshared";
        const engine::EngineStats es = (*eng)->Stats();
        const double prefilled = static_cast<double>(r.prompt_tokens) * (1.0 - r.prefix_hit_rate);
        const double proj_gflops = (prefilled + static_cast<double>(r.generated_tokens)) *
                                   static_cast<double>(es.projection_flops_per_token) /
                                   std::max(r.wall_s, 1e-9) / 1e9;
        const double weights_mib = static_cast<double>(es.weight_bytes) / (1 << 20);
        const double rss_mib =
            static_cast<double>(es.resident_bytes - std::min(es.resident_bytes, baseline_rss)) /
            (1 << 20);
        std::printf("%6d %6d %5d %6.1f %-11s %9.1f %9.2f %9.1f %11.1f %9.1f%% %6d %9.1f %6.2f %8.1f "
                    "%8.1f\n",
                    np, ns, f.nc, f.rate, system, r.generated_tokens_per_s, r.tpot_ms.mean,
                    r.ttft_ms.p50, kv_mib, saved, r.peak_running, proj_gflops,
                    fma_peak > 0 ? proj_gflops / fma_peak : 0.0, weights_mib, rss_mib);
        if (f.json) {
          std::cout << nlohmann::json{{"bench", "engine"},
                                      {"backend", backend_name},
                                      {"model", f.model_dir.empty() ? "tiny" : f.model_dir},
                                      {"kv_dtype", DTypeName(f.kv_dtype)},
                                      {"system", system},
                                      {"np", np},
                                      {"ns", ns},
                                      {"nc", f.nc},
                                      {"rate", f.rate},
                                      {"requests", f.requests},
                                      {"generated_tokens_per_s", r.generated_tokens_per_s},
                                      {"tpot_ms_mean", r.tpot_ms.mean},
                                      {"ttft_ms_p50", r.ttft_ms.p50},
                                      {"kv_bytes_peak", r.kv_bytes_peak},
                                      {"kv_saved_pct", saved},
                                      {"peak_batch", r.peak_running},
                                      {"wall_s", r.wall_s},
                                      {"projection_gflops", proj_gflops},
                                      {"fma_peak_gflops", fma_peak},
                                      {"weight_bytes", es.weight_bytes},
                                      {"resident_bytes", es.resident_bytes},
                                      {"baseline_resident_bytes", baseline_rss},
                                      {"gguf_dtype", DTypeName(f.gguf_dtype)},
                                      {"failed", r.failed}}
                           .dump()
                    << "\n";
        }
        std::fflush(stdout);
      }
    }
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace

CHUNKSERVE_REGISTER_BENCH(engine, "end-to-end engine: Table 4 shapes, sharing on vs off",
                          EngineMain);

}  // namespace chunkserve::bench
