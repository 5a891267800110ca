#include "runtime/model/safetensors.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <new>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>
#include <system_error>
#include <utility>

namespace chunkserve::model {
namespace {

using Json = nlohmann::json;

// Names come from the file; keep messages bounded.
std::string Quoted(std::string_view s) {
  constexpr size_t kMax = 120;
  std::string out = "'";
  out += s.substr(0, kMax);
  out += s.size() > kMax ? "...'" : "'";
  return out;
}

std::string ShapeString(std::span<const int64_t> shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

// The safetensors dtypes we know but do not load.
constexpr std::string_view kOtherDTypes[] = {
    "F64", "F8_E4M3", "F8_E5M2", "F8_E8M0", "F6_E2M3", "F6_E3M2", "F4",   "I64", "I32",
    "I16", "I8",      "U64",     "U32",     "U16",     "U8",      "BOOL", "C64"};

Result<DType> TensorDType(const std::string& s, const std::string& where) {
  if (s == "F32") return DType::kF32;
  if (s == "F16") return DType::kF16;
  if (s == "BF16") return DType::kBF16;
  if (std::find(std::begin(kOtherDTypes), std::end(kOtherDTypes), s) != std::end(kOtherDTypes)) {
    return Status::Unimplemented(where + "dtype " + s +
                                 " is not supported (F32, F16 and BF16 are)");
  }
  return Status::InvalidArgument(where + "unknown dtype " + Quoted(s));
}

// Reads a JSON integer in [0, INT64_MAX]; nullopt otherwise.
std::optional<uint64_t> NonNegative(const Json& v) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
    return u;
  }
  if (v.is_number_integer()) {
    const int64_t i = v.get<int64_t>();
    if (i < 0) return std::nullopt;
    return static_cast<uint64_t>(i);
  }
  return std::nullopt;
}

Result<SafetensorsTensorInfo> ParseEntry(const std::string& name, const Json& entry,
                                         uint64_t data_size, const std::string& prefix) {
  const std::string where = prefix + "tensor " + Quoted(name) + ": ";
  if (!entry.is_object()) {
    return Status::InvalidArgument(where + "entry must be an object, got " + entry.type_name());
  }
  SafetensorsTensorInfo info;
  info.name = name;

  auto dtype_it = entry.find("dtype");
  if (dtype_it == entry.end() || !dtype_it->is_string()) {
    return Status::InvalidArgument(where + "missing dtype string");
  }
  CHUNKSERVE_ASSIGN_OR_RETURN(info.dtype, TensorDType(dtype_it->get<std::string>(), where));

  auto shape_it = entry.find("shape");
  if (shape_it == entry.end() || !shape_it->is_array()) {
    return Status::InvalidArgument(where + "missing shape list");
  }
  bool has_zero = false;
  for (const Json& d : *shape_it) {
    const std::optional<uint64_t> dim = NonNegative(d);
    if (!dim.has_value()) {
      return Status::InvalidArgument(where + "shape entries must be non-negative integers, got " +
                                     d.dump());
    }
    info.shape.push_back(static_cast<int64_t>(*dim));
    has_zero |= *dim == 0;
  }

  auto offsets_it = entry.find("data_offsets");
  if (offsets_it == entry.end() || !offsets_it->is_array() || offsets_it->size() != 2) {
    return Status::InvalidArgument(where + "data_offsets must be a list of two integers");
  }
  const std::optional<uint64_t> begin = NonNegative((*offsets_it)[0]);
  const std::optional<uint64_t> end = NonNegative((*offsets_it)[1]);
  if (!begin.has_value() || !end.has_value() || *begin > *end) {
    return Status::InvalidArgument(where + "data_offsets " + offsets_it->dump() +
                                   " must be two integers 0 <= begin <= end");
  }
  info.begin = *begin;
  info.end = *end;

  // Expected byte size, with overflow treated as "too large to match any file".
  uint64_t bytes = 0;
  bool overflow = false;
  if (!has_zero) {
    bytes = DTypeSize(info.dtype);
    for (int64_t d : info.shape) {
      overflow = overflow || __builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes);
    }
  }
  if (overflow || bytes != info.end - info.begin) {
    return Status::InvalidArgument(
        where + "shape " + ShapeString(info.shape) + " of " +
        std::string(SafetensorsDTypeName(info.dtype)) + " needs " +
        (overflow ? std::string("more than 2^64") : std::to_string(bytes)) +
        " bytes but data_offsets span " + std::to_string(info.end - info.begin));
  }
  if (info.end > data_size) {
    return Status::DataLoss(where + "data_offsets [" + std::to_string(info.begin) + ", " +
                            std::to_string(info.end) + "] run past the data section (" +
                            std::to_string(data_size) +
                            " bytes): the file is truncated or corrupt");
  }
  return info;
}

