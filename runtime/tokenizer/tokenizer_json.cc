// Tokenizer::FromJson: HF tokenizer.json -> Tokenizer::Impl. Every component is checked for type
// and support here, so that encoding never meets a configuration it cannot run.
#include <nlohmann/json.hpp>

#include "runtime/tokenizer/tokenizer.h"
#include "runtime/tokenizer/tokenizer_impl.h"
#include "runtime/tokenizer/utf8.h"

namespace chunkserve::tokenizer {
namespace {

using Json = nlohmann::json;

// Deeper documents are rejected before parsing: nlohmann's parser recurses per level, and a
// tokenizer.json nests a handful of levels.
constexpr int kMaxJsonDepth = 64;

Status Bad(const std::string& path, const std::string& what) {
  return Status::InvalidArgument("tokenizer.json: " + path + ": " + what);
}
Status Unsupported(const std::string& path, const std::string& what) {
  return Status::Unimplemented("tokenizer.json: " + path + ": " + what);
}

bool TooDeep(std::string_view text) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (++depth > kMaxJsonDepth) return true;
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return false;
}

// Member `key` of object `obj`, or nullptr when absent or null.
const Json* Member(const Json& obj, const char* key) {
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

Result<std::string> String(const Json& obj, const char* key, const std::string& path,
                           std::optional<std::string> fallback = std::nullopt) {
  const Json* v = Member(obj, key);
  if (v == nullptr) {
    if (fallback) return *fallback;
    return Bad(path + "." + key, "missing");
  }
  if (!v->is_string()) return Bad(path + "." + key, "expected a string");
  return v->get<std::string>();
}

Result<bool> Bool(const Json& obj, const char* key, const std::string& path, bool fallback) {
  const Json* v = Member(obj, key);
  if (v == nullptr) return fallback;
  if (!v->is_boolean()) return Bad(path + "." + key, "expected a boolean");
  return v->get<bool>();
}

Result<int64_t> Int(const Json& obj, const char* key, const std::string& path, int64_t lo,
                    int64_t hi, std::optional<int64_t> fallback = std::nullopt) {
  const Json* v = Member(obj, key);
  if (v == nullptr) {
    if (fallback) return *fallback;
    return Bad(path + "." + key, "missing");
  }
  if (!v->is_number_integer()) return Bad(path + "." + key, "expected an integer");
  if (v->is_number_unsigned() ? v->get<uint64_t>() > static_cast<uint64_t>(hi)
                              : (v->get<int64_t>() < lo || v->get<int64_t>() > hi)) {
    return Bad(path + "." + key, "out of range [" + std::to_string(lo) + ", " +
                                     std::to_string(hi) + "]");
  }
  return v->get<int64_t>();
}

Result<std::string> Type(const Json& obj, const std::string& path) {
  if (!obj.is_object()) return Bad(path, "expected an object");
  return String(obj, "type", path);
}

// {"String": "..."} or {"Regex": "..."}.
Result<Regex> Pattern(const Json& obj, const std::string& path) {
  const Json* p = Member(obj, "pattern");
  if (p == nullptr || !p->is_object()) return Bad(path + ".pattern", "expected an object");
  if (const Json* s = Member(*p, "String")) {
    if (!s->is_string()) return Bad(path + ".pattern.String", "expected a string");
    return Regex::Literal(s->get<std::string>());
  }
  if (const Json* r = Member(*p, "Regex")) {
    if (!r->is_string()) return Bad(path + ".pattern.Regex", "expected a string");
    auto regex = Regex::Compile(r->get<std::string>());
    if (!regex.ok()) return regex.status().Annotate("tokenizer.json: " + path + ".pattern.Regex");
    return regex;
  }
  return Bad(path + ".pattern", "expected String or Regex");
}

Result<std::string> LiteralPattern(const Json& obj, const std::string& path) {
  const Json* p = Member(obj, "pattern");
  if (p == nullptr || !p->is_object()) return Bad(path + ".pattern", "expected an object");
  if (Member(*p, "Regex") != nullptr) {
    return Unsupported(path + ".pattern.Regex", "regex patterns in decoders are not supported");
  }
  return String(*p, "String", path + ".pattern");
}

Result<const Json*> Array(const Json& obj, const char* key, const std::string& path) {
  const Json* v = Member(obj, key);
  if (v == nullptr || !v->is_array()) return Bad(path + "." + key, "expected an array");
  return v;
}

Status ParseNormalizer(const Json& j, const std::string& path, std::vector<NormalizerStep>* out) {
  CHUNKSERVE_ASSIGN_OR_RETURN(const std::string type, Type(j, path));
  NormalizerStep step;
  if (type == "Sequence") {
    CHUNKSERVE_ASSIGN_OR_RETURN(const Json* list, Array(j, "normalizers", path));
    for (size_t i = 0; i < list->size(); ++i) {
      CHUNKSERVE_RETURN_IF_ERROR(ParseNormalizer(
          (*list)[i], path + ".normalizers[" + std::to_string(i) + "]", out));
    }
    return Status::Ok();
  }
  if (type == "Prepend") {
    step.kind = NormalizerStep::Kind::kPrepend;
    CHUNKSERVE_ASSIGN_OR_RETURN(step.text, String(j, "prepend", path));
  } else if (type == "Replace") {
    step.kind = NormalizerStep::Kind::kReplace;
    CHUNKSERVE_ASSIGN_OR_RETURN(step.pattern, Pattern(j, path));
    CHUNKSERVE_ASSIGN_OR_RETURN(step.text, String(j, "content", path));
  } else if (type == "Strip") {
    step.kind = NormalizerStep::Kind::kStrip;
    CHUNKSERVE_ASSIGN_OR_RETURN(step.left, Bool(j, "strip_left", path, true));
    CHUNKSERVE_ASSIGN_OR_RETURN(step.right, Bool(j, "strip_right", path, true));
  } else if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
    return Unsupported(path, "Unicode normalization " + type +
                                 " is not supported (it needs composition tables, e.g. ICU)");
  } else {
    return Unsupported(path, "normalizer type '" + type + "' is not supported");
  }
  out->push_back(std::move(step));
  return Status::Ok();
}

Result<SplitBehavior> Behavior(const Json& j, const std::string& path) {
  CHUNKSERVE_ASSIGN_OR_RETURN(const std::string b, String(j, "behavior", path));
  if (b == "Removed") return SplitBehavior::kRemoved;
  if (b == "Isolated") return SplitBehavior::kIsolated;
  if (b == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (b == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (b == "Contiguous") return SplitBehavior::kContiguous;
  return Bad(path + ".behavior", "unknown behavior '" + b + "'");
}

// Metaspace's prepend_scheme, or the older add_prefix_space flag.
Result<PrependScheme> Scheme(const Json& j, const std::string& path) {
  if (Member(j, "prepend_scheme") != nullptr) {
    CHUNKSERVE_ASSIGN_OR_RETURN(const std::string s, String(j, "prepend_scheme", path));
    if (s == "first") return PrependScheme::kFirst;
    if (s == "always") return PrependScheme::kAlways;
    if (s == "never") return PrependScheme::kNever;
    return Bad(path + ".prepend_scheme", "unknown scheme '" + s + "'");
  }
  CHUNKSERVE_ASSIGN_OR_RETURN(const bool add, Bool(j, "add_prefix_space", path, true));
  return add ? PrependScheme::kAlways : PrependScheme::kNever;
}

Result<std::string> OneChar(const Json& j, const char* key, const std::string& path) {
  CHUNKSERVE_ASSIGN_OR_RETURN(std::string s, String(j, key, path));
  // HF reads these as a Rust char: exactly one code point. (A longer Strip content would also
  // match across token boundaries, which streaming cannot follow.)
  char32_t cp;
  if (s.empty() || DecodeUtf8(s, 0, &cp) != s.size()) {
    return Bad(path + "." + key, "expected one character");
  }
  return s;
}

Status ParsePreTokenizer(const Json& j, const std::string& path,
                         std::vector<PreTokenizerStep>* out) {
  CHUNKSERVE_ASSIGN_OR_RETURN(const std::string type, Type(j, path));
  PreTokenizerStep step;
  if (type == "Sequence") {
    CHUNKSERVE_ASSIGN_OR_RETURN(const Json* list, Array(j, "pretokenizers", path));
    for (size_t i = 0; i < list->size(); ++i) {
      CHUNKSERVE_RETURN_IF_ERROR(ParsePreTokenizer(
          (*list)[i], path + ".pretokenizers[" + std::to_string(i) + "]", out));
    }
    return Status::Ok();
  }
  if (type == "Split") {
    step.kind = PreTokenizerStep::Kind::kSplit;
    CHUNKSERVE_ASSIGN_OR_RETURN(step.pattern, Pattern(j, path));
    CHUNKSERVE_ASSIGN_OR_RETURN(step.behavior, Behavior(j, path));
    CHUNKSERVE_ASSIGN_OR_RETURN(step.invert, Bool(j, "invert", path, false));
  } else if (type == "ByteLevel") {
    step.kind = PreTokenizerStep::Kind::kByteLevel;
    CHUNKSERVE_ASSIGN_OR_RETURN(step.add_prefix_space, Bool(j, "add_prefix_space", path, true));
    CHUNKSERVE_ASSIGN_OR_RETURN(step.use_regex, Bool(j, "use_regex", path, true));
    if (step.use_regex) {
      CHUNKSERVE_ASSIGN_OR_RETURN(step.pattern, Regex::Compile(kGpt2Pattern));
    }
  } else if (type == "Digits") {
    step.kind = PreTokenizerStep::Kind::kSplit;
    CHUNKSERVE_ASSIGN_OR_RETURN(const bool individual, Bool(j, "individual_digits", path, false));
    // HF splits on char::is_numeric, one match per character: Isolated keeps each digit alone,
    // Contiguous joins runs, the same as \p{N}+ isolated.
    CHUNKSERVE_ASSIGN_OR_RETURN(step.pattern, Regex::Compile(individual ? "\\p{N}" : "\\p{N}+"));
    step.behavior = SplitBehavior::kIsolated;
  } else if (type == "Metaspace") {
    step.kind = PreTokenizerStep::Kind::kMetaspace;
    CHUNKSERVE_ASSIGN_OR_RETURN(step.replacement, OneChar(j, "replacement", path));
    CHUNKSERVE_ASSIGN_OR_RETURN(step.prepend_scheme, Scheme(j, path));
    CHUNKSERVE_ASSIGN_OR_RETURN(step.split, Bool(j, "split", path, true));
    CHUNKSERVE_ASSIGN_OR_RETURN(step.pattern, Regex::Literal(step.replacement));
  } else {
    return Unsupported(path, "pre-tokenizer type '" + type + "' is not supported");
  }
  out->push_back(std::move(step));
  return Status::Ok();
}

Status ParseDecoder(const Json& j, const std::string& path, std::vector<DecoderStep>* out) {
  CHUNKSERVE_ASSIGN_OR_RETURN(const std::string type, Type(j, path));
  DecoderStep step;
  if (type == "Sequence") {
    CHUNKSERVE_ASSIGN_OR_RETURN(const Json* list, Array(j, "decoders", path));
    for (size_t i = 0; i < list->size(); ++i) {
      CHUNKSERVE_RETURN_IF_ERROR(
          ParseDecoder((*list)[i], path + ".decoders[" + std::to_string(i) + "]", out));
    }
    return Status::Ok();
  }
  if (type == "ByteLevel") {
    step.kind = DecoderStep::Kind::kByteLevel;
  } else if (type == "Replace") {
    step.kind = DecoderStep::Kind::kReplace;
    CHUNKSERVE_ASSIGN_OR_RETURN(step.pattern, LiteralPattern(j, path));
    CHUNKSERVE_ASSIGN_OR_RETURN(step.content, String(j, "content", path));
  } else if (type == "ByteFallback") {
    step.kind = DecoderStep::Kind::kByteFallback;
  } else if (type == "Fuse") {
    step.kind = DecoderStep::Kind::kFuse;
  } else if (type == "Strip") {
    step.kind = DecoderStep::Kind::kStrip;
    CHUNKSERVE_ASSIGN_OR_RETURN(step.pattern, OneChar(j, "content", path));
    CHUNKSERVE_ASSIGN_OR_RETURN(const int64_t start, Int(j, "start", path, 0, 1 << 20, 0));
    CHUNKSERVE_ASSIGN_OR_RETURN(const int64_t stop, Int(j, "stop", path, 0, 1 << 20, 0));
    step.start = static_cast<int>(start);
    step.stop = static_cast<int>(stop);
  } else if (type == "Metaspace") {
    step.kind = DecoderStep::Kind::kMetaspace;
    CHUNKSERVE_ASSIGN_OR_RETURN(step.pattern, OneChar(j, "replacement", path));
    CHUNKSERVE_ASSIGN_OR_RETURN(step.prepend_scheme, Scheme(j, path));
  } else {
    return Unsupported(path, "decoder type '" + type + "' is not supported");
  }
  out->push_back(std::move(step));
  return Status::Ok();
}

// TemplateProcessing's "single" template -> ids before and after $A.
Status ParsePostProcessor(const Json& j, const std::string& path, Tokenizer::Impl* impl) {
  CHUNKSERVE_ASSIGN_OR_RETURN(const std::string type, Type(j, path));
  if (type == "ByteLevel") return Status::Ok();  // only adjusts offsets, which we do not report
  if (type == "Sequence") {
    CHUNKSERVE_ASSIGN_OR_RETURN(const Json* list, Array(j, "processors", path));
    for (size_t i = 0; i < list->size(); ++i) {
      CHUNKSERVE_RETURN_IF_ERROR(ParsePostProcessor(
          (*list)[i], path + ".processors[" + std::to_string(i) + "]", impl));
    }
    return Status::Ok();
  }
  if (type != "TemplateProcessing") {
    return Unsupported(path, "post-processor type '" + type + "' is not supported");
  }
  CHUNKSERVE_ASSIGN_OR_RETURN(const Json* single, Array(j, "single", path));
  const Json* specials = Member(j, "special_tokens");
  if (specials != nullptr && !specials->is_object()) {
    return Bad(path + ".special_tokens", "expected an object");
  }
  impl->prefix_ids.clear();
  impl->suffix_ids.clear();
  bool seen_sequence = false;
  for (size_t i = 0; i < single->size(); ++i) {
    const std::string item_path = path + ".single[" + std::to_string(i) + "]";
    const Json& item = (*single)[i];
    if (!item.is_object()) return Bad(item_path, "expected an object");
    if (const Json* seq = Member(item, "Sequence")) {
      if (!seq->is_object()) return Bad(item_path + ".Sequence", "expected an object");
      CHUNKSERVE_ASSIGN_OR_RETURN(const std::string id, String(*seq, "id", item_path + ".Sequence"));
      if (id != "A" || seen_sequence) {
        return Bad(item_path + ".Sequence.id", "the single template must hold $A once");
      }
      seen_sequence = true;
      continue;
    }
    const Json* special = Member(item, "SpecialToken");
    if (special == nullptr || !special->is_object()) {
      return Bad(item_path, "expected Sequence or SpecialToken");
    }
    CHUNKSERVE_ASSIGN_OR_RETURN(const std::string name,
                                String(*special, "id", item_path + ".SpecialToken"));
    const Json* entry = specials == nullptr ? nullptr : Member(*specials, name.c_str());
    if (entry == nullptr || !entry->is_object()) {
      return Bad(path + ".special_tokens", "no entry for '" + name + "'");
    }
    const std::string entry_path = path + ".special_tokens." + name;
    CHUNKSERVE_ASSIGN_OR_RETURN(const Json* ids, Array(*entry, "ids", entry_path));
    for (size_t k = 0; k < ids->size(); ++k) {
      const Json& id = (*ids)[k];
      if (!id.is_number_unsigned() || id.get<uint64_t>() > INT32_MAX) {
        return Bad(entry_path + ".ids[" + std::to_string(k) + "]", "expected a token id");
      }
      (seen_sequence ? impl->suffix_ids : impl->prefix_ids)
          .push_back(static_cast<int32_t>(id.get<uint64_t>()));
    }
  }
  if (!seen_sequence) return Bad(path + ".single", "the template has no $A");
  return Status::Ok();
}

Status ParseAddedTokens(const Json& root, std::vector<AddedToken>* out) {
  const Json* list = Member(root, "added_tokens");
  if (list == nullptr) return Status::Ok();
  if (!list->is_array()) return Bad("added_tokens", "expected an array");
  for (size_t i = 0; i < list->size(); ++i) {
    const std::string path = "added_tokens[" + std::to_string(i) + "]";
    const Json& j = (*list)[i];
    if (!j.is_object()) return Bad(path, "expected an object");
    AddedToken t;
    CHUNKSERVE_ASSIGN_OR_RETURN(const int64_t id, Int(j, "id", path, 0, INT32_MAX));
    t.id = static_cast<int32_t>(id);
    CHUNKSERVE_ASSIGN_OR_RETURN(t.content, String(j, "content", path));
    if (t.content.empty()) return Bad(path + ".content", "empty");
    CHUNKSERVE_ASSIGN_OR_RETURN(t.special, Bool(j, "special", path, false));
    CHUNKSERVE_ASSIGN_OR_RETURN(t.lstrip, Bool(j, "lstrip", path, false));
    CHUNKSERVE_ASSIGN_OR_RETURN(t.rstrip, Bool(j, "rstrip", path, false));
    CHUNKSERVE_ASSIGN_OR_RETURN(t.normalized, Bool(j, "normalized", path, !t.special));
    CHUNKSERVE_ASSIGN_OR_RETURN(t.single_word, Bool(j, "single_word", path, false));
    out->push_back(std::move(t));
  }
  return Status::Ok();
}

Result<BpeModel> ParseModel(const Json& root, std::unordered_map<std::string, int32_t>* vocab) {
  const Json* m = Member(root, "model");
  if (m == nullptr || !m->is_object()) return Bad("model", "expected an object");
  CHUNKSERVE_ASSIGN_OR_RETURN(const std::string type, String(*m, "type", "model", "BPE"));
  if (type != "BPE") return Unsupported("model.type", "model type '" + type + "' is not supported");
  if (const Json* d = Member(*m, "dropout")) {
    if (!d->is_number()) return Bad("model.dropout", "expected a number");
    if (d->get<double>() > 0) return Unsupported("model.dropout", "BPE dropout is not supported");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    CHUNKSERVE_ASSIGN_OR_RETURN(const std::string v, String(*m, key, "model", ""));
    if (!v.empty()) return Unsupported(std::string("model.") + key, "not supported");
  }
  const Json* v = Member(*m, "vocab");
  if (v == nullptr || !v->is_object()) return Bad("model.vocab", "expected an object");
  vocab->reserve(v->size());
  for (const auto& [text, id] : v->items()) {
    if (!id.is_number_unsigned() || id.get<uint64_t>() > INT32_MAX) {
      return Bad("model.vocab[\"" + text + "\"]", "expected a token id");
    }
    (*vocab)[text] = static_cast<int32_t>(id.get<uint64_t>());
  }
  std::vector<std::pair<std::string, std::string>> merges;
  if (const Json* list = Member(*m, "merges")) {
    if (!list->is_array()) return Bad("model.merges", "expected an array");
    merges.reserve(list->size());
    for (size_t i = 0; i < list->size(); ++i) {
      const std::string path = "model.merges[" + std::to_string(i) + "]";
      const Json& e = (*list)[i];
      if (e.is_string()) {
        const std::string& s = e.get_ref<const std::string&>();
        const size_t space = s.find(' ');
        if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
          return Bad(path, "expected \"left right\"");
        }
        merges.emplace_back(s.substr(0, space), s.substr(space + 1));
      } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
        merges.emplace_back(e[0].get<std::string>(), e[1].get<std::string>());
      } else {
        return Bad(path, "expected \"left right\" or [left, right]");
      }
    }
  }
  BpeModel::Options options;
  CHUNKSERVE_ASSIGN_OR_RETURN(options.byte_fallback, Bool(*m, "byte_fallback", "model", false));
  CHUNKSERVE_ASSIGN_OR_RETURN(options.fuse_unk, Bool(*m, "fuse_unk", "model", false));
  CHUNKSERVE_ASSIGN_OR_RETURN(options.ignore_merges, Bool(*m, "ignore_merges", "model", false));
  if (Member(*m, "unk_token") != nullptr) {
    CHUNKSERVE_ASSIGN_OR_RETURN(const std::string unk, String(*m, "unk_token", "model"));
    const auto it = vocab->find(unk);
    if (it == vocab->end()) return Bad("model.unk_token", "'" + unk + "' is not in the vocabulary");
    options.unk_id = it->second;
  }
  auto model = BpeModel::FromMerges(*vocab, merges, options);
  if (!model.ok()) return model.status().Annotate("tokenizer.json: model.merges");
  return model;
}

}  // namespace

