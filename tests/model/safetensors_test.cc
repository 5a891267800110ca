#include "runtime/model/safetensors.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "tests/model/test_util.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace chunkserve::model {
namespace {

using ::chunkserve::model::testing::AsBytes;
using ::chunkserve::model::testing::RawSafetensors;
using ::chunkserve::model::testing::ReadFileBytes;
using ::chunkserve::model::testing::WriteFileBytes;
using ::chunkserve::testing::StatusIs;
using ::chunkserve::testing::TempDir;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

template <typename T>
std::span<const std::byte> BytesOf(const std::vector<T>& v) {
  return std::as_bytes(std::span<const T>(v));
}

TEST(SafetensorsTest, WriteThenOpenRoundTripsEveryDType) {
  TempDir dir;
  const std::vector<float> a = {1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f};
  const std::vector<uint16_t> b = {FloatToHalf(0.5f), FloatToHalf(-1.0f), FloatToHalf(3.0f)};
  const std::vector<uint16_t> c = {FloatToBf16(7.0f)};
  const std::vector<TensorToWrite> tensors = {
      {"b.half", DType::kF16, {3}, BytesOf(b)},
      {"a.float", DType::kF32, {2, 3}, BytesOf(a)},
      {"c.bf16", DType::kBF16, {}, BytesOf(c)},  // a scalar
      {"d.empty", DType::kF32, {0, 4}, {}},
  };
  const auto path = dir.path() / "t.safetensors";
  ASSERT_OK(WriteSafetensors(path, tensors, {{"format", "pt"}}));

  ASSERT_OK_AND_ASSIGN(SafetensorsFile file, SafetensorsFile::Open(path));
  EXPECT_EQ(file.header().data_offset() % 8, 0u);
  EXPECT_THAT(file.header().metadata,
              ElementsAre(std::pair<const std::string, std::string>("format", "pt")));
  ASSERT_EQ(file.tensors().size(), 4u);
  EXPECT_EQ(file.tensors()[0].name, "a.float");  // sorted by name

  ASSERT_OK_AND_ASSIGN(TensorView va, file.Get("a.float"));
  EXPECT_EQ(va.dtype, DType::kF32);
  EXPECT_THAT(va.shape, ElementsAre(2, 3));
  EXPECT_EQ(va.num_elements(), 6);
  ASSERT_EQ(va.size_bytes, 24u);
  EXPECT_EQ(std::memcmp(va.data, a.data(), 24), 0);
  // Laid out by decreasing element size: every tensor is aligned to its element size.
  EXPECT_EQ(reinterpret_cast<uintptr_t>(va.data) % 4, 0u);

  ASSERT_OK_AND_ASSIGN(TensorView vb, file.Get("b.half"));
  EXPECT_EQ(vb.dtype, DType::kF16);
  EXPECT_EQ(std::memcmp(vb.data, b.data(), 6), 0);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(vb.data) % 2, 0u);

  ASSERT_OK_AND_ASSIGN(TensorView vc, file.Get("c.bf16"));
  EXPECT_TRUE(vc.shape.empty());
  EXPECT_EQ(vc.num_elements(), 1);

  ASSERT_OK_AND_ASSIGN(TensorView vd, file.Get("d.empty"));
  EXPECT_EQ(vd.num_elements(), 0);
  EXPECT_EQ(vd.size_bytes, 0u);

  EXPECT_THAT(file.Get("nope"), StatusIs(StatusCode::kNotFound,
                                         AllOf(HasSubstr("t.safetensors"), HasSubstr("'nope'"))));
  EXPECT_FALSE(file.Find("nope").has_value());
  // No temporary file is left behind.
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()),
                          std::filesystem::directory_iterator()),
            1);
}

