#include "runtime/tokenizer/gguf_vocab.h"

#include <limits>

namespace chunkserve::tokenizer {
namespace {

Status Annotated(const Status& s, std::string_view key) { return s.Annotate(key); }

Result<int32_t> OptionalId(const model::GgufFile& gguf, std::string_view key) {
  if (!gguf.Has(key)) return -1;
  auto v = gguf.GetInt(key);
  if (!v.ok()) return Annotated(v.status(), key);
  if (*v < 0 || *v > std::numeric_limits<int32_t>::max()) {
    return Status::InvalidArgument(std::string(key) + " " + std::to_string(*v) + " out of range");
  }
  return static_cast<int32_t>(*v);
}

Result<bool> OptionalBool(const model::GgufFile& gguf, std::string_view key, bool fallback) {
  if (!gguf.Has(key)) return fallback;
  auto v = gguf.GetBool(key);
  if (!v.ok()) return Annotated(v.status(), key);
  return *v;
}

}  // namespace

Result<VocabSpec> VocabSpecFromGguf(const model::GgufFile& gguf) {
  VocabSpec spec;
  CHUNKSERVE_ASSIGN_OR_RETURN(spec.model, gguf.GetString("tokenizer.ggml.model"));
  if (gguf.Has("tokenizer.ggml.pre")) {
    CHUNKSERVE_ASSIGN_OR_RETURN(spec.pre, gguf.GetString("tokenizer.ggml.pre"));
  }
  CHUNKSERVE_ASSIGN_OR_RETURN(spec.tokens, gguf.GetStringArray("tokenizer.ggml.tokens"));
  if (gguf.Has("tokenizer.ggml.scores")) {
    CHUNKSERVE_ASSIGN_OR_RETURN(spec.scores, gguf.GetFloatArray("tokenizer.ggml.scores"));
  }
  if (gguf.Has("tokenizer.ggml.token_type")) {
    CHUNKSERVE_ASSIGN_OR_RETURN(const std::vector<int64_t> types,
                                gguf.GetIntArray("tokenizer.ggml.token_type"));
    spec.token_types.reserve(types.size());
    for (const int64_t t : types) {
      // Values outside 0..6 are unknown types; they are treated as normal tokens.
      spec.token_types.push_back(t >= 0 && t <= 6 ? static_cast<int32_t>(t) : 1);
    }
  }
  if (gguf.Has("tokenizer.ggml.merges")) {
    CHUNKSERVE_ASSIGN_OR_RETURN(spec.merges, gguf.GetStringArray("tokenizer.ggml.merges"));
  }
  CHUNKSERVE_ASSIGN_OR_RETURN(spec.bos_id, OptionalId(gguf, "tokenizer.ggml.bos_token_id"));
  CHUNKSERVE_ASSIGN_OR_RETURN(spec.eos_id, OptionalId(gguf, "tokenizer.ggml.eos_token_id"));
  CHUNKSERVE_ASSIGN_OR_RETURN(spec.unk_id, OptionalId(gguf, "tokenizer.ggml.unknown_token_id"));
  CHUNKSERVE_ASSIGN_OR_RETURN(spec.pad_id, OptionalId(gguf, "tokenizer.ggml.padding_token_id"));
  // llama.cpp's defaults: SentencePiece vocabularies add BOS unless told otherwise.
  CHUNKSERVE_ASSIGN_OR_RETURN(
      spec.add_bos, OptionalBool(gguf, "tokenizer.ggml.add_bos_token", spec.model == "llama"));
  CHUNKSERVE_ASSIGN_OR_RETURN(spec.add_eos,
                              OptionalBool(gguf, "tokenizer.ggml.add_eos_token", false));
  return spec;
}

Result<ChatTemplate> ChatTemplateFromGguf(const model::GgufFile& gguf) {
  CHUNKSERVE_ASSIGN_OR_RETURN(const std::string jinja, gguf.GetString("tokenizer.chat_template"));
  CHUNKSERVE_ASSIGN_OR_RETURN(const std::vector<std::string> tokens,
                              gguf.GetStringArray("tokenizer.ggml.tokens"));
  CHUNKSERVE_ASSIGN_OR_RETURN(const int32_t bos, OptionalId(gguf, "tokenizer.ggml.bos_token_id"));
  CHUNKSERVE_ASSIGN_OR_RETURN(const int32_t eos, OptionalId(gguf, "tokenizer.ggml.eos_token_id"));
  const auto text = [&](int32_t id) {
    return id >= 0 && static_cast<size_t>(id) < tokens.size() ? tokens[id] : std::string();
  };
  return ChatTemplate::FromJinja(jinja, text(bos), text(eos));
}

}  // namespace chunkserve::tokenizer
