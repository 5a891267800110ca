// GGUF models against the same weights as safetensors: a tiny random Llama is written with the
// tiny-model writer, re-encoded as GGUF the way llama.cpp's converter does (names, reversed dims,
// permuted q/k rows, tokenizer metadata), and both load to the same tensors and fingerprint.
#include "runtime/model/gguf_model.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "runtime/model/dtype.h"
#include "runtime/model/gguf_quant.h"
#include "runtime/model/model.h"
#include "runtime/model/tiny_model.h"
#include "tests/model/gguf_test_util.h"
#include "tests/model/test_util.h"
#include "tests/testing/model_cache.h"
#include "tests/testing/temp_dir.h"

namespace chunkserve::model {
namespace {

using testing::GgufBuilder;

// The HF name -> GGUF name map (the reverse of gguf_model.h's table), for the writer below.
std::string GgufName(const std::string& hf) {
  if (hf == "model.embed_tokens.weight") return "token_embd.weight";
  if (hf == "model.norm.weight") return "output_norm.weight";
  if (hf == "lm_head.weight") return "output.weight";
  const std::string prefix = "model.layers.";
  const size_t dot = hf.find('.', prefix.size());
  const std::string layer = hf.substr(prefix.size(), dot - prefix.size());
  const std::string rest = hf.substr(dot + 1);
  const std::pair<const char*, const char*> table[] = {
      {"input_layernorm.weight", "attn_norm.weight"},
      {"self_attn.q_proj.weight", "attn_q.weight"},
      {"self_attn.k_proj.weight", "attn_k.weight"},
      {"self_attn.v_proj.weight", "attn_v.weight"},
      {"self_attn.o_proj.weight", "attn_output.weight"},
      {"post_attention_layernorm.weight", "ffn_norm.weight"},
      {"mlp.gate_proj.weight", "ffn_gate.weight"},
      {"mlp.up_proj.weight", "ffn_up.weight"},
      {"mlp.down_proj.weight", "ffn_down.weight"}};
  for (const auto& [h, g] : table) {
    if (rest == h) {
      std::string out = "blk.";  // appended piecewise: GCC 12's -Wrestrict misfires on a + b + c
      out += layer;
      out += '.';
      out += g;
      return out;
    }
  }
  ADD_FAILURE() << "no GGUF name for " << hf;
  return hf;
}

// llama.cpp's convert_hf_to_gguf.py permute(), written independently of the loader: within each
// head, the rows [first half; second half] are interleaved, HF row j * half + i -> row 2i + j.
std::string PermuteRows(const TensorView& v, int64_t head_dim) {
  const int64_t rows = v.shape[0], cols = v.shape[1], half = head_dim / 2;
  const size_t row_bytes = static_cast<size_t>(cols) * DTypeSize(v.dtype);
  std::string out(v.size_bytes, '\0');
  for (int64_t h = 0; h < rows / head_dim; ++h) {
    for (int64_t j = 0; j < 2; ++j) {
      for (int64_t i = 0; i < half; ++i) {
        const int64_t hf_row = h * head_dim + j * half + i;
        const int64_t gguf_row = h * head_dim + 2 * i + j;
        std::memcpy(out.data() + gguf_row * row_bytes, v.data + hf_row * row_bytes, row_bytes);
      }
    }
  }
  return out;
}

struct Options {
  bool tied = false;
  std::string architecture = "llama";
  bool extra_tensor = false;
  bool tokens = true;
};

// GGUF bytes holding the same model as `m`, F32 tensors.
std::string ToGguf(const LoadedModel& m, const Options& o = {}) {
  const ModelConfig& c = m.config();
  GgufBuilder b;
  b.String("general.architecture", o.architecture);
  const std::string p = o.architecture + ".";
  b.Scalar<uint32_t>(p + "embedding_length", GgufBuilder::kU32, c.hidden_size);
  b.Scalar<uint32_t>(p + "block_count", GgufBuilder::kU32, c.num_layers);
  b.Scalar<uint32_t>(p + "feed_forward_length", GgufBuilder::kU32, c.intermediate_size);
  b.Scalar<uint32_t>(p + "attention.head_count", GgufBuilder::kU32, c.num_qo_heads);
  b.Scalar<uint32_t>(p + "attention.head_count_kv", GgufBuilder::kU32, c.num_kv_heads);
  b.Scalar<uint32_t>(p + "attention.key_length", GgufBuilder::kU32, c.head_dim);
  b.Scalar<uint32_t>(p + "rope.dimension_count", GgufBuilder::kU32, c.head_dim);
  b.Scalar<float>(p + "attention.layer_norm_rms_epsilon", GgufBuilder::kF32,
                  static_cast<float>(c.rms_norm_eps));
  b.Scalar<float>(p + "rope.freq_base", GgufBuilder::kF32, static_cast<float>(c.rope_theta));
  b.Scalar<uint32_t>(p + "context_length", GgufBuilder::kU32, c.max_position_embeddings);
  if (o.tokens) {
    std::vector<std::string> tokens;
    for (int32_t i = 0; i < c.vocab_size; ++i) tokens.push_back(std::to_string(i));
    b.StringArray("tokenizer.ggml.tokens", tokens);
  }
  b.Scalar<uint32_t>("tokenizer.ggml.bos_token_id", GgufBuilder::kU32, 1);
  b.Scalar<uint32_t>("tokenizer.ggml.eos_token_id", GgufBuilder::kU32, 2);
  for (const auto& [name, v] : m.store().tensors()) {
    if (o.tied && name == "lm_head.weight") continue;
    std::vector<uint64_t> dims(v.shape.rbegin(), v.shape.rend());
    const bool permuted = name.find("q_proj.weight") != std::string::npos ||
                          name.find("k_proj.weight") != std::string::npos;
    b.Tensor(GgufName(name), 0, dims,
             permuted ? PermuteRows(v, c.head_dim)
                      : std::string(reinterpret_cast<const char*>(v.data), v.size_bytes));
  }
  if (o.extra_tensor) {
    b.Tensor("rope_freqs.weight", 0, {static_cast<uint64_t>(c.head_dim / 2)},
             std::string(static_cast<size_t>(c.head_dim) * 2, '\0'));
  }
  return b.Build();
}

class GgufModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    TinyModelOptions o;
    o.vocab_size = 96;
    o.hidden_size = 64;
    o.num_layers = 2;
    o.num_qo_heads = 4;
    o.num_kv_heads = 2;
    o.head_dim = 16;
    o.intermediate_size = 96;
    o.max_position_embeddings = 512;
    o.rms_norm_eps = 1e-5;
    o.rope_theta = 100000.0;
    o.seed = 7;
    ASSERT_TRUE(WriteTinyModel(dir_.path() / "st", o).ok());
    auto m = LoadedModel::Load(dir_.path() / "st");
    ASSERT_TRUE(m.ok()) << m.status();
    safetensors_.emplace(std::move(m).value());
  }

