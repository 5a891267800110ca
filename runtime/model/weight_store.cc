#include "runtime/model/weight_store.h"

#include <fstream>
#include <new>
#include <nlohmann/json.hpp>
#include <sstream>
#include <system_error>
#include <utility>

namespace chunkserve::model {
namespace {

using Json = nlohmann::json;

std::string Quoted(std::string_view s) {
  constexpr size_t kMax = 120;
  std::string out = "'";
  out += s.substr(0, kMax);
  out += s.size() > kMax ? "...'" : "'";
  return out;
}

bool IsPlainFileName(const std::string& name) {
  return !name.empty() && name != "." && name != ".." &&
         name.find_first_of(std::string_view("/\\\0", 3)) == std::string::npos;
}

// weight_map of an index file: tensor name -> shard file name.
Result<std::map<std::string, std::string>> ReadIndex(const std::filesystem::path& index_path) {
  const std::string prefix = index_path.string() + ": ";
  std::ifstream in(index_path, std::ios::binary);
  if (!in) return Status::NotFound(prefix + "cannot open");
  std::ostringstream text;
  text << in.rdbuf();
  Json root;
  try {
    root = Json::parse(text.str());
  } catch (const Json::exception& e) {
    return Status::DataLoss(prefix + "malformed JSON: " + e.what());
  } catch (const std::bad_alloc&) {
    return Status::ResourceExhausted(prefix + "out of memory parsing the index");
  }
  if (!root.is_object()) return Status::DataLoss(prefix + "the index must be a JSON object");
  auto map_it = root.find("weight_map");
  if (map_it == root.end() || !map_it->is_object()) {
    return Status::InvalidArgument(prefix + "missing weight_map object");
  }
  std::map<std::string, std::string> weight_map;
  for (const auto& [tensor, file] : map_it->items()) {
    if (!file.is_string() || !IsPlainFileName(file.get<std::string>())) {
      return Status::InvalidArgument(prefix + "weight_map entry for tensor " + Quoted(tensor) +
                                     " must be a file name in the same directory, got " +
                                     file.dump());
    }
    weight_map.emplace(tensor, file.get<std::string>());
  }
  if (weight_map.empty()) return Status::InvalidArgument(prefix + "weight_map is empty");
  return weight_map;
}

}  // namespace

Status WeightStore::Add(std::unique_ptr<SafetensorsFile> file) {
  for (const SafetensorsTensorInfo& info : file->tensors()) {
    TensorView view = file->View(info);
    auto [it, inserted] = tensors_.emplace(info.name, view);
    if (!inserted) {
      return Status::InvalidArgument(file->path().string() + ": tensor " + Quoted(info.name) +
                                     " is also in another shard");
    }
    total_bytes_ += info.size_bytes();
  }
  files_.push_back(std::move(file));
  return Status::Ok();
}

Result<WeightStore> WeightStore::Open(const std::filesystem::path& path) {
  std::error_code ec;
  std::filesystem::path single;
  std::filesystem::path index;
  if (std::filesystem::is_directory(path, ec)) {
    if (std::filesystem::exists(path / kSafetensorsIndexFileName, ec)) {
      index = path / kSafetensorsIndexFileName;
    } else if (std::filesystem::exists(path / kSafetensorsFileName, ec)) {
      single = path / kSafetensorsFileName;
    } else {
      return Status::NotFound(path.string() + ": neither " +
                              std::string(kSafetensorsIndexFileName) + " nor " +
                              std::string(kSafetensorsFileName) + " found");
    }
  } else if (path.extension() == ".json") {
    index = path;
  } else {
    single = path;
  }

  WeightStore store;
  store.location_ = path;
  if (!single.empty()) {
    CHUNKSERVE_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Open(single));
    CHUNKSERVE_RETURN_IF_ERROR(store.Add(std::make_unique<SafetensorsFile>(std::move(file))));
    return store;
  }

  CHUNKSERVE_ASSIGN_OR_RETURN(auto weight_map, ReadIndex(index));
  // Open each named shard once, in name order.
  std::map<std::string, std::vector<std::string>> by_file;
  for (const auto& [tensor, file] : weight_map) by_file[file].push_back(tensor);
  const std::filesystem::path dir = index.parent_path();
  for (const auto& [file_name, expected] : by_file) {
    CHUNKSERVE_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Open(dir / file_name));
    for (const std::string& tensor : expected) {
      if (file.header().Find(tensor) == nullptr) {
        return Status::DataLoss(file.path().string() + ": tensor " + Quoted(tensor) +
                                " is missing (" + index.filename().string() + " places it here)");
      }
    }
    for (const SafetensorsTensorInfo& info : file.tensors()) {
      auto it = weight_map.find(info.name);
      if (it == weight_map.end() || it->second != file_name) {
        return Status::InvalidArgument(file.path().string() + ": tensor " + Quoted(info.name) +
                                       " is not mapped to this file by " +
                                       index.filename().string());
      }
    }
    CHUNKSERVE_RETURN_IF_ERROR(store.Add(std::make_unique<SafetensorsFile>(std::move(file))));
  }
  return store;
}

Result<WeightStore> WeightStore::FromOwned(std::filesystem::path location,
                                           std::vector<OwnedTensor> tensors) {
  WeightStore store;
  store.location_ = std::move(location);
  for (OwnedTensor& t : tensors) {
    uint64_t bytes = DTypeSize(t.dtype);
    for (int64_t d : t.shape) {
      if (d < 0 || __builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes)) {
        return Status::InvalidArgument(store.location_.string() + ": tensor " + Quoted(t.name) +
                                       " has an invalid shape");
      }
    }
    if (bytes != t.bytes.size()) {
      return Status::InvalidArgument(store.location_.string() + ": tensor " + Quoted(t.name) +
                                     " needs " + std::to_string(bytes) + " bytes, holds " +
                                     std::to_string(t.bytes.size()));
    }
    auto owned = std::make_unique<OwnedTensor>(std::move(t));
    TensorView view;
    view.name = owned->name;
    view.dtype = owned->dtype;
    view.shape = owned->shape;
    view.data = owned->bytes.data();
    view.size_bytes = owned->bytes.size();
    if (!store.tensors_.emplace(owned->name, view).second) {
      return Status::InvalidArgument(store.location_.string() + ": tensor " + Quoted(owned->name) +
                                     " appears twice");
    }
    store.total_bytes_ += view.size_bytes;
    store.owned_.push_back(std::move(owned));
  }
  return store;
}

std::optional<TensorView> WeightStore::Find(std::string_view name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) return std::nullopt;
  return it->second;
}

Result<TensorView> WeightStore::Get(std::string_view name) const {
  std::optional<TensorView> v = Find(name);
  if (!v.has_value()) {
    return Status::NotFound(location_.string() + ": no tensor " + Quoted(name));
  }
  return *v;
}

}  // namespace chunkserve::model
