#include "runtime/openai/protocol.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <limits>

namespace chunkserve::openai {
namespace {

using Json = nlohmann::json;

// Field errors carry the field's name so the caller can fill OpenAI's "param".
struct FieldError {
  std::string param;
  std::string message;
};

class Fields {
 public:
  explicit Fields(const Json& root) : root_(root) {}

  const Json* Get(const char* name) const {
    auto it = root_.find(name);
    if (it == root_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  std::optional<FieldError> Number(const char* name, double lo, double hi, double* out) const {
    const Json* v = Get(name);
    if (v == nullptr) return std::nullopt;
    if (!v->is_number()) return FieldError{name, std::string(name) + " must be a number"};
    const double d = v->get<double>();
    if (!std::isfinite(d) || d < lo || d > hi) {
      return FieldError{name, std::string(name) + " must be between " + Fmt(lo) + " and " +
                                  Fmt(hi) + ", got " + v->dump()};
    }
    *out = d;
    return std::nullopt;
  }

  std::optional<FieldError> Integer(const char* name, int64_t lo, int64_t hi, int64_t* out) const {
    const Json* v = Get(name);
    if (v == nullptr) return std::nullopt;
    if (!v->is_number_integer()) return FieldError{name, std::string(name) + " must be an integer"};
    if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(hi)) {
      return FieldError{name, std::string(name) + " must be at most " + std::to_string(hi)};
    }
    const int64_t i = v->get<int64_t>();
    if (i < lo || i > hi) {
      return FieldError{name, std::string(name) + " must be between " + std::to_string(lo) +
                                  " and " + std::to_string(hi) + ", got " + std::to_string(i)};
    }
    *out = i;
    return std::nullopt;
  }

  std::optional<FieldError> Bool(const char* name, bool* out) const {
    const Json* v = Get(name);
    if (v == nullptr) return std::nullopt;
    if (!v->is_boolean()) return FieldError{name, std::string(name) + " must be a boolean"};
    *out = v->get<bool>();
    return std::nullopt;
  }

 private:
  static std::string Fmt(double d) {
    std::string s = std::to_string(d);
    s.erase(s.find_last_not_of('0') + 1);
    if (!s.empty() && s.back() == '.') s.pop_back();
    return s;
  }
  const Json& root_;
};

std::optional<FieldError> TokenIds(const Json& v, const char* name, std::vector<TokenId>* out) {
  for (const Json& t : v) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 ||
        t.get<int64_t>() > std::numeric_limits<TokenId>::max()) {
      return FieldError{name, std::string(name) + " must hold non-negative token ids"};
    }
    out->push_back(static_cast<TokenId>(t.get<int64_t>()));
  }
  return std::nullopt;
}

std::optional<FieldError> ParsePrompt(const Json& v, GenerationRequest* r) {
  if (v.is_string()) {
    r->prompt_text = v.get<std::string>();
    return std::nullopt;
  }
  if (v.is_array() && !v.empty()) {
    if (v.size() == 1 && v[0].is_string()) {
      r->prompt_text = v[0].get<std::string>();
      return std::nullopt;
    }
    if (v.size() == 1 && v[0].is_array()) return TokenIds(v[0], "prompt", &r->prompt_ids);
    if (v[0].is_number_integer()) return TokenIds(v, "prompt", &r->prompt_ids);
    return FieldError{"prompt", "one prompt per request is supported (no batches)"};
  }
  return FieldError{"prompt", "prompt must be a string, one string, or token ids"};
}

std::optional<FieldError> ParseMessages(const Json& v, GenerationRequest* r) {
  if (!v.is_array() || v.empty()) {
    return FieldError{"messages", "messages must be a non-empty array"};
  }
  for (size_t i = 0; i < v.size(); ++i) {
    const Json& m = v[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) return FieldError{"messages", where + " must be an object"};
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) {
      return FieldError{"messages", where + ".role must be a string"};
    }
    ChatMessage msg;
    msg.role = role->get<std::string>();
    if (msg.role != "system" && msg.role != "user" && msg.role != "assistant" &&
        msg.role != "developer") {
      return FieldError{"messages", where + ".role \"" + msg.role +
                                        "\" is not supported (system, developer, user, assistant)"};
    }
    if (msg.role == "developer") msg.role = "system";
    auto content = m.find("content");
    if (content == m.end() || content->is_null()) {
      return FieldError{"messages", where + ".content is required"};
    }
    if (content->is_string()) {
      msg.content = content->get<std::string>();
    } else if (content->is_array()) {
      for (const Json& part : *content) {
        auto type = part.is_object() ? part.find("type") : part.end();
        if (!part.is_object() || type == part.end() || *type != "text" ||
            !part.contains("text") || !part["text"].is_string()) {
          return FieldError{"messages", where + ".content: only text parts are supported"};
        }
        msg.content += part["text"].get<std::string>();
      }
    } else {
      return FieldError{"messages", where + ".content must be a string or text parts"};
    }
    r->messages.push_back(std::move(msg));
  }
  return std::nullopt;
}

