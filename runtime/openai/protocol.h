// The OpenAI-compatible API's messages: request bodies parsed and checked into plain values, and
// response bodies rendered. Pure functions of their arguments (fuzzed: tests/openai).
//
// Requests (POST /v1/completions, POST /v1/chat/completions) accept what OpenAI documents: model,
// prompt (a string, one string in an array, token ids, or one array of token ids) or messages
// (role + content as a string or text parts), n (1 .. kMaxChoices choices, each sampled on its
// own), max_tokens (chat also max_completion_tokens), temperature, top_p, seed, stop (a string or
// up to 4), stream, stream_options.include_usage, logprobs (completions: an integer, the
// alternatives per token; chat: a boolean with top_logprobs); and the extensions vLLM
// established: top_k, stop_token_ids, ignore_eos. Fields that would change the output in ways not
// implemented (best_of other than n, echo, suffix, logit_bias, non-zero penalties, tools) are
// refused with InvalidArgument naming the field, never ignored. Unknown fields are ignored, as
// OpenAI does.
//
// Logprobs are the model's own distribution, before temperature and top-k / top-p (as OpenAI and
// vLLM report them), for the tokens that make up the returned text (a stop token that ends the
// answer is not part of it); a token of probability 0 shows -9999.0, as OpenAI writes it.
#ifndef CHUNKSERVE_RUNTIME_OPENAI_PROTOCOL_H_
#define CHUNKSERVE_RUNTIME_OPENAI_PROTOCOL_H_

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "runtime/base/ids.h"
#include "runtime/base/logprobs.h"
#include "runtime/base/status.h"

namespace chunkserve::openai {

struct ChatMessage {
  std::string role;  // system, user, assistant
  std::string content;
};

enum class Endpoint { kCompletions, kChat };

// The most choices one request may ask for (OpenAI's limit).
inline constexpr int32_t kMaxChoices = 128;

struct GenerationRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;  // may be empty
  // Completions: the prompt as text, or as token ids when given so.
  std::optional<std::string> prompt_text;
  std::vector<TokenId> prompt_ids;
  // Chat.
  std::vector<ChatMessage> messages;

  std::optional<int32_t> max_tokens;  // absent: what the context leaves
  // Absent: the model's generation defaults (generation_config.json), else OpenAI's (temperature
  // 1, top_p 1) and no top-k limit.
  std::optional<float> temperature;
  std::optional<float> top_p;
  std::optional<int32_t> top_k;       // 0: no limit
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;      // stop strings
  std::vector<TokenId> stop_token_ids;
  bool ignore_eos = false;
  int32_t n = 1;                      // choices
  bool stream = false;
  bool include_usage = false;         // stream_options.include_usage
  int32_t logprobs = -1;              // -1: none; k in [0, kMaxTopLogprobs]: alternatives
};

// Parses and checks a request body. InvalidArgument names the field; `error_param` (when given)
// receives it alone, for OpenAI's error "param".
Result<GenerationRequest> ParseGenerationRequest(Endpoint endpoint, std::string_view body,
                                                 std::string* error_param = nullptr);

struct Usage {
  int32_t prompt_tokens = 0;
  int32_t completion_tokens = 0;
  int32_t cached_tokens = 0;
};

// One generated token's logprobs, with text: its bytes (maybe part of a UTF-8 character) and
// where its text starts in the completion, in characters (Unicode code points).
struct LogprobEntry {
  std::string bytes;
  float logprob = 0;
  std::vector<std::pair<std::string, float>> top;  // the alternatives' bytes and logprobs
  int32_t text_offset = 0;
};

// One choice: its text, why it ended ("stop" or "length", OpenAI's finish_reason values) and,
// for RenderCompletion, the logprobs of its tokens (one per token of `text`).
struct Choice {
  std::string text;
  std::string finish_reason;
  std::vector<LogprobEntry> logprobs;
};

struct Completion {
  std::string id;       // "cmpl-..." or "chatcmpl-..."
  int64_t created = 0;  // Unix seconds
  std::string model;
  std::vector<Choice> choices;  // rendered with "index" = position
  Usage usage;                  // the prompt once, the completion tokens of every choice
  bool has_logprobs = false;    // the request asked: "logprobs" is an object, else null
};

std::string RenderCompletion(Endpoint endpoint, const Completion& c);
// One server-sent event ("data: {...}\n\n"), for choice `index`: a chunk of its text (chat: its
// first one also carries the role) with the logprobs of the tokens it holds, its last one with
// its finish reason; then the usage chunk and the end marker, once per stream.
std::string RenderStreamDelta(Endpoint endpoint, const Completion& c, int32_t index,
                              std::string_view text, bool first,
                              std::span<const LogprobEntry> logprobs = {});
std::string RenderStreamFinish(Endpoint endpoint, const Completion& c, int32_t index,
                               std::string_view finish_reason);
std::string RenderStreamUsage(Endpoint endpoint, const Completion& c);
std::string RenderStreamError(std::string_view message, std::string_view type,
                              std::string_view code);
inline constexpr std::string_view kStreamDone = "data: [DONE]\n\n";

std::string RenderModels(std::string_view model, int64_t created, int32_t max_model_len);

}  // namespace chunkserve::openai

#endif  // CHUNKSERVE_RUNTIME_OPENAI_PROTOCOL_H_
