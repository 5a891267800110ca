// Replays the GGUF fuzz target without libFuzzer: every seed in tests/model/gguf_fuzz_corpus/
// (written by make_gguf_fuzz_corpus.py), then deterministic mutations of the seeds, then mutations
// from a fresh (printed) seed. Built with ASan and UBSan over the reader's sources themselves;
// passing means no input crashed, aborted or read out of bounds.
//
// Seeds named valid_* must parse; every other seed must be rejected with a Status.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/model/gguf.h"
#include "tests/testing/fuzz_corpus.h"
#include "tests/testing/random.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace chunkserve::model {
namespace {

using Seed = ::chunkserve::testing::FuzzSeed;

std::vector<Seed> LoadCorpus() {
  return ::chunkserve::testing::LoadFuzzCorpus("tests/model/gguf_fuzz_corpus");
}

void FuzzOne(const std::string& bytes) {
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
}

// One to four random edits. GGUF is a binary format of little-endian counts, lengths, types and
// offsets, so besides byte edits the mutator overwrites aligned 4- and 8-byte words with the
// boundary values a hostile header would use.
std::string Mutate(const std::vector<Seed>& seeds, ::chunkserve::testing::Random& rng) {
  std::string s =
      seeds[static_cast<size_t>(rng.Int(0, static_cast<int64_t>(seeds.size()) - 1))].bytes;
  static const uint64_t kWords[] = {0,          1,           2,          3,          4,
                                    8,          9,           12,         13,         31,
                                    32,         33,          255,        256,        0xffff,
                                    1ull << 31, 0xffffffff,  1ull << 32, 1ull << 62, 1ull << 63,
                                    ~0ull,      ~0ull - 7,   100000,     4096,       64};
  const int edits = static_cast<int>(rng.Int(1, 4));
  for (int e = 0; e < edits; ++e) {
    if (s.empty()) s = "GGUF";
    const size_t pos = static_cast<size_t>(rng.Int(0, static_cast<int64_t>(s.size()) - 1));
    switch (rng.Int(0, 6)) {
      case 0:  // flip a bit
        s[pos] = static_cast<char>(s[pos] ^ (1 << rng.Int(0, 7)));
        break;
      case 1:  // a random byte
        s[pos] = static_cast<char>(rng.Int(0, 255));
        break;
      case 2:
      case 3: {  // an interesting 4- or 8-byte word, at a 4-aligned or any position
        const uint64_t w = kWords[rng.Int(0, std::size(kWords) - 1)];
        const size_t width = rng.Bernoulli(0.5) ? 4 : 8;
        const size_t at = rng.Bernoulli(0.7) ? pos / 4 * 4 : pos;
        if (at + width <= s.size()) std::memcpy(s.data() + at, &w, width);
        break;
      }
      case 4:  // truncate
        s.resize(pos);
        break;
      case 5:  // delete or duplicate a range
        if (rng.Bernoulli(0.5)) {
          s.erase(pos, static_cast<size_t>(rng.Int(1, 16)));
        } else {
          s.insert(pos, s.substr(pos, static_cast<size_t>(rng.Int(1, 32))));
        }
        break;
      default: {  // splice in part of another seed
        const std::string& other =
            seeds[static_cast<size_t>(rng.Int(0, static_cast<int64_t>(seeds.size()) - 1))].bytes;
        if (!other.empty()) {
          const size_t from =
              static_cast<size_t>(rng.Int(0, static_cast<int64_t>(other.size()) - 1));
          s.insert(pos, other.substr(from, static_cast<size_t>(rng.Int(1, 64))));
        }
        break;
      }
    }
  }
  return s;
}

TEST(GgufFuzzReplayTest, SeedsParseOrFailAsNamed) {
  const std::vector<Seed> seeds = LoadCorpus();
  ASSERT_GE(seeds.size(), 10u);
  for (const Seed& seed : seeds) {
    FuzzOne(seed.bytes);
    const auto g = GgufFile::Parse(
        {reinterpret_cast<const uint8_t*>(seed.bytes.data()), seed.bytes.size()}, seed.name);
    const bool valid = seed.name.starts_with("valid_");
    EXPECT_EQ(g.ok(), valid) << seed.name << ": " << g.status();
  }
}

TEST(GgufFuzzReplayTest, FixedMutationsDoNotCrash) {
  const std::vector<Seed> seeds = LoadCorpus();
  ::chunkserve::testing::Random rng(20250101);
  for (int i = 0; i < 200000; ++i) FuzzOne(Mutate(seeds, rng));
}

TEST(GgufFuzzReplayTest, FreshMutationsDoNotCrash) {
  const std::vector<Seed> seeds = LoadCorpus();
  ::chunkserve::testing::Random rng(::chunkserve::testing::TestSeed());
  for (int i = 0; i < 50000; ++i) FuzzOne(Mutate(seeds, rng));
}

}  // namespace
}  // namespace chunkserve::model
