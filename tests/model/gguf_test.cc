#include "runtime/model/gguf.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "tests/model/gguf_test_util.h"
#include "tests/model/test_util.h"
#include "tests/testing/model_cache.h"

namespace chunkserve::model {
namespace {

using testing::AsU8;
using testing::GgufBuilder;

constexpr uint32_t kF32 = static_cast<uint32_t>(GgmlType::kF32);
constexpr uint32_t kQ8_0 = static_cast<uint32_t>(GgmlType::kQ8_0);

std::string Floats(std::vector<float> v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

Result<std::unique_ptr<GgufFile>> ParseBytes(const std::string& bytes) {
  return GgufFile::Parse(AsU8(bytes), "test.gguf");
}

// Expects InvalidArgument whose message contains every fragment.
void ExpectInvalid(const std::string& bytes, std::vector<std::string> fragments) {
  auto f = ParseBytes(bytes);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), StatusCode::kInvalidArgument) << f.status();
  const std::string message(f.status().message());
  EXPECT_TRUE(message.starts_with("test.gguf: ")) << message;
  for (const std::string& fragment : fragments) {
    EXPECT_NE(message.find(fragment), std::string::npos) << message << " lacks " << fragment;
  }
}

TEST(GgufTest, ReadsEveryScalarType) {
  const std::string bytes = GgufBuilder()
                                .Scalar<uint8_t>("u8", GgufBuilder::kU8, 200)
                                .Scalar<int8_t>("i8", GgufBuilder::kI8, -100)
                                .Scalar<uint16_t>("u16", GgufBuilder::kU16, 60000)
                                .Scalar<int16_t>("i16", GgufBuilder::kI16, -30000)
                                .Scalar<uint32_t>("u32", GgufBuilder::kU32, 4000000000u)
                                .Scalar<int32_t>("i32", GgufBuilder::kI32, -2000000000)
                                .Scalar<uint64_t>("u64", GgufBuilder::kU64, 1ull << 62)
                                .Scalar<int64_t>("i64", GgufBuilder::kI64, -(1ll << 62))
                                .Scalar<float>("f32", GgufBuilder::kF32, 1.5f)
                                .Scalar<double>("f64", GgufBuilder::kF64, -2.25)
                                .Scalar<uint8_t>("yes", GgufBuilder::kBool, 1)
                                .Scalar<uint8_t>("no", GgufBuilder::kBool, 0)
                                .String("s", "héllo")
                                .String("empty", "")
                                .Build();
  auto f = ParseBytes(bytes);
  ASSERT_TRUE(f.ok()) << f.status();
  const GgufFile& g = **f;
  EXPECT_EQ(g.version(), 3u);
  EXPECT_EQ(g.keys().size(), 14u);
  EXPECT_EQ(g.keys()[0], "u8");
  EXPECT_EQ(*g.GetInt("u8"), 200);
  EXPECT_EQ(*g.GetInt("i8"), -100);
  EXPECT_EQ(*g.GetInt("u16"), 60000);
  EXPECT_EQ(*g.GetInt("i16"), -30000);
  EXPECT_EQ(*g.GetInt("u32"), 4000000000ll);
  EXPECT_EQ(*g.GetInt("i32"), -2000000000);
  EXPECT_EQ(*g.GetInt("u64"), 1ll << 62);
  EXPECT_EQ(*g.GetInt("i64"), -(1ll << 62));
  EXPECT_EQ(*g.GetFloat("f32"), 1.5);
  EXPECT_EQ(*g.GetFloat("f64"), -2.25);
  EXPECT_TRUE(*g.GetBool("yes"));
  EXPECT_FALSE(*g.GetBool("no"));
  EXPECT_EQ(*g.GetString("s"), "héllo");
  EXPECT_EQ(*g.GetString("empty"), "");
  EXPECT_EQ(*g.Type("f64"), GgufValueType::kFloat64);
  EXPECT_TRUE(g.Has("s"));
  EXPECT_FALSE(g.Has("t"));
  EXPECT_TRUE(g.tensors().empty());
}

TEST(GgufTest, ReadsArrays) {
  const std::string bytes =
      GgufBuilder()
          .StringArray("tokens", {"a", "", "<|im_end|>"})
          .Array<int32_t>("types", GgufBuilder::kI32, {1, -2, 3})
          .Array<uint64_t>("big", GgufBuilder::kU64, {0, 1ull << 40})
          .Array<float>("scores", GgufBuilder::kF32, {0.5f, -1.0f})
          .Array<double>("doubles", GgufBuilder::kF64, {0.25})
          .Array<int32_t>("none", GgufBuilder::kI32, {})
          .Build();
  auto f = ParseBytes(bytes);
  ASSERT_TRUE(f.ok()) << f.status();
  const GgufFile& g = **f;
  EXPECT_EQ(*g.GetStringArray("tokens"), (std::vector<std::string>{"a", "", "<|im_end|>"}));
  EXPECT_EQ(*g.GetIntArray("types"), (std::vector<int64_t>{1, -2, 3}));
  EXPECT_EQ(*g.GetIntArray("big"), (std::vector<int64_t>{0, 1ll << 40}));
  EXPECT_EQ(*g.GetFloatArray("scores"), (std::vector<float>{0.5f, -1.0f}));
  EXPECT_EQ(*g.GetFloatArray("doubles"), (std::vector<float>{0.25f}));
  EXPECT_TRUE(g.GetIntArray("none")->empty());
  EXPECT_EQ(*g.ArrayLength("tokens"), 3u);
  EXPECT_EQ(*g.ArrayType("types"), GgufValueType::kInt32);
}

TEST(GgufTest, VersionTwoIsAccepted) {
  auto f = ParseBytes(GgufBuilder().Version(2).String("a", "b").Build());
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->version(), 2u);
}

