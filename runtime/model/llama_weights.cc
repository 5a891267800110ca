#include "runtime/model/llama_weights.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <string_view>
#include <utility>

namespace chunkserve::model {
namespace {

std::string ShapeString(std::span<const int64_t> shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

std::string LayerPrefix(int i) { return "model.layers." + std::to_string(i) + "."; }

// model.layers.{i}.self_attn.rotary_emb.inv_freq: a buffer older checkpoints saved; it is
// recomputed from the config, never read.
bool IsRotaryBuffer(std::string_view name) {
  constexpr std::string_view kPrefix = "model.layers.";
  constexpr std::string_view kSuffix = ".self_attn.rotary_emb.inv_freq";
  if (!name.starts_with(kPrefix) || !name.ends_with(kSuffix)) return false;
  const std::string_view index =
      name.substr(kPrefix.size(), name.size() - kPrefix.size() - kSuffix.size());
  if (index.empty()) return false;
  for (char ch : index) {
    if (ch < '0' || ch > '9') return false;
  }
  return true;
}

}  // namespace

std::vector<ExpectedTensor> ExpectedLlamaTensors(const ModelConfig& c) {
  const int64_t hidden = c.hidden_size, inter = c.intermediate_size;
  const int64_t q_dim = c.q_dim(), kv_dim = c.kv_dim();
  std::vector<ExpectedTensor> out;
  out.push_back({"model.embed_tokens.weight", {c.vocab_size, hidden}});
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string p = LayerPrefix(i);
    out.push_back({p + "input_layernorm.weight", {hidden}});
    out.push_back({p + "self_attn.q_proj.weight", {q_dim, hidden}});
    out.push_back({p + "self_attn.k_proj.weight", {kv_dim, hidden}});
    out.push_back({p + "self_attn.v_proj.weight", {kv_dim, hidden}});
    out.push_back({p + "self_attn.o_proj.weight", {hidden, q_dim}});
    if (c.qkv_bias) {
      out.push_back({p + "self_attn.q_proj.bias", {q_dim}});
      out.push_back({p + "self_attn.k_proj.bias", {kv_dim}});
      out.push_back({p + "self_attn.v_proj.bias", {kv_dim}});
    }
    if (c.o_bias) out.push_back({p + "self_attn.o_proj.bias", {hidden}});
    out.push_back({p + "post_attention_layernorm.weight", {hidden}});
    out.push_back({p + "mlp.gate_proj.weight", {inter, hidden}});
    out.push_back({p + "mlp.up_proj.weight", {inter, hidden}});
    out.push_back({p + "mlp.down_proj.weight", {hidden, inter}});
  }
  out.push_back({"model.norm.weight", {hidden}});
  if (!c.tie_word_embeddings) out.push_back({"lm_head.weight", {c.vocab_size, hidden}});
  return out;
}

Result<LlamaWeights> BindLlamaWeights(const ModelConfig& config, const WeightStore& store,
                                      const BindOptions& options) {
  CHUNKSERVE_RETURN_IF_ERROR(ValidateModelConfig(config));
  const std::string where = store.location().string() + ": ";
  const std::vector<ExpectedTensor> expected = ExpectedLlamaTensors(config);

  // Shape problems: report the first, count the rest.
  std::string first_problem;
  size_t num_problems = 0;
  auto problem = [&](std::string message) {
    if (num_problems++ == 0) first_problem = std::move(message);
  };
  std::map<std::string_view, const TensorView*> found;
  for (const ExpectedTensor& e : expected) {
    auto it = store.tensors().find(e.name);
    if (it == store.tensors().end()) {
      problem("missing tensor '" + e.name + "' " + ShapeString(e.shape));
      continue;
    }
    const TensorView& v = it->second;
    if (!std::equal(v.shape.begin(), v.shape.end(), e.shape.begin(), e.shape.end())) {
      problem("tensor '" + e.name + "' has shape " + ShapeString(v.shape) + ", expected " +
              ShapeString(e.shape));
      continue;
    }
    found.emplace(e.name, &v);
  }
  std::set<std::string_view> expected_names;
  for (const ExpectedTensor& e : expected) expected_names.insert(e.name);
  for (const auto& [name, view] : store.tensors()) {
    if (expected_names.contains(name) || IsRotaryBuffer(name)) continue;
    if (config.tie_word_embeddings && name == "lm_head.weight") continue;
    if (options.allow_unused_tensors) continue;
    problem("unexpected tensor '" + name + "' (set allow_unused_tensors to ignore it)");
  }
  if (num_problems > 0) {
    std::string msg = where + first_problem;
    if (num_problems > 1) msg += " (and " + std::to_string(num_problems - 1) + " more problems)";
    return Status::InvalidArgument(msg);
  }

  // One dtype for all, and aligned for typed reads.
  const TensorView& embed = *found.at("model.embed_tokens.weight");
  LlamaWeights w;
  w.dtype = embed.dtype;
  for (const auto& [name, view] : found) {
    if (view->dtype != w.dtype) {
      return Status::Unimplemented(where + "mixed weight dtypes: tensor '" + std::string(name) +
                                   "' is " + std::string(SafetensorsDTypeName(view->dtype)) +
                                   " but model.embed_tokens.weight is " +
                                   std::string(SafetensorsDTypeName(w.dtype)));
    }
    if (reinterpret_cast<uintptr_t>(view->data) % DTypeSize(view->dtype) != 0) {
      return Status::Unimplemented(where + "tensor '" + std::string(name) +
                                   "' is not aligned to its element size in the file");
    }
  }

  auto ptr = [&](const std::string& name) -> const void* {
    auto it = found.find(name);
    return it == found.end() ? nullptr : it->second->data;
  };
  w.embed_tokens = ptr("model.embed_tokens.weight");
  w.final_norm = ptr("model.norm.weight");
  w.lm_head = config.tie_word_embeddings ? w.embed_tokens : ptr("lm_head.weight");
  w.layers.resize(static_cast<size_t>(config.num_layers));
  for (int i = 0; i < config.num_layers; ++i) {
    const std::string p = LayerPrefix(i);
    LlamaLayerWeights& l = w.layers[static_cast<size_t>(i)];
    l.input_norm = ptr(p + "input_layernorm.weight");
    l.q_proj = ptr(p + "self_attn.q_proj.weight");
    l.k_proj = ptr(p + "self_attn.k_proj.weight");
    l.v_proj = ptr(p + "self_attn.v_proj.weight");
    l.o_proj = ptr(p + "self_attn.o_proj.weight");
    l.q_bias = ptr(p + "self_attn.q_proj.bias");
    l.k_bias = ptr(p + "self_attn.k_proj.bias");
    l.v_bias = ptr(p + "self_attn.v_proj.bias");
    l.o_bias = ptr(p + "self_attn.o_proj.bias");
    l.post_attention_norm = ptr(p + "post_attention_layernorm.weight");
    l.gate_proj = ptr(p + "mlp.gate_proj.weight");
    l.up_proj = ptr(p + "mlp.up_proj.weight");
    l.down_proj = ptr(p + "mlp.down_proj.weight");
  }
  return w;
}

}  // namespace chunkserve::model
