// chunkserve-bench gemm: the Linear layer's GEMM, y = x W^T with W [n, k] (Hugging Face's
// [out, in]), on the projection shapes of real models, side by side in one run: OpenBLAS's sgemm
// on the unpacked fp32 weights (what the CPU backend ran before kernels/cpu/gemm.h; its columns
// split over the threads the same way) and the packed-weight kernel for every ISA this CPU has and
// every weight dtype. Iterations are interleaved across implementations (a, b, c, a, b, c, ...)
// so a shared machine's drift hits all of them alike; warm caches (a step runs the same layers
// back to back). Prints a table, or one JSON object per result with --json: median ms, GFLOP/s,
// the fraction of the measured FMA peak (best ISA) and the weight bytes read per second.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/dtype.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/thread_pool.h"
#include "tests/bench/bench.h"
#include "tests/bench/machine_peaks.h"

namespace chunkserve::bench {
namespace {

namespace kc = ::chunkserve::kernels::cpu;
using kernels::DType;
using Clock = std::chrono::steady_clock;

struct Shape {
  const char* model;
  const char* name;
  int64_t n, k;
};

// SmolLM2-135M (hidden 576, 9 heads of 64, 3 KV heads, MLP 1536, vocab 49152) and a Llama-3.2-1B
// sized model (hidden 2048, 8 KV heads of 64, MLP 8192).
const Shape kShapes[] = {
    {"smollm2-135m", "q/o 576x576", 576, 576},     {"smollm2-135m", "k/v 192x576", 192, 576},
    {"smollm2-135m", "gate/up 1536x576", 1536, 576}, {"smollm2-135m", "down 576x1536", 576, 1536},
    {"smollm2-135m", "lm_head 49152x576", 49152, 576}, {"llama-1b", "q/o 2048x2048", 2048, 2048},
    {"llama-1b", "gate/up 8192x2048", 8192, 2048},   {"llama-1b", "down 2048x8192", 2048, 8192},
};

struct Flags {
  std::vector<int64_t> tokens = {1, 32, 512};
  std::string model = "smollm2-135m";  // or llama-1b, all
  int32_t threads = 2;
  int32_t iters = 9;
  bool json = false;
};

struct Impl {
  std::string name;
  DType w_dtype;
  std::function<void()> run;
  double median_ms = 0.0;
};

int GemmMain(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has = i + 1 < argc;
    if (a == "--json") {
      f.json = true;
    } else if (a == "--tokens" && has) {
      if (!ParseIntList(argv[++i], 1, 1 << 16, &f.tokens)) {
        std::cerr << "gemm: --tokens takes a comma-separated list of counts in [1, 65536]\n";
        return 2;
      }
    } else if (a == "--model" && has) {
      f.model = argv[++i];
      if (f.model != "smollm2-135m" && f.model != "llama-1b" && f.model != "all") {
        std::cerr << "gemm: --model is smollm2-135m, llama-1b or all\n";
        return 2;
      }
    } else if ((a == "--threads" || a == "--iters") && has) {
      const int v = std::atoi(argv[++i]);
      if (v < 1 || v > 256) {
        std::cerr << "gemm: " << a << " takes 1..256\n";
        return 2;
      }
      (a == "--threads" ? f.threads : f.iters) = v;
    } else {
      std::cout << "usage: chunkserve-bench gemm [--model smollm2-135m|llama-1b|all] "
                   "[--tokens 1,32,512] [--threads 2] [--iters 9] [--json]\n";
      return a == "--help" || a == "-h" ? 0 : 2;
    }
  }
  openblas_set_num_threads(1);
  kc::ThreadPool pool(f.threads);
  MachinePeaks peaks = MeasureMachinePeaks(f.threads, size_t{256} << 20);
  if (!f.json) {
    std::printf("machine: %d threads; FMA peak %.1f GFLOP/s (%s; avx2 %.1f); read %.1f GB/s; "
                "OpenBLAS core %s; kernel ISA %s\n",
                f.threads, peaks.fma_gflops, FmaIsaName(peaks.fma_isa),
                peaks.fma_gflops_by_isa[static_cast<int>(FmaIsa::kAvx2)], peaks.read_gbs,
                openblas_get_corename(), kc::CpuIsaName(kc::DetectCpuIsa()));
    std::printf("%-13s %-18s %6s  %-14s %9s %9s %6s %8s\n", "model", "shape", "tokens", "impl",
                "median_ms", "GFLOP/s", "of_pk", "w_GB/s");
  }
  std::vector<kc::CpuIsa> isas;
  for (const kc::CpuIsa isa : {kc::CpuIsa::kAvx2, kc::CpuIsa::kAvx512}) {
    if (kc::CpuSupports(isa)) isas.push_back(isa);
  }
  for (const Shape& s : kShapes) {
    if (f.model != "all" && f.model != s.model) continue;
    // Weights with values of bf16 precision, so every dtype holds the same numbers.
    std::vector<float> w(static_cast<size_t>(s.n * s.k));
    std::vector<uint16_t> w_bf16(w.size()), w_f16(w.size());
    uint64_t state = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < w.size(); ++i) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      const float v = static_cast<float>(static_cast<int32_t>(state >> 40) % 2001 - 1000) * 1e-4f;
      w_bf16[i] = kc::FloatToBf16(v);
      w[i] = kc::Bf16ToFloat(w_bf16[i]);
      w_f16[i] = kc::FloatToHalf(w[i]);
    }
    const int64_t packed_elems = kc::PackedWeightElements(s.n, s.k);
    std::vector<float> p_f32(static_cast<size_t>(packed_elems));
    std::vector<uint16_t> p_bf16(static_cast<size_t>(packed_elems)), p_f16(p_bf16.size());
    kc::PackWeights(w.data(), DType::kF32, s.n, s.k, DType::kF32, p_f32.data());
    kc::PackWeights(w_bf16.data(), DType::kBF16, s.n, s.k, DType::kBF16, p_bf16.data());
    kc::PackWeights(w_f16.data(), DType::kF16, s.n, s.k, DType::kF16, p_f16.data());
    for (const int64_t m : f.tokens) {
      std::vector<float> x(static_cast<size_t>(m * s.k));
      for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 17) * 0.01f - 0.08f;
      std::vector<float> y_blas(static_cast<size_t>(m * s.n)), y(y_blas.size());
      std::vector<Impl> impls;
      impls.push_back({"openblas-f32", DType::kF32, [&] {
                         // The CPU backend's former Linear: columns split over the pool, 16-aligned.
                         const int64_t parts =
                             std::min<int64_t>(pool.num_threads(), std::max<int64_t>(1, s.n / 64));
                         auto part = [&](int64_t b, int64_t e, int32_t) {
                           for (int64_t p = b; p < e; ++p) {
                             const int64_t c0 = (s.n * p / parts) & ~15;
                             const int64_t c1 = p + 1 == parts ? s.n : (s.n * (p + 1) / parts) & ~15;
                             cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, c1 - c0, s.k,
                                         1.0f, x.data(), s.k, w.data() + c0 * s.k, s.k, 0.0f,
                                         y_blas.data() + c0, s.n);
                           }
                         };
                         pool.ParallelFor(parts, 1, 0, part);
                       }});
      for (const kc::CpuIsa isa : isas) {
        for (const DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
          const void* packed = dt == DType::kF32    ? static_cast<const void*>(p_f32.data())
                               : dt == DType::kBF16 ? static_cast<const void*>(p_bf16.data())
                                                    : static_cast<const void*>(p_f16.data());
          impls.push_back({std::string(kc::CpuIsaName(isa)) + "-" + DTypeName(dt), dt, [&, isa, dt,
                                                                                         packed] {
                             kc::GemmParams p;
                             p.x = x.data();
                             p.ldx = s.k;
                             p.w = packed;
                             p.w_dtype = dt;
                             p.y = y.data();
                             p.ldy = s.n;
                             p.m = m;
                             p.n = s.n;
                             p.k = s.k;
                             p.pool = &pool;
                             p.isa = isa;
                             if (kc::Gemm(p) != kc::KernelStatus::kOk) std::abort();
                           }});
        }
      }
      // Warm up, check every result against OpenBLAS's, then time interleaved.
      double worst = 0.0;
      impls[0].run();
      for (size_t i = 1; i < impls.size(); ++i) {
        impls[i].run();
        for (size_t j = 0; j < y.size(); ++j) {
          worst = std::max(worst, static_cast<double>(std::fabs(y[j] - y_blas[j])));
        }
      }
      // Enough iterations for ~50 ms per implementation, at least --iters.
      const auto t0 = Clock::now();
      impls[0].run();
      const double once_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      const int32_t reps = std::max<int32_t>(1, static_cast<int32_t>(5.0 / std::max(once_ms, 1e-3)));
      std::vector<std::vector<double>> ms(impls.size());
      for (int32_t it = 0; it < f.iters; ++it) {
        for (size_t i = 0; i < impls.size(); ++i) {
          const auto start = Clock::now();
          for (int32_t r = 0; r < reps; ++r) impls[i].run();
          ms[i].push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count() /
                          reps);
        }
      }
      const double flops = 2.0 * static_cast<double>(m) * s.n * s.k;
      for (size_t i = 0; i < impls.size(); ++i) {
        const double med = Median(ms[i]);
        const double gflops = flops / (med * 1e6);
        const double w_gbs = static_cast<double>(s.n * s.k) * kernels::DTypeSize(impls[i].w_dtype) /
                             (med * 1e6);
        if (f.json) {
          nlohmann::json j;
          j["bench"] = "gemm";
          j["model"] = s.model;
          j["shape"] = s.name;
          j["n"] = s.n;
          j["k"] = s.k;
          j["tokens"] = m;
          j["impl"] = impls[i].name;
          j["threads"] = f.threads;
          j["median_ms"] = med;
          j["gflops"] = gflops;
          j["fraction_of_fma_peak"] = gflops / peaks.fma_gflops;
          j["fma_peak_gflops"] = peaks.fma_gflops;
          j["fma_peak_isa"] = FmaIsaName(peaks.fma_isa);
          j["weight_gbs"] = w_gbs;
          j["max_abs_diff_vs_openblas"] = worst;
          std::cout << j.dump() << std::endl;
        } else {
          std::printf("%-13s %-18s %6lld  %-14s %9.4f %9.1f %6.2f %8.1f\n", s.model, s.name,
                      static_cast<long long>(m), impls[i].name.c_str(), med, gflops,
                      gflops / peaks.fma_gflops, w_gbs);
        }
      }
      if (!f.json && worst > 1e-3) std::printf("  ! results differ from OpenBLAS by %.3g\n", worst);
    }
  }
  return 0;
}

}  // namespace

CHUNKSERVE_REGISTER_BENCH(gemm, "Linear GEMM: OpenBLAS vs packed fp32/bf16/f16 weights per ISA",
                          GemmMain);

}  // namespace chunkserve::bench
