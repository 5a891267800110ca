// The CUDA half of `chunkserve-bench attention` (--device cuda). Same workload as the CPU run
// (attention_bench.cc): `batch` sequences of np tokens whose first ns are one prefix shared by the
// batch (one physical copy), one query per sequence and head; paged (one block per (sequence, KV
// head) walking the whole block list) and tpp (DevicePlan + TppDecode) on the same arena.
//
// Timing: CUDA events around each launch (TPP: its attend and merge kernels; the plan is uploaded
// before timing, as an engine does once per step for all layers), L2 flushed before every timed
// iteration by reading a buffer of 4x the L2 size (unless --warm; reading, not writing, so the
// timed kernels do not pay for writing back a flush's dirty lines), implementations interleaved,
// median and minimum of --iters. Bandwidth: a device-to-device copy kernel over 2 x 1 GiB, (read +
// written bytes) / median time, measured before and after the configurations (best pass used).
// Floor = minimal bytes / bandwidth with minimal bytes = shared KV once + private KV + q + o (the
// tensor-core FLOPs of decode attention are far below the memory time; they are reported, not
// part of the floor). efficiency = floor / median.
#include "tests/bench/attention_cuda.h"
#include "tests/bench/bench.h"
#include "tests/bench/attention_layout.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/dtype.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/device_plan.h"
#include "kernels/cuda/shapes.h"

namespace chunkserve::bench {
namespace {

namespace kcu = ::chunkserve::kernels::cuda;
using ::chunkserve::kernels::DType;
using ::chunkserve::kernels::KvCacheView;
using ::chunkserve::kernels::TppPlanView;

#define BENCH_CUDA(expr)                                               \
  do {                                                                 \
    const cudaError_t bench_err_ = (expr);                             \
    if (bench_err_ != cudaSuccess) {                                   \
      std::fprintf(stderr, "attention (cuda): %s failed: %s\n", #expr, \
                   cudaGetErrorString(bench_err_));                    \
      return false;                                                    \
    }                                                                  \
  } while (0)

struct DeviceMem {
  void* p = nullptr;
  DeviceMem() = default;
  DeviceMem(const DeviceMem&) = delete;
  DeviceMem& operator=(const DeviceMem&) = delete;
  ~DeviceMem() {
    if (p != nullptr) cudaFree(p);
  }
  cudaError_t Alloc(size_t bytes) { return cudaMalloc(&p, std::max<size_t>(bytes, 16)); }
  template <typename T>
  cudaError_t Upload(const std::vector<T>& v) {
    cudaError_t err = Alloc(v.size() * sizeof(T));
    if (err == cudaSuccess && !v.empty()) {
      err = cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice);
    }
    return err;
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p);
  }
};


struct Machine {
  std::string name;
  int sms = 0;
  int cc_major = 0, cc_minor = 0;
  size_t l2_bytes = 0;
  double bandwidth_gbs = 0.0;       // best copy pass of the run
  double bandwidth_low_gbs = 1e30;  // lowest
};

struct Timing {
  double median_ms = 0.0, min_ms = 0.0;
  int32_t iters = 0;
};

struct Result {
  std::string impl;
  Timing timing;
};

struct Config {
  int64_t np, ns;
  int32_t batch;
};

struct Measured {
  const char* section;
  Config cfg;
  std::vector<Result> results;
  size_t plan_upload_bytes = 0;
};

