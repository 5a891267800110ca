// Replays the committed corpus (tests/wire/corpus) through the fuzz target, plus deterministic
// mutations of every entry (bit flips, truncations, duplicated and inserted bytes), sanitized.
//
// The corpus entries are small frames written with the capnp tool, e.g.
//   echo '(token = (requestId = 7, token = 42, index = 3))' |
//     capnp encode runtime/wire/chunkserve.capnp Envelope > tests/wire/corpus/token.bin
// plus two hand-written hostile segment tables (too_many_segments.bin, oversized.bin).
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "tests/testing/fuzz_corpus.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

std::vector<std::vector<uint8_t>> Corpus() {
  std::vector<std::vector<uint8_t>> out;
  for (const auto& seed : chunkserve::testing::LoadFuzzCorpus("tests/wire/corpus")) {
    out.emplace_back(seed.bytes.begin(), seed.bytes.end());
  }
  return out;
}

void Fuzz(const std::vector<uint8_t>& v) { LLVMFuzzerTestOneInput(v.data(), v.size()); }

TEST(WireFuzzReplayTest, CorpusIsPresent) { EXPECT_GE(Corpus().size(), 6u); }

TEST(WireFuzzReplayTest, CorpusAndMutations) {
  uint64_t state = 0x9e3779b97f4a7c15ull;
  auto next = [&state] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  int runs = 0;
  for (const auto& seed : Corpus()) {
    Fuzz(seed);
    for (size_t n = 0; n <= seed.size(); ++n)
      Fuzz(std::vector<uint8_t>(seed.begin(), seed.begin() + static_cast<long>(n)));  // truncations
    for (size_t bit = 0; bit < seed.size() * 8; ++bit) {  // every single bit flip
      auto m = seed;
      m[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
      Fuzz(m);
    }
    for (int i = 0; i < 500; ++i) {  // random multi-byte mutations and doublings
      auto m = seed;
      const int edits = 1 + static_cast<int>(next() % 8);
      for (int e = 0; e < edits && !m.empty(); ++e)
        m[next() % m.size()] = static_cast<uint8_t>(next());
      if (next() % 4 == 0) m.insert(m.end(), seed.begin(), seed.end());
      if (next() % 4 == 0) m.insert(m.begin() + static_cast<long>(next() % (m.size() + 1)), 0xff);
      Fuzz(m);
      ++runs;
    }
  }
  EXPECT_GT(runs, 0);
}

}  // namespace
