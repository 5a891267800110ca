#include "runtime/model/tiny_model.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <xxhash.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/model/model.h"
#include "tests/model/test_util.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace chunkserve::model {
namespace {

using ::chunkserve::model::testing::ReadFileBytes;
using ::chunkserve::model::testing::WriteFileBytes;
using ::chunkserve::testing::StatusIs;
using ::chunkserve::testing::TempDir;
using ::testing::HasSubstr;

TinyModelOptions Small() {
  TinyModelOptions o;
  o.seed = 42;
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

std::vector<float> ToFloats(const TensorView& v) {
  std::vector<float> out(static_cast<size_t>(v.num_elements()));
  ConvertToFloat(v.dtype, v.data, out);
  return out;
}

void MeanStd(const std::vector<float>& v, double* mean, double* stddev) {
  double s = 0, s2 = 0;
  for (float x : v) {
    s += x;
    s2 += static_cast<double>(x) * x;
  }
  *mean = s / v.size();
  *stddev = std::sqrt(s2 / v.size() - *mean * *mean);
}

std::map<std::string, std::string> DirectoryBytes(const std::filesystem::path& dir) {
  std::map<std::string, std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    files[e.path().filename().string()] = ReadFileBytes(e.path());
  }
  return files;
}

struct RoundTripCase {
  const char* name;
  DType dtype;
  int shards;
};

void PrintTo(const RoundTripCase& c, std::ostream* os) { *os << c.name; }

class TinyModelRoundTripTest : public ::testing::TestWithParam<RoundTripCase> {};

TEST_P(TinyModelRoundTripTest, WritesAModelThatLoadsBack) {
  TempDir dir;
  TinyModelOptions o = Small();
  o.dtype = GetParam().dtype;
  o.num_shards = GetParam().shards;
  ASSERT_OK(WriteTinyModel(dir.path(), o));
  ASSERT_OK_AND_ASSIGN(LoadedModel m, LoadedModel::Load(dir.path()));
  ASSERT_OK_AND_ASSIGN(ModelConfig expected, TinyModelConfig(o));
  EXPECT_EQ(m.config(), expected);
  EXPECT_EQ(m.config().torch_dtype, o.dtype);
  EXPECT_EQ(m.dtype(), o.dtype);
  EXPECT_EQ(m.store().num_files(), static_cast<size_t>(o.num_shards));
  EXPECT_EQ(m.store().num_tensors(), ExpectedLlamaTensors(expected).size());
  EXPECT_EQ(std::filesystem::exists(dir.path() / "model.safetensors.index.json"), o.num_shards > 1);
  if (o.num_shards > 1) {
    EXPECT_TRUE(std::filesystem::exists(dir.path() / "model-00001-of-00003.safetensors"));
    EXPECT_TRUE(std::filesystem::exists(dir.path() / "model-00003-of-00003.safetensors"));
  }

  // Values are scaled as documented (loose bounds: 2048 samples per tensor at most).
  double mean, stddev;
  MeanStd(ToFloats(*m.store().Find("model.embed_tokens.weight")), &mean, &stddev);
  EXPECT_NEAR(mean, 0.0, 0.1);
  EXPECT_NEAR(stddev, 1.0, 0.1);
  MeanStd(ToFloats(*m.store().Find("model.layers.1.self_attn.q_proj.weight")), &mean, &stddev);
  EXPECT_NEAR(stddev, 1.0 / std::sqrt(32.0), 0.02);
  MeanStd(ToFloats(*m.store().Find("model.layers.0.mlp.down_proj.weight")), &mean, &stddev);
  EXPECT_NEAR(stddev, 1.0 / std::sqrt(48.0), 0.02);
  for (float x : ToFloats(*m.store().Find("model.norm.weight"))) {
    EXPECT_GT(x, 1.0f - 0.2f);
    EXPECT_LT(x, 1.0f + 0.2f);
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, TinyModelRoundTripTest,
                         ::testing::Values(RoundTripCase{"f32_single", DType::kF32, 1},
                                           RoundTripCase{"f16_single", DType::kF16, 1},
                                           RoundTripCase{"bf16_single", DType::kBF16, 1},
                                           RoundTripCase{"f32_sharded", DType::kF32, 3},
                                           RoundTripCase{"f16_sharded", DType::kF16, 3},
                                           RoundTripCase{"bf16_sharded", DType::kBF16, 3}),
                         [](const ::testing::TestParamInfo<RoundTripCase>& info) {
                           return std::string(info.param.name);
                         });

TEST(TinyModelTest, SameSeedGivesIdenticalBytes) {
  TempDir a, b;
  ASSERT_OK(WriteTinyModel(a.path(), Small()));
  ASSERT_OK(WriteTinyModel(b.path(), Small()));
  EXPECT_EQ(DirectoryBytes(a.path()), DirectoryBytes(b.path()));
}

TEST(TinyModelTest, DifferentSeedsGiveDifferentWeightsAndFingerprints) {
  TempDir a, b;
  TinyModelOptions o = Small();
  ASSERT_OK(WriteTinyModel(a.path(), o));
  o.seed = 43;
  ASSERT_OK(WriteTinyModel(b.path(), o));
  EXPECT_EQ(ReadFileBytes(a.path() / "config.json"), ReadFileBytes(b.path() / "config.json"));
  EXPECT_NE(ReadFileBytes(a.path() / "model.safetensors"),
            ReadFileBytes(b.path() / "model.safetensors"));
  ASSERT_OK_AND_ASSIGN(LoadedModel ma, LoadedModel::Load(a.path()));
  ASSERT_OK_AND_ASSIGN(LoadedModel mb, LoadedModel::Load(b.path()));
  EXPECT_NE(ma.fingerprint(), mb.fingerprint());
}

// The writer's output is part of its contract (tests and demos compare against it across
// machines): these hashes change only when the generator is changed on purpose.
TEST(TinyModelTest, OutputIsPinned) {
  TempDir dir;
  ASSERT_OK(WriteTinyModel(dir.path(), Small()));
  const std::string weights = ReadFileBytes(dir.path() / "model.safetensors");
  EXPECT_EQ(XXH3_64bits(weights.data(), weights.size()), 0x59ee278d4ce94fe8ull);
  ASSERT_OK_AND_ASSIGN(LoadedModel m, LoadedModel::Load(dir.path()));
  EXPECT_EQ(m.fingerprint(), 0x2dd16b4d796b7ca7ull);
}

TEST(TinyModelTest, LowPrecisionModelsHoldTheF32ValuesRounded) {
  TempDir f32_dir, f16_dir, bf16_dir;
  TinyModelOptions o = Small();
  ASSERT_OK(WriteTinyModel(f32_dir.path(), o));
  o.dtype = DType::kF16;
  ASSERT_OK(WriteTinyModel(f16_dir.path(), o));
  o.dtype = DType::kBF16;
  ASSERT_OK(WriteTinyModel(bf16_dir.path(), o));
  ASSERT_OK_AND_ASSIGN(WeightStore f32, WeightStore::Open(f32_dir.path()));
  ASSERT_OK_AND_ASSIGN(WeightStore f16, WeightStore::Open(f16_dir.path()));
  ASSERT_OK_AND_ASSIGN(WeightStore bf16, WeightStore::Open(bf16_dir.path()));
  for (const auto& [name, v] : f32.tensors()) {
    const std::vector<float> values = ToFloats(v);
    std::vector<std::byte> half(values.size() * 2), brain(values.size() * 2);
    ConvertFromFloat(values, DType::kF16, half.data());
    ConvertFromFloat(values, DType::kBF16, brain.data());
    ASSERT_EQ(std::memcmp(f16.Find(name)->data, half.data(), half.size()), 0) << name;
    ASSERT_EQ(std::memcmp(bf16.Find(name)->data, brain.data(), brain.size()), 0) << name;
  }
}

TEST(TinyModelTest, TensorValuesDoNotDependOnTheLayerCount) {
  TempDir a, b;
  TinyModelOptions o = Small();
  ASSERT_OK(WriteTinyModel(a.path(), o));
  o.num_layers = 3;
  ASSERT_OK(WriteTinyModel(b.path(), o));
  ASSERT_OK_AND_ASSIGN(WeightStore sa, WeightStore::Open(a.path()));
  ASSERT_OK_AND_ASSIGN(WeightStore sb, WeightStore::Open(b.path()));
  for (const char* name : {"model.embed_tokens.weight", "model.layers.1.mlp.up_proj.weight"}) {
    const TensorView va = *sa.Find(name), vb = *sb.Find(name);
    ASSERT_EQ(va.size_bytes, vb.size_bytes);
    EXPECT_EQ(std::memcmp(va.data, vb.data, va.size_bytes), 0) << name;
  }
}

TEST(TinyModelTest, FingerprintDoesNotDependOnSharding) {
  TempDir single, sharded;
  TinyModelOptions o = Small();
  ASSERT_OK(WriteTinyModel(single.path(), o));
  o.num_shards = 4;
  ASSERT_OK(WriteTinyModel(sharded.path(), o));
  ASSERT_OK_AND_ASSIGN(LoadedModel a, LoadedModel::Load(single.path()));
  ASSERT_OK_AND_ASSIGN(LoadedModel b, LoadedModel::Load(sharded.path()));
  EXPECT_EQ(a.fingerprint(), b.fingerprint());
  EXPECT_EQ(ModelFingerprint(a.config(), a.store(), FingerprintMode::kFull),
            ModelFingerprint(b.config(), b.store(), FingerprintMode::kFull));
}

TEST(TinyModelTest, FingerprintDependsOnDTypeAndConfig) {
  TempDir a, b, c;
  TinyModelOptions o = Small();
  ASSERT_OK(WriteTinyModel(a.path(), o));
  o.dtype = DType::kBF16;
  ASSERT_OK(WriteTinyModel(b.path(), o));
  ASSERT_OK_AND_ASSIGN(LoadedModel ma, LoadedModel::Load(a.path()));
  ASSERT_OK_AND_ASSIGN(LoadedModel mb, LoadedModel::Load(b.path()));
  EXPECT_NE(ma.fingerprint(), mb.fingerprint());
  ModelConfig other = ma.config();
  other.rope_theta = 500000.0;
  EXPECT_NE(ModelFingerprint(other, ma.store()), ma.fingerprint());
}

TEST(TinyModelTest, SampledFingerprintSeesTheSampledBytesAndFullSeesAll) {
  TempDir dir;
  TinyModelOptions o = Small();
  o.vocab_size = 1024;  // embed_tokens: 1024 x 32 f32 = 128 KiB, sampled in three 4 KiB windows
  ASSERT_OK(WriteTinyModel(dir.path(), o));
  uint64_t sampled, full;
  uint64_t embed_offset;
  {
    ASSERT_OK_AND_ASSIGN(LoadedModel m, LoadedModel::Load(dir.path()));
    sampled = m.fingerprint();
    full = ModelFingerprint(m.config(), m.store(), FingerprintMode::kFull);
    ASSERT_OK_AND_ASSIGN(SafetensorsFile f,
                         SafetensorsFile::Open(dir.path() / "model.safetensors"));
    embed_offset = f.header().data_offset() + f.header().Find("model.embed_tokens.weight")->begin;
  }
  const auto path = dir.path() / "model.safetensors";
  std::string bytes = ReadFileBytes(path);
  // Outside the samples (at 20 KiB): only the full fingerprint changes.
  bytes[embed_offset + 20 * 1024] ^= 1;
  WriteFileBytes(path, bytes);
  {
    ASSERT_OK_AND_ASSIGN(LoadedModel m, LoadedModel::Load(dir.path()));
    EXPECT_EQ(m.fingerprint(), sampled);
    EXPECT_NE(ModelFingerprint(m.config(), m.store(), FingerprintMode::kFull), full);
  }
  // Inside the middle sample (at 64 KiB).
  bytes[embed_offset + 64 * 1024] ^= 1;
  WriteFileBytes(path, bytes);
  ASSERT_OK_AND_ASSIGN(LoadedModel m, LoadedModel::Load(dir.path()));
  EXPECT_NE(m.fingerprint(), sampled);
}

TEST(TinyModelTest, RewritingADirectoryLeavesOneLayout) {
  TempDir dir;
  TinyModelOptions o = Small();
  o.num_shards = 2;
  ASSERT_OK(WriteTinyModel(dir.path(), o));
  o.num_shards = 1;
  o.num_layers = 3;
  ASSERT_OK(WriteTinyModel(dir.path(), o));
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "model.safetensors.index.json"));
  ASSERT_OK_AND_ASSIGN(LoadedModel m, LoadedModel::Load(dir.path()));
  EXPECT_EQ(m.weights().layers.size(), 3u);
  o.num_shards = 2;
  ASSERT_OK(WriteTinyModel(dir.path(), o));
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "model.safetensors"));
}

