// Replays the safetensors fuzz target without libFuzzer: every seed in tests/model/fuzz_corpus/,
// then deterministic mutations of the seeds, then mutations from a fresh (printed) seed. Built with
// ASan and UBSan over the parser sources themselves; passing means no input crashed, aborted or
// read out of bounds.
//
// Seeds named valid_* must parse; every other seed must be rejected with a Status.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/model/safetensors.h"
#include "tests/testing/fuzz_corpus.h"
#include "tests/testing/random.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace chunkserve::model {
namespace {

using Seed = ::chunkserve::testing::FuzzSeed;

std::vector<Seed> LoadCorpus() {
  return ::chunkserve::testing::LoadFuzzCorpus("tests/model/fuzz_corpus");
}

void FuzzOne(const std::string& bytes) {
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
}

void SetLength(std::string& bytes, uint64_t n) {
  if (bytes.size() < 8) bytes.resize(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((n >> (8 * i)) & 0xff);
}

// One random edit. Half of the edits that touch the header text then re-fix the length prefix so
// the mutated JSON actually reaches the parser instead of failing the length check.
std::string Mutate(const std::vector<Seed>& seeds, ::chunkserve::testing::Random& rng) {
  std::string s =
      seeds[static_cast<size_t>(rng.Int(0, static_cast<int64_t>(seeds.size()) - 1))].bytes;
  static const char kInteresting[] = {'\0', '\xff', '{', '}', '[', ']', '"', ',', ':',
                                      '-',  '0',    '1', '9', 'e', '.', ' ', '\\'};
  static const char* const kTokens[] = {"\"F32\"",
                                        "\"BF16\"",
                                        "\"F16\"",
                                        "\"I8\"",
                                        "\"shape\"",
                                        "\"data_offsets\"",
                                        "\"dtype\"",
                                        "18446744073709551615",
                                        "9223372036854775807",
                                        "-1",
                                        "0",
                                        "[]",
                                        "{}",
                                        "null",
                                        "1e999",
                                        "\"__metadata__\"",
                                        "[0,4]",
                                        "[4,0]",
                                        "4294967296"};
  const int edits = static_cast<int>(rng.Int(1, 4));
  bool touched_header = false;
  for (int e = 0; e < edits; ++e) {
    const size_t pos =
        s.empty() ? 0 : static_cast<size_t>(rng.Int(0, static_cast<int64_t>(s.size()) - 1));
    switch (rng.Int(0, 8)) {
      case 0:  // flip a bit
        if (!s.empty()) s[pos] = static_cast<char>(s[pos] ^ (1 << rng.Int(0, 7)));
        break;
      case 1:  // an interesting byte
        if (!s.empty()) s[pos] = kInteresting[rng.Int(0, sizeof(kInteresting) - 1)];
        break;
      case 2:  // insert a token
        s.insert(pos, kTokens[rng.Int(0, std::size(kTokens) - 1)]);
        touched_header = true;
        break;
      case 3:  // delete a range
        s.erase(pos, static_cast<size_t>(rng.Int(1, 16)));
        touched_header = true;
        break;
      case 4:  // truncate
        s.resize(pos);
        break;
      case 5:  // append bytes
        s.append(static_cast<size_t>(rng.Int(1, 64)),
                 kInteresting[rng.Int(0, sizeof(kInteresting) - 1)]);
        break;
      case 6: {  // an interesting header length
        const uint64_t size = s.size();
        const uint64_t choices[] = {0,        1,     2,          size,        size - 8,   size - 7,
                                    size - 9, ~0ull, 1ull << 63, 100'000'000, 100'000'001};
        SetLength(s, choices[rng.Int(0, std::size(choices) - 1)]);
        break;
      }
      case 7: {  // splice in part of another seed
        const std::string& other =
            seeds[static_cast<size_t>(rng.Int(0, static_cast<int64_t>(seeds.size()) - 1))].bytes;
        if (!other.empty()) {
          const size_t from =
              static_cast<size_t>(rng.Int(0, static_cast<int64_t>(other.size()) - 1));
          s.insert(pos, other.substr(from, static_cast<size_t>(rng.Int(1, 64))));
          touched_header = true;
        }
        break;
      }
      default: {  // duplicate a range
        if (!s.empty()) {
          s.insert(pos, s.substr(pos, static_cast<size_t>(rng.Int(1, 32))));
          touched_header = true;
        }
        break;
      }
    }
  }
  if (touched_header && s.size() >= 8 && rng.Bernoulli(0.5)) {
    // Length = everything after the prefix minus a random data tail.
    const uint64_t rest = s.size() - 8;
    SetLength(s, rest - static_cast<uint64_t>(
                            rng.Int(0, static_cast<int64_t>(std::min<uint64_t>(rest, 64)))));
  }
  return s;
}

TEST(SafetensorsFuzzReplayTest, SeedsParseOrFailAsNamed) {
  const std::vector<Seed> seeds = LoadCorpus();
  ASSERT_GE(seeds.size(), 10u);
  for (const Seed& seed : seeds) {
    FuzzOne(seed.bytes);
    const auto header = ParseSafetensorsHeader(
        {reinterpret_cast<const std::byte*>(seed.bytes.data()), seed.bytes.size()}, seed.name);
    const bool valid = seed.name.starts_with("valid_");
    EXPECT_EQ(header.ok(), valid) << seed.name << ": " << header.status();
  }
}

TEST(SafetensorsFuzzReplayTest, FixedMutationsDoNotCrash) {
  const std::vector<Seed> seeds = LoadCorpus();
  ::chunkserve::testing::Random rng(20240601);
  for (int i = 0; i < 5000; ++i) FuzzOne(Mutate(seeds, rng));
}

TEST(SafetensorsFuzzReplayTest, FreshMutationsDoNotCrash) {
  const std::vector<Seed> seeds = LoadCorpus();
  ::chunkserve::testing::Random rng(::chunkserve::testing::TestSeed());
  for (int i = 0; i < 2000; ++i) FuzzOne(Mutate(seeds, rng));
}

}  // namespace
}  // namespace chunkserve::model
