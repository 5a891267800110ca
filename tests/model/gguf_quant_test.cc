#include "runtime/model/gguf_quant.h"

#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/model/dtype.h"
#include "tests/model/test_util.h"

namespace chunkserve::model {
namespace {

struct ReferenceCase {
  std::string type;
  std::vector<uint8_t> bytes;
  std::vector<float> values;
};

std::vector<ReferenceCase> LoadReference() {
  const std::filesystem::path path = std::filesystem::path(CHUNKSERVE_SOURCE_DIR) / "tests" /
                                     "model" / "gguf_quant_reference.json";
  const nlohmann::json j = nlohmann::json::parse(testing::ReadFileBytes(path));
  std::vector<ReferenceCase> cases;
  for (const auto& c : j) {
    ReferenceCase rc;
    rc.type = c["type"].get<std::string>();
    const std::string hex = c["bytes"].get<std::string>();
    for (size_t i = 0; i + 1 < hex.size(); i += 2) {
      rc.bytes.push_back(static_cast<uint8_t>(std::stoul(hex.substr(i, 2), nullptr, 16)));
    }
    for (const auto& v : c["values"]) {
      rc.values.push_back(
          std::bit_cast<float>(static_cast<uint32_t>(std::stoul(v.get<std::string>(), nullptr, 16))));
    }
    cases.push_back(std::move(rc));
  }
  return cases;
}

GgmlType TypeByName(const std::string& name) {
  for (uint32_t t = 0; t < 64; ++t) {
    const auto info = GgmlTypeInfo(t);
    if (info.has_value() && info->name == name) return static_cast<GgmlType>(t);
  }
  ADD_FAILURE() << "unknown type " << name;
  return GgmlType::kF32;
}

class GgufQuantReferenceTest : public ::testing::TestWithParam<std::string> {};

// Against the gguf Python package (make_gguf_quant_reference.py). The same products in the same
// order give the same floats, but a compiler may contract a * b - c into one fused multiply-add
// (one rounding instead of two), so equality is asked up to 2 ulps of the value's scale.
TEST_P(GgufQuantReferenceTest, MatchesGgufPythonPackage) {
  for (const ReferenceCase& c : LoadReference()) {
    if (c.type != GetParam()) continue;
    const GgmlType type = TypeByName(c.type);
    ASSERT_TRUE(CanDequantize(type));
    std::vector<float> out(c.values.size());
    ASSERT_TRUE(DequantizeGgml(type, c.bytes, out).ok());
    float scale = 0;
    for (float v : c.values) scale = std::max(scale, std::abs(v));
    for (size_t i = 0; i < out.size(); ++i) {
      EXPECT_NEAR(out[i], c.values[i], 2 * scale * 1.2e-7f) << c.type << " element " << i;
    }
    return;
  }
  FAIL() << "no reference case for " << GetParam();
}

INSTANTIATE_TEST_SUITE_P(Types, GgufQuantReferenceTest,
                         ::testing::Values("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0",
                                           "Q5_1", "Q4_K", "Q5_K", "Q6_K"),
                         [](const auto& info) { return info.param; });

// ---- Independent scalar checks: blocks built by hand whose values follow from the layout.

void PutHalf(std::vector<uint8_t>& b, size_t at, float v) {
  const uint16_t h = FloatToHalf(v);
  b[at] = static_cast<uint8_t>(h & 0xff);
  b[at + 1] = static_cast<uint8_t>(h >> 8);
}

TEST(GgufQuantTest, Q8_0IsScaleTimesSignedBytes) {
  std::vector<uint8_t> b(34);
  PutHalf(b, 0, 0.5f);
  for (int i = 0; i < 32; ++i) b[2 + i] = static_cast<uint8_t>(static_cast<int8_t>(i - 16));
  std::vector<float> y(32);
  ASSERT_TRUE(DequantizeGgml(GgmlType::kQ8_0, b, y).ok());
  for (int i = 0; i < 32; ++i) EXPECT_EQ(y[i], 0.5f * (i - 16)) << i;
}

TEST(GgufQuantTest, Q4_0AndQ4_1PutLowNibblesFirst) {
  std::vector<uint8_t> b(20);
  PutHalf(b, 0, 2.0f);
  PutHalf(b, 2, -1.0f);                                          // Q4_1's min
  for (int j = 0; j < 16; ++j) b[4 + j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  std::vector<float> y(32);
  ASSERT_TRUE(DequantizeGgml(GgmlType::kQ4_1, b, y).ok());
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], 2.0f * j - 1.0f) << j;
    EXPECT_EQ(y[j + 16], 2.0f * (15 - j) - 1.0f) << j;
  }
  std::vector<uint8_t> q40(18);
  PutHalf(q40, 0, 2.0f);
  for (int j = 0; j < 16; ++j) q40[2 + j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  ASSERT_TRUE(DequantizeGgml(GgmlType::kQ4_0, q40, y).ok());
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], 2.0f * (j - 8)) << j;
    EXPECT_EQ(y[j + 16], 2.0f * (7 - j)) << j;
  }
}

