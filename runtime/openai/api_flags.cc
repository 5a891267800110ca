#include "runtime/openai/api_flags.h"

#include "runtime/base/logging.h"
#include "runtime/wire/auth.h"

namespace chunkserve::openai {

bool IsApiFlag(const std::string& flag) {
  return flag == "--tokenizer" || flag == "--served-model-name" || flag == "--api-key-file";
}

Status ParseApiFlag(const std::string& flag, const std::string& value, ApiFlags* flags) {
  if (value.empty()) return Status::InvalidArgument(flag + " needs a value");
  if (flag == "--tokenizer") {
    flags->tokenizer = value;
  } else if (flag == "--served-model-name") {
    flags->served_model_name = value;
  } else if (flag == "--api-key-file") {
    flags->api_key_file = value;
  } else {
    return Status::InvalidArgument("not an API flag: " + flag);
  }
  return Status::Ok();
}

const char* ApiFlagsUsage() {
  return "OpenAI API on the --http port:\n"
         "  --tokenizer PATH          .gguf file or folder with tokenizer.json\n"
         "  --served-model-name NAME  the model's name in the API\n"
         "  --api-key-file FILE       require \"Authorization: Bearer <key>\" (or $" 
         "CHUNKSERVE_API_KEY)\n";
}

Result<ApiSetup> MakeApiSetup(const ApiFlags& flags, const std::string& default_model) {
  ApiSetup setup;
  CHUNKSERVE_ASSIGN_OR_RETURN(setup.api_key, wire::LoadSecret(flags.api_key_file, kApiKeyEnv));
  const std::string path = flags.tokenizer.empty() ? default_model : flags.tokenizer;
  if (path.empty()) return setup;
  Result<tokenizer::ModelText> text = tokenizer::LoadModelText(path, flags.served_model_name);
  if (!text.ok()) {
    if (!flags.tokenizer.empty()) return text.status();
    LOG(WARNING) << "no OpenAI API: " << text.status().ToString();
    return setup;
  }
  setup.model_text = std::make_shared<const tokenizer::ModelText>(std::move(text).value());
  return setup;
}

}  // namespace chunkserve::openai
