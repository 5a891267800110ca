#include "runtime/model/model_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <numbers>
#include <string>
#include <vector>

#include "tests/model/test_util.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace chunkserve::model {
namespace {

using ::chunkserve::testing::StatusIs;
using ::chunkserve::testing::TempDir;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Json = nlohmann::json;

// Published Hugging Face configs (as shipped with the checkpoints), trimmed of nothing.
constexpr const char* kLlama2_7b = R"({
  "_name_or_path": "meta-llama/Llama-2-7b-hf", "architectures": ["LlamaForCausalLM"],
  "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096,
  "initializer_range": 0.02, "intermediate_size": 11008, "max_position_embeddings": 4096,
  "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
  "num_key_value_heads": 32, "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": null,
  "tie_word_embeddings": false, "torch_dtype": "float16", "transformers_version": "4.31.0.dev0",
  "use_cache": true, "vocab_size": 32000})";

constexpr const char* kLlama31_8b = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu",
  "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
  "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
  "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
  "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.43.0.dev0", "use_cache": true, "vocab_size": 128256})";

constexpr const char* kMistral7b_v01 = R"({
  "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
  "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
  "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mistral",
  "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.34.0.dev0",
  "use_cache": true, "vocab_size": 32000})";

constexpr const char* kMistral7b_v02 = R"({
  "architectures": ["MistralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
  "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
  "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mistral",
  "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "sliding_window": null,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.36.0",
  "use_cache": true, "vocab_size": 32000})";

constexpr const char* kQwen2_7b = R"({
  "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
  "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 3584, "initializer_range": 0.02,
  "intermediate_size": 18944, "max_position_embeddings": 131072, "max_window_layers": 28,
  "model_type": "qwen2", "num_attention_heads": 28, "num_hidden_layers": 28,
  "num_key_value_heads": 4, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
  "sliding_window": 131072, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.37.2", "use_cache": true, "use_sliding_window": false,
  "vocab_size": 152064})";

constexpr const char* kQwen2_05b = R"({
  "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
  "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
  "intermediate_size": 4864, "max_position_embeddings": 131072, "max_window_layers": 24,
  "model_type": "qwen2", "num_attention_heads": 14, "num_hidden_layers": 24,
  "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
  "sliding_window": 131072, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "transformers_version": "4.40.1", "use_cache": true, "use_sliding_window": false,
  "vocab_size": 151936})";

// A small Llama config the error cases mutate.
Json BaseLlama() {
  return Json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
    "intermediate_size": 688, "num_hidden_layers": 2, "num_attention_heads": 8,
    "num_key_value_heads": 2, "vocab_size": 1024, "rms_norm_eps": 1e-5,
    "max_position_embeddings": 2048, "bos_token_id": 1, "eos_token_id": 2})");
}

TEST(ModelConfigTest, ParsesLlama2) {
  ASSERT_OK_AND_ASSIGN(ModelConfig c, ParseModelConfig(kLlama2_7b));
  EXPECT_EQ(c.architecture, Architecture::kLlama);
  EXPECT_EQ(c.vocab_size, 32000);
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.intermediate_size, 11008);
  EXPECT_EQ(c.num_layers, 32);
  EXPECT_EQ(c.num_qo_heads, 32);
  EXPECT_EQ(c.num_kv_heads, 32);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.rope_scaling.type, RopeScalingType::kNone);
  EXPECT_EQ(c.max_position_embeddings, 4096);
  EXPECT_EQ(c.MaxContextLength(), 4096);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_FALSE(c.o_bias);
  EXPECT_EQ(c.torch_dtype, DType::kF16);
  EXPECT_THAT(c.bos_token_ids, ElementsAre(1));
  EXPECT_THAT(c.eos_token_ids, ElementsAre(2));
  EXPECT_TRUE(c.ignored_fields.empty());
}

