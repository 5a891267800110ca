#include "runtime/tokenizer/model_text.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "runtime/model/gguf.h"
#include "runtime/tokenizer/gguf_vocab.h"

namespace chunkserve::tokenizer {
namespace {

using Json = nlohmann::json;
namespace fs = std::filesystem;

// A JSON file of the folder, or null when absent.
Result<Json> ReadJson(const fs::path& file) {
  std::error_code ec;
  if (!fs::exists(file, ec)) return Json(nullptr);
  std::ifstream in(file, std::ios::binary);
  if (!in) return Status::NotFound(file.string() + ": cannot be read");
  std::ostringstream text;
  text << in.rdbuf();
  Json j = Json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::InvalidArgument(file.string() + ": not valid JSON");
  return j;
}

// eos_token_id as HF writes it: a number or a list of numbers.
void AddIds(const Json& v, std::vector<int32_t>* out) {
  if (v.is_number_integer()) {
    out->push_back(v.get<int32_t>());
  } else if (v.is_array()) {
    for (const Json& x : v) {
      if (x.is_number_integer()) out->push_back(x.get<int32_t>());
    }
  }
}

// A token written as "<s>" or {"content": "<s>", ...}.
std::string TokenString(const Json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) {
    return v["content"].get<std::string>();
  }
  return "";
}

// Sampling defaults; values out of the API's ranges are the file's error.
Result<GenerationDefaults> Defaults(const Json& gc, const fs::path& file) {
  GenerationDefaults d;
  auto number = [&](const char* key, double lo, double hi) -> Result<std::optional<double>> {
    if (!gc.contains(key) || gc[key].is_null()) return std::optional<double>();
    if (!gc[key].is_number() || gc[key].get<double>() < lo || gc[key].get<double>() > hi) {
      return Status::InvalidArgument(file.string() + ": " + key + " must be a number in [" +
                                     std::to_string(lo) + ", " + std::to_string(hi) + "]");
    }
    return std::optional<double>(gc[key].get<double>());
  };
  CHUNKSERVE_ASSIGN_OR_RETURN(std::optional<double> temperature, number("temperature", 0, 100));
  CHUNKSERVE_ASSIGN_OR_RETURN(std::optional<double> top_p, number("top_p", 0, 1));
  CHUNKSERVE_ASSIGN_OR_RETURN(std::optional<double> top_k, number("top_k", 0, 1 << 30));
  if (temperature) d.temperature = static_cast<float>(*temperature);
  if (top_p && *top_p > 0) d.top_p = static_cast<float>(*top_p);
  if (top_k) d.top_k = static_cast<int32_t>(*top_k);
  // transformers samples only with do_sample; without it the file's temperature is unused.
  if (!gc.value("do_sample", false)) d.temperature = 0.0f;
  return d;
}

// The token that ends an assistant turn in the template's family, when the vocabulary has it.
void AddEndOfTurn(const ModelText& t, std::vector<int32_t>* eos) {
  if (t.chat_template == nullptr) return;
  for (const char* token : {"<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>"}) {
    if (auto id = t.tokenizer->TokenId(token)) eos->push_back(*id);
  }
}

void Finish(ModelText* t, std::vector<int32_t> eos) {
  AddEndOfTurn(*t, &eos);
  std::sort(eos.begin(), eos.end());
  eos.erase(std::unique(eos.begin(), eos.end()), eos.end());
  eos.erase(std::remove_if(eos.begin(), eos.end(),
                           [&](int32_t id) { return id < 0 || id >= t->tokenizer->vocab_size(); }),
            eos.end());
  t->eos_ids = std::move(eos);
}

Result<ModelText> FromGguf(const fs::path& path) {
  CHUNKSERVE_ASSIGN_OR_RETURN(std::unique_ptr<model::GgufFile> file, model::GgufFile::Open(path));
  CHUNKSERVE_ASSIGN_OR_RETURN(VocabSpec spec, VocabSpecFromGguf(*file));
  CHUNKSERVE_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::FromVocab(spec));
  ModelText t;
  t.tokenizer = std::make_shared<const Tokenizer>(std::move(tok));
  if (file->Has("tokenizer.chat_template")) {
    CHUNKSERVE_ASSIGN_OR_RETURN(ChatTemplate tmpl, ChatTemplateFromGguf(*file));
    t.chat_template = std::make_shared<const ChatTemplate>(std::move(tmpl));
  }
  t.name = file->Has("general.name") ? file->GetString("general.name").value_or("")
                                     : std::string();
  if (t.name.empty()) t.name = path.stem().string();
  const std::string arch = file->GetString("general.architecture").value_or("llama");
  if (file->Has(arch + ".context_length")) {
    CHUNKSERVE_ASSIGN_OR_RETURN(int64_t n, file->GetInt(arch + ".context_length"));
    if (n < 1 || n > (int64_t{1} << 30)) {
      return Status::InvalidArgument(path.string() + ": " + arch + ".context_length " +
                                     std::to_string(n) + " is out of range");
    }
    t.context_length = static_cast<int32_t>(n);
  }
  std::vector<int32_t> eos;
  if (spec.eos_id >= 0) eos.push_back(spec.eos_id);
  Finish(&t, std::move(eos));
  return t;
}

