#include "runtime/model/tiny_model.h"

#include <unistd.h>
#include <xxhash.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <system_error>
#include <vector>

#include "runtime/model/llama_weights.h"
#include "runtime/model/safetensors.h"
#include "runtime/model/weight_store.h"

namespace chunkserve::model {
namespace {

uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

struct Init {
  double mean;
  double stddev;
};

Init InitFor(const ExpectedTensor& t, const ModelConfig& c) {
  const std::string_view name = t.name;
  if (name.ends_with("norm.weight")) return {1.0, 0.05};
  if (name.ends_with(".bias")) return {0.0, 0.1};
  if (name == "model.embed_tokens.weight") {
    return {0.0, c.tie_word_embeddings
                     ? 1.0 / std::sqrt(std::sqrt(static_cast<double>(c.hidden_size)))
                     : 1.0};
  }
  // lm_head and every linear layer: [out, in], std 1 / sqrt(in).
  return {0.0, 1.0 / std::sqrt(static_cast<double>(t.shape[1]))};
}

// The tensor's bytes in `dtype`. Each value is mean + u * stddev where u is a sum of four 16-bit
// uniforms, centred and scaled to unit variance: (sum - 2 * 65535) * sqrt(3) / 65536. The integer
// part is exact and std::fma rounds once, so the result is the same on every IEEE machine.
std::vector<std::byte> TensorBytes(uint64_t seed, const ExpectedTensor& t, const ModelConfig& c,
                                   DType dtype) {
  int64_t n = 1;
  for (int64_t d : t.shape) n *= d;
  const Init init = InitFor(t, c);
  const double scale = init.stddev * std::sqrt(3.0) / 65536.0;
  uint64_t state = XXH3_64bits_withSeed(t.name.data(), t.name.size(), seed);
  std::vector<float> values(static_cast<size_t>(n));
  for (float& v : values) {
    const uint64_t r = SplitMix64(state);
    const int64_t sum = static_cast<int64_t>((r & 0xffff) + ((r >> 16) & 0xffff) +
                                             ((r >> 32) & 0xffff) + (r >> 48));
    v = static_cast<float>(std::fma(static_cast<double>(sum - 2 * 65535), scale, init.mean));
  }
  std::vector<std::byte> bytes(values.size() * DTypeSize(dtype));
  ConvertFromFloat(values, dtype, bytes.data());
  return bytes;
}

Status WriteTextFile(const std::filesystem::path& path, const std::string& text) {
  const std::filesystem::path tmp = path.string() + ".tmp-" + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    if (!out) {
      out.close();
      std::error_code ignored;
      std::filesystem::remove(tmp, ignored);
      return Status::Unavailable(tmp.string() + ": write failed");
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::error_code ignored;
    std::filesystem::remove(tmp, ignored);
    return Status::Unavailable(path.string() + ": cannot rename into place: " + ec.message());
  }
  return Status::Ok();
}

std::string ShardName(int k, int n) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "model-%05d-of-%05d.safetensors", k, n);
  return buf;
}

}  // namespace

Result<ModelConfig> TinyModelConfig(const TinyModelOptions& o) {
  ModelConfig c;
  c.architecture = o.architecture;
  c.vocab_size = o.vocab_size;
  c.hidden_size = o.hidden_size;
  c.intermediate_size = o.intermediate_size;
  c.num_layers = o.num_layers;
  c.num_qo_heads = o.num_qo_heads;
  c.num_kv_heads = o.num_kv_heads;
  c.head_dim = o.head_dim;
  c.rms_norm_eps = o.rms_norm_eps;
  c.rope_theta = o.rope_theta;
  c.rope_scaling = o.rope_scaling;
  c.max_position_embeddings = o.max_position_embeddings;
  c.tie_word_embeddings = o.tie_word_embeddings;
  c.qkv_bias = o.architecture == Architecture::kQwen2 ||
               (o.architecture == Architecture::kLlama && o.attention_bias);
  c.o_bias = o.architecture == Architecture::kLlama && o.attention_bias;
  c.torch_dtype = o.dtype;
  c.bos_token_ids = {o.bos_token_id};
  c.eos_token_ids = {o.eos_token_id};
  CHUNKSERVE_RETURN_IF_ERROR(ValidateModelConfig(c).Annotate("tiny model options"));
  return c;
}

Status WriteTinyModel(const std::filesystem::path& dir, const TinyModelOptions& options) {
  CHUNKSERVE_ASSIGN_OR_RETURN(ModelConfig config, TinyModelConfig(options));
  const std::vector<ExpectedTensor> tensors = ExpectedLlamaTensors(config);
  const int num_shards = options.num_shards;
  if (num_shards < 1 || static_cast<size_t>(num_shards) > tensors.size()) {
    return Status::InvalidArgument("tiny model options: num_shards must be in [1, " +
                                   std::to_string(tensors.size()) + "], got " +
                                   std::to_string(num_shards));
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::Unavailable(dir.string() + ": cannot create: " + ec.message());

  const std::map<std::string, std::string> metadata = {
      {"format", "pt"}, {"chunkserve.tiny_model_seed", std::to_string(options.seed)}};
  nlohmann::json weight_map = nlohmann::json::object();
  uint64_t total_bytes = 0;
  // Contiguous runs of the table order, as even in tensor count as possible.
  size_t next = 0;
  for (int k = 0; k < num_shards; ++k) {
    const size_t end =
        tensors.size() * static_cast<size_t>(k + 1) / static_cast<size_t>(num_shards);
    std::vector<std::vector<std::byte>> buffers;
    std::vector<TensorToWrite> shard;
    buffers.reserve(end - next);
    for (; next < end; ++next) {
      const ExpectedTensor& t = tensors[next];
      buffers.push_back(TensorBytes(options.seed, t, config, options.dtype));
      shard.push_back({t.name, options.dtype, t.shape, buffers.back()});
      total_bytes += buffers.back().size();
    }
    const std::string file =
        num_shards == 1 ? std::string(kSafetensorsFileName) : ShardName(k + 1, num_shards);
    for (const TensorToWrite& t : shard) weight_map[t.name] = file;
    CHUNKSERVE_RETURN_IF_ERROR(WriteSafetensors(dir / file, shard, metadata));
  }

  // Leave exactly one layout behind; WeightStore prefers an index when both exist.
  if (num_shards == 1) {
    std::filesystem::remove(dir / kSafetensorsIndexFileName, ec);
  } else {
    const nlohmann::json index = {{"metadata", {{"total_size", total_bytes}}},
                                  {"weight_map", weight_map}};
    CHUNKSERVE_RETURN_IF_ERROR(
        WriteTextFile(dir / kSafetensorsIndexFileName, index.dump(2) + "\n"));
    std::filesystem::remove(dir / kSafetensorsFileName, ec);
  }
  return WriteTextFile(dir / "config.json", ModelConfigToJson(config));
}

}  // namespace chunkserve::model
