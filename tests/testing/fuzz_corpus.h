// The checked-in corpus of a fuzz target, for the replay tests that run it under ASan and UBSan
// in every build (tests/README.md, "Fuzzing").
#ifndef CHUNKSERVE_TESTS_TESTING_FUZZ_CORPUS_H_
#define CHUNKSERVE_TESTS_TESTING_FUZZ_CORPUS_H_

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace chunkserve::testing {

struct FuzzSeed {
  std::string name;   // the file's name (tests key expectations on prefixes such as "bad_")
  std::string bytes;
};

// Every file of `folder` (relative to the source tree, e.g. "tests/wire/corpus"), sorted by name.
inline std::vector<FuzzSeed> LoadFuzzCorpus(std::string_view folder) {
  std::vector<FuzzSeed> seeds;
  for (const auto& entry : std::filesystem::directory_iterator(
           std::filesystem::path(CHUNKSERVE_SOURCE_DIR) / std::filesystem::path(folder))) {
    std::ifstream in(entry.path(), std::ios::binary);
    std::ostringstream bytes;
    bytes << in.rdbuf();
    seeds.push_back({entry.path().filename().string(), bytes.str()});
  }
  std::sort(seeds.begin(), seeds.end(),
            [](const FuzzSeed& a, const FuzzSeed& b) { return a.name < b.name; });
  return seeds;
}

}  // namespace chunkserve::testing

#endif  // CHUNKSERVE_TESTS_TESTING_FUZZ_CORPUS_H_
