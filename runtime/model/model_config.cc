#include "runtime/model/model_config.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <numbers>
#include <sstream>
#include <system_error>
#include <utility>

namespace chunkserve::model {
namespace {

using Json = nlohmann::json;

// Sorted (binary searched). Each entry is a key Hugging Face writes into config.json that cannot
// change the forward pass of these architectures: training-only settings (dropout, init range,
// tensor-parallel pretraining slices, which are mathematically identical), generation defaults
// (the engine samples per request), and bookkeeping.
constexpr std::string_view kHarmlessFields[] = {
    "_attn_implementation",
    "_attn_implementation_autoset",
    "_name_or_path",
    "add_cross_attention",
    "attention_dropout",
    "bad_words_ids",
    "begin_suppress_tokens",
    "chunk_size_feed_forward",
    "decoder_start_token_id",
    "diversity_penalty",
    "do_sample",
    "early_stopping",
    "encoder_no_repeat_ngram_size",
    "exponential_decay_length_penalty",
    "finetuning_task",
    "forced_bos_token_id",
    "forced_eos_token_id",
    "id2label",
    "initializer_range",
    "is_decoder",
    "is_encoder_decoder",
    "label2id",
    "length_penalty",
    "max_length",
    "min_length",
    "no_repeat_ngram_size",
    "num_beam_groups",
    "num_beams",
    "num_return_sequences",
    "output_attentions",
    "output_hidden_states",
    "output_scores",
    "pad_token_id",
    "prefix",
    "pretraining_tp",
    "problem_type",
    "pruned_heads",
    "remove_invalid_values",
    "repetition_penalty",
    "return_dict",
    "return_dict_in_generate",
    "sep_token_id",
    "suppress_tokens",
    "task_specific_params",
    "temperature",
    "tf_legacy_loss",
    "tie_encoder_decoder",
    "tokenizer_class",
    "top_k",
    "top_p",
    "torchscript",
    "transformers_version",
    "typical_p",
    "unk_token_id",
    "use_bfloat16",
    "use_cache",
};

// Bits of the architectures a parsed key belongs to.
constexpr uint32_t kLlamaBit = 1u << static_cast<int>(Architecture::kLlama);
constexpr uint32_t kMistralBit = 1u << static_cast<int>(Architecture::kMistral);
constexpr uint32_t kQwen2Bit = 1u << static_cast<int>(Architecture::kQwen2);
constexpr uint32_t kAllArchs = kLlamaBit | kMistralBit | kQwen2Bit;

struct ParsedField {
  std::string_view name;
  uint32_t archs;
};

constexpr ParsedField kParsedFields[] = {
    {"architectures", kAllArchs},
    {"model_type", kAllArchs},
    {"hidden_size", kAllArchs},
    {"intermediate_size", kAllArchs},
    {"num_hidden_layers", kAllArchs},
    {"num_attention_heads", kAllArchs},
    {"num_key_value_heads", kAllArchs},
    {"head_dim", kAllArchs},
    {"vocab_size", kAllArchs},
    {"rms_norm_eps", kAllArchs},
    {"rope_theta", kAllArchs},
    {"rope_scaling", kAllArchs},
    {"rope_parameters", kAllArchs},
    {"max_position_embeddings", kAllArchs},
    {"tie_word_embeddings", kAllArchs},
    {"torch_dtype", kAllArchs},
    {"dtype", kAllArchs},
    {"bos_token_id", kAllArchs},
    {"eos_token_id", kAllArchs},
    {"hidden_act", kAllArchs},
    {"layer_types", kAllArchs},
    {"attention_bias", kLlamaBit},
    {"mlp_bias", kLlamaBit},
    {"sliding_window", kMistralBit | kQwen2Bit},
    {"use_sliding_window", kQwen2Bit},
    {"max_window_layers", kQwen2Bit},
    {"use_mrope", kQwen2Bit},
};

constexpr std::string_view kSupportedArchitectures =
    "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM";

bool IsHarmless(std::string_view key) {
  return std::binary_search(std::begin(kHarmlessFields), std::end(kHarmlessFields), key);
}

const ParsedField* FindParsed(std::string_view key) {
  for (const ParsedField& f : kParsedFields) {
    if (f.name == key) return &f;
  }
  return nullptr;
}

std::string Quoted(std::string_view s) {
  // Keys and values come from the file; keep messages bounded.
  constexpr size_t kMax = 80;
  std::string out = "'";
  out += s.substr(0, kMax);
  out += s.size() > kMax ? "...'" : "'";
  return out;
}

// Null counts as absent.
const Json* Find(const Json& object, std::string_view key) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

Status WrongType(std::string_view key, std::string_view expected, const Json& value) {
  return Status::InvalidArgument(std::string(key) + " must be " + std::string(expected) + ", got " +
                                 value.type_name());
}

Result<int64_t> AsInt64(std::string_view key, const Json& value) {
  if (value.is_number_unsigned()) {
    const uint64_t u = value.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return Status::InvalidArgument(std::string(key) + " is out of range: " + std::to_string(u));
    }
    return static_cast<int64_t>(u);
  }
  if (value.is_number_integer()) return value.get<int64_t>();
  return WrongType(key, "an integer", value);
}

Result<int32_t> AsPositiveInt32(std::string_view key, const Json& value) {
  CHUNKSERVE_ASSIGN_OR_RETURN(int64_t v, AsInt64(key, value));
  if (v <= 0 || v > std::numeric_limits<int32_t>::max()) {
    return Status::InvalidArgument(std::string(key) + " must be a positive 32-bit integer, got " +
                                   std::to_string(v));
  }
  return static_cast<int32_t>(v);
}

Result<int32_t> RequiredPositiveInt(const Json& root, std::string_view key) {
  const Json* v = Find(root, key);
  if (v == nullptr) return Status::InvalidArgument("missing required field " + std::string(key));
  return AsPositiveInt32(key, *v);
}

Result<std::optional<int32_t>> OptionalPositiveInt(const Json& root, std::string_view key) {
  const Json* v = Find(root, key);
  if (v == nullptr) return std::optional<int32_t>();
  CHUNKSERVE_ASSIGN_OR_RETURN(int32_t i, AsPositiveInt32(key, *v));
  return std::optional<int32_t>(i);
}

Result<std::optional<double>> OptionalNumber(const Json& object, std::string_view key) {
  const Json* v = Find(object, key);
  if (v == nullptr) return std::optional<double>();
  if (!v->is_number()) return WrongType(key, "a number", *v);
  return std::optional<double>(v->get<double>());
}

Result<std::optional<bool>> OptionalBool(const Json& root, std::string_view key) {
  const Json* v = Find(root, key);
  if (v == nullptr) return std::optional<bool>();
  if (!v->is_boolean()) return WrongType(key, "a boolean", *v);
  return std::optional<bool>(v->get<bool>());
}

Result<std::optional<std::string>> OptionalString(const Json& object, std::string_view key) {
  const Json* v = Find(object, key);
  if (v == nullptr) return std::optional<std::string>();
  if (!v->is_string()) return WrongType(key, "a string", *v);
  return std::optional<std::string>(v->get<std::string>());
}

Result<std::vector<TokenId>> TokenIds(const Json& root, std::string_view key) {
  std::vector<TokenId> ids;
  const Json* v = Find(root, key);
  if (v == nullptr) return ids;
  auto one = [&](const Json& item) -> Status {
    CHUNKSERVE_ASSIGN_OR_RETURN(int64_t id, AsInt64(key, item));
    if (id < 0 || id > std::numeric_limits<TokenId>::max()) {
      return Status::InvalidArgument(std::string(key) + " " + std::to_string(id) +
                                     " is not a valid token id");
    }
    ids.push_back(static_cast<TokenId>(id));
    return Status::Ok();
  };
  if (v->is_array()) {
    for (const Json& item : *v) CHUNKSERVE_RETURN_IF_ERROR(one(item));
  } else if (v->is_number()) {
    CHUNKSERVE_RETURN_IF_ERROR(one(*v));
  } else {
    return WrongType(key, "an integer or a list of integers", *v);
  }
  return ids;
}

Result<std::optional<DType>> TorchDType(const Json& root, std::string_view key) {
  CHUNKSERVE_ASSIGN_OR_RETURN(std::optional<std::string> s, OptionalString(root, key));
  if (!s.has_value()) return std::optional<DType>();
  if (*s == "float32") return std::optional<DType>(DType::kF32);
  if (*s == "float16") return std::optional<DType>(DType::kF16);
  if (*s == "bfloat16") return std::optional<DType>(DType::kBF16);
  return Status::Unimplemented(std::string(key) + " " + Quoted(*s) +
                               " is not supported (float32, float16 or bfloat16)");
}

// Parses a rope_scaling or rope_parameters object. `theta` receives rope_parameters' rope_theta.
Result<RopeScaling> ParseRope(const Json& object, std::string_view where,
                              const ModelConfigOptions& options, std::vector<std::string>* ignored,
                              std::optional<double>* theta) {
  if (!object.is_object()) return WrongType(where, "an object or null", object);
  CHUNKSERVE_ASSIGN_OR_RETURN(std::optional<std::string> rope_type,
                              OptionalString(object, "rope_type"));
  CHUNKSERVE_ASSIGN_OR_RETURN(std::optional<std::string> type, OptionalString(object, "type"));
  if (rope_type && type && *rope_type != *type) {
    return Status::InvalidArgument(std::string(where) + " has rope_type " + Quoted(*rope_type) +
                                   " but type " + Quoted(*type));
  }
  const std::string kind = rope_type ? *rope_type : type ? *type : "";
  RopeScaling rope;
  if (kind.empty()) {
    return Status::InvalidArgument(std::string(where) + " needs a rope_type");
  } else if (kind == "default") {
    rope.type = RopeScalingType::kNone;
  } else if (kind == "linear") {
    rope.type = RopeScalingType::kLinear;
  } else if (kind == "llama3") {
    rope.type = RopeScalingType::kLlama3;
  } else if (kind == "dynamic") {
    rope.type = RopeScalingType::kDynamic;
  } else {
    return Status::Unimplemented(std::string(where) + " rope_type " + Quoted(kind) +
                                 " is not supported (default, linear, llama3, dynamic)");
  }

  for (const auto& [key, value] : object.items()) {
    if (key == "rope_type" || key == "type" || key == "factor" || key == "low_freq_factor" ||
        key == "high_freq_factor" || key == "original_max_position_embeddings" ||
        (key == "rope_theta" && theta != nullptr)) {
      continue;
    }
    if (!options.ignore_unknown_fields) {
      return Status::InvalidArgument("unknown field " + Quoted(key) + " in " + std::string(where) +
                                     " (set ignore_unknown_fields to accept it)");
    }
    ignored->push_back(std::string(where) + "." + key);
  }
  if (theta != nullptr) {
    CHUNKSERVE_ASSIGN_OR_RETURN(*theta, OptionalNumber(object, "rope_theta"));
  }

  const std::string prefix = std::string(where) + ".";
  auto required_number = [&](std::string_view key) -> Result<double> {
    CHUNKSERVE_ASSIGN_OR_RETURN(std::optional<double> v, OptionalNumber(object, key));
    if (!v.has_value()) {
      return Status::InvalidArgument(prefix + std::string(key) + " is required for rope_type " +
                                     Quoted(kind));
    }
    return *v;
  };
  switch (rope.type) {
    case RopeScalingType::kNone:
      break;
    case RopeScalingType::kLinear: {
      CHUNKSERVE_ASSIGN_OR_RETURN(rope.factor, required_number("factor"));
      break;
    }
    case RopeScalingType::kDynamic: {
      CHUNKSERVE_ASSIGN_OR_RETURN(rope.factor, required_number("factor"));
      if (const Json* original = Find(object, "original_max_position_embeddings")) {
        CHUNKSERVE_ASSIGN_OR_RETURN(
            rope.original_max_position_embeddings,
            AsPositiveInt32(prefix + "original_max_position_embeddings", *original));
      }
      break;
    }
    case RopeScalingType::kLlama3: {
      CHUNKSERVE_ASSIGN_OR_RETURN(rope.factor, required_number("factor"));
      CHUNKSERVE_ASSIGN_OR_RETURN(rope.low_freq_factor, required_number("low_freq_factor"));
      CHUNKSERVE_ASSIGN_OR_RETURN(rope.high_freq_factor, required_number("high_freq_factor"));
      const Json* original = Find(object, "original_max_position_embeddings");
      if (original == nullptr) {
        return Status::InvalidArgument(prefix +
                                       "original_max_position_embeddings is required for "
                                       "rope_type 'llama3'");
      }
      CHUNKSERVE_ASSIGN_OR_RETURN(
          rope.original_max_position_embeddings,
          AsPositiveInt32(prefix + "original_max_position_embeddings", *original));
      break;
    }
  }
  return rope;
}

Result<ModelConfig> ParseRoot(const Json& root, const ModelConfigOptions& options) {
  if (!root.is_object()) return WrongType("config.json", "a JSON object", root);
  ModelConfig c;

  // Architecture: from architectures and/or model_type, which must agree.
  std::optional<Architecture> from_list;
  if (const Json* list = Find(root, "architectures")) {
    if (!list->is_array() || list->empty() || !(*list)[0].is_string()) {
      return WrongType("architectures", "a non-empty list of strings", *list);
    }
    if (list->size() != 1) {
      return Status::InvalidArgument("architectures lists " + std::to_string(list->size()) +
                                     " entries; expected exactly one");
    }
    const std::string name = (*list)[0].get<std::string>();
    if (name == "LlamaForCausalLM") {
      from_list = Architecture::kLlama;
    } else if (name == "MistralForCausalLM") {
      from_list = Architecture::kMistral;
    } else if (name == "Qwen2ForCausalLM") {
      from_list = Architecture::kQwen2;
    } else {
      return Status::Unimplemented("architecture " + Quoted(name) + " is not supported (" +
                                   std::string(kSupportedArchitectures) + ")");
    }
  }
  CHUNKSERVE_ASSIGN_OR_RETURN(std::optional<std::string> model_type,
                              OptionalString(root, "model_type"));
  std::optional<Architecture> from_type;
  if (model_type.has_value()) {
    for (Architecture a : {Architecture::kLlama, Architecture::kMistral, Architecture::kQwen2}) {
      if (*model_type == ModelTypeName(a)) from_type = a;
    }
    if (!from_type.has_value()) {
      return Status::Unimplemented("model_type " + Quoted(*model_type) +
                                   " is not supported (llama, mistral, qwen2)");
    }
  }
  if (!from_list && !from_type) {
    return Status::InvalidArgument("missing required field architectures (or model_type)");
  }
  if (from_list && from_type && *from_list != *from_type) {
    return Status::InvalidArgument("model_type " + Quoted(*model_type) +
                                   " does not match architecture " +
                                   std::string(ArchitectureName(*from_list)) + " (expects '" +
                                   std::string(ModelTypeName(*from_list)) + "')");
  }
  c.architecture = from_list ? *from_list : *from_type;
  const uint32_t arch_bit = 1u << static_cast<int>(c.architecture);

  // Key policy first, so an unknown key is reported even when a later value is also bad.
  if (root.contains("quantization_config")) {
    return Status::Unimplemented("quantized checkpoints (quantization_config) are not supported");
  }
  std::vector<std::string> unknown;
  for (const auto& [key, value] : root.items()) {
    if (IsHarmless(key)) continue;
    const ParsedField* parsed = FindParsed(key);
    if (parsed != nullptr && (parsed->archs & arch_bit) != 0) continue;
    unknown.push_back(key);
  }
  if (!unknown.empty() && !options.ignore_unknown_fields) {
    std::string msg = "unknown config field " + Quoted(unknown[0]);
    if (FindParsed(unknown[0]) != nullptr) {
      msg += " (not a " + std::string(ArchitectureName(c.architecture)) + " field)";
    }
    if (unknown.size() > 1) msg += " and " + std::to_string(unknown.size() - 1) + " more";
    msg += "; set ignore_unknown_fields to accept unknown fields";
    return Status::InvalidArgument(msg);
  }
  // Keys that would change the forward pass in ways this runtime does not implement: never
  // ignored, whatever the options say.
  for (const std::string& key : unknown) {
    const Json& v = root[key];
    const bool neutral =
        v.is_null() || (key == "partial_rotary_factor" && v.is_number() && v.get<double>() == 1.0) ||
        ((key == "num_experts" || key == "num_local_experts" || key == "n_routed_experts") &&
         v.is_number_integer() && v.get<int64_t>() <= 1);
    if (!neutral && (key == "partial_rotary_factor" || key == "attn_logit_softcapping" ||
                     key == "final_logit_softcapping" || key == "num_experts" ||
                     key == "num_local_experts" || key == "n_routed_experts")) {
      return Status::Unimplemented(Quoted(key) + " = " + v.dump() +
                                   " changes the forward pass and is not supported");
    }
  }
  c.ignored_fields = std::move(unknown);

  CHUNKSERVE_ASSIGN_OR_RETURN(c.hidden_size, RequiredPositiveInt(root, "hidden_size"));
  CHUNKSERVE_ASSIGN_OR_RETURN(c.intermediate_size, RequiredPositiveInt(root, "intermediate_size"));
  CHUNKSERVE_ASSIGN_OR_RETURN(c.num_layers, RequiredPositiveInt(root, "num_hidden_layers"));
  CHUNKSERVE_ASSIGN_OR_RETURN(c.num_qo_heads, RequiredPositiveInt(root, "num_attention_heads"));
  CHUNKSERVE_ASSIGN_OR_RETURN(c.vocab_size, RequiredPositiveInt(root, "vocab_size"));

  CHUNKSERVE_ASSIGN_OR_RETURN(std::optional<int32_t> kv_heads,
                              OptionalPositiveInt(root, "num_key_value_heads"));
  if (!kv_heads.has_value() && c.architecture != Architecture::kLlama) {
    return Status::InvalidArgument("missing required field num_key_value_heads (required for " +
                                   std::string(ArchitectureName(c.architecture)) + ")");
  }
  c.num_kv_heads = kv_heads.value_or(c.num_qo_heads);

  CHUNKSERVE_ASSIGN_OR_RETURN(std::optional<int32_t> head_dim,
                              OptionalPositiveInt(root, "head_dim"));
  if (head_dim.has_value()) {
    c.head_dim = *head_dim;
  } else {
    if (c.hidden_size % c.num_qo_heads != 0) {
      return Status::InvalidArgument("num_attention_heads (" + std::to_string(c.num_qo_heads) +
                                     ") must divide hidden_size (" + std::to_string(c.hidden_size) +
                                     ") when head_dim is absent");
    }
    c.head_dim = c.hidden_size / c.num_qo_heads;
  }

  CHUNKSERVE_ASSIGN_OR_RETURN(std::optional<double> eps, OptionalNumber(root, "rms_norm_eps"));
  c.rms_norm_eps = eps.value_or(1e-6);

  // RoPE: rope_theta + rope_scaling, or the newer rope_parameters holding both.
  CHUNKSERVE_ASSIGN_OR_RETURN(std::optional<double> theta, OptionalNumber(root, "rope_theta"));
  std::optional<RopeScaling> scaling;
  if (const Json* v = Find(root, "rope_scaling")) {
    CHUNKSERVE_ASSIGN_OR_RETURN(scaling,
                                ParseRope(*v, "rope_scaling", options, &c.ignored_fields, nullptr));
  }
  if (const Json* v = Find(root, "rope_parameters")) {
    std::optional<double> inner_theta;
    CHUNKSERVE_ASSIGN_OR_RETURN(RopeScaling params, ParseRope(*v, "rope_parameters", options,
                                                              &c.ignored_fields, &inner_theta));
    if (scaling.has_value() && !(*scaling == params)) {
      return Status::InvalidArgument("rope_scaling and rope_parameters disagree");
    }
    if (theta.has_value() && inner_theta.has_value() && *theta != *inner_theta) {
      return Status::InvalidArgument("rope_theta and rope_parameters.rope_theta disagree");
    }
    scaling = params;
    if (inner_theta.has_value()) theta = inner_theta;
  }
  c.rope_theta = theta.value_or(10000.0);
  c.rope_scaling = scaling.value_or(RopeScaling{});

  CHUNKSERVE_ASSIGN_OR_RETURN(std::optional<int32_t> max_pos,
                              OptionalPositiveInt(root, "max_position_embeddings"));
  c.max_position_embeddings =
      max_pos.value_or(c.architecture == Architecture::kLlama ? 2048 : 32768);

  CHUNKSERVE_ASSIGN_OR_RETURN(std::optional<bool> tied, OptionalBool(root, "tie_word_embeddings"));
  c.tie_word_embeddings = tied.value_or(false);

  CHUNKSERVE_ASSIGN_OR_RETURN(std::optional<DType> torch_dtype, TorchDType(root, "torch_dtype"));
  CHUNKSERVE_ASSIGN_OR_RETURN(std::optional<DType> dtype, TorchDType(root, "dtype"));
  if (torch_dtype && dtype && *torch_dtype != *dtype) {
    return Status::InvalidArgument("torch_dtype and dtype disagree");
  }
  c.torch_dtype = torch_dtype ? torch_dtype : dtype;

  CHUNKSERVE_ASSIGN_OR_RETURN(c.bos_token_ids, TokenIds(root, "bos_token_id"));
  CHUNKSERVE_ASSIGN_OR_RETURN(c.eos_token_ids, TokenIds(root, "eos_token_id"));

  CHUNKSERVE_ASSIGN_OR_RETURN(std::optional<std::string> act, OptionalString(root, "hidden_act"));
  if (act.has_value() && *act != "silu" && *act != "swish") {
    return Status::Unimplemented("hidden_act " + Quoted(*act) + " is not supported (silu)");
  }

  if (const Json* v = Find(root, "layer_types")) {
    if (!v->is_array()) return WrongType("layer_types", "a list of strings", *v);
    for (const Json& t : *v) {
      if (!t.is_string()) return WrongType("layer_types entries", "strings", t);
      if (t.get<std::string>() != "full_attention") {
        return Status::Unimplemented("layer_types " + Quoted(t.get<std::string>()) +
                                     " is not supported (full_attention only)");
      }
    }
  }

  switch (c.architecture) {
    case Architecture::kLlama: {
      CHUNKSERVE_ASSIGN_OR_RETURN(std::optional<bool> bias, OptionalBool(root, "attention_bias"));
      c.qkv_bias = c.o_bias = bias.value_or(false);
      CHUNKSERVE_ASSIGN_OR_RETURN(std::optional<bool> mlp_bias, OptionalBool(root, "mlp_bias"));
      if (mlp_bias.value_or(false)) {
        return Status::Unimplemented("mlp_bias true is not supported");
      }
      break;
    }
    case Architecture::kMistral: {
      CHUNKSERVE_ASSIGN_OR_RETURN(c.sliding_window, OptionalPositiveInt(root, "sliding_window"));
      break;
    }
    case Architecture::kQwen2: {
      c.qkv_bias = true;
      CHUNKSERVE_ASSIGN_OR_RETURN(std::optional<bool> use_window,
                                  OptionalBool(root, "use_sliding_window"));
      // Checked for type only: without use_sliding_window they change nothing.
      CHUNKSERVE_RETURN_IF_ERROR(OptionalPositiveInt(root, "sliding_window").status());
      if (const Json* v = Find(root, "max_window_layers")) {
        CHUNKSERVE_RETURN_IF_ERROR(AsInt64("max_window_layers", *v).status());
      }
      if (use_window.value_or(false)) {
        return Status::Unimplemented(
            "use_sliding_window true is not supported (Qwen2 sliding-window layers)");
      }
      CHUNKSERVE_ASSIGN_OR_RETURN(std::optional<bool> mrope, OptionalBool(root, "use_mrope"));
      if (mrope.value_or(false)) return Status::Unimplemented("use_mrope true is not supported");
      break;
    }
  }

  CHUNKSERVE_RETURN_IF_ERROR(ValidateModelConfig(c));
  return c;
}

std::string Hex(double d) {
  char buf[24];
  std::snprintf(buf, sizeof(buf), "%016llx",
                static_cast<unsigned long long>(std::bit_cast<uint64_t>(d)));
  return buf;
}

Json TokenIdsToJson(const std::vector<TokenId>& ids) {
  if (ids.size() == 1) return ids[0];
  return Json(ids);
}

}  // namespace