TEST(GgufTest, WrongTypesAndMissingKeysNameTheKey) {
  const std::string bytes = GgufBuilder()
                                .String("s", "x")
                                .Scalar<uint64_t>("huge", GgufBuilder::kU64, ~0ull)
                                .Array<int32_t>("ints", GgufBuilder::kI32, {1})
                                .Array<uint64_t>("huge_ints", GgufBuilder::kU64, {~0ull})
                                .Build();
  auto f = ParseBytes(bytes);
  ASSERT_TRUE(f.ok()) << f.status();
  const GgufFile& g = **f;
  EXPECT_EQ(g.GetInt("missing").status().code(), StatusCode::kNotFound);
  EXPECT_NE(g.GetInt("missing").status().message().find("'missing'"), std::string::npos);
  EXPECT_EQ(g.GetInt("s").status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(g.GetInt("s").status().message().find("test.gguf: key 's'"), std::string::npos);
  EXPECT_EQ(g.GetFloat("s").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(g.GetBool("s").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(g.GetString("ints").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(g.GetStringArray("ints").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(g.GetFloatArray("ints").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(g.GetIntArray("s").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(g.GetInt("huge").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(g.GetIntArray("huge_ints").status().code(), StatusCode::kInvalidArgument);
}

TEST(GgufTest, TensorsCarryShapeTypeAndData) {
  std::string q8(2 * 34, '\x01');
  const std::string bytes = GgufBuilder()
                                .Tensor("norm", kF32, {3}, Floats({1, 2, 3}))
                                .Tensor("w", kQ8_0, {32, 2}, q8)
                                .Build();
  auto f = ParseBytes(bytes);
  ASSERT_TRUE(f.ok()) << f.status();
  const GgufFile& g = **f;
  ASSERT_EQ(g.tensors().size(), 2u);
  EXPECT_EQ(g.alignment(), kGgufDefaultAlignment);
  const GgufTensorInfo* norm = g.FindTensor("norm");
  ASSERT_NE(norm, nullptr);
  EXPECT_EQ(norm->type, GgmlType::kF32);
  EXPECT_EQ(norm->dims, (std::vector<int64_t>{3}));
  EXPECT_EQ(norm->size_bytes, 12u);
  float first;
  std::memcpy(&first, norm->data, 4);
  EXPECT_EQ(first, 1.0f);
  const GgufTensorInfo* w = *g.GetTensor("w");
  EXPECT_EQ(w->dims, (std::vector<int64_t>{32, 2}));
  EXPECT_EQ(w->num_elements(), 64);
  EXPECT_EQ(w->size_bytes, 68u);
  EXPECT_EQ(w->offset, 32u);  // after 12 bytes padded to 32
  EXPECT_EQ(g.GetTensor("x").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(GgmlTypeName(w->type), "Q8_0");
}

TEST(GgufTest, HonoursGeneralAlignment) {
  const std::string bytes = GgufBuilder()
                                .Alignment(64)
                                .Tensor("a", kF32, {3}, Floats({1, 2, 3}))
                                .Tensor("b", kF32, {1}, Floats({4}))
                                .Build();
  auto f = ParseBytes(bytes);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->alignment(), 64u);
  EXPECT_EQ((*f)->data_offset() % 64, 0u);
  EXPECT_EQ((*f)->FindTensor("b")->offset, 64u);
}

TEST(GgufTest, RejectsBadAlignment) {
  ExpectInvalid(GgufBuilder().Alignment(24, false).Scalar<uint32_t>("general.alignment",
                                                                    GgufBuilder::kU32, 24)
                    .Build(),
                {"general.alignment"});
  ExpectInvalid(GgufBuilder().String("general.alignment", "32").Build(), {"general.alignment"});
  ExpectInvalid(
      GgufBuilder().Scalar<uint32_t>("general.alignment", GgufBuilder::kU32, 0).Build(),
      {"general.alignment"});
}

TEST(GgufTest, RejectsBadMagicAndVersions) {
  std::string bytes = GgufBuilder().Build();
  bytes[0] = 'X';
  ExpectInvalid(bytes, {"bad magic"});
  ExpectInvalid(GgufBuilder().Version(1).Build(), {"version 1"});
  ExpectInvalid(GgufBuilder().Version(4).Build(), {"version 4"});
  ExpectInvalid(GgufBuilder().Version(0x03000000).Build(), {"big-endian"});
  ExpectInvalid("", {"too short"});
  ExpectInvalid("GGU", {"too short"});
}

TEST(GgufTest, RejectsEveryTruncation) {
  const std::string bytes = GgufBuilder()
                                .String("name", "abc")
                                .StringArray("tokens", {"x", "yz"})
                                .Array<float>("scores", GgufBuilder::kF32, {1, 2})
                                .Tensor("t", kF32, {4}, Floats({1, 2, 3, 4}))
                                .Build();
  ASSERT_TRUE(ParseBytes(bytes).ok());
  for (size_t n = 0; n < bytes.size(); ++n) {
    auto f = ParseBytes(bytes.substr(0, n));
    EXPECT_FALSE(f.ok()) << "prefix of " << n << " bytes parsed";
    EXPECT_EQ(f.status().code(), StatusCode::kInvalidArgument) << n;
  }
}

TEST(GgufTest, HugeCountsAreRejectedBeforeAllocating) {
  // Each would ask for ~2^60 entries: the bound by the remaining bytes must reject them first.
  ExpectInvalid(GgufBuilder().KvCount(1ull << 60).Build(), {"kv_count"});
  ExpectInvalid(GgufBuilder().TensorCount(1ull << 60).Build(), {"tensor_count"});
  ExpectInvalid(
      GgufBuilder().Array<int32_t>("a", GgufBuilder::kI32, {1}, 1ull << 60).Build(),
      {"key 'a'", "cannot fit"});
  ExpectInvalid(GgufBuilder().Array<int32_t>("a", GgufBuilder::kString, {}, ~0ull).Build(),
                {"key 'a'", "strings cannot fit"});
  std::string key_len = "GGUF";
  for (uint32_t v : {3u, 0u, 0u, 1u, 0u}) key_len.append(reinterpret_cast<char*>(&v), 4);
  const uint64_t huge = ~0ull;
  key_len.append(reinterpret_cast<const char*>(&huge), 8);
  key_len.append(16, '\0');
  ExpectInvalid(key_len, {"truncated in the key"});
}

TEST(GgufTest, RejectsMalformedValues) {
  ExpectInvalid(GgufBuilder().Scalar<uint32_t>("k", 13, 0).Build(), {"key 'k'", "value type 13"});
  ExpectInvalid(GgufBuilder().Array<int32_t>("k", GgufBuilder::kArray, {}).Build(),
                {"key 'k'", "arrays of arrays"});
  ExpectInvalid(GgufBuilder().String("k", "a").String("k", "b").Build(), {"'k' appears twice"});
  ExpectInvalid(GgufBuilder().String("", "a").Build(), {"empty key"});
}

TEST(GgufTest, RejectsMalformedTensors) {
  const std::string f4 = Floats({1, 2, 3, 4});
  ExpectInvalid(GgufBuilder().Tensor("t", 99, {4}, f4).Build(), {"tensor 't'", "ggml type 99"});
  ExpectInvalid(GgufBuilder().Tensor("t", kF32, {}, f4).Build(), {"tensor 't'", "n_dims 0"});
  ExpectInvalid(GgufBuilder().Tensor("t", kF32, {1, 1, 1, 1, 4}, f4).Build(), {"n_dims 5"});
  ExpectInvalid(GgufBuilder().Tensor("t", kQ8_0, {16}, std::string(34, '\0')).Build(),
                {"tensor 't'", "block size 32"});
  ExpectInvalid(GgufBuilder().Tensor("t", kF32, {1ull << 62, 1ull << 62}, f4).Build(),
                {"tensor 't'", "overflows"});
  ExpectInvalid(GgufBuilder().Tensor("t", kF32, {~0ull}, f4).Build(), {"tensor 't'", "dim 0"});
  ExpectInvalid(GgufBuilder().Tensor("t", kF32, {8}, f4).Build(),
                {"tensor 't'", "run past the data section"});
  ExpectInvalid(GgufBuilder().Tensor("t", kF32, {4}, f4, 4).Build(),
                {"tensor 't'", "not a multiple of the alignment 32"});
  ExpectInvalid(GgufBuilder().Tensor("t", kF32, {4}, f4, 1ull << 62).Build(),
                {"tensor 't'", "run past"});
  ExpectInvalid(GgufBuilder().Tensor("t", kF32, {4}, f4).Tensor("t", kF32, {4}, f4).Build(),
                {"'t' appears twice"});
  ExpectInvalid(GgufBuilder().Tensor("", kF32, {4}, f4).Build(), {"empty name"});
}

TEST(GgufTest, RejectsOverlappingTensors) {
  const std::string f16 = Floats(std::vector<float>(16, 1.0f));
  ExpectInvalid(GgufBuilder()
                    .Tensor("a", kF32, {16}, f16, 0)
                    .Tensor("b", kF32, {16}, f16, 32)  // a covers [0, 64)
                    .Build(),
                {"'a' and 'b' overlap"});
  // Reversed order in the file: still found.
  ExpectInvalid(GgufBuilder()
                    .Tensor("b", kF32, {16}, f16, 32)
                    .Tensor("a", kF32, {16}, f16, 0)
                    .Build(),
                {"'a' and 'b' overlap"});
  // Empty tensors own no bytes and may sit anywhere.
  auto f = ParseBytes(GgufBuilder()
                          .Tensor("a", kF32, {16}, f16, 0)
                          .Tensor("e", kF32, {0}, "", 0)
                          .Build());
  EXPECT_TRUE(f.ok()) << f.status();
}

TEST(GgufTest, OpenMapsAFileAndNamesItInErrors) {
  const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) / "gguf_open";
  std::filesystem::create_directories(dir);
  const std::filesystem::path good = dir / "good.gguf";
  testing::WriteFileBytes(
      good, GgufBuilder().String("general.architecture", "llama")
                .Tensor("t", kF32, {2}, Floats({5, 6}))
                .Build());
  auto f = GgufFile::Open(good);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(*(*f)->GetString("general.architecture"), "llama");
  EXPECT_EQ(reinterpret_cast<uintptr_t>((*f)->FindTensor("t")->data) % 32, 0u);

  const std::filesystem::path bad = dir / "bad.gguf";
  testing::WriteFileBytes(bad, "GGUF\x07");
  auto b = GgufFile::Open(bad);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find(bad.string()), std::string::npos) << b.status();
  EXPECT_EQ(GgufFile::Open(dir / "missing.gguf").status().code(), StatusCode::kNotFound);
}

TEST(GgufTest, OpensTheRealSmolLM2File) {
  const auto path = ::chunkserve::testing::CachedModelPath(::chunkserve::testing::kSmolLM2Gguf);
  if (!path.ok()) GTEST_SKIP() << path.status().message();
  auto f = GgufFile::Open(*path);
  ASSERT_TRUE(f.ok()) << f.status();
  const GgufFile& g = **f;
  EXPECT_EQ(g.version(), 3u);
  EXPECT_EQ(*g.GetString("general.architecture"), "llama");
  EXPECT_EQ(*g.GetInt("llama.block_count"), 30);
  EXPECT_EQ(*g.GetFloat("llama.rope.freq_base"), 100000.0);
  EXPECT_EQ(*g.ArrayLength("tokenizer.ggml.tokens"), 49152u);
  EXPECT_EQ(g.GetStringArray("tokenizer.ggml.tokens")->at(2), "<|im_end|>");
  EXPECT_EQ(g.tensors().size(), 272u);
  const GgufTensorInfo* embd = g.FindTensor("token_embd.weight");
  ASSERT_NE(embd, nullptr);
  EXPECT_EQ(embd->type, GgmlType::kQ8_0);
  EXPECT_EQ(embd->dims, (std::vector<int64_t>{576, 49152}));
}

}  // namespace
}  // namespace chunkserve::model
