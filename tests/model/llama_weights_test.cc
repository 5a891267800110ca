#include "runtime/model/llama_weights.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/model/model.h"
#include "runtime/model/tiny_model.h"
#include "tests/model/test_util.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace chunkserve::model {
namespace {

using ::chunkserve::model::testing::RawSafetensors;
using ::chunkserve::model::testing::ReadFileBytes;
using ::chunkserve::model::testing::WriteFileBytes;
using ::chunkserve::testing::StatusIs;
using ::chunkserve::testing::TempDir;
using ::testing::AllOf;
using ::testing::HasSubstr;
using Json = nlohmann::json;

TinyModelOptions Small() {
  TinyModelOptions o;
  o.vocab_size = 64;
  o.hidden_size = 32;
  o.num_layers = 2;
  o.num_qo_heads = 4;
  o.num_kv_heads = 2;
  o.head_dim = 8;
  o.intermediate_size = 48;
  o.max_position_embeddings = 256;
  return o;
}

// Rewrites model.safetensors of `dir` with `edit` applied to its tensor list.
void RewriteTensors(const std::filesystem::path& dir,
                    void (*edit)(std::vector<TensorToWrite>&, std::vector<std::vector<float>>&)) {
  auto store = WeightStore::Open(dir);
  ASSERT_OK(store.status());
  std::vector<TensorToWrite> tensors;
  std::vector<std::vector<float>> extra;
  extra.reserve(16);
  for (const auto& [name, v] : store->tensors()) {
    tensors.push_back({name, v.dtype, {v.shape.begin(), v.shape.end()}, v.bytes()});
  }
  edit(tensors, extra);
  // Write to a new name first: the store still maps the old file.
  ASSERT_OK(WriteSafetensors(dir / "new.safetensors", tensors));
  std::filesystem::rename(dir / "new.safetensors", dir / "model.safetensors");
}

TEST(LlamaWeightsTest, ExpectedTensorsFollowTheConfig) {
  ASSERT_OK_AND_ASSIGN(ModelConfig c, TinyModelConfig(Small()));
  std::vector<ExpectedTensor> t = ExpectedLlamaTensors(c);
  ASSERT_EQ(t.size(), 1u + 2 * 9 + 1 + 1);
  EXPECT_EQ(t.front().name, "model.embed_tokens.weight");
  EXPECT_EQ(t.front().shape, (std::vector<int64_t>{64, 32}));
  EXPECT_EQ(t[2].name, "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(t[2].shape, (std::vector<int64_t>{32, 32}));
  EXPECT_EQ(t[3].shape, (std::vector<int64_t>{16, 32}));  // k_proj: kv_dim 2 * 8
  EXPECT_EQ(t[5].shape, (std::vector<int64_t>{32, 32}));  // o_proj: [hidden, q_dim]
  EXPECT_EQ(t[9].shape, (std::vector<int64_t>{32, 48}));  // down_proj
  EXPECT_EQ(t.back().name, "lm_head.weight");

  c.tie_word_embeddings = true;
  EXPECT_EQ(ExpectedLlamaTensors(c).size(), 1u + 2 * 9 + 1);
  c.qkv_bias = c.o_bias = true;
  EXPECT_EQ(ExpectedLlamaTensors(c).size(), 1u + 2 * 13 + 1);
}

TEST(LlamaWeightsTest, BindsEveryPointer) {
  TempDir dir;
  ASSERT_OK(WriteTinyModel(dir.path(), Small()));
  ASSERT_OK_AND_ASSIGN(LoadedModel m, LoadedModel::Load(dir.path()));
  const LlamaWeights& w = m.weights();
  EXPECT_EQ(w.dtype, DType::kF32);
  ASSERT_EQ(w.layers.size(), 2u);
  EXPECT_EQ(w.embed_tokens, m.store().Find("model.embed_tokens.weight")->data);
  EXPECT_EQ(w.lm_head, m.store().Find("lm_head.weight")->data);
  EXPECT_NE(w.lm_head, w.embed_tokens);
  EXPECT_EQ(w.final_norm, m.store().Find("model.norm.weight")->data);
  for (int i = 0; i < 2; ++i) {
    const LlamaLayerWeights& l = w.layers[i];
    const std::string p = "model.layers." + std::to_string(i) + ".";
    EXPECT_EQ(l.q_proj, m.store().Find(p + "self_attn.q_proj.weight")->data);
    EXPECT_EQ(l.down_proj, m.store().Find(p + "mlp.down_proj.weight")->data);
    for (const void* ptr : {l.input_norm, l.k_proj, l.v_proj, l.o_proj, l.post_attention_norm,
                            l.gate_proj, l.up_proj}) {
      EXPECT_NE(ptr, nullptr);
    }
    EXPECT_EQ(l.q_bias, nullptr);
    EXPECT_EQ(l.o_bias, nullptr);
  }
}

TEST(LlamaWeightsTest, PointersSurviveMovingTheLoadedModel) {
  TempDir dir;
  ASSERT_OK(WriteTinyModel(dir.path(), Small()));
  ASSERT_OK_AND_ASSIGN(LoadedModel m, LoadedModel::Load(dir.path()));
  const void* q = m.weights().layers[1].q_proj;
  LoadedModel moved = std::move(m);
  EXPECT_EQ(moved.weights().layers[1].q_proj, q);
  EXPECT_EQ(moved.store().Find("model.layers.1.self_attn.q_proj.weight")->data, q);
}

TEST(LlamaWeightsTest, TiedModelSharesTheEmbedding) {
  TempDir dir;
  TinyModelOptions o = Small();
  o.tie_word_embeddings = true;
  ASSERT_OK(WriteTinyModel(dir.path(), o));
  ASSERT_OK_AND_ASSIGN(LoadedModel m, LoadedModel::Load(dir.path()));
  EXPECT_EQ(m.weights().lm_head, m.weights().embed_tokens);
  EXPECT_FALSE(m.store().Find("lm_head.weight").has_value());
}

TEST(LlamaWeightsTest, TiedModelMayStillCarryAnLmHead) {
  TempDir dir;
  TinyModelOptions o = Small();
  ASSERT_OK(WriteTinyModel(dir.path(), o));
  ASSERT_OK_AND_ASSIGN(ModelConfig c, LoadModelConfig(dir.path()));
  c.tie_word_embeddings = true;
  WriteFileBytes(dir.path() / "config.json", ModelConfigToJson(c));
  ASSERT_OK_AND_ASSIGN(LoadedModel m, LoadedModel::Load(dir.path()));
  EXPECT_EQ(m.weights().lm_head, m.weights().embed_tokens);
}

TEST(LlamaWeightsTest, Qwen2BindsQkvBiases) {
  TempDir dir;
  TinyModelOptions o = Small();
  o.architecture = Architecture::kQwen2;
  ASSERT_OK(WriteTinyModel(dir.path(), o));
  ASSERT_OK_AND_ASSIGN(LoadedModel m, LoadedModel::Load(dir.path()));
  EXPECT_EQ(m.config().architecture, Architecture::kQwen2);
  for (const LlamaLayerWeights& l : m.weights().layers) {
    EXPECT_NE(l.q_bias, nullptr);
    EXPECT_NE(l.k_bias, nullptr);
    EXPECT_NE(l.v_bias, nullptr);
    EXPECT_EQ(l.o_bias, nullptr);
  }
}

TEST(LlamaWeightsTest, LlamaAttentionBiasBindsAllFourBiases) {
  TempDir dir;
  TinyModelOptions o = Small();
  o.attention_bias = true;
  ASSERT_OK(WriteTinyModel(dir.path(), o));
  ASSERT_OK_AND_ASSIGN(LoadedModel m, LoadedModel::Load(dir.path()));
  EXPECT_NE(m.weights().layers[0].o_bias, nullptr);
  EXPECT_NE(m.weights().layers[0].q_bias, nullptr);
}

TEST(LlamaWeightsTest, MissingTensorIsNamed) {
  TempDir dir;
  ASSERT_OK(WriteTinyModel(dir.path(), Small()));
  RewriteTensors(dir.path(), [](std::vector<TensorToWrite>& t, std::vector<std::vector<float>>&) {
    std::erase_if(
        t, [](const TensorToWrite& x) { return x.name == "model.layers.1.mlp.up_proj.weight"; });
  });
  EXPECT_THAT(LoadedModel::Load(dir.path()),
              StatusIs(StatusCode::kInvalidArgument,
                       AllOf(HasSubstr(dir.path().string()),
                             HasSubstr("missing tensor 'model.layers.1.mlp.up_proj.weight' "
                                       "[48, 32]"))));
}

TEST(LlamaWeightsTest, ShapeMismatchAgainstTheConfigIsNamedAndCounted) {
  TempDir dir;
  ASSERT_OK(WriteTinyModel(dir.path(), Small()));
  ASSERT_OK_AND_ASSIGN(ModelConfig c, LoadModelConfig(dir.path()));
  c.intermediate_size = 64;
  WriteFileBytes(dir.path() / "config.json", ModelConfigToJson(c));
  EXPECT_THAT(LoadedModel::Load(dir.path()),
              StatusIs(StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("tensor 'model.layers.0.mlp.gate_proj.weight' has shape "
                                       "[48, 32], expected [64, 32]"),
                             HasSubstr("(and 5 more problems)"))));
}

TEST(LlamaWeightsTest, UnexpectedTensorIsRejectedUnlessAllowed) {
  TempDir dir;
  ASSERT_OK(WriteTinyModel(dir.path(), Small()));
  RewriteTensors(dir.path(), [](std::vector<TensorToWrite>& t, std::vector<std::vector<float>>& x) {
    x.push_back(std::vector<float>(4, 1.0f));
    const auto bytes = std::as_bytes(std::span<const float>(x.back()));
    t.push_back({"model.layers.0.self_attn.rotary_emb.inv_freq", DType::kF32, {4}, bytes});
    t.push_back({"model.layers.0.extra_norm.weight", DType::kF32, {4}, bytes});
  });
  EXPECT_THAT(LoadedModel::Load(dir.path()),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("unexpected tensor 'model.layers.0.extra_norm.weight'")));
  LoadModelOptions options;
  options.bind.allow_unused_tensors = true;
  EXPECT_OK(LoadedModel::Load(dir.path(), options).status());
}