std::string_view ArchitectureName(Architecture arch) {
  switch (arch) {
    case Architecture::kLlama:
      return "LlamaForCausalLM";
    case Architecture::kMistral:
      return "MistralForCausalLM";
    case Architecture::kQwen2:
      return "Qwen2ForCausalLM";
  }
  return "unknown";
}

std::string_view ModelTypeName(Architecture arch) {
  switch (arch) {
    case Architecture::kLlama:
      return "llama";
    case Architecture::kMistral:
      return "mistral";
    case Architecture::kQwen2:
      return "qwen2";
  }
  return "unknown";
}

Result<Architecture> ParseArchitecture(std::string_view text) {
  for (Architecture a : {Architecture::kLlama, Architecture::kMistral, Architecture::kQwen2}) {
    if (text == ArchitectureName(a) || text == ModelTypeName(a)) return a;
  }
  return Status::Unimplemented("architecture " + Quoted(text) + " is not supported (" +
                               std::string(kSupportedArchitectures) + ")");
}

int32_t ModelConfig::MaxContextLength() const {
  int32_t n = max_position_embeddings;
  if (sliding_window.has_value()) n = std::min(n, *sliding_window);
  if (rope_scaling.type == RopeScalingType::kDynamic &&
      rope_scaling.original_max_position_embeddings > 0) {
    n = std::min(n, rope_scaling.original_max_position_embeddings);
  }
  return n;
}

