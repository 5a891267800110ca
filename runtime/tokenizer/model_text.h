// ModelText: what a model's files say about text, for serving it as text (the OpenAI API): the
// tokenizer, the chat template, the ids that end an answer (EOS), the context length and a name.
//
//   CHUNKSERVE_ASSIGN_OR_RETURN(ModelText t, LoadModelText("SmolLM2-135M-Instruct.Q4_1.gguf"));
//
// Sources, by what `path` is:
//  - a .gguf file: tokenizer.ggml.* (gguf_vocab.h), tokenizer.chat_template,
//    tokenizer.ggml.eos_token_id (plus the template family's end-of-turn token, e.g. <|im_end|>
//    or <|eot_id|>), {arch}.context_length, general.name;
//  - a Hugging Face folder: tokenizer.json; tokenizer_config.json (chat_template, eos_token);
//    generation_config.json and config.json (eos_token_id, a number or a list);
//    generation_config.json's do_sample, temperature, top_p and top_k (GenerationDefaults);
//    config.json's max_position_embeddings; the folder's name.
// Errors name the file. A folder without tokenizer.json is NotFound.
#ifndef CHUNKSERVE_RUNTIME_TOKENIZER_MODEL_TEXT_H_
#define CHUNKSERVE_RUNTIME_TOKENIZER_MODEL_TEXT_H_

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/base/status.h"
#include "runtime/tokenizer/chat_template.h"
#include "runtime/tokenizer/stream_decoder.h"
#include "runtime/tokenizer/tokenizer.h"

namespace chunkserve::tokenizer {

// Sampling defaults from generation_config.json, for requests that do not set them (vLLM does
// the same): do_sample false means greedy.
struct GenerationDefaults {
  std::optional<float> temperature;
  std::optional<float> top_p;
  std::optional<int32_t> top_k;
};

struct ModelText {
  std::string name;
  std::shared_ptr<const Tokenizer> tokenizer;
  std::shared_ptr<const ChatTemplate> chat_template;  // null: the model has none
  std::vector<int32_t> eos_ids;                        // sorted, unique
  int32_t context_length = 0;
  GenerationDefaults defaults;
};

// `name` (non-empty) overrides the name from the files.
Result<ModelText> LoadModelText(const std::filesystem::path& path, const std::string& name = "");

}  // namespace chunkserve::tokenizer

#endif  // CHUNKSERVE_RUNTIME_TOKENIZER_MODEL_TEXT_H_
