#include "runtime/model/gguf_model.h"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <limits>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "runtime/model/gguf_quant.h"

namespace chunkserve::model {
namespace {

// Reads an integer key into int32 > 0 (or >= 0 when `allow_zero`). nullopt when absent.
Result<std::optional<int32_t>> OptionalInt32(const GgufFile& f, const std::string& key,
                                             bool allow_zero = false) {
  if (!f.Has(key)) return std::optional<int32_t>();
  CHUNKSERVE_ASSIGN_OR_RETURN(int64_t v, f.GetInt(key));
  if (v < (allow_zero ? 0 : 1) || v > std::numeric_limits<int32_t>::max()) {
    return Status::InvalidArgument(f.name() + ": key '" + key + "' = " + std::to_string(v) +
                                   " is out of range");
  }
  return std::optional<int32_t>(static_cast<int32_t>(v));
}

Result<int32_t> RequiredInt32(const GgufFile& f, const std::string& key) {
  CHUNKSERVE_ASSIGN_OR_RETURN(std::optional<int32_t> v, OptionalInt32(f, key));
  if (!v.has_value()) return Status::NotFound(f.name() + ": no key '" + key + "'");
  return *v;
}

// A float key as a double. A float32 value is read as the shortest decimal that rounds to it:
// the converter wrote config.json's decimal (rms_norm_eps 1e-05) as float32, so this recovers it
// (1e-05, not 9.99999974738e-06) and the config, and the fingerprint, equal the original's. Both
// read the same in the fp32 arithmetic of the forward pass.
Result<double> FloatKey(const GgufFile& f, const std::string& key) {
  CHUNKSERVE_ASSIGN_OR_RETURN(double v, f.GetFloat(key));
  CHUNKSERVE_ASSIGN_OR_RETURN(GgufValueType type, f.Type(key));
  if (type != GgufValueType::kFloat32) return v;
  char buf[64];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), static_cast<float>(v));
  if (ec != std::errc()) return v;
  double shortest = v;
  std::from_chars(buf, end, shortest);
  return shortest;
}

// GGUF tensor name -> Hugging Face name, and whether its rows are permuted (q, k).
struct Mapped {
  std::string name;
  bool permuted = false;
};

std::optional<Mapped> HfName(std::string_view gguf_name, int32_t num_layers) {
  if (gguf_name == "token_embd.weight") return Mapped{"model.embed_tokens.weight"};
  if (gguf_name == "output_norm.weight") return Mapped{"model.norm.weight"};
  if (gguf_name == "output.weight") return Mapped{"lm_head.weight"};
  constexpr std::string_view kBlk = "blk.";
  if (!gguf_name.starts_with(kBlk)) return std::nullopt;
  const std::string_view rest = gguf_name.substr(kBlk.size());
  const size_t dot = rest.find('.');
  if (dot == std::string_view::npos || dot == 0 || dot > 9) return std::nullopt;
  int32_t layer = 0;
  for (char c : rest.substr(0, dot)) {
    if (c < '0' || c > '9') return std::nullopt;
    layer = layer * 10 + (c - '0');
  }
  if (layer >= num_layers || (dot > 1 && rest[0] == '0')) return std::nullopt;
  static constexpr std::pair<std::string_view, std::string_view> kLayer[] = {
      {"attn_norm.weight", "input_layernorm.weight"},
      {"attn_q.weight", "self_attn.q_proj.weight"},
      {"attn_k.weight", "self_attn.k_proj.weight"},
      {"attn_v.weight", "self_attn.v_proj.weight"},
      {"attn_output.weight", "self_attn.o_proj.weight"},
      {"ffn_norm.weight", "post_attention_layernorm.weight"},
      {"ffn_gate.weight", "mlp.gate_proj.weight"},
      {"ffn_up.weight", "mlp.up_proj.weight"},
      {"ffn_down.weight", "mlp.down_proj.weight"},
  };
  const std::string_view suffix = rest.substr(dot + 1);
  for (const auto& [g, hf] : kLayer) {
    if (suffix == g) {
      return Mapped{"model.layers." + std::to_string(layer) + "." + std::string(hf),
                    g == "attn_q.weight" || g == "attn_k.weight"};
    }
  }
  return std::nullopt;
}

}  // namespace