Result<SafetensorsHeader> ParseJson(const char* text, size_t size, uint64_t data_size,
                                    const std::string& prefix) {
  // The DOM parser keeps the last of duplicate keys; a callback sees every top-level key so a
  // duplicate (two definitions of one tensor) is an error instead of a silent choice.
  std::set<std::string, std::less<>> seen;
  std::optional<std::string> duplicate;
  auto callback = [&](int depth, Json::parse_event_t event, Json& parsed) {
    if (event == Json::parse_event_t::key && depth == 1 && !duplicate.has_value() &&
        parsed.is_string()) {
      const std::string& key = parsed.get_ref<const std::string&>();
      if (!seen.insert(key).second) duplicate = key;
    }
    return true;
  };
  Json root;
  try {
    root = Json::parse(text, text + size, callback);
  } catch (const Json::exception& e) {
    return Status::DataLoss(prefix + "malformed header JSON: " + e.what());
  } catch (const std::bad_alloc&) {
    return Status::ResourceExhausted(prefix + "out of memory parsing the header JSON");
  }
  if (!root.is_object()) {
    return Status::DataLoss(prefix + "header must be a JSON object, got " + root.type_name());
  }
  if (duplicate.has_value()) {
    return Status::DataLoss(prefix + "header defines " + Quoted(*duplicate) + " twice");
  }

  SafetensorsHeader header;
  header.header_size = size;
  header.data_size = data_size;
  for (const auto& [key, value] : root.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) {
        return Status::InvalidArgument(prefix + "__metadata__ must be an object, got " +
                                       value.type_name());
      }
      for (const auto& [mkey, mvalue] : value.items()) {
        if (!mvalue.is_string()) {
          return Status::InvalidArgument(prefix + "__metadata__ value " + Quoted(mkey) +
                                         " must be a string, got " + mvalue.type_name());
        }
        header.metadata.emplace(mkey, mvalue.get<std::string>());
      }
      continue;
    }
    if (key.empty()) {
      // A tensor needs a name to be found; EncodeSafetensors refuses to write one without.
      return Status::InvalidArgument(prefix + "a tensor has an empty name");
    }
    CHUNKSERVE_ASSIGN_OR_RETURN(SafetensorsTensorInfo info,
                                ParseEntry(key, value, data_size, prefix));
    header.tensors.push_back(std::move(info));
  }
  // items() of a (std::map-backed) object come in key order, so tensors are sorted by name.

  // Overlap: sort the non-empty byte ranges by start; each must start at or after the previous
  // end. Empty tensors own no bytes and may sit anywhere.
  std::vector<const SafetensorsTensorInfo*> ranges;
  for (const SafetensorsTensorInfo& t : header.tensors) {
    if (t.size_bytes() > 0) ranges.push_back(&t);
  }
  std::sort(ranges.begin(), ranges.end(), [](const auto* a, const auto* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->name < b->name;
  });
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i]->begin < ranges[i - 1]->end) {
      return Status::InvalidArgument(prefix + "tensors " + Quoted(ranges[i - 1]->name) + " and " +
                                     Quoted(ranges[i]->name) + " overlap");
    }
  }
  return header;
}

std::string ErrnoText(int err) { return std::strerror(err); }

}  // namespace

int64_t SafetensorsTensorInfo::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;  // validated: fits (it times the dtype size fits the file)
  return n;
}

int64_t TensorView::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

const SafetensorsTensorInfo* SafetensorsHeader::Find(std::string_view name) const {
  auto it = std::lower_bound(tensors.begin(), tensors.end(), name,
                             [](const SafetensorsTensorInfo& t, std::string_view n) {
                               return std::string_view(t.name) < n;
                             });
  if (it == tensors.end() || it->name != name) return nullptr;
  return &*it;
}

Result<SafetensorsHeader> ParseSafetensorsHeader(std::span<const std::byte> file,
                                                 std::string_view file_name) {
  const std::string prefix = std::string(file_name) + ": ";
  if (file.size() < 8) {
    return Status::DataLoss(prefix + "file is " + std::to_string(file.size()) +
                            " bytes, too short for the 8-byte header length");
  }
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(file[i]) << (8 * i);
  const uint64_t available = file.size() - 8;
  if (n > kMaxSafetensorsHeaderBytes) {
    return Status::DataLoss(prefix + "header length " + std::to_string(n) + " exceeds the " +
                            std::to_string(kMaxSafetensorsHeaderBytes) + "-byte limit");
  }
  if (n > available) {
    return Status::DataLoss(prefix + "header length " + std::to_string(n) + " runs past the end " +
                            "of the file (" + std::to_string(available) +
                            " bytes after the length): the file is truncated or corrupt");
  }
  const char* text = reinterpret_cast<const char*>(file.data() + 8);
  if (n < 2 || text[0] != '{') {
    return Status::DataLoss(prefix + "header does not start with a JSON object");
  }
  return ParseJson(text, static_cast<size_t>(n), available - n, prefix);
}

