// StreamDecoder against Tokenizer::Decode, its reference: on random decoder pipelines built from
// every step kind, with byte-fallback tokens, a hole in the vocabulary and a special token, the
// pushes and the flush must add up to the decode of the whole sequence; plus which pipelines are
// local (Decoder::IsLocal) and the cases that once broke the guarantee.
#include <gtest/gtest.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/tokenizer/stream_decoder.h"
#include "runtime/tokenizer/tokenizer.h"
#include "runtime/tokenizer/utf8.h"
#include "tests/testing/random.h"
#include "tests/tokenizer/test_util.h"

namespace chunkserve::tokenizer {
namespace {

using chunkserve::testing::Random;
using chunkserve::testing::TestSeed;

// Entries a decoder step can act on: plain text, "▁" and "Ġ" spaces, byte-fallback tokens that
// make valid and invalid UTF-8, byte-level characters for half a character, U+FFFD itself.
const std::vector<std::string>& Entries() {
  static const std::vector<std::string> entries = {
      "a", "b", " ", "a ", " a", "  ", "ab", "xy", "\xe2\x96\x81", "\xe2\x96\x81" "a",
      "\xe2\x96\x81\xe2\x96\x81", "\xc4\xa0", "\xc4\xa0" "b", "\xc3\xa4", "\xc2\xbd", "<0xE4>",
      "<0xBD>", "<0xA0>", "<0x41>", "<0x20>", "<0xE2>", "<0x96>", "<0x81>", "\xef\xbf\xbd"};
  return entries;
}
constexpr int32_t kHole = 5;      // no entry has this id
constexpr int32_t kSpecial = 25;  // the special added token "<s>"

int32_t IdOf(size_t entry) { return static_cast<int32_t>(entry < kHole ? entry : entry + 1); }

nlohmann::json TokenizerJson(const std::vector<nlohmann::json>& decoders) {
  nlohmann::json vocab = nlohmann::json::object();
  for (size_t i = 0; i < Entries().size(); ++i) vocab[Entries()[i]] = IdOf(i);
  vocab["<s>"] = kSpecial;
  nlohmann::json j = {
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}},
      {"added_tokens",
       {{{"id", kSpecial}, {"content", "<s>"}, {"special", true}, {"lstrip", false},
         {"rstrip", false}, {"normalized", false}, {"single_word", false}}}}};
  if (!decoders.empty()) j["decoder"] = {{"type", "Sequence"}, {"decoders", decoders}};
  return j;
}

Tokenizer Load(const std::vector<nlohmann::json>& decoders) {
  auto t = Tokenizer::FromJson(TokenizerJson(decoders).dump());
  if (!t.ok()) throw std::runtime_error(t.status().ToString());  // gtest reports it as a failure
  return std::move(*t);
}

nlohmann::json RandomStep(Random& rng) {
  switch (rng.Int(0, 5)) {
    case 0: return {{"type", "ByteLevel"}};
    case 1: return {{"type", "ByteFallback"}};
    case 2: return {{"type", "Fuse"}};
    case 3:
      static const char* const kStripped[] = {" ", "a", "\xe2\x96\x81"};
      return {{"type", "Strip"}, {"content", kStripped[rng.Int(0, 2)]},
              {"start", rng.Int(0, 2)}, {"stop", rng.Int(0, 2)}};
    case 4: {
      static const char* const kPatterns[] = {"\xe2\x96\x81", "ab", " ", "a",
                                              "\xe2\x96\x81\xe2\x96\x81"};
      static const char* const kContents[] = {" ", "X", "", "  "};
      return {{"type", "Replace"},
              {"pattern", {{"String", kPatterns[rng.Int(0, 4)]}}},
              {"content", kContents[rng.Int(0, 3)]}};
    }
    default: {
      static const char* const kSchemes[] = {"always", "first", "never"};
      return {{"type", "Metaspace"}, {"replacement", "\xe2\x96\x81"},
              {"prepend_scheme", kSchemes[rng.Int(0, 2)]}};
    }
  }
}

// Pushes every id, checking each piece, and returns pieces + flush.
std::string Stream(const Tokenizer& t, const std::vector<int32_t>& ids, bool skip_special) {
  StreamDecoder stream(t, skip_special);
  std::string streamed;
  for (const int32_t id : ids) {
    auto piece = stream.Push(id);
    EXPECT_TRUE(piece.ok()) << piece.status().ToString();
    if (!piece.ok()) return streamed;
    EXPECT_TRUE(IsValidUtf8(*piece));
    streamed += *piece;
  }
  return streamed + stream.Flush();
}

std::string Describe(const Tokenizer& t, const std::vector<int32_t>& ids) {
  std::string s;
  for (const int32_t id : ids) {
    s += '[';
    s += t.TokenText(id).value_or("(hole)");
    s += ']';
  }
  return s;
}