TEST(LlamaWeightsTest, MixedDTypesAreUnimplemented) {
  TempDir dir;
  ASSERT_OK(WriteTinyModel(dir.path(), Small()));
  RewriteTensors(dir.path(), [](std::vector<TensorToWrite>& t, std::vector<std::vector<float>>& x) {
    for (TensorToWrite& w : t) {
      if (w.name != "model.norm.weight") continue;
      x.push_back(std::vector<float>(16));  // 32 bf16 values in 16 floats' bytes
      w.dtype = DType::kBF16;
      w.data = std::as_bytes(std::span<const float>(x.back()));
    }
  });
  EXPECT_THAT(LoadedModel::Load(dir.path()),
              StatusIs(StatusCode::kUnimplemented,
                       HasSubstr("mixed weight dtypes: tensor 'model.norm.weight' is BF16")));
}

TEST(LlamaWeightsTest, MisalignedTensorIsUnimplemented) {
  // A hand-made file whose F32 tensor starts 2 bytes into the data section.
  TempDir dir;
  ASSERT_OK_AND_ASSIGN(ModelConfig c, TinyModelConfig(Small()));
  c.num_layers = 1;
  Json header = Json::object();
  uint64_t offset = 2;  // two bytes of padding first
  for (const ExpectedTensor& t : ExpectedLlamaTensors(c)) {
    uint64_t bytes = 4;
    for (int64_t d : t.shape) bytes *= static_cast<uint64_t>(d);
    header[t.name] = {
        {"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  while ((8 + text.size()) % 8 != 0) text += ' ';
  WriteFileBytes(dir.path() / "model.safetensors", RawSafetensors(text, std::string(offset, '\0')));
  WriteFileBytes(dir.path() / "config.json", ModelConfigToJson(c));
  EXPECT_THAT(LoadedModel::Load(dir.path()),
              StatusIs(StatusCode::kUnimplemented, HasSubstr("not aligned")));
}

}  // namespace
}  // namespace chunkserve::model
