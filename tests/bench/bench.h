// chunkserve-bench subcommand registry.
//
// A benchmark is a function `int Main(int argc, char** argv)` (argv[0] is the subcommand name)
// registered under a name:
//   CHUNKSERVE_REGISTER_BENCH(attention, "decode attention: naive vs paged vs tpp", AttentionMain);
// Benchmarks print a human-readable table by default and one JSON object per result line with
// --json. They never assert on time.
#ifndef CHUNKSERVE_TESTS_BENCH_BENCH_H_
#define CHUNKSERVE_TESTS_BENCH_BENCH_H_

#include <map>
#include <string>

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

struct BenchRegistration {
  BenchRegistration(const char* name, const char* help, BenchMain main) {
    Registry()[name] = BenchEntry{help, main};
  }
};

}  // namespace chunkserve::bench

#define CHUNKSERVE_REGISTER_BENCH(name, help, fn) \
  static ::chunkserve::bench::BenchRegistration chunkserve_bench_registration_##name(#name, help, fn)

#endif  // CHUNKSERVE_TESTS_BENCH_BENCH_H_