  std::filesystem::path WriteGguf(const Options& o = {}, const std::string& name = "m.gguf") {
    const std::filesystem::path path = dir_.path() / name;
    testing::WriteFileBytes(path, ToGguf(*safetensors_, o));
    return path;
  }

  ::chunkserve::testing::TempDir dir_;
  std::optional<LoadedModel> safetensors_;
};

TEST_F(GgufModelTest, LoadsTheSameWeightsAndFingerprintAsSafetensors) {
  auto g = LoadedModel::Load(WriteGguf());
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(CanonicalModelConfig(g->config()), CanonicalModelConfig(safetensors_->config()));
  EXPECT_EQ(g->config().vocab_size, 96);
  EXPECT_EQ(g->config().max_position_embeddings, 512);
  EXPECT_EQ(g->config().eos_token_ids, std::vector<TokenId>{2});
  EXPECT_EQ(g->config().bos_token_ids, std::vector<TokenId>{1});
  EXPECT_EQ(g->dtype(), DType::kF32);
  ASSERT_EQ(g->store().num_tensors(), safetensors_->store().num_tensors());
  for (const auto& [name, v] : safetensors_->store().tensors()) {
    const auto gv = g->store().Find(name);
    ASSERT_TRUE(gv.has_value()) << name;
    EXPECT_EQ(std::vector<int64_t>(gv->shape.begin(), gv->shape.end()),
              std::vector<int64_t>(v.shape.begin(), v.shape.end()))
        << name;
    ASSERT_EQ(gv->size_bytes, v.size_bytes) << name;
    EXPECT_EQ(std::memcmp(gv->data, v.data, v.size_bytes), 0) << name;
  }
  EXPECT_EQ(g->fingerprint(), safetensors_->fingerprint());
}

