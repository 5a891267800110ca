// Tokenizer::FromVocab (GGUF-style metadata) on VocabSpecs built from the committed
// tokenizer.json files, checked against the same HF references; and loading errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "runtime/tokenizer/tokenizer.h"
#include "tests/tokenizer/test_util.h"

namespace chunkserve::tokenizer {
namespace {

using testing::DataDir;
using testing::DiffIds;
using testing::LoadReference;
using testing::ReadFile;
using testing::ReferenceRow;

// tokens by id, token types from the added tokens, merges as "a b" strings.
VocabSpec SpecFromJson(const std::string& name) {
  const auto j = nlohmann::json::parse(ReadFile(DataDir() / (name + ".tokenizer.json")));
  VocabSpec spec;
  const auto& vocab = j.at("model").at("vocab");
  size_t n = vocab.size();
  for (const auto& t : j.at("added_tokens")) n = std::max(n, t.at("id").get<size_t>() + 1);
  spec.tokens.resize(n);
  spec.token_types.assign(n, 1);
  for (const auto& [text, id] : vocab.items()) spec.tokens[id.get<size_t>()] = text;
  for (const auto& t : j.at("added_tokens")) {
    const size_t id = t.at("id").get<size_t>();
    spec.tokens[id] = t.at("content").get<std::string>();
    spec.token_types[id] = t.at("special").get<bool>() ? 3 : 4;
  }
  for (const auto& m : j.at("model").at("merges")) {
    spec.merges.push_back(m.is_string() ? m.get<std::string>()
                                        : m[0].get<std::string>() + " " + m[1].get<std::string>());
  }
  return spec;
}

TEST(FromVocabTest, Gpt2LlamaBpeMatchesHfOnCorpus) {
  VocabSpec spec = SpecFromJson("bytelevel_bpe");
  spec.model = "gpt2";
  spec.pre = "llama-bpe";  // the committed tokenizer splits with Llama 3's regex
  // The lstrip/single_word added tokens have no GGUF equivalent; keep them out of this check.
  const std::vector<ReferenceRow> rows = LoadReference("bytelevel_bpe");
  auto t = Tokenizer::FromVocab(spec);
  ASSERT_TRUE(t.ok()) << t.status();
  int checked = 0;
  for (const ReferenceRow& row : rows) {
    if (row.text.find("<tool>") != std::string::npos ||
        row.text.find("[SEP]") != std::string::npos) {
      continue;
    }
    auto ids = t->Encode(row.text, /*add_special_tokens=*/false);
    ASSERT_TRUE(ids.ok()) << ids.status();
    EXPECT_EQ(*ids, row.ids) << "text: \"" << row.text << "\"\n" << DiffIds(row.ids, *ids);
    ++checked;
  }
  EXPECT_GE(checked, 270);
}

TEST(FromVocabTest, LlamaScoresBpeMatchesHfOnCorpus) {
  VocabSpec spec = SpecFromJson("sentencepiece_bpe");
  spec.model = "llama";
  // Scores as SentencePiece's BPE has them: earlier merges score higher. Each learned piece's
  // score is minus the rank of the merge that made it.
  spec.scores.assign(spec.tokens.size(), 0.0f);
  for (size_t rank = 0; rank < spec.merges.size(); ++rank) {
    const std::string& m = spec.merges[rank];
    const std::string merged = m.substr(0, m.find(' ')) + m.substr(m.find(' ') + 1);
    const auto it = std::find(spec.tokens.begin(), spec.tokens.end(), merged);
    ASSERT_NE(it, spec.tokens.end()) << merged;
    spec.scores[it - spec.tokens.begin()] = -static_cast<float>(rank + 1);
  }
  for (size_t i = 3; i < 259; ++i) spec.token_types[i] = 6;
  spec.token_types[0] = 2;
  spec.unk_id = 0;
  spec.bos_id = 1;
  spec.eos_id = 2;
  spec.add_bos = true;
  spec.merges.clear();
  auto t = Tokenizer::FromVocab(spec);
  ASSERT_TRUE(t.ok()) << t.status();
  for (const ReferenceRow& row : LoadReference("sentencepiece_bpe")) {
    auto ids = t->Encode(row.text, /*add_special_tokens=*/true);
    ASSERT_TRUE(ids.ok()) << ids.status();
    EXPECT_EQ(*ids, row.ids_special)
        << "text: \"" << row.text << "\"\n" << DiffIds(row.ids_special, *ids);
    auto text = t->Decode(*ids, /*skip_special_tokens=*/true);
    ASSERT_TRUE(text.ok()) << text.status();
    EXPECT_EQ(*text, row.decoded_skip);
  }
}

TEST(FromVocabTest, UnknownPreTokenizerIsUnimplemented) {
  VocabSpec spec = SpecFromJson("bytelevel_bpe");
  spec.model = "gpt2";
  spec.pre = "no-such-pre";
  auto t = Tokenizer::FromVocab(spec);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(t.status().message().find("no-such-pre"), std::string_view::npos);
}

TEST(FromVocabTest, MismatchedArraysAreInvalidArgument) {
  VocabSpec spec = SpecFromJson("bytelevel_bpe");
  spec.model = "gpt2";
  spec.token_types.pop_back();
  EXPECT_EQ(Tokenizer::FromVocab(spec).status().code(), StatusCode::kInvalidArgument);
  spec = SpecFromJson("bytelevel_bpe");
  spec.model = "gpt2";
  spec.merges.push_back("nospace");
  EXPECT_EQ(Tokenizer::FromVocab(spec).status().code(), StatusCode::kInvalidArgument);
}

// --- tokenizer.json loading errors ---------------------------------------------------------

Status Load(const std::string& json) { return Tokenizer::FromJson(json).status(); }

constexpr const char* kMinimal =
    R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]}})";