TEST(TinyModelTest, RejectsInvalidOptions) {
  TempDir dir;
  TinyModelOptions o = Small();
  o.num_kv_heads = 3;
  EXPECT_THAT(WriteTinyModel(dir.path(), o),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("tiny model options: num_key_value_heads (3) must divide")));
  o = Small();
  o.num_shards = 0;
  EXPECT_THAT(WriteTinyModel(dir.path(), o),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("num_shards must be in [1, 21]")));
  o.num_shards = 22;
  EXPECT_THAT(WriteTinyModel(dir.path(), o), StatusIs(StatusCode::kInvalidArgument));
  o = Small();
  o.head_dim = 7;
  EXPECT_THAT(WriteTinyModel(dir.path(), o), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

TEST(TinyModelTest, DefaultIsTheDocumentedDemoModel) {
  ASSERT_OK_AND_ASSIGN(ModelConfig c, TinyModelConfig(TinyModelOptions::Default()));
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.num_qo_heads / c.num_kv_heads, 4);
  int64_t params = 0;
  for (const ExpectedTensor& t : ExpectedLlamaTensors(c)) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    params += n;
  }
  EXPECT_GT(params, 3'500'000);
  EXPECT_LT(params, 4'500'000);
  TempDir dir;
  ASSERT_OK(WriteTinyModel(dir.path(), TinyModelOptions::Default()));
  ASSERT_OK_AND_ASSIGN(LoadedModel m, LoadedModel::Load(dir.path()));
  EXPECT_EQ(m.config().MaxContextLength(), 8192);
}

}  // namespace
}  // namespace chunkserve::model