Result<Tokenizer> Tokenizer::FromJson(std::string_view tokenizer_json) {
  if (TooDeep(tokenizer_json)) {
    return Status::InvalidArgument("tokenizer.json: nested deeper than " +
                                   std::to_string(kMaxJsonDepth) + " levels");
  }
  const Json root = Json::parse(tokenizer_json, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return Status::InvalidArgument("tokenizer.json: malformed JSON");
  if (!root.is_object()) return Bad("(root)", "expected an object");
  for (const char* key : {"truncation", "padding"}) {
    if (Member(root, key) != nullptr) {
      return Unsupported(key, "truncation and padding are not supported; set them to null");
    }
  }
  auto impl = std::make_shared<Impl>();
  std::unordered_map<std::string, int32_t> vocab;
  CHUNKSERVE_ASSIGN_OR_RETURN(impl->model, ParseModel(root, &vocab));
  std::vector<AddedToken> added;
  CHUNKSERVE_RETURN_IF_ERROR(ParseAddedTokens(root, &added));
  CHUNKSERVE_RETURN_IF_ERROR(BuildIdTables(vocab, added, impl.get()));

  if (const Json* n = Member(root, "normalizer")) {
    std::vector<NormalizerStep> steps;
    CHUNKSERVE_RETURN_IF_ERROR(ParseNormalizer(*n, "normalizer", &steps));
    impl->normalizer = Normalizer(std::move(steps));
  }
  if (const Json* p = Member(root, "pre_tokenizer")) {
    std::vector<PreTokenizerStep> steps;
    CHUNKSERVE_RETURN_IF_ERROR(ParsePreTokenizer(*p, "pre_tokenizer", &steps));
    impl->pre_tokenizer = PreTokenizer(std::move(steps));
  }
  if (const Json* d = Member(root, "decoder")) {
    std::vector<DecoderStep> steps;
    CHUNKSERVE_RETURN_IF_ERROR(ParseDecoder(*d, "decoder", &steps));
    impl->decoder = Decoder(std::move(steps));
  }
  if (const Json* p = Member(root, "post_processor")) {
    CHUNKSERVE_RETURN_IF_ERROR(ParsePostProcessor(*p, "post_processor", impl.get()));
  }
  const int32_t size = static_cast<int32_t>(impl->id_to_token.size());
  for (const auto* list : {&impl->prefix_ids, &impl->suffix_ids}) {
    for (const int32_t id : *list) {
      if (id >= size) {
        return Bad("post_processor", "token id " + std::to_string(id) + " >= vocab size " +
                                         std::to_string(size));
      }
    }
  }
  // tokenizer.json names no BOS/EOS; the template's first token is the BOS by convention, and
  // the usual end-of-text spellings give the EOS.
  if (!impl->prefix_ids.empty()) impl->bos_id = impl->prefix_ids.front();
  for (const char* eos : {"</s>", "<|endoftext|>", "<|end_of_text|>", "<|im_end|>", "<eos>"}) {
    const auto it = impl->token_to_id.find(eos);
    if (it != impl->token_to_id.end()) {
      impl->eos_id = it->second;
      break;
    }
  }
  impl->added = AddedTokenMatcher(std::move(added));
  return MakeTokenizer(std::move(impl));
}

}  // namespace chunkserve::tokenizer
