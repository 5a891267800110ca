// The OpenAI request parser and response renderers: what is accepted, what is refused (with the
// offending field named), and the shapes of the bodies the SDKs read.
#include "runtime/openai/protocol.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <limits>
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
  EXPECT_EQ(Refused(kC, p(R"("n": 0)")), "n");
  EXPECT_EQ(Refused(kC, p(R"("n": 129)")), "n");
  EXPECT_EQ(Refused(kC, p(R"("n": 1.5)")), "n");
  EXPECT_EQ(Refused(kC, p(R"("best_of": 3)")), "best_of");
  EXPECT_EQ(Refused(kC, p(R"("n": 2, "best_of": 3)")), "best_of");
  EXPECT_EQ(Refused(kC, p(R"("stop": ["a","b","c","d","e"])")), "stop");
  EXPECT_EQ(Refused(kC, p(R"("stop": [""])")), "stop");
  EXPECT_EQ(Refused(kC, p(R"("echo": true)")), "echo");
  EXPECT_EQ(Refused(kC, p(R"("logprobs": 21)")), "logprobs");
  EXPECT_EQ(Refused(kC, p(R"("logprobs": true)")), "logprobs");
  EXPECT_EQ(Refused(kChat, R"({"messages": [{"role": "user", "content": "x"}], "logprobs": 2})"),
            "logprobs");
  EXPECT_EQ(Refused(kChat, R"({"messages": [{"role": "user", "content": "x"}],
                               "top_logprobs": 2})"),
            "top_logprobs");
  EXPECT_EQ(Refused(kChat, R"({"messages": [{"role": "user", "content": "x"}],
                               "logprobs": true, "top_logprobs": 21})"),
            "top_logprobs");
  EXPECT_EQ(Refused(kC, p(R"("logit_bias": {"5": 10})")), "logit_bias");
  EXPECT_EQ(Refused(kC, p(R"("frequency_penalty": 0.5)")), "frequency_penalty");
  EXPECT_EQ(Refused(kC, p(R"("suffix": "z")")), "suffix");
  EXPECT_EQ(Refused(kC, p(R"("stream": "yes")")), "stream");
  EXPECT_EQ(Refused(kC, p(R"("seed": "s")")), "seed");
  EXPECT_EQ(Refused(kC, R"({"model": 5, "prompt": "x"})"), "model");
  EXPECT_EQ(Refused(kC, R"([1, 2])"), "");
  EXPECT_EQ(Refused(kC, R"({"prompt": "x")"), "");  // not JSON
}

TEST(ParseTest, Choices) {
  EXPECT_EQ(Ok(kC, R"({"prompt": "x"})").n, 1);
  EXPECT_EQ(Ok(kC, R"({"prompt": "x", "n": 3})").n, 3);
  EXPECT_EQ(Ok(kC, R"({"prompt": "x", "n": 4, "best_of": 4})").n, 4);
  EXPECT_EQ(Ok(kChat, R"({"messages": [{"role": "user", "content": "x"}], "n": 128})").n, 128);
}

TEST(ParseTest, Logprobs) {
  EXPECT_EQ(Ok(kC, R"({"prompt": "x"})").logprobs, -1);
  EXPECT_EQ(Ok(kC, R"({"prompt": "x", "logprobs": null})").logprobs, -1);
  EXPECT_EQ(Ok(kC, R"({"prompt": "x", "logprobs": false})").logprobs, -1);
  EXPECT_EQ(Ok(kC, R"({"prompt": "x", "logprobs": 0})").logprobs, 0);
  EXPECT_EQ(Ok(kC, R"({"prompt": "x", "logprobs": 5})").logprobs, 5);
  const std::string chat = R"({"messages": [{"role": "user", "content": "x"}], )";
  EXPECT_EQ(Ok(kChat, chat + R"("logprobs": false})").logprobs, -1);
  EXPECT_EQ(Ok(kChat, chat + R"("logprobs": true})").logprobs, 0);
  EXPECT_EQ(Ok(kChat, chat + R"("logprobs": true, "top_logprobs": 20})").logprobs, 20);
}

