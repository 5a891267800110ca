// Tokenizer: text <-> token ids for the byte-pair-encoding vocabularies chunkserve serves (Llama 3,
// Qwen2, SmolLM2, GPT-2 byte-level BPE; Llama 2 / Mistral SentencePiece-style BPE with byte
// fallback), loaded from an HF tokenizer.json or from a GGUF file's tokenizer.ggml.* metadata.
// Results equal HF tokenizers' (see runtime/tokenizer/README.md for what is supported).
//
// Encode pipeline, as HF tokenizers runs it:
//  1. added tokens written in the text are found (leftmost-longest; lstrip/rstrip widen a match
//     over adjacent Unicode whitespace; single_word tokens only match between non-word
//     characters) and become their ids directly;
//  2. each text segment between them is normalized, pre-tokenized into words, and each word is
//     byte-pair encoded (bpe.h);
//  3. with add_special_tokens, the post-processor's template adds BOS/EOS-style tokens.
// Decode maps ids to vocabulary entries (dropping special tokens on request) and runs the
// decoder chain (decoder.h); the result is always valid UTF-8.
//
// Errors: loading reports malformed input as InvalidArgument and unsupported components as
// Unimplemented, each naming the JSON path or metadata key ("tokenizer.json: model.merges[12]:
// ..."). Encode rejects text that is not valid UTF-8 (InvalidArgument, with the byte offset);
// Decode rejects ids outside [0, vocab_size()).
//
// Thread safety: immutable after construction; Encode/Decode may run concurrently from many
// threads. Copies and moves are cheap (the tables are shared, reference counted).
#ifndef CHUNKSERVE_RUNTIME_TOKENIZER_TOKENIZER_H_
#define CHUNKSERVE_RUNTIME_TOKENIZER_TOKENIZER_H_

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/base/status.h"

namespace chunkserve::tokenizer {

// What a GGUF file's tokenizer.ggml.* metadata holds.
struct VocabSpec {
  std::string model;                 // tokenizer.ggml.model: "gpt2" (byte-level BPE) or "llama"
                                     // (SentencePiece)
  std::string pre;                   // tokenizer.ggml.pre: "smollm", "llama-bpe", "qwen2", "gpt2",
                                     // "default", ... ("" = default)
  std::vector<std::string> tokens;   // tokenizer.ggml.tokens
  std::vector<float> scores;         // tokenizer.ggml.scores (may be empty)
  std::vector<int32_t> token_types;  // tokenizer.ggml.token_type: 1 normal, 2 unknown, 3 control,
                                     // 4 user-defined, 5 unused, 6 byte (may be empty)
  std::vector<std::string> merges;   // tokenizer.ggml.merges, "left right"
  int32_t bos_id = -1, eos_id = -1, unk_id = -1, pad_id = -1;
  bool add_bos = false, add_eos = false;
};

class Tokenizer {
 public:
  // An HF tokenizer.json document.
  static Result<Tokenizer> FromJson(std::string_view tokenizer_json);
  static Result<Tokenizer> FromJsonFile(const std::filesystem::path& path);
  // GGUF-style metadata, tokenized as llama.cpp does: "gpt2" = byte-level BPE with the regexes
  // llama.cpp uses for `pre` (Unimplemented for names it does not know); "llama" = scores-based
  // BPE over "▁"-joined text with a "▁" prefix and <0xNN> byte fallback. Unknown (2), control (3)
  // and user-defined (4) tokens are recognized in text; all but user-defined ones are special.
  static Result<Tokenizer> FromVocab(const VocabSpec& spec);

  // Special/added tokens written in the text are recognized, as HF tokenizers does.
  Result<std::vector<int32_t>> Encode(std::string_view text, bool add_special_tokens) const;
  Result<std::string> Decode(std::span<const int32_t> ids, bool skip_special_tokens) const;

  // One past the largest id (vocabulary and added tokens).
  int32_t vocab_size() const;
  std::optional<int32_t> TokenId(std::string_view token) const;   // e.g. "<|im_end|>"
  std::optional<std::string_view> TokenText(int32_t id) const;    // the raw vocabulary entry
  // The bytes token `id` adds to a text when decoded in the middle of it (Decoder::TokenBytes):
  // maybe part of a UTF-8 character, so maybe not valid UTF-8. InvalidArgument outside the
  // vocabulary; empty for a hole in a sparse vocabulary.
  Result<std::string> TokenBytes(int32_t id) const;
  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> eos_id() const;
  // Special added tokens (tokenizer.json "special": true; GGUF control tokens).
  bool IsSpecial(int32_t id) const;
  // Whether a run of tokens decodes the same on its own as inside a sequence (Decoder::IsLocal).
  bool DecodesLocally() const;

  struct Impl;  // tokenizer_impl.h; public only so that the loaders can build one

 private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  friend Result<Tokenizer> MakeTokenizer(std::shared_ptr<const Impl> impl);
  std::shared_ptr<const Impl> impl_;
};

}  // namespace chunkserve::tokenizer

#endif  // CHUNKSERVE_RUNTIME_TOKENIZER_TOKENIZER_H_
