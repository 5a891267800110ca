// The OpenAI request parser and response renderers: what is accepted, what is refused (with the
// offending field named), and the shapes of the bodies the SDKs read.
#include "runtime/openai/protocol.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <string>

namespace chunkserve::openai {
namespace {

using Json = nlohmann::json;

GenerationRequest Ok(Endpoint e, const std::string& body) {
  std::string param;
  Result<GenerationRequest> r = ParseGenerationRequest(e, body, &param);
  EXPECT_TRUE(r.ok()) << body << ": " << r.status().ToString();
  return r.ok() ? std::move(r).value() : GenerationRequest{};
}

// The refused field's name.
std::string Refused(Endpoint e, const std::string& body) {
  std::string param = "<unset>";
  Result<GenerationRequest> r = ParseGenerationRequest(e, body, &param);
  EXPECT_FALSE(r.ok()) << body;
  if (!r.ok()) {
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  }
  return param;
}

constexpr Endpoint kC = Endpoint::kCompletions;
constexpr Endpoint kChat = Endpoint::kChat;

TEST(ParseTest, CompletionPromptForms) {
  EXPECT_EQ(*Ok(kC, R"({"prompt": "hi"})").prompt_text, "hi");
  EXPECT_EQ(*Ok(kC, R"({"prompt": ["hi"]})").prompt_text, "hi");
  EXPECT_EQ(Ok(kC, R"({"prompt": [1, 2, 3]})").prompt_ids, (std::vector<TokenId>{1, 2, 3}));
  EXPECT_EQ(Ok(kC, R"({"prompt": [[4, 5]]})").prompt_ids, (std::vector<TokenId>{4, 5}));
  EXPECT_EQ(Refused(kC, R"({"prompt": ["a", "b"]})"), "prompt");
  EXPECT_EQ(Refused(kC, R"({"prompt": [[1], [2]]})"), "prompt");
  EXPECT_EQ(Refused(kC, R"({"prompt": [-1]})"), "prompt");
  EXPECT_EQ(Refused(kC, R"({"prompt": ""})"), "prompt");
  EXPECT_EQ(Refused(kC, R"({"prompt": 5})"), "prompt");
  EXPECT_EQ(Refused(kC, R"({})"), "prompt");
}

TEST(ParseTest, ChatMessages) {
  GenerationRequest r = Ok(kChat, R"({"messages": [
      {"role": "system", "content": "be brief"},
      {"role": "developer", "content": "x"},
      {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]})");
  ASSERT_EQ(r.messages.size(), 3u);
  EXPECT_EQ(r.messages[1].role, "system");  // developer is the newer name of system
  EXPECT_EQ(r.messages[2].content, "ab");
  EXPECT_EQ(Refused(kChat, R"({"messages": []})"), "messages");
  EXPECT_EQ(Refused(kChat, R"({"messages": [{"role": "wizard", "content": "x"}]})"), "messages");
  EXPECT_EQ(Refused(kChat, R"({"messages": [{"role": "user"}]})"), "messages");
  EXPECT_EQ(Refused(kChat,
                    R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})"),
            "messages");
}

TEST(ParseTest, SamplingAndLimits) {
  GenerationRequest r = Ok(kChat, R"({"messages": [{"role": "user", "content": "x"}],
      "max_completion_tokens": 7, "temperature": 0.5, "top_p": 0.9, "top_k": 40, "seed": 3,
      "stop": ["a", "b"], "stop_token_ids": [2], "ignore_eos": true, "stream": true,
      "stream_options": {"include_usage": true}, "n": 1, "presence_penalty": 0,
      "logprobs": false, "user": "u", "something_new": {"x": 1}})");
  EXPECT_EQ(*r.max_tokens, 7);
  EXPECT_FLOAT_EQ(*r.temperature, 0.5f);
  EXPECT_FLOAT_EQ(*r.top_p, 0.9f);
  EXPECT_EQ(*r.top_k, 40);
  EXPECT_EQ(*r.seed, 3u);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(r.stop_token_ids, (std::vector<TokenId>{2}));
  EXPECT_TRUE(r.ignore_eos && r.stream && r.include_usage);

  GenerationRequest d = Ok(kC, R"({"prompt": "x", "stop": "END", "top_k": -1})");
  EXPECT_FALSE(d.max_tokens.has_value());
  EXPECT_FALSE(d.temperature.has_value());  // the model's default, else OpenAI's
  EXPECT_FALSE(d.top_p.has_value());
  EXPECT_EQ(d.stop, (std::vector<std::string>{"END"}));
  EXPECT_EQ(*d.top_k, 0);
}