TEST(ModelConfigTest, ParsesLlama3WithGqaAndLlama3RopeScaling) {
  ASSERT_OK_AND_ASSIGN(ModelConfig c, ParseModelConfig(kLlama31_8b));
  EXPECT_EQ(c.num_qo_heads, 32);
  EXPECT_EQ(c.num_kv_heads, 8);
  EXPECT_EQ(c.q_dim(), 4096);
  EXPECT_EQ(c.kv_dim(), 1024);
  EXPECT_EQ(c.rope_theta, 500000.0);
  EXPECT_EQ(c.rope_scaling.type, RopeScalingType::kLlama3);
  EXPECT_EQ(c.rope_scaling.factor, 8.0);
  EXPECT_EQ(c.rope_scaling.low_freq_factor, 1.0);
  EXPECT_EQ(c.rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_EQ(c.torch_dtype, DType::kBF16);
  EXPECT_THAT(c.eos_token_ids, ElementsAre(128001, 128008, 128009));
}

TEST(ModelConfigTest, MissingKvHeadsDefaultsToHeadsForLlama) {
  Json j = BaseLlama();
  j.erase("num_key_value_heads");
  ASSERT_OK_AND_ASSIGN(ModelConfig c, ParseModelConfig(j.dump()));
  EXPECT_EQ(c.num_kv_heads, 8);
  EXPECT_EQ(c.head_dim, 32);
}

TEST(ModelConfigTest, MistralSlidingWindowCapsTheContext) {
  ASSERT_OK_AND_ASSIGN(ModelConfig c, ParseModelConfig(kMistral7b_v01));
  EXPECT_EQ(c.architecture, Architecture::kMistral);
  EXPECT_EQ(c.sliding_window, 4096);
  EXPECT_EQ(c.max_position_embeddings, 32768);
  EXPECT_EQ(c.MaxContextLength(), 4096);
  EXPECT_FALSE(c.qkv_bias);

  ASSERT_OK_AND_ASSIGN(ModelConfig v2, ParseModelConfig(kMistral7b_v02));
  EXPECT_FALSE(v2.sliding_window.has_value());
  EXPECT_EQ(v2.MaxContextLength(), 32768);
  EXPECT_EQ(v2.rope_theta, 1e6);
}

TEST(ModelConfigTest, Qwen2HasQkvBiasesButNoOutputBias) {
  ASSERT_OK_AND_ASSIGN(ModelConfig c, ParseModelConfig(kQwen2_7b));
  EXPECT_EQ(c.architecture, Architecture::kQwen2);
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_FALSE(c.o_bias);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.num_kv_heads, 4);
  EXPECT_FALSE(c.sliding_window.has_value());  // use_sliding_window false: not in effect
  EXPECT_EQ(c.MaxContextLength(), 131072);
}

TEST(ModelConfigTest, ParsesTiedEmbeddings) {
  ASSERT_OK_AND_ASSIGN(ModelConfig c, ParseModelConfig(kQwen2_05b));
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.head_dim, 64);
}

TEST(ModelConfigTest, LlamaAttentionBiasCoversQkvAndOutput) {
  Json j = BaseLlama();
  j["attention_bias"] = true;
  ASSERT_OK_AND_ASSIGN(ModelConfig c, ParseModelConfig(j.dump()));
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_TRUE(c.o_bias);
}

TEST(ModelConfigTest, ExplicitHeadDimNeedNotDivideHidden) {
  Json j = BaseLlama();
  j["head_dim"] = 64;  // q_dim 512 != hidden 256, as in Mistral Nemo
  ASSERT_OK_AND_ASSIGN(ModelConfig c, ParseModelConfig(j.dump()));
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.q_dim(), 512);
}

TEST(ModelConfigTest, NullValuesCountAsAbsent) {
  Json j = BaseLlama();
  j["head_dim"] = nullptr;
  j["rope_theta"] = nullptr;
  j["torch_dtype"] = nullptr;
  ASSERT_OK_AND_ASSIGN(ModelConfig c, ParseModelConfig(j.dump()));
  EXPECT_EQ(c.head_dim, 32);
  EXPECT_EQ(c.rope_theta, 10000.0);
  EXPECT_FALSE(c.torch_dtype.has_value());
}

TEST(ModelConfigTest, ArchitectureMayComeFromModelTypeAlone) {
  Json j = BaseLlama();
  j.erase("architectures");
  j["model_type"] = "mistral";
  ASSERT_OK_AND_ASSIGN(ModelConfig c, ParseModelConfig(j.dump()));
  EXPECT_EQ(c.architecture, Architecture::kMistral);
}

