// A Llama model from a GGUF file (llama.cpp's format): the config from the llama.* metadata and
// the weights dequantized into a WeightStore under their Hugging Face names, so that
// BindLlamaWeights and every backend take them unchanged. LoadedModel::Load calls these for a
// path ending in ".gguf".
//
// Config (GGUF key -> ModelConfig field; all llama.* keys are "<general.architecture>.*"):
//   general.architecture                   must be "llama" (else Unimplemented naming it)
//   llama.embedding_length                 hidden_size                      (required)
//   llama.block_count                      num_layers                       (required)
//   llama.feed_forward_length              intermediate_size                (required)
//   llama.attention.head_count             num_qo_heads                     (required)
//   llama.attention.head_count_kv          num_kv_heads                     (default head_count)
//   llama.attention.key_length             head_dim          (default hidden_size / head_count)
//   llama.rope.dimension_count             must equal head_dim (partial rotary: Unimplemented)
//   llama.attention.layer_norm_rms_epsilon rms_norm_eps                     (required)
//   llama.rope.freq_base                   rope_theta                       (default 10000)
//   llama.rope.scaling.type / .factor      "none" or "linear" (others Unimplemented)
//   llama.context_length                   max_position_embeddings          (required)
//   tokenizer.ggml.tokens (length)         vocab_size; else llama.vocab_size; else token_embd's
//   tokenizer.ggml.bos_token_id            bos_token_ids (one id, when present)
//   tokenizer.ggml.eos_token_id            eos_token_ids (one id, when present)
//   output.weight absent                   tie_word_embeddings
// Float32 values are read as the shortest decimal that rounds to them (1e-05, as config.json had
// it, not 9.99999974738e-06), so a converted checkpoint's config equals the original's.
//
// Tensors (GGUF -> Hugging Face; GGUF dims are reversed into row-major shapes):
//   token_embd.weight           model.embed_tokens.weight
//   blk.N.attn_norm.weight      model.layers.N.input_layernorm.weight
//   blk.N.attn_q.weight         model.layers.N.self_attn.q_proj.weight   (rows un-permuted)
//   blk.N.attn_k.weight         model.layers.N.self_attn.k_proj.weight   (rows un-permuted)
//   blk.N.attn_v.weight         model.layers.N.self_attn.v_proj.weight
//   blk.N.attn_output.weight    model.layers.N.self_attn.o_proj.weight
//   blk.N.ffn_norm.weight       model.layers.N.post_attention_layernorm.weight
//   blk.N.ffn_gate/up/down.weight  model.layers.N.mlp.gate_proj/up_proj/down_proj.weight
//   output_norm.weight          model.norm.weight
//   output.weight               lm_head.weight
// Any other tensor (rope_freqs.weight of Llama 3 files included) is Unimplemented, naming it.
//
// The Q/K permutation. llama.cpp's converter reorders the rows of q_proj and k_proj so that its
// RoPE, which rotates adjacent pairs (2i, 2i+1), matches Hugging Face's rotate_half, which rotates
// (i, i + head_dim/2): within each head, HF row j * head_dim/2 + i is stored as GGUF row 2i + j.
// We undo it exactly as transformers' GGUF loader does (reverse_permute, with num_qo_heads for q
// and num_kv_heads for k): GGUF row h * head_dim + 2i + j -> HF row h * head_dim + j * head_dim/2 + i.
//
// Memory: the dequantized weights live in the WeightStore (product of shapes * DTypeSize(dtype)
// bytes: 4x the parameter count for f32); the file's mapping is released when loading ends.
//
// Thread safety: pure functions of their arguments.
#ifndef CHUNKSERVE_RUNTIME_MODEL_GGUF_MODEL_H_
#define CHUNKSERVE_RUNTIME_MODEL_GGUF_MODEL_H_

#include <cstdint>
#include <string>

#include "runtime/base/status.h"
#include "runtime/model/dtype.h"
#include "runtime/model/gguf.h"
#include "runtime/model/model_config.h"
#include "runtime/model/weight_store.h"

namespace chunkserve::model {

// The ModelConfig of a GGUF file (table above), validated by ValidateModelConfig. Errors name the
// file and the key.
Result<ModelConfig> GgufModelConfig(const GgufFile& file);

// Every tensor of `file` dequantized to `dtype` (f32, f16 or bf16) under its Hugging Face name,
// with q/k rows un-permuted for `config`. Errors name the file and the tensor.
Result<WeightStore> GgufWeightStore(const GgufFile& file, const ModelConfig& config, DType dtype);

// The HF row that GGUF row `row` of a permuted q (num_heads = num_qo_heads) or k (num_kv_heads)
// weight holds. `row` < num_heads * head_dim; head_dim even.
int64_t GgufUnpermutedRow(int64_t row, int64_t head_dim);

}  // namespace chunkserve::model

#endif  // CHUNKSERVE_RUNTIME_MODEL_GGUF_MODEL_H_