Result<SafetensorsFile> SafetensorsFile::Open(const std::filesystem::path& path) {
  CHUNKSERVE_ASSIGN_OR_RETURN(MappedFile file, MappedFile::Open(path));
  CHUNKSERVE_ASSIGN_OR_RETURN(SafetensorsHeader header,
                              ParseSafetensorsHeader(file.bytes(), path.string()));
  return SafetensorsFile(std::move(file), std::move(header));
}

TensorView SafetensorsFile::View(const SafetensorsTensorInfo& info) const {
  TensorView v;
  v.name = info.name;
  v.dtype = info.dtype;
  v.shape = info.shape;
  v.data = file_.bytes().data() + header_.data_offset() + info.begin;
  v.size_bytes = static_cast<size_t>(info.size_bytes());
  return v;
}

std::optional<TensorView> SafetensorsFile::Find(std::string_view name) const {
  const SafetensorsTensorInfo* info = header_.Find(name);
  if (info == nullptr) return std::nullopt;
  return View(*info);
}

Result<TensorView> SafetensorsFile::Get(std::string_view name) const {
  std::optional<TensorView> v = Find(name);
  if (!v.has_value()) {
    return Status::NotFound(path().string() + ": no tensor " + Quoted(name));
  }
  return *v;
}

Result<std::vector<std::byte>> EncodeSafetensors(
    std::span<const TensorToWrite> tensors, const std::map<std::string, std::string>& metadata) {
  std::set<std::string_view> names;
  for (const TensorToWrite& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__") {
      return Status::InvalidArgument("invalid tensor name " + Quoted(t.name));
    }
    if (!names.insert(t.name).second) {
      return Status::InvalidArgument("duplicate tensor name " + Quoted(t.name));
    }
    uint64_t bytes = DTypeSize(t.dtype);
    for (int64_t d : t.shape) {
      if (d < 0 || __builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes)) {
        return Status::InvalidArgument("tensor " + Quoted(t.name) + " has invalid shape " +
                                       ShapeString(t.shape));
      }
    }
    if (bytes != t.data.size()) {
      return Status::InvalidArgument("tensor " + Quoted(t.name) + " with shape " +
                                     ShapeString(t.shape) + " needs " + std::to_string(bytes) +
                                     " bytes, got " + std::to_string(t.data.size()));
    }
  }

  std::vector<size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return DTypeSize(tensors[a].dtype) > DTypeSize(tensors[b].dtype);
  });

  std::string header;
  try {
    Json j = Json::object();
    uint64_t offset = 0;
    for (size_t i : order) {
      const TensorToWrite& t = tensors[i];
      j[t.name] = {{"dtype", std::string(SafetensorsDTypeName(t.dtype))},
                   {"shape", t.shape},
                   {"data_offsets", {offset, offset + t.data.size()}}};
      offset += t.data.size();
    }
    if (!metadata.empty()) j["__metadata__"] = metadata;
    header = j.dump();
  } catch (const Json::exception& e) {  // names or metadata that are not valid UTF-8
    return Status::InvalidArgument(std::string("cannot encode the safetensors header: ") +
                                   e.what());
  }
  while ((8 + header.size()) % 8 != 0) header += ' ';

  std::vector<std::byte> out;
  size_t total = 8 + header.size();
  for (const TensorToWrite& t : tensors) total += t.data.size();
  out.reserve(total);
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<std::byte>(header.size() >> (8 * i)));
  const auto* h = reinterpret_cast<const std::byte*>(header.data());
  out.insert(out.end(), h, h + header.size());
  for (size_t i : order) out.insert(out.end(), tensors[i].data.begin(), tensors[i].data.end());
  return out;
}

Status WriteSafetensors(const std::filesystem::path& path, std::span<const TensorToWrite> tensors,
                        const std::map<std::string, std::string>& metadata) {
  CHUNKSERVE_ASSIGN_OR_RETURN(const std::vector<std::byte> bytes,
                              EncodeSafetensors(tensors, metadata));
  const std::filesystem::path tmp = path.string() + ".tmp-" + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return Status::Unavailable(tmp.string() + ": cannot create: " + ErrnoText(errno));
    out.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
    out.flush();
    if (!out) {
      const int err = errno;
      out.close();
      std::error_code ignored;
      std::filesystem::remove(tmp, ignored);
      return Status::Unavailable(tmp.string() + ": write failed: " + ErrnoText(err));
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

}  // namespace chunkserve::model