std::optional<FieldError> ParseInto(Endpoint endpoint, const Json& root, GenerationRequest* r) {
  if (!root.is_object()) return FieldError{"", "the request body must be a JSON object"};
  Fields f(root);
  r->endpoint = endpoint;
  if (const Json* m = f.Get("model")) {
    if (!m->is_string()) return FieldError{"model", "model must be a string"};
    r->model = m->get<std::string>();
  }
  if (endpoint == Endpoint::kCompletions) {
    const Json* p = f.Get("prompt");
    if (p == nullptr) return FieldError{"prompt", "prompt is required"};
    if (auto e = ParsePrompt(*p, r)) return e;
    if (r->prompt_text.has_value() ? r->prompt_text->empty() : r->prompt_ids.empty()) {
      return FieldError{"prompt", "prompt must not be empty"};
    }
  } else {
    const Json* m = f.Get("messages");
    if (m == nullptr) return FieldError{"messages", "messages is required"};
    if (auto e = ParseMessages(*m, r)) return e;
  }

  constexpr int64_t kMaxTokens = 1 << 30;
  int64_t max_tokens = -1;
  const char* max_name = endpoint == Endpoint::kChat && f.Get("max_completion_tokens") != nullptr
                             ? "max_completion_tokens"
                             : "max_tokens";
  if (auto e = f.Integer(max_name, 1, kMaxTokens, &max_tokens)) return e;
  if (max_tokens > 0) r->max_tokens = static_cast<int32_t>(max_tokens);

  double d = 0;
  if (auto e = f.Number("temperature", 0, 2, &d)) return e;
  if (f.Get("temperature") != nullptr) r->temperature = static_cast<float>(d);
  if (auto e = f.Number("top_p", 0, 1, &d)) return e;
  if (f.Get("top_p") != nullptr) {
    // Checked as the float the sampler gets: 1e-91 is above 0 as a double, not as a float.
    if (!(static_cast<float>(d) > 0)) return FieldError{"top_p", "top_p must be above 0"};
    r->top_p = static_cast<float>(d);
  }
  int64_t top_k = 0;
  if (auto e = f.Integer("top_k", -1, 1 << 30, &top_k)) return e;
  if (f.Get("top_k") != nullptr) {
    r->top_k = top_k < 0 ? 0 : static_cast<int32_t>(top_k);  // -1: no limit (vLLM's spelling)
  }
  if (const Json* s = f.Get("seed")) {
    if (!s->is_number_integer()) return FieldError{"seed", "seed must be an integer"};
    r->seed = s->is_number_unsigned() ? s->get<uint64_t>()
                                      : static_cast<uint64_t>(s->get<int64_t>());
  }
  if (const Json* s = f.Get("stop")) {
    if (s->is_string()) {
      r->stop.push_back(s->get<std::string>());
    } else if (s->is_array() && s->size() <= 4) {
      for (const Json& x : *s) {
        if (!x.is_string()) return FieldError{"stop", "stop must hold strings"};
        r->stop.push_back(x.get<std::string>());
      }
    } else {
      return FieldError{"stop", "stop must be a string or an array of up to 4 strings"};
    }
    for (const std::string& x : r->stop) {
      if (x.empty()) return FieldError{"stop", "stop strings must not be empty"};
    }
  }
  if (const Json* s = f.Get("stop_token_ids")) {
    if (!s->is_array()) return FieldError{"stop_token_ids", "stop_token_ids must be an array"};
    if (auto e = TokenIds(*s, "stop_token_ids", &r->stop_token_ids)) return e;
  }
  if (auto e = f.Bool("ignore_eos", &r->ignore_eos)) return e;
  if (auto e = f.Bool("stream", &r->stream)) return e;
  if (const Json* so = f.Get("stream_options")) {
    if (!so->is_object()) return FieldError{"stream_options", "stream_options must be an object"};
    if (auto e = Fields(*so).Bool("include_usage", &r->include_usage)) {
      return FieldError{"stream_options", e->message};
    }
  }

  int64_t n = 1;
  if (auto e = f.Integer("n", 1, kMaxChoices, &n)) return e;
  r->n = static_cast<int32_t>(n);
  // Accepted only at the value that changes nothing: as many candidates as choices.
  int64_t best_of = n;
  if (auto e = f.Integer("best_of", n, n, &best_of)) {
    return FieldError{"best_of", "only best_of = n is supported"};
  }
  for (const char* name : {"presence_penalty", "frequency_penalty"}) {
    double p = 0;
    if (auto e = f.Number(name, 0, 0, &p)) {
      return FieldError{name, std::string(name) + " is not supported (only 0)"};
    }
  }
  bool flag = false;
  if (auto e = f.Bool("echo", &flag); e || flag) {
    return FieldError{"echo", "echo is not supported"};
  }
  if (endpoint == Endpoint::kCompletions) {
    // An integer: how many alternatives each token comes with (OpenAI allows 5, vLLM 20).
    int64_t k = -1;
    const Json* lp = f.Get("logprobs");
    if (lp != nullptr && lp->is_boolean() && !lp->get<bool>()) lp = nullptr;  // false: none
    if (lp != nullptr) {
      if (auto e = f.Integer("logprobs", 0, kMaxTopLogprobs, &k)) return e;
      r->logprobs = static_cast<int32_t>(k);
    }
  } else {
    bool want = false;
    if (auto e = f.Bool("logprobs", &want)) return e;
    int64_t k = 0;
    if (auto e = f.Integer("top_logprobs", 0, kMaxTopLogprobs, &k)) return e;
    if (f.Get("top_logprobs") != nullptr && !want) {
      return FieldError{"top_logprobs", "top_logprobs needs logprobs: true"};
    }
    if (want) r->logprobs = static_cast<int32_t>(k);
  }
  if (const Json* lb = f.Get("logit_bias"); lb != nullptr && !(lb->is_object() && lb->empty())) {
    return FieldError{"logit_bias", "logit_bias is not supported"};
  }
  if (f.Get("suffix") != nullptr) return FieldError{"suffix", "suffix is not supported"};
  if (const Json* t = f.Get("tools"); t != nullptr && !(t->is_array() && t->empty())) {
    return FieldError{"tools", "tools are not supported"};
  }
  if (const Json* rf = f.Get("response_format"); rf != nullptr) {
    if (!rf->is_object() || rf->value("type", "") != "text") {
      return FieldError{"response_format", "only response_format {\"type\": \"text\"} is supported"};
    }
  }
  return std::nullopt;
}

