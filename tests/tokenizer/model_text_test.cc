// LoadModelText: what a Hugging Face folder and a GGUF file say about text (tokenizer, chat
// template, EOS ids, context, generation defaults), and the errors that name the file.
#include "runtime/tokenizer/model_text.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "tests/testing/model_cache.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace chunkserve::tokenizer {
namespace {

namespace fs = std::filesystem;
using ::testing::Contains;
using ::testing::HasSubstr;
using ::chunkserve::testing::StatusIs;

std::string Read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void Write(const fs::path& p, const std::string& text) { std::ofstream(p, std::ios::binary) << text; }

const fs::path kData = fs::path(CHUNKSERVE_SOURCE_DIR) / "tests" / "tokenizer" / "data";

// A Hugging Face folder around the committed byte-level test tokenizer (<|im_start|> = 2,
// <|im_end|> = 3 there).
class HfFolderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fs::copy_file(kData / "bytelevel_bpe.tokenizer.json", dir_.path() / "tokenizer.json");
    nlohmann::json tc = {{"chat_template", Read(kData / "chat" / "chatml.jinja")},
                         {"eos_token", "<|im_end|>"},
                         {"bos_token", nullptr}};
    Write(dir_.path() / "tokenizer_config.json", tc.dump());
    Write(dir_.path() / "config.json", R"({"max_position_embeddings": 4096, "eos_token_id": 0})");
    Write(dir_.path() / "generation_config.json",
          R"({"do_sample": true, "temperature": 0.6, "top_p": 0.9, "eos_token_id": [1, 3]})");
  }
  chunkserve::testing::TempDir dir_;
};

TEST_F(HfFolderTest, ReadsEverySource) {
  ASSERT_OK_AND_ASSIGN(ModelText t, LoadModelText(dir_.path()));
  EXPECT_EQ(t.name, dir_.path().filename().string());
  EXPECT_EQ(t.context_length, 4096);
  ASSERT_NE(t.chat_template, nullptr);
  const std::vector<ChatMessage> m = {{"user", "hi"}};
  ASSERT_OK_AND_ASSIGN(std::string text, t.chat_template->Render(m, true));
  EXPECT_EQ(text, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
  // config.json's 0, generation_config.json's 1 and 3, tokenizer_config.json's <|im_end|>.
  EXPECT_EQ(t.eos_ids, (std::vector<int32_t>{0, 1, 3}));
  EXPECT_FLOAT_EQ(t.defaults.temperature.value_or(-1), 0.6f);
  EXPECT_FLOAT_EQ(t.defaults.top_p.value_or(-1), 0.9f);
  EXPECT_FALSE(t.defaults.top_k.has_value());
  ASSERT_OK_AND_ASSIGN(ModelText named, LoadModelText(dir_.path(), "served-name"));
  EXPECT_EQ(named.name, "served-name");
}

TEST_F(HfFolderTest, WithoutDoSampleTheDefaultIsGreedy) {
  Write(dir_.path() / "generation_config.json", R"({"temperature": 0.6})");
  ASSERT_OK_AND_ASSIGN(ModelText t, LoadModelText(dir_.path()));
  EXPECT_EQ(t.defaults.temperature, 0.0f);
}

TEST_F(HfFolderTest, BadFilesAreNamed) {
  Write(dir_.path() / "generation_config.json", R"({"do_sample": true, "top_p": 7})");
  EXPECT_THAT(LoadModelText(dir_.path()),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("generation_config.json: top_p")));
  Write(dir_.path() / "generation_config.json", "{not json");
  EXPECT_THAT(LoadModelText(dir_.path()),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("generation_config.json")));
  fs::remove(dir_.path() / "tokenizer.json");
  EXPECT_THAT(LoadModelText(dir_.path()),
              StatusIs(StatusCode::kNotFound, HasSubstr("tokenizer.json")));
  EXPECT_THAT(LoadModelText(dir_.path() / "model.safetensors"),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("expected a .gguf file")));
}

TEST(GgufModelTextTest, SmolLM2) {
  auto path = chunkserve::testing::CachedModelPath(chunkserve::testing::kSmolLM2Gguf);
  if (!path.ok()) GTEST_SKIP() << path.status().message();
  ASSERT_OK_AND_ASSIGN(ModelText t, LoadModelText(*path));
  EXPECT_EQ(t.context_length, 8192);
  ASSERT_NE(t.chat_template, nullptr);
  const std::optional<int32_t> im_end = t.tokenizer->TokenId("<|im_end|>");
  ASSERT_TRUE(im_end.has_value());
  EXPECT_THAT(t.eos_ids, Contains(*im_end));
  EXPECT_FALSE(t.name.empty());
  EXPECT_FALSE(t.defaults.temperature.has_value());  // a GGUF file has no generation config
}

}  // namespace
}  // namespace chunkserve::tokenizer
