// chunkserve-bench <benchmark> [flags]: runs one registered benchmark; `chunkserve-bench` alone
// lists them.
#include <cstring>
#include <iostream>

#include "tests/bench/bench.h"

namespace chunkserve::bench {
std::map<std::string, BenchEntry>& Registry() {
  static auto* registry = new std::map<std::string, BenchEntry>();
  return *registry;
}
}  // namespace chunkserve::bench

int main(int argc, char** argv) {
  auto& registry = chunkserve::bench::Registry();
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    std::cout << "usage: chunkserve-bench <benchmark> [flags]   (<benchmark> --help for flags)\n";
    for (const auto& [name, entry] : registry) std::cout << "  " << name << "\t" << entry.help << "\n";
    return argc < 2 ? 2 : 0;
  }
  auto it = registry.find(argv[1]);
  if (it == registry.end()) {
    std::cerr << "chunkserve-bench: unknown benchmark '" << argv[1] << "'\n";
    return 2;
  }
  return it->second.main(argc - 1, argv + 1);
}
