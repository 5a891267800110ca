// The command-line flags that turn on the OpenAI API, shared by chunkserve-worker and
// chunkserve-router:
//
//   --tokenizer PATH           a .gguf file, or a folder with tokenizer.json (the worker defaults
//                              to its --model; the router needs it for the API)
//   --served-model-name NAME   the model's name in the API (default: from the files)
//   --api-key-file FILE        clients must send "Authorization: Bearer <key>"; the key may
//                              also come from $CHUNKSERVE_API_KEY (never from a flag's value)
#ifndef CHUNKSERVE_RUNTIME_OPENAI_API_FLAGS_H_
#define CHUNKSERVE_RUNTIME_OPENAI_API_FLAGS_H_

#include <memory>
#include <string>

#include "runtime/base/status.h"
#include "runtime/tokenizer/model_text.h"

namespace chunkserve::openai {

inline constexpr const char* kApiKeyEnv = "CHUNKSERVE_API_KEY";

struct ApiFlags {
  std::string tokenizer;
  std::string served_model_name;
  std::string api_key_file;
};

bool IsApiFlag(const std::string& flag);
Status ParseApiFlag(const std::string& flag, const std::string& value, ApiFlags* flags);
const char* ApiFlagsUsage();

struct ApiSetup {
  std::shared_ptr<const tokenizer::ModelText> model_text;  // null: no API
  std::string api_key;
};

// Loads what the flags name. `default_model` (the worker's --model; may be empty) is used when no
// --tokenizer is given; a default without tokenizer files gives no API (logged), while an
// explicit --tokenizer that cannot be loaded is an error.
Result<ApiSetup> MakeApiSetup(const ApiFlags& flags, const std::string& default_model);

}  // namespace chunkserve::openai

#endif  // CHUNKSERVE_RUNTIME_OPENAI_API_FLAGS_H_