std::span<const std::string_view> HarmlessConfigFields() { return kHarmlessFields; }

Result<ModelConfig> ParseModelConfig(std::string_view json_text,
                                     const ModelConfigOptions& options) {
  Json root;
  try {
    root = Json::parse(json_text);
  } catch (const Json::exception& e) {
    return Status::InvalidArgument(std::string("malformed JSON: ") + e.what());
  }
  return ParseRoot(root, options);
}

Result<ModelConfig> LoadModelConfig(const std::filesystem::path& path,
                                    const ModelConfigOptions& options) {
  std::error_code ec;
  std::filesystem::path file = path;
  if (std::filesystem::is_directory(path, ec)) file = path / "config.json";
  if (!std::filesystem::exists(file, ec)) {
    return Status::NotFound(file.string() + ": no such file");
  }
  std::ifstream in(file, std::ios::binary);
  if (!in) return Status::Unavailable(file.string() + ": cannot open");
  std::ostringstream text;
  text << in.rdbuf();
  Result<ModelConfig> config = ParseModelConfig(text.str(), options);
  if (!config.ok()) return config.status().Annotate(file.string());
  return config;
}

Status ValidateModelConfig(const ModelConfig& c) {
  auto positive = [](std::string_view name, int64_t v) -> Status {
    if (v <= 0 || v > std::numeric_limits<int32_t>::max()) {
      return Status::InvalidArgument(
          std::string(name) + " must be a positive 32-bit integer, got " + std::to_string(v));
    }
    return Status::Ok();
  };
  CHUNKSERVE_RETURN_IF_ERROR(positive("vocab_size", c.vocab_size));
  CHUNKSERVE_RETURN_IF_ERROR(positive("hidden_size", c.hidden_size));
  CHUNKSERVE_RETURN_IF_ERROR(positive("intermediate_size", c.intermediate_size));
  CHUNKSERVE_RETURN_IF_ERROR(positive("num_hidden_layers", c.num_layers));
  CHUNKSERVE_RETURN_IF_ERROR(positive("num_attention_heads", c.num_qo_heads));
  CHUNKSERVE_RETURN_IF_ERROR(positive("num_key_value_heads", c.num_kv_heads));
  CHUNKSERVE_RETURN_IF_ERROR(positive("head_dim", c.head_dim));
  CHUNKSERVE_RETURN_IF_ERROR(positive("max_position_embeddings", c.max_position_embeddings));
  CHUNKSERVE_RETURN_IF_ERROR(
      positive("num_attention_heads * head_dim", int64_t{c.num_qo_heads} * c.head_dim));
  if (c.num_qo_heads % c.num_kv_heads != 0) {
    return Status::InvalidArgument("num_key_value_heads (" + std::to_string(c.num_kv_heads) +
                                   ") must divide num_attention_heads (" +
                                   std::to_string(c.num_qo_heads) + ")");
  }
  if (c.head_dim % 2 != 0) {
    return Status::InvalidArgument("head_dim (" + std::to_string(c.head_dim) +
                                   ") must be even for RoPE");
  }
  if (!std::isfinite(c.rms_norm_eps) || c.rms_norm_eps <= 0 || c.rms_norm_eps >= 1) {
    return Status::InvalidArgument("rms_norm_eps must be in (0, 1), got " +
                                   std::to_string(c.rms_norm_eps));
  }
  if (!std::isfinite(c.rope_theta) || c.rope_theta <= 0) {
    return Status::InvalidArgument("rope_theta must be finite and positive, got " +
                                   std::to_string(c.rope_theta));
  }
  const RopeScaling& r = c.rope_scaling;
  if (r.type != RopeScalingType::kNone && (!std::isfinite(r.factor) || r.factor <= 0)) {
    return Status::InvalidArgument("rope_scaling.factor must be finite and positive, got " +
                                   std::to_string(r.factor));
  }
  if (r.type == RopeScalingType::kLlama3) {
    if (!std::isfinite(r.low_freq_factor) || !std::isfinite(r.high_freq_factor) ||
        r.low_freq_factor <= 0 || r.high_freq_factor <= r.low_freq_factor) {
      return Status::InvalidArgument(
          "rope_scaling needs 0 < low_freq_factor < high_freq_factor, got " +
          std::to_string(r.low_freq_factor) + " and " + std::to_string(r.high_freq_factor));
    }
    CHUNKSERVE_RETURN_IF_ERROR(positive("rope_scaling.original_max_position_embeddings",
                                        r.original_max_position_embeddings));
  }
  if (r.original_max_position_embeddings < 0) {
    return Status::InvalidArgument("rope_scaling.original_max_position_embeddings is negative");
  }
  if (c.sliding_window.has_value()) {
    if (c.architecture != Architecture::kMistral) {
      return Status::InvalidArgument("sliding_window is only supported for MistralForCausalLM");
    }
    CHUNKSERVE_RETURN_IF_ERROR(positive("sliding_window", *c.sliding_window));
  }
  switch (c.architecture) {
    case Architecture::kLlama:
      if (c.qkv_bias != c.o_bias) {
        return Status::InvalidArgument(
            "LlamaForCausalLM attention_bias puts biases on q, k, v and o together");
      }
      break;
    case Architecture::kMistral:
      if (c.qkv_bias || c.o_bias) {
        return Status::InvalidArgument("MistralForCausalLM has no attention biases");
      }
      break;
    case Architecture::kQwen2:
      if (!c.qkv_bias || c.o_bias) {
        return Status::InvalidArgument("Qwen2ForCausalLM has q, k, v biases and no o bias");
      }
      break;
  }
  for (const auto* ids : {&c.bos_token_ids, &c.eos_token_ids}) {
    for (TokenId id : *ids) {
      if (id < 0 || id >= c.vocab_size) {
        return Status::InvalidArgument(
            std::string(ids == &c.bos_token_ids ? "bos_token_id " : "eos_token_id ") +
            std::to_string(id) + " >= vocab_size " + std::to_string(c.vocab_size));
      }
    }
  }
  return Status::Ok();
}

