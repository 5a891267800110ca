// chunkserve-bench subcommand registry.
//
// A benchmark is a function `int Main(int argc, char** argv)` (argv[0] is the subcommand name)
// registered under a name:
//   CHUNKSERVE_REGISTER_BENCH(attention, "decode attention: naive vs paged vs tpp", AttentionMain);
// Benchmarks print a human-readable table by default and one JSON object per result line with
// --json. They never assert on time.
#ifndef CHUNKSERVE_TESTS_BENCH_BENCH_H_
#define CHUNKSERVE_TESTS_BENCH_BENCH_H_

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/attention_params.h"

namespace chunkserve::bench {

using BenchMain = int (*)(int argc, char** argv);

struct BenchEntry {
  std::string help;
  BenchMain main;
};

std::map<std::string, BenchEntry>& Registry();

// KV dtype flag values: f32, f16, bf16. ParseDType returns false for anything else.
inline bool ParseDType(const std::string& s, kernels::DType* out) {
  if (s == "f32") *out = kernels::DType::kF32;
  else if (s == "f16") *out = kernels::DType::kF16;
  else if (s == "bf16") *out = kernels::DType::kBF16;
  else return false;
  return true;
}

inline const char* DTypeName(kernels::DType t) {
  return t == kernels::DType::kF16 ? "f16" : t == kernels::DType::kBF16 ? "bf16" : "f32";
}

// The median of `v` (0 for none): what every benchmark reports.
inline double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// A comma-separated list of integers, each in [lo, hi], into *out; false (and *out partly
// filled) for an empty list or a bad item.
template <typename T>
bool ParseIntList(const std::string& s, int64_t lo, int64_t hi, std::vector<T>* out) {
  out->clear();
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    char* end = nullptr;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (end == item.c_str() || *end != '\0' || v < lo || v > hi) return false;
    out->push_back(static_cast<T>(v));
  }
  return !out->empty();
}

struct BenchRegistration {
  BenchRegistration(const char* name, const char* help, BenchMain main) {
    Registry()[name] = BenchEntry{help, main};
  }
};

}  // namespace chunkserve::bench

#define CHUNKSERVE_REGISTER_BENCH(name, help, fn) \
  static ::chunkserve::bench::BenchRegistration chunkserve_bench_registration_##name(#name, help, fn)

#endif  // CHUNKSERVE_TESTS_BENCH_BENCH_H_
