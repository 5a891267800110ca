// chunkserve-make-tiny-model: writes a random-weight Llama-family model directory (config.json +
// safetensors), deterministic from --seed, then loads it back to check it and prints a summary.
//
//   chunkserve-make-tiny-model --out /tmp/tiny [--seed 7 --dtype bf16 --layers 2 --shards 3]
//
// Exit status: 0 on success, 1 when writing or checking fails, 2 on a usage error.
#include <cerrno>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

#include "runtime/model/model.h"
#include "runtime/model/tiny_model.h"

namespace {

using chunkserve::Result;
using chunkserve::Status;
namespace model = chunkserve::model;

constexpr const char* kUsage = R"(usage: chunkserve-make-tiny-model --out DIR [options]

Writes a random-weight model (config.json + safetensors) deterministic from the seed.
Defaults are the built-in demo model (TinyModelOptions::Default()).

  --out DIR                 output directory (created if missing)               required
  --seed N                  weight seed                                         0
  --dtype f32|f16|bf16      weight dtype                                        f32
  --arch llama|mistral|qwen2                                                    llama
  --vocab N                 vocab_size                                          1024
  --hidden N                hidden_size                                         256
  --layers N                num_hidden_layers                                   4
  --heads N                 num_attention_heads                                 8
  --kv-heads N              num_key_value_heads                                 2
  --head-dim N              head_dim                                            64
  --intermediate N          intermediate_size                                   688
  --max-positions N         max_position_embeddings                             8192
  --rope-theta X            rope_theta                                          10000
  --tied                    tie lm_head to the embeddings
  --attention-bias          llama: biases on q, k, v, o (qwen2 always has q, k, v biases)
  --shards N                number of safetensors shards (1 = model.safetensors) 1
  --help                    this text
)";

Result<int64_t> ParseInt(std::string_view flag, const char* text) {
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0') {
    return Status::InvalidArgument(std::string(flag) + ": not an integer: " + text);
  }
  return static_cast<int64_t>(v);
}

Result<int32_t> ParseInt32(std::string_view flag, const char* text) {
  CHUNKSERVE_ASSIGN_OR_RETURN(int64_t v, ParseInt(flag, text));
  if (v < INT32_MIN || v > INT32_MAX) {
    return Status::InvalidArgument(std::string(flag) + ": out of range: " + text);
  }
  return static_cast<int32_t>(v);
}

struct Args {
  std::string out;
  model::TinyModelOptions options = model::TinyModelOptions::Default();
  bool help = false;
};

Result<Args> ParseArgs(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      args.help = true;
      return args;
    }
    if (flag == "--tied") {
      args.options.tie_word_embeddings = true;
      continue;
    }
    if (flag == "--attention-bias") {
      args.options.attention_bias = true;
      continue;
    }
    if (i + 1 >= argc) return Status::InvalidArgument(std::string(flag) + " needs a value");
    const char* value = argv[++i];
    model::TinyModelOptions& o = args.options;
    if (flag == "--out") {
      args.out = value;
    } else if (flag == "--seed") {
      char* end = nullptr;
      errno = 0;
      const unsigned long long seed = std::strtoull(value, &end, 10);
      if (errno != 0 || end == value || *end != '\0' || value[0] == '-') {
        return Status::InvalidArgument(std::string("--seed: not a non-negative integer: ") + value);
      }
      o.seed = seed;
    } else if (flag == "--dtype") {
      CHUNKSERVE_ASSIGN_OR_RETURN(o.dtype, model::ParseDType(value));
    } else if (flag == "--arch") {
      CHUNKSERVE_ASSIGN_OR_RETURN(o.architecture, model::ParseArchitecture(value));
    } else if (flag == "--vocab") {
      CHUNKSERVE_ASSIGN_OR_RETURN(o.vocab_size, ParseInt32(flag, value));
    } else if (flag == "--hidden") {
      CHUNKSERVE_ASSIGN_OR_RETURN(o.hidden_size, ParseInt32(flag, value));
    } else if (flag == "--layers") {
      CHUNKSERVE_ASSIGN_OR_RETURN(o.num_layers, ParseInt32(flag, value));
    } else if (flag == "--heads") {
      CHUNKSERVE_ASSIGN_OR_RETURN(o.num_qo_heads, ParseInt32(flag, value));
    } else if (flag == "--kv-heads") {
      CHUNKSERVE_ASSIGN_OR_RETURN(o.num_kv_heads, ParseInt32(flag, value));
    } else if (flag == "--head-dim") {
      CHUNKSERVE_ASSIGN_OR_RETURN(o.head_dim, ParseInt32(flag, value));
    } else if (flag == "--intermediate") {
      CHUNKSERVE_ASSIGN_OR_RETURN(o.intermediate_size, ParseInt32(flag, value));
    } else if (flag == "--max-positions") {
      CHUNKSERVE_ASSIGN_OR_RETURN(o.max_position_embeddings, ParseInt32(flag, value));
    } else if (flag == "--shards") {
      CHUNKSERVE_ASSIGN_OR_RETURN(o.num_shards, ParseInt32(flag, value));
    } else if (flag == "--rope-theta") {
      char* end = nullptr;
      o.rope_theta = std::strtod(value, &end);
      if (end == value || *end != '\0') {
        return Status::InvalidArgument(std::string("--rope-theta: not a number: ") + value);
      }
    } else {
      return Status::InvalidArgument("unknown flag " + std::string(flag));
    }
  }
  if (args.out.empty()) return Status::InvalidArgument("--out DIR is required");
  return args;
}

}  // namespace

int main(int argc, char** argv) {
  Result<Args> args = ParseArgs(argc, argv);
  if (!args.ok()) {
    std::fprintf(stderr, "chunkserve-make-tiny-model: %s\n\n%s",
                 std::string(args.status().message()).c_str(), kUsage);
    return 2;
  }
  if (args->help) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (Status s = model::WriteTinyModel(args->out, args->options); !s.ok()) {
    std::fprintf(stderr, "chunkserve-make-tiny-model: %s\n", s.ToString().c_str());
    return 1;
  }
  Result<model::LoadedModel> loaded = model::LoadedModel::Load(args->out);
  if (!loaded.ok()) {
    std::fprintf(stderr, "chunkserve-make-tiny-model: written model does not load: %s\n",
                 loaded.status().ToString().c_str());
    return 1;
  }
  const model::ModelConfig& c = loaded->config();
  std::printf(
      "wrote %s: %s, vocab %d, hidden %d, %d layers, %d/%d heads x %d, intermediate %d, %s, "
      "%zu tensors in %zu file(s), %" PRIu64 " bytes, fingerprint %016" PRIx64 "\n",
      args->out.c_str(), std::string(model::ArchitectureName(c.architecture)).c_str(), c.vocab_size,
      c.hidden_size, c.num_layers, c.num_qo_heads, c.num_kv_heads, c.head_dim, c.intermediate_size,
      std::string(model::DTypeName(loaded->dtype())).c_str(), loaded->store().num_tensors(),
      loaded->store().num_files(), loaded->store().total_bytes(), loaded->fingerprint());
  return 0;
}