TEST(SafetensorsTest, ViewsSurviveMovingTheFile) {
  TempDir dir;
  const std::vector<float> a = {1.0f, 2.0f};
  ASSERT_OK(WriteSafetensors(dir.path() / "m.safetensors",
                             std::vector<TensorToWrite>{{"x", DType::kF32, {2}, BytesOf(a)}}));
  ASSERT_OK_AND_ASSIGN(SafetensorsFile file, SafetensorsFile::Open(dir.path() / "m.safetensors"));
  ASSERT_OK_AND_ASSIGN(TensorView before, file.Get("x"));
  SafetensorsFile moved = std::move(file);
  ASSERT_OK_AND_ASSIGN(TensorView after, moved.Get("x"));
  EXPECT_EQ(before.data, after.data);
  EXPECT_EQ(before.name, "x");
}

TEST(SafetensorsTest, ParsesAHandWrittenHeaderWithOffsetsOutOfOrder) {
  const std::string header =
      R"({"second":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
      R"("first":{"dtype":"BF16","shape":[2],"data_offsets":[4,8]},"__metadata__":{"k":"v"}})";
  const std::string file = RawSafetensors(header + "  ", std::string(8, '\0'));
  ASSERT_OK_AND_ASSIGN(SafetensorsHeader h, ParseSafetensorsHeader(AsBytes(file), "hand"));
  ASSERT_EQ(h.tensors.size(), 2u);
  EXPECT_EQ(h.tensors[0].name, "first");
  EXPECT_EQ(h.tensors[0].begin, 4u);
  EXPECT_EQ(h.header_size, header.size() + 2);
  EXPECT_EQ(h.data_size, 8u);
  EXPECT_EQ(h.metadata.at("k"), "v");
  EXPECT_NE(h.Find("second"), nullptr);
  EXPECT_EQ(h.Find("third"), nullptr);
}

TEST(SafetensorsTest, AcceptsGapsBetweenTensors) {
  const std::string header = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                             R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})";
  EXPECT_OK(ParseSafetensorsHeader(AsBytes(RawSafetensors(header, std::string(16, 'x'))), "f"));
}

// A tensor without a name cannot be looked up, and EncodeSafetensors refuses to write one: the
// parser refuses it too (the fuzzer's round-trip oracle found the two disagreeing).
TEST(SafetensorsTest, AnEmptyTensorNameIsInvalid) {
  const std::string header = R"({"":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]}})";
  EXPECT_THAT(ParseSafetensorsHeader(AsBytes(RawSafetensors(header, std::string(4, 'x'))), "f"),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("empty name")));
}

TEST(SafetensorsTest, EmptyHeaderObjectIsAValidEmptyFile) {
  ASSERT_OK_AND_ASSIGN(SafetensorsHeader h,
                       ParseSafetensorsHeader(AsBytes(RawSafetensors("{}", "")), "f"));
  EXPECT_TRUE(h.tensors.empty());
}

// Corruption cases: raw file bytes, the code, and a message fragment. Every message also starts
// with the file name ("bad.safetensors: ").
struct CorruptCase {
  const char* name;
  std::string bytes;
  StatusCode code;
  const char* message;
};

std::string OneTensor(const std::string& entry, size_t data_bytes) {
  return RawSafetensors(R"({"w":)" + entry + "}", std::string(data_bytes, '\0'));
}

void PrintTo(const CorruptCase& c, std::ostream* os) { *os << c.name; }

class SafetensorsCorruptionTest : public ::testing::TestWithParam<CorruptCase> {};

TEST_P(SafetensorsCorruptionTest, IsRejectedInMemory) {
  const CorruptCase& c = GetParam();
  EXPECT_THAT(ParseSafetensorsHeader(AsBytes(c.bytes), "bad.safetensors"),
              StatusIs(c.code, AllOf(HasSubstr("bad.safetensors: "), HasSubstr(c.message))));
}

TEST_P(SafetensorsCorruptionTest, IsRejectedFromDisk) {
  const CorruptCase& c = GetParam();
  TempDir dir;
  const auto path = dir.path() / "bad.safetensors";
  WriteFileBytes(path, c.bytes);
  EXPECT_THAT(SafetensorsFile::Open(path),
              StatusIs(c.code, AllOf(HasSubstr(path.string()), HasSubstr(c.message))));
}

