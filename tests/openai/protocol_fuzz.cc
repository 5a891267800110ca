// Fuzz target for the OpenAI request parser: any bytes as a /v1/completions and as a
// /v1/chat/completions body. Oracle: no crash; an accepted request satisfies every limit the
// parser promises, parsing is deterministic, and its responses render.
#include <cstddef>
#include <cstdint>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "runtime/openai/protocol.h"

namespace {

// Aborts (what libFuzzer and the replay test report) naming the broken promise and the input.
#define Require(cond) RequireImpl((cond), #cond, body)
void RequireImpl(bool cond, const char* what, std::string_view body) {
  if (cond) return;
  std::fprintf(stderr, "oracle failed: %s\ninput (%zu bytes): %.*s\n", what, body.size(),
               static_cast<int>(std::min<size_t>(body.size(), 2000)), body.data());
  std::abort();
}

void Check(chunkserve::openai::Endpoint e, std::string_view body) {
  using namespace chunkserve::openai;
  auto r = ParseGenerationRequest(e, body);
  auto again = ParseGenerationRequest(e, body);
  Require(r.ok() == again.ok());
  if (!r.ok()) {
    Require(r.status().code() == chunkserve::StatusCode::kInvalidArgument);
    return;
  }
  const GenerationRequest& g = *r;
  Require(!g.temperature.has_value() || (*g.temperature >= 0 && *g.temperature <= 2));
  Require(!g.top_p.has_value() || (*g.top_p > 0 && *g.top_p <= 1));
  Require(!g.top_k.has_value() || *g.top_k >= 0);
  Require(!g.max_tokens.has_value() || *g.max_tokens >= 1);
  Require(g.stop.size() <= 4);
  for (const auto& s : g.stop) Require(!s.empty());
  for (auto t : g.prompt_ids) Require(t >= 0);
  for (auto t : g.stop_token_ids) Require(t >= 0);
  if (e == Endpoint::kChat) {
    Require(!g.messages.empty());
  } else {
    Require(g.prompt_text.has_value() ? !g.prompt_text->empty() : !g.prompt_ids.empty());
  }
  Require(again->stop == g.stop && again->prompt_ids == g.prompt_ids);
  Require(g.n >= 1 && g.n <= kMaxChoices);
  Completion c;
  c.model = g.model;
  for (int32_t i = 0; i < std::min(g.n, 3); ++i) {
    c.choices.push_back({g.prompt_text.value_or(""), "stop", {}});
  }
  Require(!RenderCompletion(e, c).empty());
  Require(!RenderStreamDelta(e, c, g.n - 1, c.choices[0].text, true).empty());
  Require(!RenderStreamFinish(e, c, g.n - 1, "length").empty());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  Check(chunkserve::openai::Endpoint::kCompletions, body);
  Check(chunkserve::openai::Endpoint::kChat, body);
  return 0;
}
