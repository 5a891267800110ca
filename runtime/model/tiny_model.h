// The tiny-model writer: random-weight Llama-family models in the real on-disk format
// (config.json + safetensors), for tests and the demo. Nothing is downloaded.
//
// Determinism. The bytes written depend only on the options: the same options give identical
// files on every machine, compiler and standard library (explicit splitmix64 streams, integer
// arithmetic and one correctly rounded multiply per value; no std:: distributions). Each tensor
// draws from its own stream, seeded from (seed, tensor name), so changing the layer count does not
// change the other tensors' values, and the f32 / f16 / bf16 variants of one seed hold the same
// values rounded to the dtype.
//
// Values. Roughly normal (a sum of four uniforms, so bounded at +-2*sqrt(3) standard deviations),
// scaled so activations stay near unit size through the network:
//   linear weights [out, in]        std 1 / sqrt(in)
//   model.embed_tokens.weight       std 1 (tied: hidden_size^-1/4, which also keeps logits sane)
//   lm_head.weight                  std 1 / sqrt(hidden_size)
//   RMSNorm weights                 1 + 0.05 * noise
//   biases                          std 0.1
//
// Thread safety: functions are reentrant; do not point two writers at one directory at once.
#ifndef CHUNKSERVE_RUNTIME_MODEL_TINY_MODEL_H_
#define CHUNKSERVE_RUNTIME_MODEL_TINY_MODEL_H_

#include <cstdint>
#include <filesystem>

#include "runtime/base/ids.h"
#include "runtime/base/status.h"
#include "runtime/model/dtype.h"
#include "runtime/model/model_config.h"

namespace chunkserve::model {

struct TinyModelOptions {
  uint64_t seed = 0;
  Architecture architecture = Architecture::kLlama;
  int32_t vocab_size = 1024;
  int32_t hidden_size = 256;
  int32_t num_layers = 4;
  int32_t num_qo_heads = 8;
  int32_t num_kv_heads = 2;
  int32_t head_dim = 64;  // written explicitly; need not be hidden_size / num_qo_heads
  int32_t intermediate_size = 688;
  DType dtype = DType::kF32;
  bool tie_word_embeddings = false;
  // Llama only: biases on q, k, v and o (attention_bias). Qwen2 always has q, k, v biases and
  // Mistral never has any, whatever this says.
  bool attention_bias = false;
  int32_t num_shards = 1;  // 1: model.safetensors; more: model-0000k-of-0000n + index
  double rms_norm_eps = 1e-5;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  int32_t max_position_embeddings = 8192;
  TokenId bos_token_id = 1;
  TokenId eos_token_id = 2;

  // The built-in demo model (these defaults): vocab 1024, hidden 256, 4 layers, 8 query heads
  // sharing 2 KV heads (GQA 4:1, as in Llama 3 and Mistral), head_dim 64 (in the kernels' dispatch
  // set), SwiGLU width 688, fp32, 8192 positions. About 3.9M parameters (16 MB in fp32), ~8 MFLOP
  // per token outside attention, 8 KiB of fp32 KV per token: a few hundred requests with
  // multi-thousand-token shared prefixes run in about a minute on two CPU cores.
  static TinyModelOptions Default() { return TinyModelOptions{}; }
};

// The config the options describe; InvalidArgument when it is not a valid ModelConfig.
Result<ModelConfig> TinyModelConfig(const TinyModelOptions& options);

// Writes config.json and model.safetensors (num_shards == 1) or model-0000k-of-0000n.safetensors
// plus model.safetensors.index.json into `dir`, creating it if needed. Every file is written to a
// temporary name and renamed into place; config.json comes last. A stale layout of the other kind
// (an index when writing one file, model.safetensors when writing shards) is removed so the
// directory loads as what was just written. InvalidArgument for invalid options (including
// num_shards < 1 or more shards than tensors); Unavailable for I/O errors.
Status WriteTinyModel(const std::filesystem::path& dir, const TinyModelOptions& options);

}  // namespace chunkserve::model

#endif  // CHUNKSERVE_RUNTIME_MODEL_TINY_MODEL_H_