TEST(ModelConfigTest, AcceptsEveryHarmlessField) {
  Json j = BaseLlama();
  for (std::string_view f : HarmlessConfigFields()) j[std::string(f)] = 1;
  ASSERT_OK_AND_ASSIGN(ModelConfig c, ParseModelConfig(j.dump()));
  EXPECT_TRUE(c.ignored_fields.empty());
  EXPECT_TRUE(std::is_sorted(HarmlessConfigFields().begin(), HarmlessConfigFields().end()));
}

TEST(ModelConfigTest, IgnoreUnknownFieldsRecordsThem) {
  Json j = BaseLlama();
  j["zeta"] = 1;
  j["alpha"] = "x";
  j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 2.0}, {"extra", 1}};
  ModelConfigOptions options;
  options.ignore_unknown_fields = true;
  ASSERT_OK_AND_ASSIGN(ModelConfig c, ParseModelConfig(j.dump(), options));
  EXPECT_THAT(c.ignored_fields, ElementsAre("alpha", "zeta", "rope_scaling.extra"));
  EXPECT_EQ(c.rope_scaling.type, RopeScalingType::kLinear);
}

// As transformers does: what a config class does not use is accepted (and logged by the loader),
// e.g. the unk_token_id transformers itself writes, or a key of another architecture.
TEST(ModelConfigTest, UnknownFieldsAreAcceptedByDefault) {
  Json j = BaseLlama();
  j["unk_token_id"] = 0;
  j["sliding_window"] = 4096;
  j["some_future_key"] = {{"x", 1}};
  j["partial_rotary_factor"] = 1.0;  // the neutral value of a math-changing key
  ASSERT_OK_AND_ASSIGN(ModelConfig c, ParseModelConfig(j.dump()));
  EXPECT_THAT(c.ignored_fields,
              ElementsAre("partial_rotary_factor", "sliding_window", "some_future_key"));
}

TEST(ModelConfigTest, IgnoreUnknownFieldsStillValidatesKnownOnes) {
  Json j = BaseLlama();
  j["zeta"] = 1;
  j["num_key_value_heads"] = 3;
  ModelConfigOptions options;
  options.ignore_unknown_fields = true;
  EXPECT_THAT(ParseModelConfig(j.dump(), options),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("num_key_value_heads (3)")));
}

TEST(ModelConfigTest, RopeParametersIsTheNewerSpellingOfRopeScaling) {
  Json j = BaseLlama();
  j["rope_parameters"] = {{"rope_type", "linear"}, {"factor", 4.0}, {"rope_theta", 250000.0}};
  ASSERT_OK_AND_ASSIGN(ModelConfig c, ParseModelConfig(j.dump()));
  EXPECT_EQ(c.rope_scaling.type, RopeScalingType::kLinear);
  EXPECT_EQ(c.rope_scaling.factor, 4.0);
  EXPECT_EQ(c.rope_theta, 250000.0);

  j["rope_theta"] = 10000.0;
  EXPECT_THAT(ParseModelConfig(j.dump()),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("disagree")));
}

TEST(ModelConfigTest, DynamicRopeIsPlainRopeInsideTheOriginalContext) {
  Json j = BaseLlama();
  j["rope_scaling"] = {{"type", "dynamic"}, {"factor", 2.0}};
  ASSERT_OK_AND_ASSIGN(ModelConfig c, ParseModelConfig(j.dump()));
  EXPECT_EQ(c.rope_scaling.type, RopeScalingType::kDynamic);
  EXPECT_EQ(c.MaxContextLength(), 2048);
  Json plain = BaseLlama();
  ASSERT_OK_AND_ASSIGN(ModelConfig p, ParseModelConfig(plain.dump()));
  EXPECT_EQ(RopeInverseFrequencies(c), RopeInverseFrequencies(p));
  EXPECT_EQ(CanonicalModelConfig(c), CanonicalModelConfig(p));
}