int64_t GgufUnpermutedRow(int64_t row, int64_t head_dim) {
  const int64_t half = head_dim / 2;
  const int64_t h = row / head_dim;
  const int64_t r = row % head_dim;  // = 2i + j
  return h * head_dim + (r % 2) * half + r / 2;
}

Result<ModelConfig> GgufModelConfig(const GgufFile& f) {
  CHUNKSERVE_ASSIGN_OR_RETURN(std::string arch, f.GetString("general.architecture"));
  if (arch != "llama") {
    return Status::Unimplemented(f.name() + ": general.architecture '" + arch +
                                 "' is not supported (llama is)");
  }
  const std::string p = arch + ".";
  ModelConfig c;
  c.architecture = Architecture::kLlama;
  CHUNKSERVE_ASSIGN_OR_RETURN(c.hidden_size, RequiredInt32(f, p + "embedding_length"));
  CHUNKSERVE_ASSIGN_OR_RETURN(c.num_layers, RequiredInt32(f, p + "block_count"));
  CHUNKSERVE_ASSIGN_OR_RETURN(c.intermediate_size, RequiredInt32(f, p + "feed_forward_length"));
  CHUNKSERVE_ASSIGN_OR_RETURN(c.num_qo_heads, RequiredInt32(f, p + "attention.head_count"));
  CHUNKSERVE_ASSIGN_OR_RETURN(std::optional<int32_t> kv,
                              OptionalInt32(f, p + "attention.head_count_kv"));
  c.num_kv_heads = kv.value_or(c.num_qo_heads);
  CHUNKSERVE_ASSIGN_OR_RETURN(std::optional<int32_t> key_length,
                              OptionalInt32(f, p + "attention.key_length"));
  if (key_length.has_value()) {
    c.head_dim = *key_length;
  } else {
    if (c.hidden_size % c.num_qo_heads != 0) {
      return Status::InvalidArgument(f.name() + ": " + p + "attention.head_count (" +
                                     std::to_string(c.num_qo_heads) + ") must divide " + p +
                                     "embedding_length (" + std::to_string(c.hidden_size) + ")");
    }
    c.head_dim = c.hidden_size / c.num_qo_heads;
  }
  CHUNKSERVE_ASSIGN_OR_RETURN(std::optional<int32_t> value_length,
                              OptionalInt32(f, p + "attention.value_length"));
  if (value_length.has_value() && *value_length != c.head_dim) {
    return Status::Unimplemented(f.name() + ": " + p + "attention.value_length " +
                                 std::to_string(*value_length) + " differs from the key length " +
                                 std::to_string(c.head_dim));
  }
  CHUNKSERVE_ASSIGN_OR_RETURN(std::optional<int32_t> rope_dims,
                              OptionalInt32(f, p + "rope.dimension_count"));
  if (rope_dims.has_value() && *rope_dims != c.head_dim) {
    return Status::Unimplemented(f.name() + ": " + p + "rope.dimension_count " +
                                 std::to_string(*rope_dims) + " is not the head dim " +
                                 std::to_string(c.head_dim) + " (partial rotary embeddings)");
  }
  CHUNKSERVE_ASSIGN_OR_RETURN(c.rms_norm_eps, FloatKey(f, p + "attention.layer_norm_rms_epsilon"));
  if (f.Has(p + "rope.freq_base")) {
    CHUNKSERVE_ASSIGN_OR_RETURN(c.rope_theta, FloatKey(f, p + "rope.freq_base"));
  }
  if (f.Has(p + "rope.scaling.type")) {
    CHUNKSERVE_ASSIGN_OR_RETURN(std::string type, f.GetString(p + "rope.scaling.type"));
    if (type == "linear") {
      c.rope_scaling.type = RopeScalingType::kLinear;
      CHUNKSERVE_ASSIGN_OR_RETURN(c.rope_scaling.factor, FloatKey(f, p + "rope.scaling.factor"));
    } else if (type != "none") {
      return Status::Unimplemented(f.name() + ": " + p + "rope.scaling.type '" + type +
                                   "' is not supported (none and linear are)");
    }
  }
  CHUNKSERVE_ASSIGN_OR_RETURN(c.max_position_embeddings, RequiredInt32(f, p + "context_length"));

  // Vocabulary: the tokenizer's, else the declared size, else the embedding's rows.
  const GgufTensorInfo* embd = f.FindTensor("token_embd.weight");
  if (f.Has("tokenizer.ggml.tokens")) {
    CHUNKSERVE_ASSIGN_OR_RETURN(uint64_t n, f.ArrayLength("tokenizer.ggml.tokens"));
    if (n == 0 || n > static_cast<uint64_t>(std::numeric_limits<int32_t>::max())) {
      return Status::InvalidArgument(f.name() + ": tokenizer.ggml.tokens has " +
                                     std::to_string(n) + " entries");
    }
    c.vocab_size = static_cast<int32_t>(n);
  } else if (f.Has(p + "vocab_size")) {
    CHUNKSERVE_ASSIGN_OR_RETURN(c.vocab_size, RequiredInt32(f, p + "vocab_size"));
  } else if (embd != nullptr && embd->dims.size() == 2 &&
             embd->dims[1] <= std::numeric_limits<int32_t>::max() && embd->dims[1] > 0) {
    c.vocab_size = static_cast<int32_t>(embd->dims[1]);
  } else {
    return Status::NotFound(f.name() + ": no vocabulary size (tokenizer.ggml.tokens, " + p +
                            "vocab_size or token_embd.weight)");
  }
  for (const auto& [key, ids] : {std::pair{"tokenizer.ggml.bos_token_id", &c.bos_token_ids},
                                 std::pair{"tokenizer.ggml.eos_token_id", &c.eos_token_ids}}) {
    CHUNKSERVE_ASSIGN_OR_RETURN(std::optional<int32_t> id, OptionalInt32(f, key, true));
    if (id.has_value()) ids->push_back(*id);
  }
  c.tie_word_embeddings = f.FindTensor("output.weight") == nullptr;
  const Status valid = ValidateModelConfig(c);
  if (!valid.ok()) return Status::InvalidArgument(f.name() + ": " + std::string(valid.message()));
  return c;
}