TEST(FromJsonTest, MinimalModelEncodes) {
  auto t = Tokenizer::FromJson(kMinimal);
  ASSERT_TRUE(t.ok()) << t.status();
  auto ids = t->Encode("abab", false);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, (std::vector<int32_t>{2, 2}));
  EXPECT_EQ(t->Decode(*ids, false).value_or(""), "ab ab");  // no decoder: joined with spaces
}

TEST(FromJsonTest, MalformedJsonIsInvalidArgument) {
  EXPECT_EQ(Load("{").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Load("[]").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Load(std::string(100000, '[')).code(), StatusCode::kInvalidArgument);
}

TEST(FromJsonTest, WrongTypeNamesThePath) {
  const Status s = Load(R"({"model": {"type": "BPE", "vocab": {"a": "x"}, "merges": []}})");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("model.vocab[\"a\"]"), std::string_view::npos) << s;
  const Status m = Load(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a c"]}})");
  EXPECT_EQ(m.code(), StatusCode::kInvalidArgument) << m;
}

TEST(FromJsonTest, NfcNormalizerIsUnimplementedNamingThePath) {
  const Status s = Load(
      R"({"normalizer": {"type": "Sequence", "normalizers": [{"type": "NFC"}]},
          "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}})");
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented);
  EXPECT_NE(s.message().find("normalizer.normalizers[0]"), std::string_view::npos) << s;
}

TEST(FromJsonTest, UnknownComponentsAreUnimplemented) {
  EXPECT_EQ(Load(R"({"model": {"type": "WordPiece", "vocab": {}}})").code(),
            StatusCode::kUnimplemented);
  EXPECT_EQ(Load(R"({"pre_tokenizer": {"type": "BertPreTokenizer"},
                     "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}})")
                .code(),
            StatusCode::kUnimplemented);
  EXPECT_EQ(Load(R"({"decoder": {"type": "WordPiece"},
                     "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}})")
                .code(),
            StatusCode::kUnimplemented);
}

TEST(FromJsonTest, StripAndMetaspaceTakeExactlyOneCharacter) {
  for (const char* step :
       {R"({"type": "Strip", "content": "  ", "start": 1, "stop": 0})",
        R"({"type": "Strip", "content": "", "start": 1, "stop": 0})",
        R"({"type": "Metaspace", "replacement": "__", "prepend_scheme": "always"})"}) {
    const Status s = Load(std::string(R"({"decoder": )") + step +
                          R"(, "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}})");
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << step;
    EXPECT_NE(s.message().find("expected one character"), std::string_view::npos) << s;
  }
  // One code point of several bytes is one character.
  EXPECT_TRUE(Load(R"({"decoder": {"type": "Strip", "content": "▁", "start": 1, "stop": 0},
                       "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}})")
                  .ok());
}

TEST(FromJsonTest, EncodeRejectsInvalidUtf8AndDecodeRejectsBadIds) {
  auto t = Tokenizer::FromJson(kMinimal);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->Encode("a\xff", false).status().code(), StatusCode::kInvalidArgument);
  const int32_t bad[] = {0, 3};
  EXPECT_EQ(t->Decode(bad, false).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace chunkserve::tokenizer
