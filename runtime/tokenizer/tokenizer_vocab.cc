// Tokenizer::FromVocab: GGUF tokenizer.ggml.* metadata -> Tokenizer::Impl, tokenizing as
// llama.cpp does (src/llama-vocab.cpp), expressed with the same components as tokenizer.json:
//  - "gpt2": llama.cpp's regex list for `pre`, each regex a Split(Isolated), then ByteLevel
//    without its own regex; BPE with the merges; ByteLevel decoder.
//  - "llama": normalizer Prepend("▁") + Replace(" " -> "▁") (llama.cpp adds the space prefix at
//    the start and after every special token, as Prepend on every segment does); BPE ranked by
//    scores with <0xNN> byte fallback; decoder Replace("▁" -> " "), ByteFallback, Fuse,
//    Strip(" ", 1, 0).
#include "runtime/tokenizer/tokenizer.h"
#include "runtime/tokenizer/tokenizer_impl.h"

namespace chunkserve::tokenizer {
namespace {

// tokenizer.ggml.token_type values.
constexpr int32_t kTypeUnknown = 2;
constexpr int32_t kTypeControl = 3;
constexpr int32_t kTypeUserDefined = 4;
constexpr int32_t kTypeByte = 6;

constexpr const char* kGpt2Regex =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";
constexpr const char* kLlama3Regex =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
    "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr const char* kQwen2Regex =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
    "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

// The regexes llama.cpp applies, in order, for a tokenizer.ggml.pre name.
Result<std::vector<std::string>> PreRegexes(const std::string& pre) {
  if (pre.empty() || pre == "default") {
    return std::vector<std::string>{"[\\p{P}\\$\\+<=>\\^~\\|]+", kGpt2Regex, "\\p{N}+",
                                    "[0-9][0-9][0-9]"};
  }
  if (pre == "gpt2" || pre == "gpt-2" || pre == "mpt" || pre == "olmo" || pre == "jais") {
    return std::vector<std::string>{kGpt2Regex};
  }
  if (pre == "llama3" || pre == "llama-v3" || pre == "llama-bpe" || pre == "falcon3" ||
      pre == "pixtral") {
    return std::vector<std::string>{kLlama3Regex};
  }
  if (pre == "qwen2" || pre == "qwen2.5" || pre == "qwen-2.5" || pre == "deepseek-r1-qwen" ||
      pre == "stablelm2") {
    return std::vector<std::string>{kQwen2Regex};
  }
  if (pre == "smollm" || pre == "starcoder" || pre == "refact" || pre == "command-r" ||
      pre == "codeshell" || pre == "exaone" || pre == "minerva-7b") {
    return std::vector<std::string>{"\\p{N}", kGpt2Regex};
  }
  return Status::Unimplemented("tokenizer.ggml.pre '" + pre + "' is not supported");
}

Status CheckId(int32_t id, size_t n, const char* key) {
  if (id >= 0 && static_cast<size_t>(id) >= n) {
    return Status::InvalidArgument(std::string(key) + " " + std::to_string(id) +
                                   " >= number of tokens " + std::to_string(n));
  }
  return Status::Ok();
}

}  // namespace

Result<Tokenizer> Tokenizer::FromVocab(const VocabSpec& spec) {
  const size_t n = spec.tokens.size();
  if (n == 0) return Status::InvalidArgument("tokenizer.ggml.tokens is empty");
  if (n > static_cast<size_t>(INT32_MAX)) {
    return Status::InvalidArgument("tokenizer.ggml.tokens has too many entries");
  }
  if (!spec.token_types.empty() && spec.token_types.size() != n) {
    return Status::InvalidArgument("tokenizer.ggml.token_type has " +
                                   std::to_string(spec.token_types.size()) + " entries for " +
                                   std::to_string(n) + " tokens");
  }
  if (!spec.scores.empty() && spec.scores.size() != n) {
    return Status::InvalidArgument("tokenizer.ggml.scores has " +
                                   std::to_string(spec.scores.size()) + " entries for " +
                                   std::to_string(n) + " tokens");
  }
  CHUNKSERVE_RETURN_IF_ERROR(CheckId(spec.bos_id, n, "tokenizer.ggml.bos_token_id"));
  CHUNKSERVE_RETURN_IF_ERROR(CheckId(spec.eos_id, n, "tokenizer.ggml.eos_token_id"));
  CHUNKSERVE_RETURN_IF_ERROR(CheckId(spec.unk_id, n, "tokenizer.ggml.unknown_token_id"));
  CHUNKSERVE_RETURN_IF_ERROR(CheckId(spec.pad_id, n, "tokenizer.ggml.padding_token_id"));

  auto impl = std::make_shared<Impl>();
  std::unordered_map<std::string, int32_t> vocab;
  vocab.reserve(n);
  std::vector<AddedToken> added;
  for (size_t i = 0; i < n; ++i) {
    const int32_t id = static_cast<int32_t>(i);
    // A repeated entry (a malformed vocabulary) keeps its first id.
    vocab.emplace(spec.tokens[i], id);
    const int32_t type = spec.token_types.empty() ? 1 : spec.token_types[i];
    // llama.cpp recognizes every non-normal, non-byte token in text (its special-token cache:
    // unknown, control, user-defined); user-defined ones are not special.
    if ((type == kTypeUnknown || type == kTypeControl || type == kTypeUserDefined) &&
        !spec.tokens[i].empty()) {
      AddedToken t;
      t.content = spec.tokens[i];
      t.id = id;
      t.special = type != kTypeUserDefined;
      added.push_back(std::move(t));
    }
  }
  CHUNKSERVE_RETURN_IF_ERROR(BuildIdTables(vocab, added, impl.get()));

  BpeModel::Options options;
  if (spec.unk_id >= 0) options.unk_id = spec.unk_id;
  if (spec.model == "gpt2") {
    std::vector<std::pair<std::string, std::string>> merges;
    merges.reserve(spec.merges.size());
    for (size_t i = 0; i < spec.merges.size(); ++i) {
      const std::string& m = spec.merges[i];
      // llama.cpp splits at the first space after the first character.
      const size_t space = m.size() > 1 ? m.find(' ', 1) : std::string::npos;
      if (space == std::string::npos) {
        return Status::InvalidArgument("tokenizer.ggml.merges[" + std::to_string(i) +
                                       "]: expected \"left right\", got '" + m + "'");
      }
      merges.emplace_back(m.substr(0, space), m.substr(space + 1));
    }
    // llama.cpp's BPE has no unknown token for byte-level vocabularies.
    options.unk_id.reset();
    auto model = BpeModel::FromMerges(vocab, merges, options);
    if (!model.ok()) return model.status().Annotate("tokenizer.ggml.merges");
    impl->model = std::move(model).value();
    CHUNKSERVE_ASSIGN_OR_RETURN(const std::vector<std::string> regexes, PreRegexes(spec.pre));
    std::vector<PreTokenizerStep> steps;
    for (const std::string& r : regexes) {
      PreTokenizerStep step;
      step.kind = PreTokenizerStep::Kind::kSplit;
      CHUNKSERVE_ASSIGN_OR_RETURN(step.pattern, Regex::Compile(r));
      step.behavior = SplitBehavior::kIsolated;
      steps.push_back(std::move(step));
    }
    PreTokenizerStep byte_level;
    byte_level.kind = PreTokenizerStep::Kind::kByteLevel;
    steps.push_back(std::move(byte_level));
    impl->pre_tokenizer = PreTokenizer(std::move(steps));
    DecoderStep decode;
    decode.kind = DecoderStep::Kind::kByteLevel;
    impl->decoder = Decoder({decode});
  } else if (spec.model == "llama") {
    if (spec.scores.empty()) {
      return Status::InvalidArgument("tokenizer.ggml.scores is required for model 'llama'");
    }
    options.byte_fallback = true;
    std::vector<bool> mergeable(n, true);
    for (size_t i = 0; i < n && !spec.token_types.empty(); ++i) {
      mergeable[i] = spec.token_types[i] != kTypeByte;
    }
    CHUNKSERVE_ASSIGN_OR_RETURN(impl->model,
                                BpeModel::FromScores(vocab, spec.scores, mergeable, options));
    NormalizerStep prepend;
    prepend.kind = NormalizerStep::Kind::kPrepend;
    prepend.text = "\xE2\x96\x81";
    NormalizerStep replace;
    replace.kind = NormalizerStep::Kind::kReplace;
    CHUNKSERVE_ASSIGN_OR_RETURN(replace.pattern, Regex::Literal(" "));
    replace.text = "\xE2\x96\x81";
    impl->normalizer = Normalizer({prepend, replace});
    std::vector<DecoderStep> steps(4);
    steps[0].kind = DecoderStep::Kind::kReplace;
    steps[0].pattern = "\xE2\x96\x81";
    steps[0].content = " ";
    steps[1].kind = DecoderStep::Kind::kByteFallback;
    steps[2].kind = DecoderStep::Kind::kFuse;
    steps[3].kind = DecoderStep::Kind::kStrip;
    steps[3].pattern = " ";
    steps[3].start = 1;
    impl->decoder = Decoder(std::move(steps));
  } else {
    return Status::Unimplemented("tokenizer.ggml.model '" + spec.model + "' is not supported");
  }

  if (spec.bos_id >= 0) impl->bos_id = spec.bos_id;
  if (spec.eos_id >= 0) impl->eos_id = spec.eos_id;
  if (spec.add_bos && impl->bos_id) impl->prefix_ids.push_back(*impl->bos_id);
  if (spec.add_eos && impl->eos_id) impl->suffix_ids.push_back(*impl->eos_id);
  impl->added = AddedTokenMatcher(std::move(added));
  return MakeTokenizer(std::move(impl));
}

}  // namespace chunkserve::tokenizer
