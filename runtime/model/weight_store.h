// WeightStore: every tensor of a model checkpoint, from one safetensors file or from shards.
//
// Layouts accepted by Open(path):
//  - a directory holding model.safetensors.index.json: sharded. The index is
//      {"metadata": {...}, "weight_map": {"<tensor>": "<shard file name>", ...}}
//    Shard names are plain file names in the same directory (no '/', not "." or ".."). Every
//    shard the map names is opened once; each tensor must be in the shard the map says, and every
//    tensor of every shard must be in the map (no strays, no tensor in two shards).
//  - a directory holding model.safetensors: a single file.
//  - a path to a .safetensors file, or to an index .json file.
// Each file is validated by SafetensorsFile::Open. Errors name the file and the tensor; a
// directory with neither file is NotFound naming both candidates.
//
// FromOwned builds a store over tensors held in memory instead of mapped files: weights that had
// to be converted at load (GGUF checkpoints, dequantized; see gguf_model.h).
//
// Ownership: the store owns the mappings or the owned tensors. TensorViews stay valid (same
// addresses) while the store lives, including after the store is moved.
//
// Thread safety: immutable after Open; concurrent readers are fine.
#ifndef CHUNKSERVE_RUNTIME_MODEL_WEIGHT_STORE_H_
#define CHUNKSERVE_RUNTIME_MODEL_WEIGHT_STORE_H_

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/base/status.h"
#include "runtime/model/safetensors.h"

namespace chunkserve::model {

inline constexpr std::string_view kSafetensorsFileName = "model.safetensors";
inline constexpr std::string_view kSafetensorsIndexFileName = "model.safetensors.index.json";

// A tensor whose bytes a WeightStore owns.
struct OwnedTensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;    // row-major, as TensorView
  std::vector<std::byte> bytes;  // product(shape) * DTypeSize(dtype); malloc-aligned (>= 16)
};

class WeightStore {
 public:
  static Result<WeightStore> Open(const std::filesystem::path& path);
  // A store over `tensors`, which it keeps. `location` names it in errors. InvalidArgument, naming
  // the tensor, for duplicate names or bytes that do not match the shape and dtype.
  static Result<WeightStore> FromOwned(std::filesystem::path location,
                                       std::vector<OwnedTensor> tensors);

  WeightStore(WeightStore&&) noexcept = default;
  WeightStore& operator=(WeightStore&&) noexcept = default;

  // The tensor, or nullopt when absent.
  std::optional<TensorView> Find(std::string_view name) const;
  // NotFound naming the tensor and the store's location when absent.
  Result<TensorView> Get(std::string_view name) const;

  // Every tensor, sorted by name.
  const std::map<std::string, TensorView, std::less<>>& tensors() const { return tensors_; }
  size_t num_tensors() const { return tensors_.size(); }
  size_t num_files() const { return files_.size(); }  // 0 for FromOwned
  // Sum of the tensors' byte sizes.
  uint64_t total_bytes() const { return total_bytes_; }
  // What Open was given (a directory or a file).
  const std::filesystem::path& location() const { return location_; }

 private:
  WeightStore() = default;
  Status Add(std::unique_ptr<SafetensorsFile> file);

  std::filesystem::path location_;
  // unique_ptr: views point into the files' headers and mappings, and into the owned tensors'
  // names, shapes and bytes, which must not move.
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::vector<std::unique_ptr<OwnedTensor>> owned_;
  std::map<std::string, TensorView, std::less<>> tensors_;
  uint64_t total_bytes_ = 0;
};

}  // namespace chunkserve::model

#endif  // CHUNKSERVE_RUNTIME_MODEL_WEIGHT_STORE_H_