std::string ModelConfigToJson(const ModelConfig& c) {
  Json j = Json::object();
  j["architectures"] = Json::array({std::string(ArchitectureName(c.architecture))});
  j["model_type"] = std::string(ModelTypeName(c.architecture));
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_layers;
  j["num_attention_heads"] = c.num_qo_heads;
  j["num_key_value_heads"] = c.num_kv_heads;
  j["head_dim"] = c.head_dim;
  j["hidden_act"] = "silu";
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope_theta;
  switch (c.rope_scaling.type) {
    case RopeScalingType::kNone:
      j["rope_scaling"] = nullptr;
      break;
    case RopeScalingType::kLinear:
      j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", c.rope_scaling.factor}};
      break;
    case RopeScalingType::kDynamic:
      j["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", c.rope_scaling.factor}};
      if (c.rope_scaling.original_max_position_embeddings > 0) {
        j["rope_scaling"]["original_max_position_embeddings"] =
            c.rope_scaling.original_max_position_embeddings;
      }
      break;
    case RopeScalingType::kLlama3:
      j["rope_scaling"] = {
          {"rope_type", "llama3"},
          {"factor", c.rope_scaling.factor},
          {"low_freq_factor", c.rope_scaling.low_freq_factor},
          {"high_freq_factor", c.rope_scaling.high_freq_factor},
          {"original_max_position_embeddings", c.rope_scaling.original_max_position_embeddings}};
      break;
  }
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  if (c.torch_dtype.has_value()) j["torch_dtype"] = std::string(TorchDTypeName(*c.torch_dtype));
  if (!c.bos_token_ids.empty()) j["bos_token_id"] = TokenIdsToJson(c.bos_token_ids);
  if (!c.eos_token_ids.empty()) j["eos_token_id"] = TokenIdsToJson(c.eos_token_ids);
  switch (c.architecture) {
    case Architecture::kLlama:
      j["attention_bias"] = c.qkv_bias;
      j["mlp_bias"] = false;
      break;
    case Architecture::kMistral:
      if (c.sliding_window.has_value()) {
        j["sliding_window"] = *c.sliding_window;
      } else {
        j["sliding_window"] = nullptr;
      }
      break;
    case Architecture::kQwen2:
      j["use_sliding_window"] = false;
      break;
  }
  return j.dump(2) + "\n";
}