// Q4_K with every sub-block scale s + 1 and min s (s = sub-block index), d = 1, dmin = 0.5:
// element 32s + l of the 256 is (s + 1) * nibble - 0.5 * s.
TEST(GgufQuantTest, Q4_KUsesSixBitScalesPerSubBlock) {
  std::vector<uint8_t> b(144);
  PutHalf(b, 0, 1.0f);
  PutHalf(b, 2, 0.5f);
  uint8_t sc[8], mn[8];
  for (int s = 0; s < 8; ++s) {
    sc[s] = static_cast<uint8_t>(s + 1 + (s >= 4 ? 16 : 0));  // exercise the top two bits
    mn[s] = static_cast<uint8_t>(s + (s >= 4 ? 32 : 0));
  }
  uint8_t* scales = b.data() + 4;
  for (int s = 0; s < 4; ++s) {
    scales[s] = static_cast<uint8_t>(sc[s] | ((sc[s + 4] >> 4) << 6));
    scales[s + 4] = static_cast<uint8_t>(mn[s] | ((mn[s + 4] >> 4) << 6));
    scales[s + 8] = static_cast<uint8_t>((sc[s + 4] & 0x0f) | ((mn[s + 4] & 0x0f) << 4));
  }
  for (int i = 0; i < 128; ++i) b[16 + i] = static_cast<uint8_t>((i % 16) | ((15 - i % 16) << 4));
  std::vector<float> y(256);
  ASSERT_TRUE(DequantizeGgml(GgmlType::kQ4_K, b, y).ok());
  for (int s = 0; s < 8; ++s) {
    for (int l = 0; l < 32; ++l) {
      const int byte = 32 * (s / 2) + l;
      const int nibble = s % 2 == 0 ? byte % 16 : 15 - byte % 16;
      EXPECT_EQ(y[32 * s + l], static_cast<float>(sc[s]) * nibble - 0.5f * mn[s]) << s << " " << l;
    }
  }
}

// Q6_K with d = 1, scales 1, qh = 0: element l + 32k of each half is nibble - 32.
TEST(GgufQuantTest, Q6_KLowBitsWithoutHighBitsAreOffsetBy32) {
  std::vector<uint8_t> b(210);
  for (int i = 0; i < 128; ++i) b[i] = static_cast<uint8_t>(0x5a);  // low nibble 10, high 5
  for (int i = 0; i < 16; ++i) b[192 + i] = 1;
  PutHalf(b, 208, 1.0f);
  std::vector<float> y(256);
  ASSERT_TRUE(DequantizeGgml(GgmlType::kQ6_K, b, y).ok());
  for (int i = 0; i < 256; ++i) EXPECT_EQ(y[i], (i % 128) < 64 ? 10 - 32 : 5 - 32) << i;
  b[128] = 0x03;  // qh[0] bits 0..1: element 0 gains 48
  ASSERT_TRUE(DequantizeGgml(GgmlType::kQ6_K, b, y).ok());
  EXPECT_EQ(y[0], 10 + 48 - 32);
}

TEST(GgufQuantTest, RejectsWrongSizesAndUnsupportedTypes) {
  std::vector<uint8_t> b(34);
  std::vector<float> y(32);
  EXPECT_EQ(DequantizeGgml(GgmlType::kQ8_0, std::span(b).first(33), y).code(),
            StatusCode::kInvalidArgument);
  std::vector<float> y16(16);
  EXPECT_EQ(DequantizeGgml(GgmlType::kQ8_0, b, y16).code(), StatusCode::kInvalidArgument);
  const Status s = DequantizeGgml(static_cast<GgmlType>(16), b, y);  // IQ2_XXS
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented);
  EXPECT_NE(s.message().find("IQ2_XXS"), std::string::npos) << s;
  EXPECT_FALSE(CanDequantize(GgmlType::kQ8_K));
}

}  // namespace
}  // namespace chunkserve::model
