// ModelConfig: a Llama-family decoder described by a Hugging Face config.json.
//
// Supported architectures (all RMSNorm + RoPE + GQA + SwiGLU, pre-norm residual blocks):
//
//   architectures[0]     model_type   attention biases
//   LlamaForCausalLM     "llama"      q, k, v and o when attention_bias is true
//   MistralForCausalLM   "mistral"    none
//   Qwen2ForCausalLM     "qwen2"      q, k and v always; never o
//
// Field policy. Every top-level key of config.json is in exactly one of three groups:
//  - parsed: read, type-checked and validated (see ParseModelConfig below for the list);
//  - harmless: known Hugging Face keys that cannot change the forward pass (training settings,
//    generation defaults, bookkeeping), accepted and ignored: HarmlessConfigFields();
//  - anything else, including a parsed key of another architecture (sliding_window in a Llama
//    config): accepted into ModelConfig::ignored_fields, which the loader logs, as transformers
//    accepts keys its config class does not use. ModelConfigOptions::ignore_unknown_fields =
//    false makes them an InvalidArgument naming the alphabetically first such key and counting
//    the rest (strict mode). Keys known to change the math in ways not implemented
//    (partial_rotary_factor other than 1, logit soft-capping, mixture-of-experts sizes) are
//    Unimplemented in either mode.
// Keys that ask for something this runtime does not do (hidden_act other than silu, mlp_bias,
// rope_scaling "yarn" / "longrope", Qwen2 sliding-window layers, layer_types other than
// full_attention, quantization_config) are Unimplemented errors naming the key and value,
// whatever the options say.
//
// Sliding window (Mistral): a window of W tokens is exact full attention for contexts of at most
// W tokens, so a Mistral config with sliding_window W is accepted and MaxContextLength() is capped
// at W. The engine must not run sequences past MaxContextLength().
//
// Error codes: malformed JSON, wrong types, missing required keys, out-of-range values and unknown
// keys are InvalidArgument; recognised but unsupported features and architectures are
// Unimplemented. Messages name the key: "num_key_value_heads (3) must divide num_attention_heads
// (8)"; LoadModelConfig prefixes the file's path.
//
// Thread safety: values; the functions are pure.
#ifndef CHUNKSERVE_RUNTIME_MODEL_MODEL_CONFIG_H_
#define CHUNKSERVE_RUNTIME_MODEL_MODEL_CONFIG_H_

#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/base/ids.h"
#include "runtime/base/status.h"
#include "runtime/model/dtype.h"

namespace chunkserve::model {

enum class Architecture : int32_t { kLlama = 0, kMistral = 1, kQwen2 = 2 };

// "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM".
std::string_view ArchitectureName(Architecture arch);
// "llama", "mistral", "qwen2".
std::string_view ModelTypeName(Architecture arch);
// Accepts an architecture name or a model_type. Unimplemented for anything else.
Result<Architecture> ParseArchitecture(std::string_view text);

enum class RopeScalingType : int32_t {
  kNone = 0,    // plain RoPE (also rope_type "default")
  kLinear = 1,  // positions divided by factor
  kLlama3 = 2,  // Llama 3.1 frequency-dependent scaling
  // Dynamic NTK: rescales only for sequences longer than the original context, which
  // MaxContextLength() never allows, so inside it this is exactly kNone.
  kDynamic = 3,
};

struct RopeScaling {
  RopeScalingType type = RopeScalingType::kNone;
  double factor = 1.0;            // kLinear, kLlama3, kDynamic; > 0
  double low_freq_factor = 1.0;   // kLlama3
  double high_freq_factor = 4.0;  // kLlama3; > low_freq_factor
  // kLlama3: required, > 0. kDynamic: optional (0 = absent); caps MaxContextLength().
  int32_t original_max_position_embeddings = 0;

  friend bool operator==(const RopeScaling&, const RopeScaling&) = default;
};

struct ModelConfig {
  Architecture architecture = Architecture::kLlama;

  // Shapes. Hugging Face names in comments.
  int32_t vocab_size = 0;         // vocab_size
  int32_t hidden_size = 0;        // hidden_size
  int32_t intermediate_size = 0;  // intermediate_size (SwiGLU width)
  int32_t num_layers = 0;         // num_hidden_layers
  int32_t num_qo_heads = 0;       // num_attention_heads
  int32_t num_kv_heads = 0;       // num_key_value_heads; divides num_qo_heads
  int32_t head_dim = 0;           // head_dim (default hidden_size / num_attention_heads); even

  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  int32_t max_position_embeddings = 0;
  // Mistral's attention window in tokens, when set. Caps MaxContextLength().
  std::optional<int32_t> sliding_window;