constexpr StatusCode kDataLoss = StatusCode::kDataLoss;
constexpr StatusCode kInvalid = StatusCode::kInvalidArgument;

INSTANTIATE_TEST_SUITE_P(
    Cases, SafetensorsCorruptionTest,
    ::testing::Values(
        CorruptCase{"empty_file", "", kDataLoss, "file is 0 bytes"},
        CorruptCase{"seven_bytes", std::string(7, '\0'), kDataLoss, "file is 7 bytes"},
        CorruptCase{"header_length_past_eof", RawSafetensors("{}", "", 100), kDataLoss,
                    "header length 100 runs past the end of the file (2 bytes"},
        CorruptCase{"header_length_huge", RawSafetensors("{}", "", ~0ull), kDataLoss,
                    "exceeds the 100000000-byte limit"},
        CorruptCase{"header_length_zero", RawSafetensors("", "{}"), kDataLoss,
                    "does not start with a JSON object"},
        CorruptCase{"header_not_object", RawSafetensors("[1,2]", ""), kDataLoss,
                    "does not start with a JSON object"},
        CorruptCase{"bad_json", RawSafetensors(R"({"w": {"dtype": )", ""), kDataLoss,
                    "malformed header JSON"},
        CorruptCase{"trailing_garbage", RawSafetensors("{} x", ""), kDataLoss,
                    "malformed header JSON"},
        CorruptCase{"duplicate_tensor",
                    RawSafetensors(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                                   R"("w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                                   std::string(8, '\0')),
                    kDataLoss, "defines 'w' twice"},
        CorruptCase{"entry_not_object", OneTensor("[1]", 0), kInvalid,
                    "tensor 'w': entry must be an object"},
        CorruptCase{"missing_dtype", OneTensor(R"({"shape":[1],"data_offsets":[0,4]})", 4),
                    kInvalid, "tensor 'w': missing dtype"},
        CorruptCase{"unknown_dtype",
                    OneTensor(R"({"dtype":"Q4","shape":[1],"data_offsets":[0,4]})", 4), kInvalid,
                    "tensor 'w': unknown dtype 'Q4'"},
        CorruptCase{"unsupported_dtype",
                    OneTensor(R"({"dtype":"I8","shape":[4],"data_offsets":[0,4]})", 4),
                    StatusCode::kUnimplemented, "tensor 'w': dtype I8 is not supported"},
        CorruptCase{"missing_shape", OneTensor(R"({"dtype":"F32","data_offsets":[0,4]})", 4),
                    kInvalid, "tensor 'w': missing shape"},
        CorruptCase{"negative_shape",
                    OneTensor(R"({"dtype":"F32","shape":[-1],"data_offsets":[0,4]})", 4), kInvalid,
                    "shape entries must be non-negative integers, got -1"},
        CorruptCase{"fractional_shape",
                    OneTensor(R"({"dtype":"F32","shape":[1.5],"data_offsets":[0,4]})", 4), kInvalid,
                    "shape entries must be non-negative integers"},
        CorruptCase{"shape_product_overflows",
                    OneTensor(R"({"dtype":"F32","shape":[4294967296,4294967296,16],)"
                              R"("data_offsets":[0,4]})",
                              4),
                    kInvalid, "needs more than 2^64 bytes"},
        CorruptCase{"size_mismatch",
                    OneTensor(R"({"dtype":"F32","shape":[2,3],"data_offsets":[0,20]})", 20),
                    kInvalid, "shape [2, 3] of F32 needs 24 bytes but data_offsets span 20"},
        CorruptCase{"offsets_not_a_pair",
                    OneTensor(R"({"dtype":"F32","shape":[1],"data_offsets":[0,4,8]})", 8), kInvalid,
                    "data_offsets must be a list of two integers"},
        CorruptCase{"offsets_reversed",
                    OneTensor(R"({"dtype":"F32","shape":[1],"data_offsets":[8,4]})", 8), kInvalid,
                    "must be two integers 0 <= begin <= end"},
        CorruptCase{"offsets_overflow_int64",
                    OneTensor(R"({"dtype":"F32","shape":[1],)"
                              R"("data_offsets":[18446744073709551612,18446744073709551615]})",
                              4),
                    kInvalid, "must be two integers 0 <= begin <= end"},
        CorruptCase{"offsets_out_of_range",
                    OneTensor(R"({"dtype":"F32","shape":[4],"data_offsets":[4,20]})", 8), kDataLoss,
                    "data_offsets [4, 20] run past the data section (8 bytes)"},
        CorruptCase{"overlapping",
                    RawSafetensors(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                   R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                                   std::string(12, '\0')),
                    kInvalid, "tensors 'a' and 'b' overlap"},
        CorruptCase{"metadata_not_strings", RawSafetensors(R"({"__metadata__":{"format":1}})", ""),
                    kInvalid, "__metadata__ value 'format' must be a string"},
        CorruptCase{"metadata_not_object", RawSafetensors(R"({"__metadata__":[]})", ""), kInvalid,
                    "__metadata__ must be an object"}),
    [](const ::testing::TestParamInfo<CorruptCase>& info) { return std::string(info.param.name); });

