// The CUDA backend's creation errors, checked on any machine of a CUDA build (label cpu):
// unsupported options and model shapes are refused before the device is touched, and without a
// device CudaBackend::Create, the model on it (forward::CreateLlamaModel) and Engine::Create
// (backend kCuda) return Unavailable with a clear message instead of crashing. On a machine with
// a device the no-device cases skip.
#include <gtest/gtest.h>

#include "runtime/backend/cuda_backend.h"
#include "runtime/engine/engine.h"
#include "runtime/forward/llama.h"
#include "runtime/model/tiny_model.h"
#include "tests/testing/gpu.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace chunkserve::backend {
namespace {

using ::chunkserve::testing::StatusIs;
using ::testing::HasSubstr;

model::TinyModelOptions Model(int32_t head_dim) {
  model::TinyModelOptions o;
  o.seed = 1;
  o.vocab_size = 64;
  o.hidden_size = 64;
  o.num_layers = 1;
  o.num_qo_heads = 2;
  o.num_kv_heads = 1;
  o.head_dim = head_dim;
  o.intermediate_size = 64;
  o.max_position_embeddings = 256;
  return o;
}

class CudaBackendCreateTest : public ::testing::Test {
 protected:
  model::LoadedModel Load(int32_t head_dim) {
    const auto path = dir_.path() / ("hd" + std::to_string(head_dim));
    EXPECT_OK(model::WriteTinyModel(path, Model(head_dim)));
    auto m = model::LoadedModel::Load(path);
    EXPECT_TRUE(m.ok()) << m.status();
    return std::move(m).value();
  }
  // The model on the CUDA backend, f16 unless given.
  static Result<std::unique_ptr<forward::LlamaModel>> OnCuda(const model::LoadedModel& m,
                                                             forward::RunnerOptions o) {
    o.backend = forward::BackendKind::kCuda;
    return forward::CreateLlamaModel(m, o);
  }
  testing::TempDir dir_;
};

TEST_F(CudaBackendCreateTest, UnsupportedHeadDimIsUnimplemented) {
  const model::LoadedModel m = Load(16);
  EXPECT_THAT(
      OnCuda(m, {.num_slots = 8, .chunk_size = 16, .kv_dtype = kernels::DType::kF16}).status(),
      StatusIs(StatusCode::kUnimplemented, HasSubstr("head_dim 64 and 128")));
}

TEST_F(CudaBackendCreateTest, BadOptionsAreInvalidArgument) {
  const model::LoadedModel m = Load(64);
  constexpr kernels::DType kF16 = kernels::DType::kF16;
  EXPECT_THAT(OnCuda(m, {.num_slots = 8, .chunk_size = 24, .kv_dtype = kF16}).status(),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("multiple of 16")));
  EXPECT_THAT(OnCuda(m, {.num_slots = 8, .chunk_size = 256, .kv_dtype = kF16}).status(),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("multiple of 16 in [16, 128]")));
  EXPECT_THAT(OnCuda(m, {.num_slots = 0, .chunk_size = 16, .kv_dtype = kF16}).status(),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("num_slots")));
  EXPECT_THAT(
      OnCuda(m, {.num_slots = 8, .chunk_size = 16, .kv_dtype = kernels::DType::kF32}).status(),
      StatusIs(StatusCode::kInvalidArgument, HasSubstr("f16 or bf16")));
  EXPECT_THAT(
      OnCuda(m, {.cuda_device = -1, .num_slots = 8, .chunk_size = 16, .kv_dtype = kF16}).status(),
      StatusIs(StatusCode::kInvalidArgument, HasSubstr("device")));
  EXPECT_THAT(CudaBackend::Create({.dtype = kernels::DType::kF32}).status(),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("f16 or bf16")));
  EXPECT_THAT(CudaBackend::Create({.device = -1}).status(),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("device")));
}

TEST_F(CudaBackendCreateTest, NoDeviceIsUnavailable) {
  if (testing::CudaDeviceCount() > 0) GTEST_SKIP() << "this machine has a CUDA device";
  const model::LoadedModel m = Load(64);
  EXPECT_THAT(CudaBackend::Create({}).status(),
              StatusIs(StatusCode::kUnavailable, HasSubstr("no CUDA device")));
  EXPECT_THAT(
      OnCuda(m, {.num_slots = 8, .chunk_size = 16, .kv_dtype = kernels::DType::kF16}).status(),
      StatusIs(StatusCode::kUnavailable, HasSubstr("no CUDA device")));
}

TEST_F(CudaBackendCreateTest, EngineWithCudaBackendAndNoDeviceIsUnavailable) {
  if (testing::CudaDeviceCount() > 0) GTEST_SKIP() << "this machine has a CUDA device";
  const auto path = dir_.path() / "engine";
  ASSERT_OK(model::WriteTinyModel(path, Model(64)));
  engine::EngineOptions o;
  o.model_dir = path.string();
  o.backend = engine::BackendKind::kCuda;
  o.kv_dtype = kernels::DType::kF16;
  o.chunk_size = 16;
  o.kv_cache_bytes = 1u << 20;
  EXPECT_THAT(engine::Engine::Create(o).status(),
              StatusIs(StatusCode::kUnavailable, HasSubstr("no CUDA device")));
  // f32 KV is refused by the backend before the device is looked at.
  o.kv_dtype = kernels::DType::kF32;
  EXPECT_THAT(engine::Engine::Create(o).status(),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("f16 or bf16")));
}

}  // namespace
}  // namespace chunkserve::backend