std::string CanonicalModelConfig(const ModelConfig& c) {
  std::string s = "chunkserve-model-config-v1";
  auto add = [&s](std::string_view key, const std::string& value) {
    s += ';';
    s += key;
    s += '=';
    s += value;
  };
  add("arch", std::string(ModelTypeName(c.architecture)));
  add("vocab", std::to_string(c.vocab_size));
  add("hidden", std::to_string(c.hidden_size));
  add("inter", std::to_string(c.intermediate_size));
  add("layers", std::to_string(c.num_layers));
  add("qo_heads", std::to_string(c.num_qo_heads));
  add("kv_heads", std::to_string(c.num_kv_heads));
  add("head_dim", std::to_string(c.head_dim));
  add("eps", Hex(c.rms_norm_eps));
  add("theta", Hex(c.rope_theta));
  // kDynamic equals kNone inside MaxContextLength(), so both hash alike.
  const bool scaled = c.rope_scaling.type == RopeScalingType::kLinear ||
                      c.rope_scaling.type == RopeScalingType::kLlama3;
  add("rope", scaled ? std::to_string(static_cast<int>(c.rope_scaling.type)) : "0");
  if (scaled) add("rope_factor", Hex(c.rope_scaling.factor));
  if (c.rope_scaling.type == RopeScalingType::kLlama3) {
    add("rope_low", Hex(c.rope_scaling.low_freq_factor));
    add("rope_high", Hex(c.rope_scaling.high_freq_factor));
    add("rope_original", std::to_string(c.rope_scaling.original_max_position_embeddings));
  }
  add("tied", c.tie_word_embeddings ? "1" : "0");
  add("qkv_bias", c.qkv_bias ? "1" : "0");
  add("o_bias", c.o_bias ? "1" : "0");
  return s;
}

