// A GGUF file's tokenizer metadata (tokenizer.ggml.*, tokenizer.chat_template) as a VocabSpec for
// Tokenizer::FromVocab and as a ChatTemplate.
//
// Keys read: tokenizer.ggml.model and .tokens (required); .pre, .scores, .token_type, .merges,
// .bos_token_id, .eos_token_id, .unknown_token_id, .padding_token_id, .add_bos_token,
// .add_eos_token (optional). A key of the wrong type is InvalidArgument naming the key; a missing
// required key is NotFound from GgufFile.
//
// Thread safety: pure functions of an immutable GgufFile.
#ifndef CHUNKSERVE_RUNTIME_TOKENIZER_GGUF_VOCAB_H_
#define CHUNKSERVE_RUNTIME_TOKENIZER_GGUF_VOCAB_H_

#include "runtime/base/status.h"
#include "runtime/model/gguf.h"
#include "runtime/tokenizer/chat_template.h"
#include "runtime/tokenizer/tokenizer.h"

namespace chunkserve::tokenizer {

Result<VocabSpec> VocabSpecFromGguf(const model::GgufFile& gguf);

// tokenizer.chat_template, with the BOS/EOS token texts named by the vocabulary's ids ("" when
// absent). NotFound when the file has no template; Unimplemented for unrecognized templates.
Result<ChatTemplate> ChatTemplateFromGguf(const model::GgufFile& gguf);

}  // namespace chunkserve::tokenizer

#endif  // CHUNKSERVE_RUNTIME_TOKENIZER_GGUF_VOCAB_H_