TEST(ModelConfigTest, RopeInverseFrequenciesPlainAndLinear) {
  ASSERT_OK_AND_ASSIGN(ModelConfig c, ParseModelConfig(kLlama2_7b));
  std::vector<float> inv = RopeInverseFrequencies(c);
  ASSERT_EQ(inv.size(), 64u);
  EXPECT_EQ(inv[0], 1.0f);
  EXPECT_FLOAT_EQ(inv[1], static_cast<float>(std::pow(10000.0, -2.0 / 128)));
  EXPECT_FLOAT_EQ(inv[63], static_cast<float>(std::pow(10000.0, -126.0 / 128)));

  c.rope_scaling.type = RopeScalingType::kLinear;
  c.rope_scaling.factor = 4.0;
  std::vector<float> linear = RopeInverseFrequencies(c);
  for (size_t i = 0; i < inv.size(); ++i) EXPECT_FLOAT_EQ(linear[i], inv[i] / 4.0f) << i;
}

TEST(ModelConfigTest, RopeInverseFrequenciesLlama3Bands) {
  ASSERT_OK_AND_ASSIGN(ModelConfig c, ParseModelConfig(kLlama31_8b));
  std::vector<float> inv = RopeInverseFrequencies(c);
  ASSERT_EQ(inv.size(), 64u);
  // Llama 3.1: wavelengths below 8192 / 4 = 2048 tokens are kept, above 8192 / 1 divided by 8,
  // in between interpolated: inv = ((1 - s) / 8 + s) * base with s = (8192 / wavelen - 1) / 3.
  for (int i = 0; i < 64; ++i) {
    const double base = std::pow(500000.0, -2.0 * i / 128);
    const double wavelen = 2 * std::numbers::pi / base;
    double expected;
    if (wavelen < 2048) {
      expected = base;
    } else if (wavelen > 8192) {
      expected = base / 8;
    } else {
      const double s = (8192 / wavelen - 1) / 3;
      expected = ((1 - s) / 8 + s) * base;
    }
    EXPECT_NEAR(inv[i], expected, 1e-6 * expected) << i;
  }
  EXPECT_EQ(inv[0], 1.0f);
}

TEST(ModelConfigTest, JsonRoundTrips) {
  for (const char* text :
       {kLlama2_7b, kLlama31_8b, kMistral7b_v01, kMistral7b_v02, kQwen2_7b, kQwen2_05b}) {
    ASSERT_OK_AND_ASSIGN(ModelConfig c, ParseModelConfig(text));
    ASSERT_OK_AND_ASSIGN(ModelConfig back, ParseModelConfig(ModelConfigToJson(c)));
    EXPECT_EQ(back, c) << ModelConfigToJson(c);
  }
}

TEST(ModelConfigTest, CanonicalFormIgnoresTokenIdsButNotMath) {
  ASSERT_OK_AND_ASSIGN(ModelConfig a, ParseModelConfig(kLlama31_8b));
  ModelConfig b = a;
  b.eos_token_ids = {7};
  b.torch_dtype.reset();
  EXPECT_EQ(CanonicalModelConfig(a), CanonicalModelConfig(b));
  b.rms_norm_eps = 1e-6;
  EXPECT_NE(CanonicalModelConfig(a), CanonicalModelConfig(b));
}

TEST(ModelConfigTest, LoadsFromDirectoryAndNamesTheFileInErrors) {
  TempDir dir;
  testing::WriteFileBytes(dir.path() / "config.json", kMistral7b_v01);
  ASSERT_OK_AND_ASSIGN(ModelConfig c, LoadModelConfig(dir.path()));
  EXPECT_EQ(c.architecture, Architecture::kMistral);
  ASSERT_OK_AND_ASSIGN(ModelConfig same, LoadModelConfig(dir.path() / "config.json"));
  EXPECT_EQ(same, c);

  testing::WriteFileBytes(dir.path() / "config.json", "{\"architectures\": [\"Bert\"]}");
  EXPECT_THAT(LoadModelConfig(dir.path()),
              StatusIs(StatusCode::kUnimplemented, HasSubstr("config.json: architecture 'Bert'")));
  EXPECT_THAT(LoadModelConfig(dir.path() / "missing"), StatusIs(StatusCode::kNotFound));
}