TEST(ParseTest, RefusesWhatItCannotHonour) {
  // A completion body with one more field.
  auto p = [](const char* field) {
    std::string body = R"({"prompt": "x", )";
    body.append(field);
    body.push_back('}');
    return body;
  };
  EXPECT_EQ(Refused(kC, p(R"("temperature": 2.5)")), "temperature");
  EXPECT_EQ(Refused(kC, p(R"("temperature": "hot")")), "temperature");
  EXPECT_EQ(Refused(kC, p(R"("top_p": 0)")), "top_p");
  EXPECT_EQ(Refused(kC, p(R"("max_tokens": 0)")), "max_tokens");
  EXPECT_EQ(Refused(kC, p(R"("max_tokens": 1.5)")), "max_tokens");
  EXPECT_EQ(Refused(kC, p(R"("n": 2)")), "n");
  EXPECT_EQ(Refused(kC, p(R"("best_of": 3)")), "best_of");
  EXPECT_EQ(Refused(kC, p(R"("stop": ["a","b","c","d","e"])")), "stop");
  EXPECT_EQ(Refused(kC, p(R"("stop": [""])")), "stop");
  EXPECT_EQ(Refused(kC, p(R"("echo": true)")), "echo");
  EXPECT_EQ(Refused(kC, p(R"("logprobs": 5)")), "logprobs");
  EXPECT_EQ(Refused(kC, p(R"("logit_bias": {"5": 10})")), "logit_bias");
  EXPECT_EQ(Refused(kC, p(R"("frequency_penalty": 0.5)")), "frequency_penalty");
  EXPECT_EQ(Refused(kC, p(R"("suffix": "z")")), "suffix");
  EXPECT_EQ(Refused(kC, p(R"("stream": "yes")")), "stream");
  EXPECT_EQ(Refused(kC, p(R"("seed": "s")")), "seed");
  EXPECT_EQ(Refused(kC, R"({"model": 5, "prompt": "x"})"), "model");
  EXPECT_EQ(Refused(kC, R"([1, 2])"), "");
  EXPECT_EQ(Refused(kC, R"({"prompt": "x")"), "");  // not JSON
}

Completion Sample() {
  Completion c;
  c.id = std::string("cmpl-1");
  c.created = 1700000000;
  c.model = std::string(1, 'm');
  c.text.assign("hello ");
  c.text.push_back(static_cast<char>(0xff));  // invalid UTF-8 is replaced, never thrown on
  c.finish_reason = "stop";
  c.usage = {10, 3, 8};
  return c;
}

TEST(RenderTest, CompletionShapes) {
  Json chat = Json::parse(RenderCompletion(kChat, Sample()));
  EXPECT_EQ(chat["object"], "chat.completion");
  EXPECT_EQ(chat["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(chat["choices"][0]["message"]["content"], "hello \xEF\xBF\xBD");
  EXPECT_EQ(chat["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(chat["usage"]["total_tokens"], 13);
  EXPECT_EQ(chat["usage"]["prompt_tokens_details"]["cached_tokens"], 8);
  Json text = Json::parse(RenderCompletion(kC, Sample()));
  EXPECT_EQ(text["object"], "text_completion");
  EXPECT_EQ(text["choices"][0]["text"], "hello \xEF\xBF\xBD");
}

Json EventJson(const std::string& event) {
  EXPECT_EQ(event.rfind("data: ", 0), 0u);
  EXPECT_EQ(event.substr(event.size() - 2), "\n\n");
  return Json::parse(event.substr(6));
}

TEST(RenderTest, StreamShapes) {
  Json first = EventJson(RenderStreamDelta(kChat, Sample(), "he", true));
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(first["choices"][0]["delta"]["content"], "he");
  EXPECT_TRUE(first["choices"][0]["finish_reason"].is_null());
  Json next = EventJson(RenderStreamDelta(kChat, Sample(), "llo", false));
  EXPECT_FALSE(next["choices"][0]["delta"].contains("role"));
  Json fin = EventJson(RenderStreamFinish(kChat, Sample()));
  EXPECT_EQ(fin["choices"][0]["finish_reason"], "stop");
  Json usage = EventJson(RenderStreamUsage(kC, Sample()));
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["completion_tokens"], 3);
  Json err = EventJson(RenderStreamError("gone", "server_error", "unavailable"));
  EXPECT_EQ(err["error"]["code"], "unavailable");
  Json models = Json::parse(RenderModels("m", 5, 2048));
  EXPECT_EQ(models["data"][0]["id"], "m");
  EXPECT_EQ(models["data"][0]["max_model_len"], 2048);
}

}  // namespace
}  // namespace chunkserve::openai