TEST_F(GgufModelTest, DequantizesToTheRequestedDType) {
  LoadModelOptions options;
  options.gguf_dtype = DType::kBF16;
  auto g = LoadedModel::Load(WriteGguf(), options);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->dtype(), DType::kBF16);
  const TensorView st = *safetensors_->store().Find("model.layers.1.self_attn.k_proj.weight");
  const TensorView gv = *g->store().Find("model.layers.1.self_attn.k_proj.weight");
  std::vector<float> expected(static_cast<size_t>(st.num_elements()));
  ConvertToFloat(DType::kF32, st.data, expected);
  std::vector<uint16_t> want(expected.size());
  ConvertFromFloat(expected, DType::kBF16, want.data());
  ASSERT_EQ(gv.size_bytes, want.size() * 2);
  EXPECT_EQ(std::memcmp(gv.data, want.data(), gv.size_bytes), 0);
  options.gguf_dtype = DType::kF16;
  auto h = LoadedModel::Load(WriteGguf(), options);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->dtype(), DType::kF16);
}

TEST_F(GgufModelTest, MissingOutputWeightMeansTied) {
  auto g = LoadedModel::Load(WriteGguf({.tied = true}));
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_TRUE(g->config().tie_word_embeddings);
  EXPECT_EQ(g->weights().lm_head, g->weights().embed_tokens);
}

TEST_F(GgufModelTest, VocabularyFromTheEmbeddingWithoutTokenizer) {
  auto g = LoadedModel::Load(WriteGguf({.tokens = false}));
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->config().vocab_size, 96);
}

TEST_F(GgufModelTest, OtherArchitecturesAreUnimplementedByName) {
  auto g = LoadedModel::Load(WriteGguf({.architecture = "gpt2"}));
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(g.status().message().find("general.architecture 'gpt2'"), std::string::npos)
      << g.status();
}

TEST_F(GgufModelTest, UnknownTensorsAreNamed) {
  auto g = LoadedModel::Load(WriteGguf({.extra_tensor = true}));
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("rope_freqs.weight"), std::string::npos) << g.status();
}

TEST(GgufUnpermutedRowTest, InverseOfTheConverterPermutation) {
  // head_dim 8: GGUF rows 0..7 of a head hold HF rows 0,4,1,5,2,6,3,7.
  const int64_t expected[] = {0, 4, 1, 5, 2, 6, 3, 7};
  for (int64_t r = 0; r < 8; ++r) {
    EXPECT_EQ(GgufUnpermutedRow(r, 8), expected[r]) << r;
    EXPECT_EQ(GgufUnpermutedRow(r + 16, 8), expected[r] + 16) << r;
  }
}

TEST(GgufRealModelTest, SmolLM2ConfigAndWeights) {
  const auto path = ::chunkserve::testing::CachedModelPath(::chunkserve::testing::kSmolLM2Gguf);
  if (!path.ok()) GTEST_SKIP() << path.status().message();
  auto m = LoadedModel::Load(*path);
  ASSERT_TRUE(m.ok()) << m.status();
  const ModelConfig& c = m->config();
  EXPECT_EQ(c.num_layers, 30);
  EXPECT_EQ(c.hidden_size, 576);
  EXPECT_EQ(c.intermediate_size, 1536);
  EXPECT_EQ(c.num_qo_heads, 9);
  EXPECT_EQ(c.num_kv_heads, 3);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.vocab_size, 49152);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.rope_theta, 100000.0);
  EXPECT_EQ(c.eos_token_ids, std::vector<TokenId>{2});
  EXPECT_EQ(c.bos_token_ids, std::vector<TokenId>{1});
  EXPECT_EQ(m->store().num_tensors(), 272u);
}

}  // namespace
}  // namespace chunkserve::model