Result<WeightStore> GgufWeightStore(const GgufFile& f, const ModelConfig& config, DType dtype) {
  std::vector<OwnedTensor> out;
  out.reserve(f.tensors().size());
  std::vector<float> row;
  for (const GgufTensorInfo& t : f.tensors()) {
    const std::string where = f.name() + ": tensor '" + t.name + "': ";
    if (t.name == "rope_freqs.weight") {
      return Status::Unimplemented(where + "per-dimension RoPE frequency factors (Llama 3 rope "
                                           "scaling) are not supported");
    }
    const std::optional<Mapped> mapped = HfName(t.name, config.num_layers);
    if (!mapped.has_value()) return Status::Unimplemented(where + "not a Llama tensor we know");
    if (!CanDequantize(t.type)) {
      return Status::Unimplemented(where + "ggml type " + GgmlTypeName(t.type) +
                                   " cannot be dequantized");
    }
    OwnedTensor o;
    o.name = mapped->name;
    o.dtype = dtype;
    o.shape.assign(t.dims.rbegin(), t.dims.rend());
    const int64_t cols = t.dims[0];
    const int64_t rows = cols == 0 ? 0 : t.num_elements() / cols;
    if (mapped->permuted && (o.shape.size() != 2 || rows % config.head_dim != 0)) {
      return Status::InvalidArgument(where + "expected [n * head_dim, hidden] with head_dim " +
                                     std::to_string(config.head_dim));
    }
    const size_t elem = DTypeSize(dtype);
    o.bytes.resize(static_cast<size_t>(t.num_elements()) * elem);
    // Row by row: a row is a whole number of blocks (the reader checked ne[0]), so it dequantizes
    // on its own, and the row permutation and the dtype conversion need one row of scratch.
    const GgmlTypeTraits traits = *GgmlTypeInfo(static_cast<uint32_t>(t.type));
    const size_t row_bytes = static_cast<size_t>(cols / traits.block_size * traits.type_size);
    row.resize(static_cast<size_t>(cols));
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t dst_row = mapped->permuted ? GgufUnpermutedRow(r, config.head_dim) : r;
      std::byte* dst = o.bytes.data() + static_cast<size_t>(dst_row * cols) * elem;
      CHUNKSERVE_RETURN_IF_ERROR(
          DequantizeGgml(t.type, t.bytes().subspan(static_cast<size_t>(r) * row_bytes, row_bytes),
                         row));
      ConvertFromFloat(row, dtype, dst);
    }
    out.push_back(std::move(o));
  }
  return WeightStore::FromOwned(f.name(), std::move(out));
}

}  // namespace chunkserve::model