  bool tie_word_embeddings = false;  // lm_head shares model.embed_tokens.weight
  bool qkv_bias = false;             // q_proj, k_proj, v_proj carry biases
  bool o_bias = false;               // o_proj carries a bias (Llama attention_bias only)

  // The checkpoint's declared dtype (torch_dtype / dtype), when given. Informational: the weights'
  // real dtype is the one in the safetensors headers.
  std::optional<DType> torch_dtype;
  std::vector<TokenId> bos_token_ids;  // bos_token_id: an int, a list or absent
  std::vector<TokenId> eos_token_ids;  // eos_token_id: an int, a list or absent

  // Unknown top-level keys that ModelConfigOptions::ignore_unknown_fields let through, sorted.
  std::vector<std::string> ignored_fields;

  int32_t q_dim() const { return num_qo_heads * head_dim; }   // q_proj rows
  int32_t kv_dim() const { return num_kv_heads * head_dim; }  // k_proj / v_proj rows
  // The longest sequence (prompt + generated) the engine may run: max_position_embeddings,
  // capped by sliding_window and by a dynamic rope scaling's original_max_position_embeddings.
  int32_t MaxContextLength() const;

  friend bool operator==(const ModelConfig&, const ModelConfig&) = default;
};

struct ModelConfigOptions {
  // Unknown top-level keys become ModelConfig::ignored_fields (the default) instead of errors.
  // Keys that are parsed keep being validated either way.
  bool ignore_unknown_fields = true;
};

// Known Hugging Face config keys that cannot change a Llama-family forward pass; accepted and
// ignored. Sorted.
std::span<const std::string_view> HarmlessConfigFields();

// Parses config.json text. Parsed keys (all optional unless marked required):
//   architectures (list of one name) and/or model_type: at least one is required, and they agree;
//   hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, vocab_size: required
//     positive integers;
//   num_key_value_heads: default num_attention_heads for llama, required for mistral and qwen2
//     (their Hugging Face defaults are not "= heads", so we do not guess);
//   head_dim: default hidden_size / num_attention_heads (which must then divide exactly);
//   rms_norm_eps (default 1e-6), rope_theta (default 10000), rope_scaling (null or an object with
//     "rope_type" or "type": "default", "linear" {factor}, "dynamic" {factor[,
//     original_max_position_embeddings]}, "llama3" {factor, low_freq_factor, high_freq_factor,
//     original_max_position_embeddings}), rope_parameters (the newer spelling
//     that also holds rope_theta), max_position_embeddings (default 2048 llama, 32768 mistral and
//     qwen2), tie_word_embeddings (default false), torch_dtype / dtype, bos_token_id,
//     eos_token_id, hidden_act ("silu" or "swish"), attention_bias and mlp_bias (llama),
//     sliding_window (mistral; qwen2 only with use_sliding_window false), use_sliding_window,
//     max_window_layers, use_mrope (must be false) and layer_types (all "full_attention"), qwen2.
// Null values count as absent. The result satisfies ValidateModelConfig.
Result<ModelConfig> ParseModelConfig(std::string_view json_text,
                                     const ModelConfigOptions& options = {});

// Reads and parses `path`: a config.json file, or a directory holding one. NotFound when it does
// not exist; error messages start with the file's path.
Result<ModelConfig> LoadModelConfig(const std::filesystem::path& path,
                                    const ModelConfigOptions& options = {});

// Checks the invariants every consumer relies on: positive shapes within int32, num_kv_heads
// divides num_qo_heads, even head_dim, eps in (0, 1), theta finite and positive, rope scaling
// parameters in range, biases consistent with the architecture, token ids inside the vocabulary.
Status ValidateModelConfig(const ModelConfig& config);

// Hugging Face config.json text for `config` (pretty-printed, keys sorted, deterministic).
// ParseModelConfig(ModelConfigToJson(c)) == c for every valid c without ignored_fields.
std::string ModelConfigToJson(const ModelConfig& config);

// A canonical byte string of the fields that determine the forward pass (architecture, shapes,
// eps, rope, biases, tying), for fingerprints. Token ids, dtype and context limits are left out:
// they do not change a layer's keys and values.
std::string CanonicalModelConfig(const ModelConfig& config);

// RoPE inverse frequencies, [head_dim / 2]: inv_freq[i] = rope_theta^(-2i / head_dim), then the
// config's scaling (linear: / factor; llama3: Hugging Face's _compute_llama3_parameters). Rotating
// pairs (i, i + head_dim / 2) of each head by angle position * inv_freq[i] is Hugging Face's
// rotate_half convention. Computed in double, rounded once to float.
std::vector<float> RopeInverseFrequencies(const ModelConfig& config);

}  // namespace chunkserve::model

#endif  // CHUNKSERVE_RUNTIME_MODEL_MODEL_CONFIG_H_
