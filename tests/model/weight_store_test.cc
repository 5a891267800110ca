#include "runtime/model/weight_store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/model/test_util.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace chunkserve::model {
namespace {

using ::chunkserve::model::testing::ReadFileBytes;
using ::chunkserve::model::testing::WriteFileBytes;
using ::chunkserve::testing::StatusIs;
using ::chunkserve::testing::TempDir;
using ::testing::AllOf;
using ::testing::HasSubstr;
using Json = nlohmann::json;

// Two shards: a.safetensors {x, y}, b.safetensors {z}, plus the index.
class ShardedStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK(Write("a.safetensors", {"x", "y"}));
    ASSERT_OK(Write("b.safetensors", {"z"}));
    index_ = {
        {"metadata", {{"total_size", 48}}},
        {"weight_map", {{"x", "a.safetensors"}, {"y", "a.safetensors"}, {"z", "b.safetensors"}}}};
    WriteIndex();
  }

  Status Write(const std::string& file, const std::vector<std::string>& names) {
    std::vector<TensorToWrite> tensors;
    for (const std::string& n : names) {
      tensors.push_back({n, DType::kF32, {4}, std::as_bytes(std::span<const float>(values_))});
    }
    return WriteSafetensors(dir_.path() / file, tensors);
  }
  void WriteIndex() {
    WriteFileBytes(dir_.path() / std::string(kSafetensorsIndexFileName), index_.dump());
  }

  TempDir dir_;
  Json index_;
  const std::vector<float> values_ = {1.0f, 2.0f, 3.0f, 4.0f};
};

TEST_F(ShardedStoreTest, OpensFromTheDirectoryAndFromTheIndexPath) {
  for (const auto& path : {dir_.path(), dir_.path() / std::string(kSafetensorsIndexFileName)}) {
    ASSERT_OK_AND_ASSIGN(WeightStore store, WeightStore::Open(path));
    EXPECT_EQ(store.num_files(), 2u);
    EXPECT_EQ(store.num_tensors(), 3u);
    EXPECT_EQ(store.total_bytes(), 48u);
    ASSERT_OK_AND_ASSIGN(TensorView z, store.Get("z"));
    EXPECT_EQ(z.num_elements(), 4);
    float first;
    std::memcpy(&first, z.data, sizeof(first));
    EXPECT_EQ(first, 1.0f);
  }
}

TEST_F(ShardedStoreTest, ViewsSurviveMovingTheStore) {
  ASSERT_OK_AND_ASSIGN(WeightStore store, WeightStore::Open(dir_.path()));
  const std::byte* before = store.Find("y")->data;
  WeightStore moved = std::move(store);
  EXPECT_EQ(moved.Find("y")->data, before);
  EXPECT_THAT(moved.Get("w"), StatusIs(StatusCode::kNotFound, HasSubstr("no tensor 'w'")));
}

TEST_F(ShardedStoreTest, IndexPreferredOverASingleFile) {
  ASSERT_OK(Write(std::string(kSafetensorsFileName), {"only"}));
  ASSERT_OK_AND_ASSIGN(WeightStore store, WeightStore::Open(dir_.path()));
  EXPECT_EQ(store.num_tensors(), 3u);
}

TEST_F(ShardedStoreTest, MissingShardFileIsNotFound) {
  index_["weight_map"]["z"] = "c.safetensors";
  WriteIndex();
  EXPECT_THAT(WeightStore::Open(dir_.path()),
              StatusIs(StatusCode::kNotFound, HasSubstr("c.safetensors")));
}

TEST_F(ShardedStoreTest, TensorMissingFromItsShardIsDataLoss) {
  index_["weight_map"]["w"] = "b.safetensors";
  WriteIndex();
  EXPECT_THAT(
      WeightStore::Open(dir_.path()),
      StatusIs(StatusCode::kDataLoss, AllOf(HasSubstr("b.safetensors: tensor 'w' is missing"),
                                            HasSubstr(std::string(kSafetensorsIndexFileName)))));
}

TEST_F(ShardedStoreTest, StrayTensorInAShardIsRejected) {
  index_["weight_map"].erase("y");
  WriteIndex();
  EXPECT_THAT(WeightStore::Open(dir_.path()),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("a.safetensors: tensor 'y' is not mapped to this file")));
}

TEST_F(ShardedStoreTest, ShardNamesMustStayInTheDirectory) {
  for (const char* bad : {"../a.safetensors", "/etc/passwd", "", ".."}) {
    index_["weight_map"]["z"] = bad;
    WriteIndex();
    EXPECT_THAT(WeightStore::Open(dir_.path()),
                StatusIs(StatusCode::kInvalidArgument,
                         HasSubstr("must be a file name in the same directory")))
        << bad;
  }
}

TEST_F(ShardedStoreTest, MalformedIndexIsRejected) {
  WriteFileBytes(dir_.path() / std::string(kSafetensorsIndexFileName), "{\"weight_map\": {");
  EXPECT_THAT(WeightStore::Open(dir_.path()),
              StatusIs(StatusCode::kDataLoss, HasSubstr("malformed JSON")));
  WriteFileBytes(dir_.path() / std::string(kSafetensorsIndexFileName), "{\"metadata\": {}}");
  EXPECT_THAT(WeightStore::Open(dir_.path()),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("missing weight_map")));
  WriteFileBytes(dir_.path() / std::string(kSafetensorsIndexFileName), "{\"weight_map\": {}}");
  EXPECT_THAT(WeightStore::Open(dir_.path()),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("weight_map is empty")));
}

TEST_F(ShardedStoreTest, CorruptShardNamesTheShard) {
  std::string bytes = ReadFileBytes(dir_.path() / "b.safetensors");
  bytes.resize(bytes.size() - 1);
  WriteFileBytes(dir_.path() / "b.safetensors", bytes);
  EXPECT_THAT(WeightStore::Open(dir_.path()),
              StatusIs(StatusCode::kDataLoss, HasSubstr("b.safetensors: tensor 'z'")));
}

TEST(WeightStoreTest, OpensASingleFileFromTheDirectoryOrTheFile) {
  TempDir dir;
  const std::vector<float> v = {1.0f};
  ASSERT_OK(
      WriteSafetensors(dir.path() / std::string(kSafetensorsFileName),
                       std::vector<TensorToWrite>{
                           {"t", DType::kF32, {1}, std::as_bytes(std::span<const float>(v))}}));
  for (const auto& path : {dir.path(), dir.path() / std::string(kSafetensorsFileName)}) {
    ASSERT_OK_AND_ASSIGN(WeightStore store, WeightStore::Open(path));
    EXPECT_EQ(store.num_files(), 1u);
    EXPECT_TRUE(store.Find("t").has_value());
    EXPECT_EQ(store.location(), path);
  }
}

TEST(WeightStoreTest, EmptyDirectoryIsNotFound) {
  TempDir dir;
  EXPECT_THAT(WeightStore::Open(dir.path()),
              StatusIs(StatusCode::kNotFound, AllOf(HasSubstr("model.safetensors.index.json"),
                                                    HasSubstr("model.safetensors found"))));
}

}  // namespace
}  // namespace chunkserve::model
