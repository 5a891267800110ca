// Replays the tokenizer.json fuzz target without libFuzzer: every seed in
// tests/tokenizer/fuzz_corpus/, then deterministic mutations of the seeds, then mutations from a
// fresh (printed) seed. Built with ASan and UBSan over the tokenizer sources themselves; passing
// means no input crashed, aborted (the round-trip oracle included) or read out of bounds.
//
// Seeds named valid_* must load; every other seed must be rejected with a Status.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/tokenizer/tokenizer.h"
#include "tests/testing/fuzz_corpus.h"
#include "tests/testing/random.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace chunkserve::tokenizer {
namespace {

using Seed = ::chunkserve::testing::FuzzSeed;

std::vector<Seed> LoadCorpus() {
  return ::chunkserve::testing::LoadFuzzCorpus("tests/tokenizer/fuzz_corpus");
}

void FuzzOne(const std::string& bytes) {
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
}

// One to four random edits: bit flips, interesting bytes, tokenizer.json words and values,
// deletions, truncation, splices from other seeds.
std::string Mutate(const std::vector<Seed>& seeds, ::chunkserve::testing::Random& rng) {
  const auto pick = [&](size_t n) { return static_cast<size_t>(rng.Int(0, static_cast<int64_t>(n) - 1)); };
  std::string s = seeds[pick(seeds.size())].bytes;
  static const char kInteresting[] = {'\0', '\xff', '{', '}', '[', ']', '"', ',', ':',
                                      '\\', '0',    '9', '-', ' ', '(', ')', '*', '+'};
  static const char* const kTokens[] = {
      "\"type\"", "\"Sequence\"", "\"ByteLevel\"", "\"Split\"", "\"Metaspace\"", "\"Digits\"",
      "\"Replace\"", "\"Prepend\"", "\"Strip\"", "\"Fuse\"", "\"ByteFallback\"",
      "\"TemplateProcessing\"", "\"Isolated\"", "\"Removed\"", "\"MergedWithNext\"",
      "\"Contiguous\"", "\"invert\": true", "\"Regex\"", "\"String\"", "\"(?!\\\\S)\"", "\"\"",
      "null", "true", "false", "-1", "0", "2147483647", "4294967296", "1e999", "[]", "{}",
      "\"<0xFF>\"", "\"\\u2581\"", "\"\\ud800\"", "\"a b\"", "[\"a\",\"b\"]", "\"(a+)+$\""};
  const int edits = static_cast<int>(rng.Int(1, 4));
  for (int e = 0; e < edits; ++e) {
    const size_t pos = s.empty() ? 0 : pick(s.size());
    switch (rng.Int(0, 6)) {
      case 0:
        if (!s.empty()) s[pos] = static_cast<char>(s[pos] ^ (1 << rng.Int(0, 7)));
        break;
      case 1:
        if (!s.empty()) s[pos] = kInteresting[pick(sizeof(kInteresting))];
        break;
      case 2:
        s.insert(pos, kTokens[pick(std::size(kTokens))]);
        break;
      case 3:
        s.erase(pos, static_cast<size_t>(rng.Int(1, 16)));
        break;
      case 4:
        s.resize(pos);
        break;
      case 5: {
        const std::string& other = seeds[pick(seeds.size())].bytes;
        if (!other.empty()) s.insert(pos, other.substr(pick(other.size()), rng.Int(1, 64)));
        break;
      }
      default:
        if (!s.empty()) s.insert(pos, s.substr(pos, static_cast<size_t>(rng.Int(1, 32))));
        break;
    }
  }
  return s;
}

TEST(TokenizerJsonFuzzReplayTest, SeedsLoadOrFailAsNamed) {
  const std::vector<Seed> seeds = LoadCorpus();
  ASSERT_GE(seeds.size(), 10u);
  for (const Seed& seed : seeds) {
    FuzzOne(seed.bytes);
    const auto t = Tokenizer::FromJson(seed.bytes);
    EXPECT_EQ(t.ok(), seed.name.starts_with("valid_")) << seed.name << ": " << t.status();
  }
}

TEST(TokenizerJsonFuzzReplayTest, FixedMutationsDoNotCrash) {
  const std::vector<Seed> seeds = LoadCorpus();
  ::chunkserve::testing::Random rng(20240601);
  for (int i = 0; i < 5000; ++i) FuzzOne(Mutate(seeds, rng));
}

TEST(TokenizerJsonFuzzReplayTest, FreshMutationsDoNotCrash) {
  const std::vector<Seed> seeds = LoadCorpus();
  ::chunkserve::testing::Random rng(::chunkserve::testing::TestSeed());
  for (int i = 0; i < 2000; ++i) FuzzOne(Mutate(seeds, rng));
}

}  // namespace
}  // namespace chunkserve::tokenizer
