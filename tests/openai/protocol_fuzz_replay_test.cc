// Replays the OpenAI request fuzz target without libFuzzer: every seed in tests/openai/corpus/,
// then mutations of the seeds from a printed seed (CHUNKSERVE_TEST_SEED replays them). Built with
// ASan and UBSan over the parser itself; the target aborts when its oracle fails.
//
// Seeds named bad_* must be refused; the others must be accepted.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/openai/protocol.h"
#include "tests/testing/fuzz_corpus.h"
#include "tests/testing/random.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace chunkserve::openai {
namespace {

std::vector<::chunkserve::testing::FuzzSeed> Corpus() {
  return ::chunkserve::testing::LoadFuzzCorpus("tests/openai/corpus");
}

void FuzzOne(const std::string& s) {
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(s.data()), s.size());
}

TEST(OpenAIProtocolFuzzReplay, Seeds) {
  const auto seeds = Corpus();
  ASSERT_GE(seeds.size(), 4u);
  for (const auto& [name, bytes] : seeds) {
    FuzzOne(bytes);
    const Endpoint e = name.find("chat") != std::string::npos ? Endpoint::kChat
                                                              : Endpoint::kCompletions;
    EXPECT_EQ(ParseGenerationRequest(e, bytes).ok(), name.rfind("bad_", 0) != 0) << name;
  }
}

TEST(OpenAIProtocolFuzzReplay, Mutations) {
  const auto seeds = Corpus();
  ::chunkserve::testing::Random rng(::chunkserve::testing::TestSeed());
  static const char* const kTokens[] = {
      "null", "true", "-1", "0", "1e999", "2.0000001", "18446744073709551616", "[]", "{}",
      "\"\"", "[[]]", "[1,[2]]", "\"\\ud800\"", "\"\\u0000\"", "\xff\xfe", "\"n\":2",
      "\"stop\":[\"\"]", "\"messages\":[{}]", "\"prompt\":[[1],[2]]", ",", ":", "\"", "{", "}"};
  for (int i = 0; i < 20000; ++i) {
    std::string s = seeds[static_cast<size_t>(rng.Int(0, static_cast<int64_t>(seeds.size()) - 1))]
                        .bytes;
    for (int e = static_cast<int>(rng.Int(1, 4)); e > 0; --e) {
      const size_t pos = s.empty() ? 0 : static_cast<size_t>(rng.Int(0, static_cast<int64_t>(s.size()) - 1));
      switch (rng.Int(0, 3)) {
        case 0:
          if (!s.empty()) s[pos] = static_cast<char>(s[pos] ^ (1 << rng.Int(0, 7)));
          break;
        case 1:
          s.insert(pos, kTokens[rng.Int(0, static_cast<int64_t>(std::size(kTokens)) - 1)]);
          break;
        case 2:
          s.erase(pos, static_cast<size_t>(rng.Int(1, 12)));
          break;
        default:
          s.resize(pos);
          break;
      }
    }
    FuzzOne(s);
  }
}

}  // namespace
}  // namespace chunkserve::openai
