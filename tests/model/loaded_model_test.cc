// LoadedModel::ReleaseWeights: once a runner holds its own copy, the checkpoint is dropped but the
// model keeps what the engine still asks of it (config, dtype, fingerprint, where it came from).
#include <gtest/gtest.h>

#include "runtime/model/model.h"
#include "runtime/model/tiny_model.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/tiny_models.h"

namespace chunkserve::model {
namespace {

using ::chunkserve::testing::TempDir;

TEST(LoadedModelTest, ReleaseWeightsKeepsTheIdentityAndDropsTheTensors) {
  TempDir dir;
  TinyModelOptions o = chunkserve::testing::SmallTestModel(7);
  o.dtype = DType::kBF16;
  ASSERT_OK(WriteTinyModel(dir.path(), o));
  ASSERT_OK_AND_ASSIGN(LoadedModel m, LoadedModel::Load(dir.path()));
  ASSERT_TRUE(m.has_weights());
  ASSERT_GT(m.store().num_tensors(), 0u);
  const uint64_t fingerprint = m.fingerprint();
  const int32_t layers = m.config().num_layers;

  m.ReleaseWeights();
  EXPECT_FALSE(m.has_weights());
  EXPECT_EQ(m.store().num_tensors(), 0u);
  EXPECT_EQ(m.store().total_bytes(), 0u);
  EXPECT_EQ(m.weights().embed_tokens, nullptr);
  EXPECT_EQ(m.fingerprint(), fingerprint);
  EXPECT_EQ(m.config().num_layers, layers);
  EXPECT_EQ(m.dtype(), DType::kBF16);
  EXPECT_EQ(m.dir(), dir.path());
  m.ReleaseWeights();  // twice is harmless
  EXPECT_FALSE(m.has_weights());
}

}  // namespace
}  // namespace chunkserve::model
