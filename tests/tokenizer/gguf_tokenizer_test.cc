// SmolLM2-135M-Instruct's tokenizer from its GGUF metadata against transformers' conversion of the
// same GGUF (data/reference_smollm2.json), and its chat template. Skips when the model file is
// absent (.ci/fetch-models fetches it).
#include <gtest/gtest.h>

#include <memory>

#include "runtime/model/gguf.h"
#include "runtime/tokenizer/gguf_vocab.h"
#include "runtime/tokenizer/stream_decoder.h"
#include "tests/testing/model_cache.h"
#include "tests/tokenizer/test_util.h"

namespace chunkserve::tokenizer {
namespace {

using testing::DiffIds;
using testing::LoadReference;
using testing::ReferenceRow;

class SmolLM2GgufTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const auto path = ::chunkserve::testing::CachedModelPath(::chunkserve::testing::kSmolLM2Gguf);
    if (!path.ok()) {
      *skip_reason_ = std::string(path.status().message());
      return;
    }
    auto gguf = model::GgufFile::Open(*path);
    ASSERT_TRUE(gguf.ok()) << gguf.status();
    gguf_ = std::move(gguf).value().release();
  }
  void SetUp() override {
    if (gguf_ == nullptr) GTEST_SKIP() << *skip_reason_;
  }
  static inline model::GgufFile* gguf_ = nullptr;
  static inline std::string* skip_reason_ = new std::string();
};

TEST_F(SmolLM2GgufTest, MetadataDescribesASmollmByteLevelVocabulary) {
  auto spec = VocabSpecFromGguf(*gguf_);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->model, "gpt2");
  EXPECT_EQ(spec->pre, "smollm");
  EXPECT_EQ(spec->tokens.size(), 49152u);
  EXPECT_EQ(spec->bos_id, 1);
  EXPECT_EQ(spec->eos_id, 2);
  EXPECT_FALSE(spec->add_bos);
}

TEST_F(SmolLM2GgufTest, EncodeAndDecodeMatchTransformersOnCorpus) {
  auto spec = VocabSpecFromGguf(*gguf_);
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto t = Tokenizer::FromVocab(*spec);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->TokenId("<|im_end|>"), 2);
  EXPECT_TRUE(t->IsSpecial(2));
  for (const ReferenceRow& row : LoadReference("smollm2")) {
    auto ids = t->Encode(row.text, /*add_special_tokens=*/true);
    ASSERT_TRUE(ids.ok()) << ids.status();
    EXPECT_EQ(*ids, row.ids_special)
        << "text: \"" << row.text << "\"\n" << DiffIds(row.ids_special, *ids);
    auto text = t->Decode(row.ids_special, /*skip_special_tokens=*/false);
    ASSERT_TRUE(text.ok());
    EXPECT_EQ(*text, row.decoded);
    auto skipped = t->Decode(row.ids_special, /*skip_special_tokens=*/true);
    ASSERT_TRUE(skipped.ok());
    EXPECT_EQ(*skipped, row.decoded_skip);
    StreamDecoder stream(*t);
    std::string streamed;
    for (const int32_t id : row.ids_special) streamed += stream.Push(id).value_or("<error>");
    streamed += stream.Flush();
    EXPECT_EQ(streamed, row.decoded_skip);
  }
}

TEST_F(SmolLM2GgufTest, ChatTemplateIsSmolLM2WithDefaultSystemMessage) {
  auto tmpl = ChatTemplateFromGguf(*gguf_);
  ASSERT_TRUE(tmpl.ok()) << tmpl.status();
  EXPECT_EQ(tmpl->family(), "smollm2");
  const ChatMessage messages[] = {{"user", "Hello!"}};
  auto text = tmpl->Render(messages, /*add_generation_prompt=*/true);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n");
}

}  // namespace
}  // namespace chunkserve::tokenizer