TEST(SafetensorsTest, TruncatedFileNamesTheFileAndTheTensor) {
  TempDir dir;
  const std::vector<float> a(64, 1.0f), b(64, 2.0f);
  const auto path = dir.path() / "model.safetensors";
  ASSERT_OK(
      WriteSafetensors(path, std::vector<TensorToWrite>{{"a", DType::kF32, {64}, BytesOf(a)},
                                                        {"b", DType::kF32, {64}, BytesOf(b)}}));
  std::string bytes = ReadFileBytes(path);
  bytes.resize(bytes.size() - 10);
  WriteFileBytes(path, bytes);
  EXPECT_THAT(SafetensorsFile::Open(path),
              StatusIs(kDataLoss,
                       AllOf(HasSubstr("model.safetensors: tensor 'b'"), HasSubstr("truncated"))));
}

TEST(SafetensorsTest, OpenReportsMissingFilesAndDirectories) {
  TempDir dir;
  EXPECT_THAT(SafetensorsFile::Open(dir.path() / "none.safetensors"),
              StatusIs(StatusCode::kNotFound, HasSubstr("none.safetensors")));
  EXPECT_THAT(SafetensorsFile::Open(dir.path()),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("not a regular file")));
}

TEST(SafetensorsTest, WriterRejectsBadInput) {
  TempDir dir;
  const std::vector<float> a = {1.0f, 2.0f};
  const auto path = dir.path() / "w.safetensors";
  EXPECT_THAT(
      WriteSafetensors(path, std::vector<TensorToWrite>{{"x", DType::kF32, {3}, BytesOf(a)}}),
      StatusIs(kInvalid, HasSubstr("needs 12 bytes, got 8")));
  EXPECT_THAT(
      WriteSafetensors(path, std::vector<TensorToWrite>{{"x", DType::kF32, {2}, BytesOf(a)},
                                                        {"x", DType::kF32, {2}, BytesOf(a)}}),
      StatusIs(kInvalid, HasSubstr("duplicate tensor name 'x'")));
  EXPECT_THAT(WriteSafetensors(
                  path, std::vector<TensorToWrite>{{"__metadata__", DType::kF32, {2}, BytesOf(a)}}),
              StatusIs(kInvalid, HasSubstr("invalid tensor name")));
  EXPECT_THAT(
      WriteSafetensors(path, std::vector<TensorToWrite>{{"bad\xff", DType::kF32, {2}, BytesOf(a)}}),
      StatusIs(kInvalid, HasSubstr("cannot encode")));
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_THAT(WriteSafetensors(dir.path() / "no" / "dir" / "w.safetensors", {}),
              StatusIs(StatusCode::kUnavailable));
}

}  // namespace
}  // namespace chunkserve::model