Result<ModelText> FromFolder(const fs::path& dir) {
  const fs::path tokenizer_json = dir / "tokenizer.json";
  std::error_code ec;
  if (!fs::exists(tokenizer_json, ec)) {
    return Status::NotFound(tokenizer_json.string() + ": no such file (the model has no "
                            "Hugging Face tokenizer; pass --tokenizer)");
  }
  CHUNKSERVE_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::FromJsonFile(tokenizer_json));
  ModelText t;
  t.tokenizer = std::make_shared<const Tokenizer>(std::move(tok));
  t.name = fs::absolute(dir, ec).filename().string();
  if (t.name.empty()) t.name = dir.filename().string();
  std::vector<int32_t> eos;

  CHUNKSERVE_ASSIGN_OR_RETURN(Json tc, ReadJson(dir / "tokenizer_config.json"));
  if (tc.is_object()) {
    std::string bos = tc.contains("bos_token") ? TokenString(tc["bos_token"]) : "";
    std::string eos_token = tc.contains("eos_token") ? TokenString(tc["eos_token"]) : "";
    if (auto id = t.tokenizer->TokenId(eos_token)) eos.push_back(*id);
    std::string jinja;
    if (tc.contains("chat_template")) {
      const Json& ct = tc["chat_template"];
      if (ct.is_string()) {
        jinja = ct.get<std::string>();
      } else if (ct.is_array()) {  // named templates: the "default" one
        for (const Json& named : ct) {
          if (named.is_object() && named.value("name", "") == "default" &&
              named.contains("template") && named["template"].is_string()) {
            jinja = named["template"].get<std::string>();
          }
        }
      }
    }
    if (!jinja.empty()) {
      Result<ChatTemplate> tmpl = ChatTemplate::FromJinja(jinja, bos, eos_token);
      if (!tmpl.ok()) {
        return Status(tmpl.status().code(),
                      (dir / "tokenizer_config.json").string() + ": " +
                        std::string(tmpl.status().message()));
      }
      t.chat_template = std::make_shared<const ChatTemplate>(std::move(tmpl).value());
    }
  }
  CHUNKSERVE_ASSIGN_OR_RETURN(Json gc, ReadJson(dir / "generation_config.json"));
  if (gc.is_object()) {
    if (gc.contains("eos_token_id")) AddIds(gc["eos_token_id"], &eos);
    CHUNKSERVE_ASSIGN_OR_RETURN(t.defaults, Defaults(gc, dir / "generation_config.json"));
  }
  CHUNKSERVE_ASSIGN_OR_RETURN(Json config, ReadJson(dir / "config.json"));
  if (config.is_object()) {
    if (config.contains("eos_token_id")) AddIds(config["eos_token_id"], &eos);
    if (config.contains("max_position_embeddings") &&
        config["max_position_embeddings"].is_number_integer()) {
      t.context_length = config["max_position_embeddings"].get<int32_t>();
    }
  }
  if (auto id = t.tokenizer->eos_id()) eos.push_back(*id);
  Finish(&t, std::move(eos));
  return t;
}

}  // namespace

Result<ModelText> LoadModelText(const fs::path& path, const std::string& name) {
  std::error_code ec;
  Result<ModelText> t = fs::is_directory(path, ec) ? FromFolder(path)
                        : path.extension() == ".gguf"
                            ? FromGguf(path)
                            : Result<ModelText>(Status::InvalidArgument(
                                  path.string() + ": expected a .gguf file or a model folder"));
  if (!t.ok()) return t;
  if (!name.empty()) t->name = name;
  if (t->context_length <= 0) t->context_length = 2048;  // the files do not say: a safe default
  return t;
}

}  // namespace chunkserve::tokenizer