TEST(StreamDecoderTest, RandomPipelinesAddUpToDecode) {
  Random rng(TestSeed());
  const int32_t vocab = kSpecial + 1;
  for (int pipeline = 0; pipeline < 400; ++pipeline) {
    std::vector<nlohmann::json> decoders;
    for (int64_t n = rng.Int(0, 4); n > 0; --n) decoders.push_back(RandomStep(rng));
    const Tokenizer t = Load(decoders);
    for (int sequence = 0; sequence < 50; ++sequence) {
      const std::vector<int32_t> ids = rng.Tokens(static_cast<size_t>(rng.Int(1, 12)), vocab);
      const bool skip_special = rng.Bernoulli(0.5);
      auto full = t.Decode(ids, skip_special);
      ASSERT_TRUE(full.ok());
      ASSERT_EQ(Stream(t, ids, skip_special), *full)
          << "decoder " << nlohmann::json(decoders).dump() << ", ids " << Describe(t, ids)
          << ", skip_special_tokens " << skip_special;
    }
  }
}

TEST(StreamDecoderTest, SkippedSpecialTokenLeavesAByteRunOpen) {
  // <0x20> <s> <0xA0> skipping <s> is the run 20 A0: invalid, so two U+FFFD, not " " first.
  const Tokenizer t = Load({{{"type", "ByteFallback"}}});
  const std::vector<int32_t> ids = {*t.TokenId("<0x20>"), kSpecial, *t.TokenId("<0xA0>")};
  EXPECT_EQ(*t.Decode(ids, true), "\xef\xbf\xbd\xef\xbf\xbd");
  EXPECT_EQ(Stream(t, ids, true), "\xef\xbf\xbd\xef\xbf\xbd");
  const std::vector<int32_t> with_hole = {*t.TokenId("<0xE4>"), kHole, *t.TokenId("<0xBD>"),
                                          kHole, *t.TokenId("<0xA0>"), *t.TokenId("a")};
  EXPECT_EQ(*t.Decode(with_hole, false), "\xe4\xbd\xa0" "a");
  EXPECT_EQ(Stream(t, with_hole, false), "\xe4\xbd\xa0" "a");
}

TEST(StreamDecoderTest, NonLocalDecoderHoldsTextForFlush) {
  // After Fuse, ByteLevel keeps the whole text as its bytes once any character is outside its
  // table: "Ġ" alone decodes to " ", "Ġ▁" to "Ġ▁".
  const Tokenizer t = Load({{{"type", "Fuse"}}, {{"type", "ByteLevel"}}});
  ASSERT_FALSE(t.DecodesLocally());
  StreamDecoder stream(t, false);
  EXPECT_EQ(*stream.Push(*t.TokenId("\xc4\xa0")), "");
  EXPECT_EQ(*stream.Push(*t.TokenId("\xe2\x96\x81")), "");
  EXPECT_EQ(stream.Flush(), "\xc4\xa0\xe2\x96\x81");
}

TEST(StreamDecoderTest, WhichPipelinesAreLocal) {
  const nlohmann::json byte_level = {{"type", "ByteLevel"}};
  const nlohmann::json fuse = {{"type", "Fuse"}};
  const nlohmann::json byte_fallback = {{"type", "ByteFallback"}};
  const auto replace = [](const std::string& pattern) {
    return nlohmann::json{{"type", "Replace"}, {"pattern", {{"String", pattern}}}, {"content", " "}};
  };
  const nlohmann::json strip = {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}};
  const nlohmann::json metaspace = {{"type", "Metaspace"}, {"replacement", "\xe2\x96\x81"},
                                    {"prepend_scheme", "always"}};
  // GPT-2 / Llama 3 / Qwen, Llama 2 / Mistral, T5-style, no decoder at all.
  EXPECT_TRUE(Load({byte_level}).DecodesLocally());
  EXPECT_TRUE(Load({replace("\xe2\x96\x81"), byte_fallback, fuse, strip}).DecodesLocally());
  EXPECT_TRUE(Load({metaspace}).DecodesLocally());
  EXPECT_TRUE(Load({}).DecodesLocally());
  EXPECT_TRUE(Load({fuse, replace("\xe2\x96\x81"), strip, metaspace}).DecodesLocally());
  // A step after a merge that looks at the merged text as a whole.
  EXPECT_FALSE(Load({fuse, byte_level}).DecodesLocally());
  EXPECT_FALSE(Load({byte_level, byte_level}).DecodesLocally());
  EXPECT_FALSE(Load({fuse, byte_fallback}).DecodesLocally());
  EXPECT_FALSE(Load({byte_level, replace("ab")}).DecodesLocally());
  EXPECT_TRUE(Load({replace("ab"), fuse}).DecodesLocally());
  for (const char* name : {"bytelevel_bpe", "sentencepiece_bpe"}) {
    auto t = Tokenizer::FromJsonFile(testing::DataDir() / (std::string(name) + ".tokenizer.json"));
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    EXPECT_TRUE(t->DecodesLocally()) << name;
  }
}

}  // namespace
}  // namespace chunkserve::tokenizer
