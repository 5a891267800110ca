// LoadedModel: a model directory (config.json + safetensors) parsed, mapped, validated and bound,
// or a llama.cpp GGUF file parsed and dequantized (gguf_model.h), plus the model fingerprint that
// seeds chunk hashes.
//
//   CHUNKSERVE_ASSIGN_OR_RETURN(model::LoadedModel m, model::LoadedModel::Load(dir));
//   m.config().num_layers;          // shapes, eps, rope (ModelConfig)
//   m.weights().layers[0].q_proj;   // typed pointers into the mappings (LlamaWeights)
//   m.fingerprint();                // seed for chunk hashes
//
// Fingerprint. Two models with equal fingerprints compute the same keys and values for the same
// tokens, so a chunk hash seeded with it never matches a chunk from a different model. It is
// XXH3-64 over, in order: a version tag, CanonicalModelConfig(config) (architecture, shapes, eps,
// rope, biases, tying), and for every tensor of the store in name order its name, dtype, shape and
// contents: all bytes in FingerprintMode::kFull; in kSampled (the default, cheap for multi-GB
// checkpoints) all bytes of tensors up to 12 KiB and, for larger ones, their first, middle and last
// 4 KiB. Fine-tunes of one base model change every weight, so sampling tells them apart with
// overwhelming probability; it is not a cryptographic content hash. The value does not depend on
// how the checkpoint is split into shards, on the safetensors metadata or on token ids; it does
// depend on the weights' dtype. It is stable across runs, machines and builds (a change of the
// algorithm changes the version tag).
//
// Thread safety: immutable after Load (until ReleaseWeights); concurrent readers are fine.
#ifndef CHUNKSERVE_RUNTIME_MODEL_MODEL_H_
#define CHUNKSERVE_RUNTIME_MODEL_MODEL_H_

#include <cstdint>
#include <filesystem>

#include "runtime/base/status.h"
#include "runtime/model/llama_weights.h"
#include "runtime/model/model_config.h"
#include "runtime/model/weight_store.h"

namespace chunkserve::model {

enum class FingerprintMode : int32_t {
  kSampled = 0,  // a few KiB per tensor
  kFull = 1,     // every byte (reads the whole checkpoint)
};

uint64_t ModelFingerprint(const ModelConfig& config, const WeightStore& store,
                          FingerprintMode mode = FingerprintMode::kSampled);

struct LoadModelOptions {
  ModelConfigOptions config;  // config.json only
  BindOptions bind;
  FingerprintMode fingerprint = FingerprintMode::kSampled;
  // GGUF only: the dtype the weights are dequantized to (f32, f16 or bf16). Safetensors weights
  // keep the dtype of the file.
  DType gguf_dtype = DType::kF32;
};

// Whether Load treats `path` as a GGUF file: a path whose extension is ".gguf".
bool IsGgufPath(const std::filesystem::path& path);

class LoadedModel {
 public:
  // Loads `dir`: LoadModelConfig(dir), WeightStore::Open(dir), BindLlamaWeights, fingerprint.
  // A path to a .gguf file instead: GgufFile::Open, GgufModelConfig, GgufWeightStore (dequantized
  // to options.gguf_dtype; the file is unmapped before returning), BindLlamaWeights, fingerprint
  // (over the dequantized tensors, so the same weights in either format give the same value).
  // Errors are those of the steps, each naming its file.
  static Result<LoadedModel> Load(const std::filesystem::path& dir,
                                  const LoadModelOptions& options = {});

  LoadedModel(LoadedModel&&) noexcept = default;
  LoadedModel& operator=(LoadedModel&&) noexcept = default;

  // What Load was given: the directory, or the .gguf file.
  const std::filesystem::path& dir() const { return dir_; }
  const ModelConfig& config() const { return config_; }
  const WeightStore& store() const { return store_; }
  // Valid while this LoadedModel lives (moves included).
  const LlamaWeights& weights() const { return weights_; }
  DType dtype() const { return weights_.dtype; }
  uint64_t fingerprint() const { return fingerprint_; }

  // Frees the weights (unmaps the checkpoint files, drops dequantized GGUF tensors) once a runner
  // holds its own copy, so that they are not resident twice. dir(), config(), dtype() and
  // fingerprint() keep their values; weights() is empty afterwards (null tensors, no layers) and
  // store() holds nothing. Not thread-safe: call it before sharing the model.
  void ReleaseWeights();
  bool has_weights() const { return !weights_.layers.empty(); }

 private:
  LoadedModel(std::filesystem::path dir, ModelConfig config, WeightStore store)
      : dir_(std::move(dir)), config_(std::move(config)), store_(std::move(store)) {}

  std::filesystem::path dir_;
  ModelConfig config_;
  WeightStore store_;
  LlamaWeights weights_;
  uint64_t fingerprint_ = 0;
};

}  // namespace chunkserve::model

#endif  // CHUNKSERVE_RUNTIME_MODEL_MODEL_H_