// Each error case: a mutation of BaseLlama (or raw text), the code, and a message fragment.
struct ErrorCase {
  const char* name;
  std::string text;
  StatusCode code;
  const char* message;
  bool strict = false;  // parsed with ignore_unknown_fields = false
};

std::string Mutated(void (*mutate)(Json&)) {
  Json j = BaseLlama();
  mutate(j);
  return j.dump();
}

void PrintTo(const ErrorCase& c, std::ostream* os) { *os << c.name; }

class ModelConfigErrorTest : public ::testing::TestWithParam<ErrorCase> {};

TEST_P(ModelConfigErrorTest, IsRejectedWithAClearError) {
  const ErrorCase& c = GetParam();
  ModelConfigOptions options;
  options.ignore_unknown_fields = !c.strict;
  EXPECT_THAT(ParseModelConfig(c.text, options), StatusIs(c.code, HasSubstr(c.message))) << c.text;
}

constexpr StatusCode kInvalid = StatusCode::kInvalidArgument;
constexpr StatusCode kUnimpl = StatusCode::kUnimplemented;

INSTANTIATE_TEST_SUITE_P(
    Cases, ModelConfigErrorTest,
    ::testing::Values(
        ErrorCase{"malformed_json", "{\"hidden_size\": ", kInvalid, "malformed JSON"},
        ErrorCase{"not_an_object", "[1, 2]", kInvalid, "must be a JSON object"},
        ErrorCase{"unknown_architecture",
                  Mutated([](Json& j) { j["architectures"] = {"GPT2LMHeadModel"}; }), kUnimpl,
                  "architecture 'GPT2LMHeadModel' is not supported"},
        ErrorCase{"unknown_model_type", Mutated([](Json& j) {
                    j.erase("architectures");
                    j["model_type"] = "gpt2";
                  }),
                  kUnimpl, "model_type 'gpt2' is not supported"},
        ErrorCase{"model_type_mismatch", Mutated([](Json& j) { j["model_type"] = "qwen2"; }),
                  kInvalid, "does not match architecture LlamaForCausalLM"},
        ErrorCase{"two_architectures", Mutated([](Json& j) {
                    j["architectures"] = {"LlamaForCausalLM", "MistralForCausalLM"};
                  }),
                  kInvalid, "expected exactly one"},
        ErrorCase{"architectures_not_a_list",
                  Mutated([](Json& j) { j["architectures"] = "LlamaForCausalLM"; }), kInvalid,
                  "architectures must be a non-empty list"},
        ErrorCase{"no_architecture", Mutated([](Json& j) {
                    j.erase("architectures");
                    j.erase("model_type");
                  }),
                  kInvalid, "missing required field architectures"},
        ErrorCase{"unknown_field", Mutated([](Json& j) { j["partial_rotary_factor"] = 0.5; }),
                  kInvalid, "unknown config field 'partial_rotary_factor'", true},
        ErrorCase{"math_changing_field",
                  Mutated([](Json& j) { j["partial_rotary_factor"] = 0.5; }), kUnimpl,
                  "'partial_rotary_factor' = 0.5 changes the forward pass"},
        ErrorCase{"softcapping", Mutated([](Json& j) { j["final_logit_softcapping"] = 30.0; }),
                  kUnimpl, "'final_logit_softcapping' = 30.0 changes the forward pass"},
        ErrorCase{"experts", Mutated([](Json& j) { j["num_local_experts"] = 8; }), kUnimpl,
                  "'num_local_experts' = 8 changes the forward pass"},
        ErrorCase{"unknown_fields_counted", Mutated([](Json& j) {
                    j["aaa"] = 1;
                    j["bbb"] = 2;
                  }),
                  kInvalid, "'aaa' and 1 more", true},
        ErrorCase{"field_of_another_architecture",
                  Mutated([](Json& j) { j["sliding_window"] = 4096; }), kInvalid,
                  "'sliding_window' (not a LlamaForCausalLM field)", true},
        ErrorCase{"quantized", Mutated([](Json& j) {
                    j["quantization_config"] = {{"bits", 4}};
                  }),
                  kUnimpl, "quantization_config"},
        ErrorCase{"missing_hidden_size", Mutated([](Json& j) { j.erase("hidden_size"); }), kInvalid,
                  "missing required field hidden_size"},
        ErrorCase{"missing_intermediate_size",
                  Mutated([](Json& j) { j.erase("intermediate_size"); }), kInvalid,
                  "missing required field intermediate_size"},
        ErrorCase{"missing_num_hidden_layers",
                  Mutated([](Json& j) { j.erase("num_hidden_layers"); }), kInvalid,
                  "missing required field num_hidden_layers"},
        ErrorCase{"missing_num_attention_heads",
                  Mutated([](Json& j) { j.erase("num_attention_heads"); }), kInvalid,
                  "missing required field num_attention_heads"},
        ErrorCase{"missing_vocab_size", Mutated([](Json& j) { j.erase("vocab_size"); }), kInvalid,
                  "missing required field vocab_size"},
        ErrorCase{"null_required_field", Mutated([](Json& j) { j["vocab_size"] = nullptr; }),
                  kInvalid, "missing required field vocab_size"},
        ErrorCase{"mistral_without_kv_heads", Mutated([](Json& j) {
                    j["architectures"] = {"MistralForCausalLM"};
                    j["model_type"] = "mistral";
                    j.erase("num_key_value_heads");
                  }),
                  kInvalid, "num_key_value_heads (required for MistralForCausalLM)"},
        ErrorCase{"string_for_int", Mutated([](Json& j) { j["hidden_size"] = "256"; }), kInvalid,
                  "hidden_size must be an integer, got string"},
        ErrorCase{"float_for_int", Mutated([](Json& j) { j["hidden_size"] = 256.5; }), kInvalid,
                  "hidden_size must be an integer, got number"},
        ErrorCase{"zero_layers", Mutated([](Json& j) { j["num_hidden_layers"] = 0; }), kInvalid,
                  "num_hidden_layers must be a positive 32-bit integer, got 0"},
        ErrorCase{"negative_vocab", Mutated([](Json& j) { j["vocab_size"] = -5; }), kInvalid,
                  "vocab_size must be a positive 32-bit integer, got -5"},
        ErrorCase{"huge_hidden", Mutated([](Json& j) { j["hidden_size"] = 1ll << 40; }), kInvalid,
                  "hidden_size must be a positive 32-bit integer"},
        ErrorCase{"huge_unsigned", Mutated([](Json& j) { j["hidden_size"] = ~0ull; }), kInvalid,
                  "hidden_size is out of range"},
        ErrorCase{"heads_do_not_divide_hidden", Mutated([](Json& j) {
                    j["num_attention_heads"] = 6;
                    j["num_key_value_heads"] = 2;
                  }),
                  kInvalid, "num_attention_heads (6) must divide hidden_size (256)"},
        ErrorCase{"kv_heads_do_not_divide_heads",
                  Mutated([](Json& j) { j["num_key_value_heads"] = 3; }), kInvalid,
                  "num_key_value_heads (3) must divide num_attention_heads (8)"},
        ErrorCase{"odd_head_dim", Mutated([](Json& j) { j["head_dim"] = 33; }), kInvalid,
                  "head_dim (33) must be even"},
        ErrorCase{"bad_eps", Mutated([](Json& j) { j["rms_norm_eps"] = -1e-6; }), kInvalid,
                  "rms_norm_eps must be in (0, 1)"},
        ErrorCase{"eps_string", Mutated([](Json& j) { j["rms_norm_eps"] = "1e-5"; }), kInvalid,
                  "rms_norm_eps must be a number, got string"},
        ErrorCase{"zero_theta", Mutated([](Json& j) { j["rope_theta"] = 0; }), kInvalid,
                  "rope_theta must be finite and positive"},
        ErrorCase{"tie_not_bool", Mutated([](Json& j) { j["tie_word_embeddings"] = 1; }), kInvalid,
                  "tie_word_embeddings must be a boolean, got number"},
        ErrorCase{"gelu", Mutated([](Json& j) { j["hidden_act"] = "gelu"; }), kUnimpl,
                  "hidden_act 'gelu' is not supported"},
        ErrorCase{"mlp_bias", Mutated([](Json& j) { j["mlp_bias"] = true; }), kUnimpl, "mlp_bias"},
        ErrorCase{"yarn", Mutated([](Json& j) {
                    j["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}};
                  }),
                  kUnimpl, "rope_type 'yarn' is not supported"},
        ErrorCase{"rope_scaling_not_object", Mutated([](Json& j) { j["rope_scaling"] = 2.0; }),
                  kInvalid, "rope_scaling must be an object or null"},
        ErrorCase{"rope_scaling_without_type", Mutated([](Json& j) {
                    j["rope_scaling"] = {{"factor", 2.0}};
                  }),
                  kInvalid, "rope_scaling needs a rope_type"},
        ErrorCase{"rope_types_disagree", Mutated([](Json& j) {
                    j["rope_scaling"] = {{"type", "linear"}, {"rope_type", "llama3"}};
                  }),
                  kInvalid, "rope_type 'llama3' but type 'linear'"},
        ErrorCase{"linear_without_factor", Mutated([](Json& j) {
                    j["rope_scaling"] = {{"rope_type", "linear"}};
                  }),
                  kInvalid, "rope_scaling.factor is required"},
        ErrorCase{"llama3_without_low_freq", Mutated([](Json& j) {
                    j["rope_scaling"] = {{"rope_type", "llama3"},
                                         {"factor", 8.0},
                                         {"high_freq_factor", 4.0},
                                         {"original_max_position_embeddings", 8192}};
                  }),
                  kInvalid, "rope_scaling.low_freq_factor is required"},
        ErrorCase{"llama3_bands_inverted", Mutated([](Json& j) {
                    j["rope_scaling"] = {{"rope_type", "llama3"},
                                         {"factor", 8.0},
                                         {"low_freq_factor", 4.0},
                                         {"high_freq_factor", 1.0},
                                         {"original_max_position_embeddings", 8192}};
                  }),
                  kInvalid, "low_freq_factor < high_freq_factor"},
        ErrorCase{"rope_scaling_unknown_key", Mutated([](Json& j) {
                    j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 2.0}, {"beta", 1}};
                  }),
                  kInvalid, "unknown field 'beta' in rope_scaling", true},
        ErrorCase{"eos_outside_vocab", Mutated([](Json& j) {
                    j["eos_token_id"] = {2, 5000};
                  }),
                  kInvalid, "eos_token_id 5000 >= vocab_size 1024"},
        ErrorCase{"eos_string", Mutated([](Json& j) { j["eos_token_id"] = "2"; }), kInvalid,
                  "eos_token_id must be an integer or a list of integers"},
        ErrorCase{"negative_bos", Mutated([](Json& j) { j["bos_token_id"] = -1; }), kInvalid,
                  "bos_token_id -1 is not a valid token id"},
        ErrorCase{"fp8_dtype", Mutated([](Json& j) { j["torch_dtype"] = "float8_e4m3fn"; }),
                  kUnimpl, "torch_dtype 'float8_e4m3fn' is not supported"},
        ErrorCase{"dtypes_disagree", Mutated([](Json& j) {
                    j["torch_dtype"] = "float16";
                    j["dtype"] = "bfloat16";
                  }),
                  kInvalid, "torch_dtype and dtype disagree"},
        ErrorCase{"sliding_layer_types", Mutated([](Json& j) {
                    j["layer_types"] = {"full_attention", "sliding_attention"};
                  }),
                  kUnimpl, "layer_types 'sliding_attention'"},
        ErrorCase{"qwen2_sliding_window", Mutated([](Json& j) {
                    j["architectures"] = {"Qwen2ForCausalLM"};
                    j["model_type"] = "qwen2";
                    j["use_sliding_window"] = true;
                    j["sliding_window"] = 4096;
                  }),
                  kUnimpl, "use_sliding_window true is not supported"},
        ErrorCase{"mistral_zero_window", Mutated([](Json& j) {
                    j["architectures"] = {"MistralForCausalLM"};
                    j["model_type"] = "mistral";
                    j["sliding_window"] = 0;
                  }),
                  kInvalid, "sliding_window must be a positive 32-bit integer"}),
    [](const ::testing::TestParamInfo<ErrorCase>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace chunkserve::model