std::vector<float> RopeInverseFrequencies(const ModelConfig& c) {
  const int half = c.head_dim / 2;
  std::vector<float> out(static_cast<size_t>(half));
  const RopeScaling& r = c.rope_scaling;
  for (int i = 0; i < half; ++i) {
    double inv = 1.0 / std::pow(c.rope_theta, (2.0 * i) / c.head_dim);
    if (r.type == RopeScalingType::kLinear) {
      inv /= r.factor;
    } else if (r.type == RopeScalingType::kLlama3) {
      // Hugging Face _compute_llama3_parameters: long wavelengths are slowed by `factor`,
      // short ones kept, and the band between interpolates smoothly.
      const double original = r.original_max_position_embeddings;
      const double low_freq_wavelen = original / r.low_freq_factor;
      const double high_freq_wavelen = original / r.high_freq_factor;
      const double wavelen = 2.0 * std::numbers::pi / inv;
      if (wavelen > low_freq_wavelen) {
        inv /= r.factor;
      } else if (wavelen >= high_freq_wavelen) {
        const double smooth =
            (original / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
        inv = (1.0 - smooth) * inv / r.factor + smooth * inv;
      }
    }
    // kDynamic: NTK rescaling only starts past max_position_embeddings, which
    // MaxContextLength() never exceeds, so inside it the frequencies are the plain ones.
    out[static_cast<size_t>(i)] = static_cast<float>(inv);
  }
  return out;
}

}  // namespace chunkserve::model
