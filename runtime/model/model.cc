#include "runtime/model/model.h"

// The state struct's definition, so it lives on the stack (no allocation that could fail).
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include <memory>
#include <string>

#include "runtime/base/logging.h"
#include "runtime/model/gguf.h"
#include "runtime/model/gguf_model.h"

namespace chunkserve::model {
namespace {

constexpr std::string_view kFingerprintVersion = "chunkserve-model-fingerprint-v1";
constexpr size_t kSampleBytes = 4096;

class Hasher {
 public:
  Hasher() {
    XXH3_INITSTATE(&state_);
    XXH3_64bits_reset(&state_);
  }
  void Bytes(const void* data, size_t size) { XXH3_64bits_update(&state_, data, size); }
  void String(std::string_view s) {
    U64(s.size());
    Bytes(s.data(), s.size());
  }
  // Little-endian whatever the host, so the value is the same on every machine.
  void U64(uint64_t v) {
    unsigned char b[8];
    for (int i = 0; i < 8; ++i) b[i] = static_cast<unsigned char>(v >> (8 * i));
    Bytes(b, sizeof(b));
  }
  uint64_t Digest() { return XXH3_64bits_digest(&state_); }

 private:
  XXH3_state_t state_;
};

}  // namespace

uint64_t ModelFingerprint(const ModelConfig& config, const WeightStore& store,
                          FingerprintMode mode) {
  Hasher h;
  h.String(kFingerprintVersion);
  h.String(CanonicalModelConfig(config));
  h.U64(store.num_tensors());
  for (const auto& [name, view] : store.tensors()) {
    h.String(name);
    h.U64(static_cast<uint64_t>(view.dtype));
    h.U64(view.shape.size());
    for (int64_t d : view.shape) h.U64(static_cast<uint64_t>(d));
    const size_t n = view.size_bytes;
    if (mode == FingerprintMode::kFull || n <= 3 * kSampleBytes) {
      h.Bytes(view.data, n);
    } else {
      h.Bytes(view.data, kSampleBytes);
      h.Bytes(view.data + (n / 2 - kSampleBytes / 2), kSampleBytes);
      h.Bytes(view.data + (n - kSampleBytes), kSampleBytes);
    }
  }
  return h.Digest();
}

void LoadedModel::ReleaseWeights() {
  LlamaWeights empty;
  empty.dtype = weights_.dtype;
  weights_ = std::move(empty);
  Result<WeightStore> none = WeightStore::FromOwned(store_.location(), {});
  if (none.ok()) store_ = std::move(none).value();  // an empty store cannot fail; keep it if it did
}

bool IsGgufPath(const std::filesystem::path& path) { return path.extension() == ".gguf"; }

Result<LoadedModel> LoadedModel::Load(const std::filesystem::path& dir,
                                      const LoadModelOptions& options) {
  ModelConfig config;
  std::optional<WeightStore> store;
  if (IsGgufPath(dir)) {
    if (options.gguf_dtype != DType::kF32 && options.gguf_dtype != DType::kF16 &&
        options.gguf_dtype != DType::kBF16) {
      return Status::InvalidArgument("gguf_dtype must be f32, f16 or bf16");
    }
    CHUNKSERVE_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file, GgufFile::Open(dir));
    CHUNKSERVE_ASSIGN_OR_RETURN(config, GgufModelConfig(*file));
    CHUNKSERVE_ASSIGN_OR_RETURN(store, GgufWeightStore(*file, config, options.gguf_dtype));
  } else {
    CHUNKSERVE_ASSIGN_OR_RETURN(config, LoadModelConfig(dir, options.config));
    if (!config.ignored_fields.empty()) {
      std::string names;
      for (const std::string& f : config.ignored_fields) names += (names.empty() ? "" : ", ") + f;
      LOG(INFO) << dir.string() << ": config.json fields not used by this runtime, ignored: "
                << names;
    }
    CHUNKSERVE_ASSIGN_OR_RETURN(store, WeightStore::Open(dir));
  }
  LoadedModel m(dir, std::move(config), std::move(*store));
  // Bound after the store reached its final home; the views point into its heap-held files, so
  // later moves of the LoadedModel keep them valid.
  CHUNKSERVE_ASSIGN_OR_RETURN(m.weights_, BindLlamaWeights(m.config_, m.store_, options.bind));
  m.fingerprint_ = ModelFingerprint(m.config_, m.store_, options.fingerprint);
  return m;
}

}  // namespace chunkserve::model
