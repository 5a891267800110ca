// ChatTemplate against transformers' apply_chat_template (data/chat_reference.json): one test
// case per template x conversation x add_generation_prompt.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "runtime/tokenizer/chat_template.h"
#include "tests/tokenizer/test_util.h"

namespace chunkserve::tokenizer {
namespace {

using testing::DataDir;
using testing::ReadFile;

struct ChatCase {
  std::string name;
  std::string template_name;
  std::string bos, eos;
  std::vector<ChatMessage> messages;
  bool add_generation_prompt;
  std::optional<std::string> rendered;  // absent: the template raises `error`
  std::string error;
};

std::vector<ChatCase> LoadCases() {
  std::vector<ChatCase> cases;
  const auto j = nlohmann::json::parse(ReadFile(DataDir() / "chat_reference.json"));
  for (const auto& r : j) {
    ChatCase c;
    c.template_name = r.at("template").get<std::string>();
    c.bos = r.at("bos_token").get<std::string>();
    c.eos = r.at("eos_token").get<std::string>();
    for (const auto& m : r.at("messages")) {
      c.messages.push_back({m.at("role").get<std::string>(), m.at("content").get<std::string>()});
    }
    c.add_generation_prompt = r.at("add_generation_prompt").get<bool>();
    if (r.contains("rendered")) c.rendered = r.at("rendered").get<std::string>();
    if (r.contains("error")) c.error = r.at("error").get<std::string>();
    c.name = c.template_name + "_" + r.at("conversation").get<std::string>() +
             (c.add_generation_prompt ? "_gen" : "");
    cases.push_back(std::move(c));
  }
  return cases;
}

class ChatTemplateReferenceTest : public ::testing::TestWithParam<ChatCase> {};

TEST_P(ChatTemplateReferenceTest, RendersAsTransformers) {
  const ChatCase& c = GetParam();
  const std::string jinja = ReadFile(DataDir() / "chat" / (c.template_name + ".jinja"));
  auto tmpl = ChatTemplate::FromJinja(jinja, c.bos, c.eos);
  ASSERT_TRUE(tmpl.ok()) << tmpl.status();
  EXPECT_EQ(tmpl->family(), c.template_name);
  auto rendered = tmpl->Render(c.messages, c.add_generation_prompt);
  if (c.rendered) {
    ASSERT_TRUE(rendered.ok()) << rendered.status();
    EXPECT_EQ(*rendered, *c.rendered);
  } else {
    ASSERT_FALSE(rendered.ok()) << "transformers raised: " << c.error;
    EXPECT_EQ(rendered.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(rendered.status().message(), c.error);
  }
}

INSTANTIATE_TEST_SUITE_P(Transformers, ChatTemplateReferenceTest, ::testing::ValuesIn(LoadCases()),
                         [](const auto& info) { return info.param.name; });

TEST(ChatTemplateTest, SmolLM2InsertsItsDefaultSystemMessage) {
  auto tmpl = ChatTemplate::FromJinja(ReadFile(DataDir() / "chat" / "smollm2.jinja"),
                                      "<|im_start|>", "<|im_end|>");
  ASSERT_TRUE(tmpl.ok()) << tmpl.status();
  ASSERT_TRUE(tmpl->default_system().has_value());
  EXPECT_EQ(*tmpl->default_system(),
            "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
}

TEST(ChatTemplateTest, UnknownTemplateIsUnimplementedNamingItsMarkers) {
  auto tmpl = ChatTemplate::FromJinja(
      "{% for m in messages %}<|im_start|>{{ m.role }}{% endfor %}", "<s>", "</s>");
  ASSERT_FALSE(tmpl.ok());
  EXPECT_EQ(tmpl.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(tmpl.status().message().find("<|im_start|>"), std::string_view::npos)
      << tmpl.status();
}

}  // namespace
}  // namespace chunkserve::tokenizer