// Times `runs` interleaved with events; each iteration flushes L2 first (unless warm).
bool TimeInterleaved(const CudaAttentionOptions& o, const void* flush, size_t flush_bytes,
                     unsigned* sink,
                     const std::vector<std::function<cudaError_t()>>& runs,
                     std::vector<Timing>* out) {
  cudaEvent_t start, stop;
  BENCH_CUDA(cudaEventCreate(&start));
  BENCH_CUDA(cudaEventCreate(&stop));
  std::vector<std::vector<double>> ms(runs.size());
  for (int32_t i = 0; i < o.iters + 1; ++i) {  // iteration 0 warms up (module load, attributes)
    for (size_t k = 0; k < runs.size(); ++k) {
      // The flush buffer holds one repeated word, so its XOR over a multiple of 16 bytes is 0.
      if (!o.warm) BENCH_CUDA(kcu::ReadWords(flush, flush_bytes, 0xffffffffu, sink, nullptr));
      BENCH_CUDA(cudaEventRecord(start, nullptr));
      BENCH_CUDA(runs[k]());
      BENCH_CUDA(cudaEventRecord(stop, nullptr));
      BENCH_CUDA(cudaEventSynchronize(stop));
      float t = 0.0f;
      BENCH_CUDA(cudaEventElapsedTime(&t, start, stop));
      if (i > 0) ms[k].push_back(t);
    }
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  out->clear();
  for (const auto& v : ms) {
    out->push_back({Median(v), *std::min_element(v.begin(), v.end()), o.iters});
  }
  return true;
}

bool MeasureBandwidth(Machine* m) {
  constexpr size_t kBytes = size_t{1} << 30;
  DeviceMem a, b;
  BENCH_CUDA(a.Alloc(kBytes));
  BENCH_CUDA(b.Alloc(kBytes));
  BENCH_CUDA(kcu::FillWords(a.p, kBytes, 0x12345678u, nullptr));
  cudaEvent_t start, stop;
  BENCH_CUDA(cudaEventCreate(&start));
  BENCH_CUDA(cudaEventCreate(&stop));
  std::vector<double> ms;
  for (int i = 0; i < 11; ++i) {
    BENCH_CUDA(cudaEventRecord(start, nullptr));
    BENCH_CUDA(kcu::CopyBytes(b.p, a.p, kBytes, nullptr));
    BENCH_CUDA(cudaEventRecord(stop, nullptr));
    BENCH_CUDA(cudaEventSynchronize(stop));
    float t = 0.0f;
    BENCH_CUDA(cudaEventElapsedTime(&t, start, stop));
    if (i > 0) ms.push_back(t);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  const double gbs = 2.0 * kBytes / (Median(ms) * 1e6);
  m->bandwidth_gbs = std::max(m->bandwidth_gbs, gbs);
  m->bandwidth_low_gbs = std::min(m->bandwidth_low_gbs, gbs);
  return true;
}

double MinimalBytes(const CudaAttentionOptions& o, const Config& cfg) {
  const BenchLayout l = BuildBenchLayout(cfg.batch, o.chunk, cfg.np, cfg.ns);
  const double kv_row = 2.0 * o.kv_heads * o.head_dim * 2.0;  // K and V, 2 bytes each
  const double qo = 2.0 * cfg.batch * o.heads * o.head_dim * 2.0;
  return static_cast<double>(l.shared_tokens + l.private_tokens) * kv_row + qo;
}

double Flops(const CudaAttentionOptions& o, const Config& cfg) {
  return 4.0 * cfg.batch * static_cast<double>(cfg.np) * o.heads * o.head_dim;
}

bool RunConfig(const CudaAttentionOptions& o, const Config& cfg, const void* flush,
               size_t flush_bytes, unsigned* sink, Measured* m) {
  const BenchLayout layout = BuildBenchLayout(cfg.batch, o.chunk, cfg.np, cfg.ns);
  const bool bf16 = o.kv_dtype == DType::kBF16;
  const size_t arena_elems =
      static_cast<size_t>(layout.num_slots) * o.kv_heads * o.chunk * o.head_dim;
  DeviceMem k, v, q, o_tpp, o_paged, indptr, bslot, blen;
  BENCH_CUDA(k.Alloc(arena_elems * 2));
  BENCH_CUDA(v.Alloc(arena_elems * 2));
  const size_t qn = static_cast<size_t>(cfg.batch) * o.heads * o.head_dim;
  BENCH_CUDA(q.Alloc(qn * 2));
  BENCH_CUDA(o_tpp.Alloc(qn * 2));
  BENCH_CUDA(o_paged.Alloc(qn * 2));
  BENCH_CUDA(kcu::FillRandom16(k.p, arena_elems, bf16, 1, nullptr));
  BENCH_CUDA(kcu::FillRandom16(v.p, arena_elems, bf16, 2, nullptr));
  BENCH_CUDA(kcu::FillRandom16(q.p, qn, bf16, 3, nullptr));
  BENCH_CUDA(indptr.Upload(layout.block_indptr));
  BENCH_CUDA(bslot.Upload(layout.block_slot));
  BENCH_CUDA(blen.Upload(layout.block_len));

  KvCacheView kv;
  kv.k = k.p;
  kv.v = v.p;
  kv.dtype = o.kv_dtype;
  kv.num_slots = layout.num_slots;
  kv.num_kv_heads = o.kv_heads;
  kv.chunk_size = o.chunk;
  kv.head_dim = o.head_dim;
  const float sm_scale = 1.0f / std::sqrt(static_cast<float>(o.head_dim));

  kcu::DevicePlan plan;
  BENCH_CUDA(plan.Update(layout.Plan(), {o.heads, o.kv_heads, o.chunk, layout.num_slots}, nullptr,
                         kcu::TppScheduleOptions{0, o.ctas_per_sm, 0}));
  m->plan_upload_bytes = plan.last_upload_bytes();
  DeviceMem workspace;
  BENCH_CUDA(workspace.Alloc(plan.WorkspaceBytes(o.head_dim)));

  kcu::TppDecodeParams tp;
  tp.q = q.p;
  tp.o = o_tpp.p;
  tp.kv = kv;
  tp.num_qo_heads = o.heads;
  tp.sm_scale = sm_scale;
  tp.plan = &plan;
  tp.workspace = workspace.p;
  tp.workspace_bytes = std::max<size_t>(plan.WorkspaceBytes(o.head_dim), 16);
  kcu::PagedDecodeParams pp;
  pp.q = q.p;
  pp.o = o_paged.p;
  pp.kv = kv;
  pp.num_seqs = cfg.batch;
  pp.num_qo_heads = o.heads;
  pp.block_indptr = indptr.as<int32_t>();
  pp.block_slot = bslot.as<int32_t>();
  pp.block_len = blen.as<int32_t>();
  pp.sm_scale = sm_scale;

  BENCH_CUDA(kcu::TppDecode(tp, nullptr));
  BENCH_CUDA(kcu::PagedDecode(pp, nullptr));
  BENCH_CUDA(cudaDeviceSynchronize());
  // Same inputs, same inner loop, different split and merge order: agreement to a few 16-bit ulps.
  std::vector<uint16_t> a(qn), b(qn);
  BENCH_CUDA(cudaMemcpy(a.data(), o_tpp.p, qn * 2, cudaMemcpyDeviceToHost));
  BENCH_CUDA(cudaMemcpy(b.data(), o_paged.p, qn * 2, cudaMemcpyDeviceToHost));
  std::vector<float> fa(qn), fb(qn);
  kernels::cpu::ConvertToFloat(o.kv_dtype, a.data(), fa.data(), qn);
  kernels::cpu::ConvertToFloat(o.kv_dtype, b.data(), fb.data(), qn);
  double worst = 0.0;
  for (size_t i = 0; i < qn; ++i) {
    const double d = std::abs(static_cast<double>(fa[i]) - fb[i]);
    if (!(d <= worst)) worst = std::isfinite(d) ? d : INFINITY;
  }
  const double agree = bf16 ? 2e-2 : 4e-3;
  if (!(worst <= agree)) {
    std::fprintf(stderr, "attention (cuda): tpp and paged disagree: max |diff| = %g\n", worst);
    return false;
  }
  std::vector<Timing> t;
  if (!TimeInterleaved(o, flush, flush_bytes, sink,
                       {[&] { return kcu::PagedDecode(pp, nullptr); },
                        [&] { return kcu::TppDecode(tp, nullptr); }},
                       &t)) {
    return false;
  }
  m->results = {{"paged", t[0]}, {"tpp", t[1]}};
  return true;
}

void EmitJson(const CudaAttentionOptions& o, const Machine& mc, const Measured& m,
              const Result& r) {
  const double bytes = MinimalBytes(o, m.cfg);
  const double flops = Flops(o, m.cfg);
  const double floor_ms = bytes / (mc.bandwidth_gbs * 1e6);
  nlohmann::json j;
  j["bench"] = "attention";
  j["device"] = "cuda";
  j["device_name"] = mc.name;
  j["section"] = m.section;
  j["impl"] = r.impl;
  j["np"] = m.cfg.np;
  j["ns"] = m.cfg.ns;
  j["batch"] = m.cfg.batch;
  j["heads"] = o.heads;
  j["kv_heads"] = o.kv_heads;
  j["head_dim"] = o.head_dim;
  j["chunk"] = o.chunk;
  j["kv_dtype"] = o.kv_dtype == DType::kBF16 ? "bf16" : "f16";
  j["threads"] = mc.sms;  // streaming multiprocessors
  j["isa"] = "sm_" + std::to_string(mc.cc_major) + std::to_string(mc.cc_minor);
  j["iters"] = r.timing.iters;
  j["cache"] = o.warm ? "warm" : "cold";
  j["median_ms"] = r.timing.median_ms;
  j["min_ms"] = r.timing.min_ms;
  j["floor_ms"] = floor_ms;
  j["efficiency"] = floor_ms / r.timing.median_ms;
  j["bytes"] = bytes;
  j["flops"] = flops;
  j["bandwidth_gbs"] = mc.bandwidth_gbs;
  j["bandwidth_low_gbs"] = mc.bandwidth_low_gbs;
  j["fma_gflops"] = nullptr;  // not measured on the GPU: decode attention is memory-bound there
  j["achieved_gbs"] = bytes / (r.timing.median_ms * 1e6);
  j["achieved_gflops"] = flops / (r.timing.median_ms * 1e6);
  j["tokens_per_s"] = m.cfg.batch / (r.timing.median_ms * 1e-3);
  j["plan_upload_bytes"] = m.plan_upload_bytes;
  j["ctas_per_sm"] = o.ctas_per_sm;
  std::cout << j.dump() << std::endl;
}

const Result* Find(const Measured& m, const char* impl) {
  for (const Result& r : m.results) {
    if (r.impl == impl) return &r;
  }
  return nullptr;
}

void PrintTables(const CudaAttentionOptions& o, const Machine& mc,
                 const std::vector<Measured>& all) {
  std::printf(
      "device: %s (sm_%d%d, %d SMs, L2 %.0f MiB); copy bandwidth %.0f GB/s (best pass; lowest "
      "%.0f)\n",
      mc.name.c_str(), mc.cc_major, mc.cc_minor, mc.sms, mc.l2_bytes / 1048576.0, mc.bandwidth_gbs,
      mc.bandwidth_low_gbs);
  std::printf("KV %s; heads %d, kv heads %d, head dim %d, chunk %d; L2 %s; median of %d\n",
              o.kv_dtype == DType::kBF16 ? "bf16" : "f16", o.heads, o.kv_heads, o.head_dim, o.chunk,
              o.warm ? "warm" : "flushed before every timed iteration", o.iters);
  std::printf("%-8s %6s %6s %6s %11s %11s %9s %11s %8s %9s\n", "section", "np", "ns", "batch",
              "paged_us", "tpp_us", "tpp/paged", "floor_us", "tpp_eff", "paged_eff");
  for (const Measured& m : all) {
    const Result* paged = Find(m, "paged");
    const Result* tpp = Find(m, "tpp");
    if (paged == nullptr || tpp == nullptr) continue;
    const double floor_ms = MinimalBytes(o, m.cfg) / (mc.bandwidth_gbs * 1e6);
    std::printf("%-8s %6lld %6lld %6d %11.1f %11.1f %8.2fx %11.1f %8.2f %9.2f\n", m.section,
                static_cast<long long>(m.cfg.np), static_cast<long long>(m.cfg.ns), m.cfg.batch,
                paged->timing.median_ms * 1e3, tpp->timing.median_ms * 1e3,
                paged->timing.median_ms / tpp->timing.median_ms, floor_ms * 1e3,
                floor_ms / tpp->timing.median_ms, floor_ms / paged->timing.median_ms);
  }
}

}  // namespace

int RunCudaAttentionBench(const CudaAttentionOptions& o) {
  int count = 0;
  if (kcu::DeviceCount(&count) != cudaSuccess || count < 1) {
    std::fprintf(stderr, "attention: no CUDA device (--device cuda needs one); nothing was run\n");
    return kNoCudaDeviceExitCode;
  }
  kcu::AttentionShape shape;
  shape.dtype = o.kv_dtype;
  shape.num_qo_heads = o.heads;
  shape.num_kv_heads = o.kv_heads;
  shape.head_dim = o.head_dim;
  shape.chunk_size = o.chunk;
  shape.num_slots = 1;
  if (const char* e = kcu::CheckAttentionShape(shape)) {
    std::fprintf(stderr, "attention (cuda): unsupported shape: %s\n", e);
    return 2;
  }
  Machine mc;
  cudaDeviceProp prop{};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    std::fprintf(stderr, "attention (cuda): cannot read the device properties\n");
    return 1;
  }
  mc.name = prop.name;
  mc.sms = prop.multiProcessorCount;
  mc.cc_major = prop.major;
  mc.cc_minor = prop.minor;
  mc.l2_bytes = static_cast<size_t>(prop.l2CacheSize);
  const size_t flush_bytes = std::max<size_t>(4 * mc.l2_bytes, size_t{64} << 20);
  DeviceMem flush, sink;
  if (flush.Alloc(flush_bytes) != cudaSuccess || sink.Alloc(16) != cudaSuccess ||
      kcu::FillWords(flush.p, flush_bytes, 0x3c003c00u, nullptr) != cudaSuccess ||
      !MeasureBandwidth(&mc)) {
    return 1;
  }

  std::vector<Measured> all;
  auto run = [&](const char* section, const Config& cfg) {
    Measured m{section, cfg, {}, 0};
    if (!o.json) {
      std::fprintf(stderr, "attention (cuda): %s np %lld ns %lld batch %d...\n", section,
                   static_cast<long long>(cfg.np), static_cast<long long>(cfg.ns), cfg.batch);
    }
    if (!RunConfig(o, cfg, flush.p, flush_bytes, sink.as<unsigned>(), &m)) return false;
    all.push_back(std::move(m));
    return true;
  };
  bool ok = true;
  if (!o.grid) {
    ok = run("single", Config{o.np, o.ns, o.batch});
  } else {
    for (int64_t np : {1024, 2048, 4096}) {
      for (int64_t ns : {int64_t{0}, np / 2, 3 * np / 4, np}) {
        if (ok) ok = run("table3", Config{np, ns, o.batch});
      }
    }
    for (int32_t batch : o.sweep_batches) {
      if (ok && batch >= 1) ok = run("figure4", Config{o.np, o.ns, batch});
    }
  }
  if (!MeasureBandwidth(&mc)) return 1;
  if (o.json) {
    for (const Measured& m : all) {
      for (const Result& r : m.results) EmitJson(o, mc, m, r);
    }
  } else {
    PrintTables(o, mc, all);
  }
  return ok ? 0 : 1;
}

}  // namespace chunkserve::bench