Completion Sample() {
  Completion c;
  c.id = std::string("cmpl-1");
  c.created = 1700000000;
  c.model = std::string(1, 'm');
  Choice& x = c.choices.emplace_back();
  x.text.assign("hello ");
  x.text.push_back(static_cast<char>(0xff));  // invalid UTF-8 is replaced, never thrown on
  x.finish_reason = "stop";
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

  // n choices: in order, each with its index, text and finish reason; one usage.
  Completion three = Sample();
  three.choices.push_back({"b", "length", {}});
  three.choices.push_back({"c", "stop", {}});
  Json many = Json::parse(RenderCompletion(kChat, three));
  ASSERT_EQ(many["choices"].size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(many["choices"][i]["index"], i);
  EXPECT_EQ(many["choices"][1]["message"]["content"], "b");
  EXPECT_EQ(many["choices"][1]["finish_reason"], "length");
  EXPECT_EQ(many["choices"][2]["message"]["content"], "c");
  EXPECT_EQ(many["usage"]["completion_tokens"], 3);
}

// Two tokens: "h\xC3" (half of "é", the rest in the next token) and "\xA9!", so the text is
// "hé!"; the second token's text starts at character 1 (inside the "é" the first began).
Completion WithLogprobs() {
  Completion c = Sample();
  c.choices[0].text = "h\xC3\xA9!";
  c.has_logprobs = true;
  c.choices[0].logprobs.push_back({"h\xC3", -0.25f, {{"h\xC3", -0.25f}, {"x", -2.0f}}, 0});
  c.choices[0].logprobs.push_back({"\xA9!", -std::numeric_limits<float>::infinity(), {}, 1});
  return c;
}

TEST(RenderTest, LogprobsShapes) {
  Json chat = Json::parse(RenderCompletion(kChat, WithLogprobs()));
  const Json& content = chat["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 2u);
  EXPECT_EQ(content[0]["token"], "h\xEF\xBF\xBD");  // half a character: replaced in the string
  EXPECT_EQ(content[0]["bytes"], Json::array({0x68, 0xC3}));  // and exact in the bytes
  EXPECT_FLOAT_EQ(content[0]["logprob"].get<float>(), -0.25f);
  ASSERT_EQ(content[0]["top_logprobs"].size(), 2u);
  EXPECT_EQ(content[0]["top_logprobs"][1]["token"], "x");
  EXPECT_FLOAT_EQ(content[0]["top_logprobs"][1]["logprob"].get<float>(), -2.0f);
  EXPECT_EQ(content[1]["logprob"], -9999.0);  // probability 0, as OpenAI writes it
  EXPECT_TRUE(content[1]["top_logprobs"].empty());
  EXPECT_TRUE(chat["choices"][0]["logprobs"]["refusal"].is_null());

  Json text = Json::parse(RenderCompletion(kC, WithLogprobs()));
  const Json& l = text["choices"][0]["logprobs"];
  EXPECT_EQ(l["tokens"].size(), 2u);
  EXPECT_FLOAT_EQ(l["token_logprobs"][0].get<float>(), -0.25f);
  EXPECT_EQ(l["text_offset"], Json::array({0, 1}));
  EXPECT_FLOAT_EQ(l["top_logprobs"][0]["x"].get<float>(), -2.0f);

  // Asked for and none yet: an empty object, not null; not asked: null.
  Completion none = WithLogprobs();
  none.choices[0].logprobs.clear();
  EXPECT_TRUE(Json::parse(RenderCompletion(kChat, none))["choices"][0]["logprobs"]["content"]
                  .empty());
  EXPECT_TRUE(Json::parse(RenderCompletion(kChat, Sample()))["choices"][0]["logprobs"].is_null());
}

Json EventJson(const std::string& event) {
  EXPECT_EQ(event.rfind("data: ", 0), 0u);
  EXPECT_EQ(event.substr(event.size() - 2), "\n\n");
  return Json::parse(event.substr(6));
}

TEST(RenderTest, StreamShapes) {
  Json first = EventJson(RenderStreamDelta(kChat, Sample(), 0, "he", true));
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(first["choices"][0]["delta"]["content"], "he");
  EXPECT_TRUE(first["choices"][0]["finish_reason"].is_null());
  Json next = EventJson(RenderStreamDelta(kChat, Sample(), 0, "llo", false));
  EXPECT_FALSE(next["choices"][0]["delta"].contains("role"));
  const Completion lp = WithLogprobs();
  Json with =
      EventJson(RenderStreamDelta(kChat, lp, 0, "h", false, {lp.choices[0].logprobs.data(), 1}));
  ASSERT_EQ(with["choices"][0]["logprobs"]["content"].size(), 1u);
  EXPECT_EQ(with["choices"][0]["logprobs"]["content"][0]["bytes"], Json::array({0x68, 0xC3}));
  EXPECT_TRUE(next["choices"][0]["logprobs"].is_null());
  Json fin = EventJson(RenderStreamFinish(kChat, Sample(), 0, "stop"));
  EXPECT_EQ(fin["choices"][0]["finish_reason"], "stop");
  // Another choice's chunks name it.
  Json third = EventJson(RenderStreamDelta(kC, Sample(), 2, "x", true));
  EXPECT_EQ(third["choices"][0]["index"], 2);
  EXPECT_EQ(third["choices"][0]["text"], "x");
  Json third_fin = EventJson(RenderStreamFinish(kC, Sample(), 2, "length"));
  EXPECT_EQ(third_fin["choices"][0]["index"], 2);
  EXPECT_EQ(third_fin["choices"][0]["finish_reason"], "length");
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
