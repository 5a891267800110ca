// The Llama-family checkpoint layout (Hugging Face tensor names and shapes) and LlamaWeights, the
// typed view of a checkpoint that backends consume.
//
// Tensors, with shapes in the config's terms (q_dim = num_qo_heads * head_dim,
// kv_dim = num_kv_heads * head_dim); weights of linear layers are [out, in], so y = x W^T + b:
//
//   model.embed_tokens.weight                         [vocab_size, hidden_size]
//   model.layers.{i}.input_layernorm.weight           [hidden_size]
//   model.layers.{i}.self_attn.q_proj.weight          [q_dim, hidden_size]
//   model.layers.{i}.self_attn.k_proj.weight          [kv_dim, hidden_size]
//   model.layers.{i}.self_attn.v_proj.weight          [kv_dim, hidden_size]
//   model.layers.{i}.self_attn.o_proj.weight          [hidden_size, q_dim]
//   model.layers.{i}.self_attn.{q,k,v}_proj.bias      [q_dim], [kv_dim], [kv_dim]  (qkv_bias)
//   model.layers.{i}.self_attn.o_proj.bias            [hidden_size]                (o_bias)
//   model.layers.{i}.post_attention_layernorm.weight  [hidden_size]
//   model.layers.{i}.mlp.gate_proj.weight             [intermediate_size, hidden_size]
//   model.layers.{i}.mlp.up_proj.weight               [intermediate_size, hidden_size]
//   model.layers.{i}.mlp.down_proj.weight             [hidden_size, intermediate_size]
//   model.norm.weight                                 [hidden_size]
//   lm_head.weight                                    [vocab_size, hidden_size]  (unless tied)
//
// The forward pass these describe (for the backend; not implemented here), per layer:
//   h = x + o_proj(attention(rope(q_proj(n)), rope(k_proj(n)), v_proj(n))), n = rmsnorm1(x)
//   x' = h + down_proj(silu(gate_proj(m)) * up_proj(m)),                    m = rmsnorm2(h)
// with rmsnorm(x) = x / sqrt(mean(x^2) + rms_norm_eps) * weight, and logits =
// lm_head(rmsnorm_final(x)). RoPE frequencies: RopeInverseFrequencies(config).
#ifndef CHUNKSERVE_RUNTIME_MODEL_LLAMA_WEIGHTS_H_
#define CHUNKSERVE_RUNTIME_MODEL_LLAMA_WEIGHTS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/base/status.h"
#include "runtime/model/dtype.h"
#include "runtime/model/model_config.h"
#include "runtime/model/weight_store.h"

namespace chunkserve::model {

struct ExpectedTensor {
  std::string name;
  std::vector<int64_t> shape;
};

// Every tensor a checkpoint for `config` must hold, in the order of the table above (embeddings,
// layer 0 .. n-1, final norm, lm_head). Biases appear only when the config has them; lm_head only
// when not tied. `config` must satisfy ValidateModelConfig.
std::vector<ExpectedTensor> ExpectedLlamaTensors(const ModelConfig& config);

// One decoder layer. Pointers are into the WeightStore's mappings, each aligned to the element
// size of LlamaWeights::dtype, row-major with the shapes of the table above.
struct LlamaLayerWeights {
  const void* input_norm = nullptr;           // [hidden_size]
  const void* q_proj = nullptr;               // [q_dim, hidden_size]
  const void* k_proj = nullptr;               // [kv_dim, hidden_size]
  const void* v_proj = nullptr;               // [kv_dim, hidden_size]
  const void* o_proj = nullptr;               // [hidden_size, q_dim]
  const void* q_bias = nullptr;               // [q_dim]; null unless config.qkv_bias
  const void* k_bias = nullptr;               // [kv_dim]; null unless config.qkv_bias
  const void* v_bias = nullptr;               // [kv_dim]; null unless config.qkv_bias
  const void* o_bias = nullptr;               // [hidden_size]; null unless config.o_bias
  const void* post_attention_norm = nullptr;  // [hidden_size]
  const void* gate_proj = nullptr;            // [intermediate_size, hidden_size]
  const void* up_proj = nullptr;              // [intermediate_size, hidden_size]
  const void* down_proj = nullptr;            // [hidden_size, intermediate_size]
};

// The whole model. Every tensor has the one element type `dtype`. Non-owning: valid while the
// WeightStore it was bound from lives.
struct LlamaWeights {
  DType dtype = DType::kF32;
  const void* embed_tokens = nullptr;     // [vocab_size, hidden_size]
  const void* final_norm = nullptr;       // [hidden_size]
  const void* lm_head = nullptr;          // [vocab_size, hidden_size]; == embed_tokens when tied
  std::vector<LlamaLayerWeights> layers;  // num_layers entries
};

struct BindOptions {
  // Accept tensors the model does not use. Off by default: an unexpected tensor usually means the
  // checkpoint is not the architecture the config claims. Always accepted regardless:
  // model.layers.{i}.self_attn.rotary_emb.inv_freq (recomputed from the config) and, when tied,
  // lm_head.weight (Hugging Face ties it to the embeddings on load).
  bool allow_unused_tensors = false;
};

// Checks the store against ExpectedLlamaTensors(config) and returns the pointers. Errors, each
// naming the tensor and the store's location, with a count of further problems:
//  - a missing tensor, a shape mismatch or an unexpected tensor: InvalidArgument;
//  - tensors of different dtypes, or a tensor not aligned to its element size: Unimplemented.
Result<LlamaWeights> BindLlamaWeights(const ModelConfig& config, const WeightStore& store,
                                      const BindOptions& options = {});

}  // namespace chunkserve::model

#endif  // CHUNKSERVE_RUNTIME_MODEL_LLAMA_WEIGHTS_H_