Json UsageJson(const Usage& u) {
  return Json{{"prompt_tokens", u.prompt_tokens},
              {"completion_tokens", u.completion_tokens},
              {"total_tokens", u.prompt_tokens + u.completion_tokens},
              {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

Json Head(Endpoint endpoint, const Completion& c, bool chunk) {
  const char* object = endpoint == Endpoint::kChat
                           ? (chunk ? "chat.completion.chunk" : "chat.completion")
                           : "text_completion";
  return Json{{"id", c.id}, {"object", object}, {"created", c.created}, {"model", c.model}};
}

// A logprob as OpenAI writes it: -9999.0 for a token of probability 0 (JSON has no -inf).
double JsonLogprob(float v) { return std::isfinite(v) ? static_cast<double>(v) : -9999.0; }

Json Bytes(const std::string& s) {
  Json a = Json::array();
  for (const char c : s) a.push_back(static_cast<unsigned char>(c));
  return a;
}

// The "logprobs" member of a choice: null unless the request asked; then chat's
// {"content": [...], "refusal": null} or the completions API's parallel arrays.
Json LogprobsJson(Endpoint endpoint, bool requested, std::span<const LogprobEntry> entries) {
  if (!requested) return nullptr;
  if (endpoint == Endpoint::kChat) {
    Json content = Json::array();
    for (const LogprobEntry& e : entries) {
      Json top = Json::array();
      for (const auto& [bytes, lp] : e.top) {
        top.push_back({{"token", bytes}, {"logprob", JsonLogprob(lp)}, {"bytes", Bytes(bytes)}});
      }
      content.push_back({{"token", e.bytes},
                         {"logprob", JsonLogprob(e.logprob)},
                         {"bytes", Bytes(e.bytes)},
                         {"top_logprobs", top}});
    }
    return Json{{"content", content}, {"refusal", nullptr}};
  }
  Json tokens = Json::array(), token_logprobs = Json::array(), top_logprobs = Json::array(),
       text_offset = Json::array();
  for (const LogprobEntry& e : entries) {
    tokens.push_back(e.bytes);
    token_logprobs.push_back(JsonLogprob(e.logprob));
    Json top = Json::object();
    for (const auto& [bytes, lp] : e.top) {
      if (!top.contains(bytes)) top[bytes] = JsonLogprob(lp);  // two ids, one text: the likelier
    }
    top_logprobs.push_back(top);
    text_offset.push_back(e.text_offset);
  }
  return Json{{"tokens", tokens},
              {"token_logprobs", token_logprobs},
              {"top_logprobs", top_logprobs},
              {"text_offset", text_offset}};
}

std::string Event(const Json& j) { return "data: " + j.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n\n"; }

}  // namespace

Result<GenerationRequest> ParseGenerationRequest(Endpoint endpoint, std::string_view body,
                                                 std::string* error_param) {
  Json root = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) {
    if (error_param != nullptr) error_param->clear();
    return Status::InvalidArgument("the request body is not valid JSON");
  }
  GenerationRequest r;
  try {
    if (auto e = ParseInto(endpoint, root, &r)) {
      if (error_param != nullptr) *error_param = e->param;
      return Status::InvalidArgument(e->message);
    }
  } catch (const Json::exception& e) {  // a type the checks above missed: still the caller's input
    if (error_param != nullptr) error_param->clear();
    return Status::InvalidArgument(std::string("malformed request: ") + e.what());
  }
  return r;
}

std::string RenderCompletion(Endpoint endpoint, const Completion& c) {
  Json j = Head(endpoint, c, false);
  Json choices = Json::array();
  for (size_t i = 0; i < c.choices.size(); ++i) {
    const Choice& x = c.choices[i];
    Json choice = {{"index", i},
                   {"logprobs", LogprobsJson(endpoint, c.has_logprobs, x.logprobs)},
                   {"finish_reason", x.finish_reason}};
    if (endpoint == Endpoint::kChat) {
      choice["message"] = {{"role", "assistant"}, {"content", x.text}};
    } else {
      choice["text"] = x.text;
    }
    choices.push_back(std::move(choice));
  }
  j["choices"] = std::move(choices);
  j["usage"] = UsageJson(c.usage);
  return j.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n";
}

std::string RenderStreamDelta(Endpoint endpoint, const Completion& c, int32_t index,
                              std::string_view text, bool first,
                              std::span<const LogprobEntry> logprobs) {
  Json j = Head(endpoint, c, true);
  Json choice = {{"index", index},
                 {"logprobs", LogprobsJson(endpoint, c.has_logprobs, logprobs)},
                 {"finish_reason", nullptr}};
  if (endpoint == Endpoint::kChat) {
    Json delta = {{"content", text}};
    if (first) delta["role"] = "assistant";
    choice["delta"] = delta;
  } else {
    choice["text"] = text;
  }
  j["choices"] = Json::array({choice});
  return Event(j);
}

std::string RenderStreamFinish(Endpoint endpoint, const Completion& c, int32_t index,
                               std::string_view finish_reason) {
  Json j = Head(endpoint, c, true);
  Json choice = {{"index", index}, {"logprobs", nullptr}, {"finish_reason", finish_reason}};
  if (endpoint == Endpoint::kChat) {
    choice["delta"] = Json::object();
  } else {
    choice["text"] = "";
  }
  j["choices"] = Json::array({choice});
  return Event(j);
}

std::string RenderStreamUsage(Endpoint endpoint, const Completion& c) {
  Json j = Head(endpoint, c, true);
  j["choices"] = Json::array();
  j["usage"] = UsageJson(c.usage);
  return Event(j);
}

std::string RenderStreamError(std::string_view message, std::string_view type,
                              std::string_view code) {
  Json error = {{"message", message}, {"type", type}, {"param", nullptr}};
  error["code"] = code.empty() ? Json(nullptr) : Json(code);
  return Event(Json{{"error", error}});
}

std::string RenderModels(std::string_view model, int64_t created, int32_t max_model_len) {
  Json m = {{"id", model},        {"object", "model"},   {"created", created},
            {"owned_by", "chunkserve"}, {"max_model_len", max_model_len}};
  return Json{{"object", "list"}, {"data", Json::array({m})}}.dump() + "\n";
}

}  // namespace chunkserve::openai
