#include "runtime/model/gguf.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <new>
#include <utility>

namespace chunkserve::model {
namespace {

static_assert(std::endian::native == std::endian::little,
              "the GGUF reader decodes little-endian values with memcpy");

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32
// Smallest encodings, used to bound counts by the bytes that remain before allocating.
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;              // empty key, type, one-byte value
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 4 + 8;  // empty name, n_dims 0, type, offset

// Keys and names come from the file; keep messages bounded.
std::string Quoted(std::string_view s) {
  constexpr size_t kMax = 120;
  std::string out = "'";
  out += s.substr(0, kMax);
  out += s.size() > kMax ? "...'" : "'";
  return out;
}

// Size in bytes of a scalar value type; 0 for string, array and unknown types.
uint64_t ScalarSize(GgufValueType type) {
  switch (type) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kBool:
      return 1;
    case GgufValueType::kUint16:
    case GgufValueType::kInt16:
      return 2;
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kFloat32:
      return 4;
    case GgufValueType::kUint64:
    case GgufValueType::kInt64:
    case GgufValueType::kFloat64:
      return 8;
    case GgufValueType::kString:
    case GgufValueType::kArray:
      return 0;
  }
  return 0;
}

bool KnownValueType(uint32_t t) { return t <= static_cast<uint32_t>(GgufValueType::kFloat64); }

bool IsInteger(GgufValueType t) {
  switch (t) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kUint16:
    case GgufValueType::kInt16:
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kUint64:
    case GgufValueType::kInt64:
      return true;
    default:
      return false;
  }
}

// A bounds-checked little-endian cursor over the file. Every read either succeeds entirely or
// returns false and leaves the position unchanged.
class Reader {
 public:
  Reader(std::span<const uint8_t> bytes, size_t pos) : bytes_(bytes), pos_(pos) {}

  size_t pos() const { return pos_; }
  uint64_t remaining() const { return bytes_.size() - pos_; }

  bool Skip(uint64_t n) {
    if (n > remaining()) return false;
    pos_ += static_cast<size_t>(n);
    return true;
  }
  template <typename T>
  bool Read(T* out) {
    if (sizeof(T) > remaining()) return false;
    std::memcpy(out, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool ReadString(std::string_view* out) {
    uint64_t n = 0;
    const size_t start = pos_;
    if (!Read(&n)) return false;
    if (n > remaining()) {
      pos_ = start;
      return false;
    }
    *out = {reinterpret_cast<const char*>(bytes_.data() + pos_), static_cast<size_t>(n)};
    pos_ += static_cast<size_t>(n);
    return true;
  }

 private:
  std::span<const uint8_t> bytes_;
  size_t pos_;
};

template <typename T>
T Load(std::span<const uint8_t> bytes, size_t offset) {
  T v;
  std::memcpy(&v, bytes.data() + offset, sizeof(T));
  return v;
}

// Reads the integer of type `type` at `offset` (validated by the parser to lie inside `bytes`).
// nullopt for a uint64 above INT64_MAX.
std::optional<int64_t> LoadInt(std::span<const uint8_t> bytes, size_t offset, GgufValueType type) {
  switch (type) {
    case GgufValueType::kUint8:
      return Load<uint8_t>(bytes, offset);
    case GgufValueType::kInt8:
      return Load<int8_t>(bytes, offset);
    case GgufValueType::kUint16:
      return Load<uint16_t>(bytes, offset);
    case GgufValueType::kInt16:
      return Load<int16_t>(bytes, offset);
    case GgufValueType::kUint32:
      return Load<uint32_t>(bytes, offset);
    case GgufValueType::kInt32:
      return Load<int32_t>(bytes, offset);
    case GgufValueType::kInt64:
      return Load<int64_t>(bytes, offset);
    case GgufValueType::kUint64: {
      const uint64_t v = Load<uint64_t>(bytes, offset);
      if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
      return static_cast<int64_t>(v);
    }
    default:
      return std::nullopt;
  }
}

std::string_view LoadString(std::span<const uint8_t> bytes, size_t offset, size_t* next) {
  const uint64_t n = Load<uint64_t>(bytes, offset);
  *next = offset + 8 + static_cast<size_t>(n);
  return {reinterpret_cast<const char*>(bytes.data() + offset + 8), static_cast<size_t>(n)};
}

}  // namespace

std::string_view GgufValueTypeName(GgufValueType type) {
  switch (type) {
    case GgufValueType::kUint8: return "uint8";
    case GgufValueType::kInt8: return "int8";
    case GgufValueType::kUint16: return "uint16";
    case GgufValueType::kInt16: return "int16";
    case GgufValueType::kUint32: return "uint32";
    case GgufValueType::kInt32: return "int32";
    case GgufValueType::kFloat32: return "float32";
    case GgufValueType::kBool: return "bool";
    case GgufValueType::kString: return "string";
    case GgufValueType::kArray: return "array";
    case GgufValueType::kUint64: return "uint64";
    case GgufValueType::kInt64: return "int64";
    case GgufValueType::kFloat64: return "float64";
  }
  return "unknown";
}

std::optional<GgmlTypeTraits> GgmlTypeInfo(uint32_t type) {
  // ggml.c's type_traits (block size, bytes per block), as the gguf Python package's
  // GGML_QUANT_SIZES lists them.
  struct Row {
    uint32_t id;
    GgmlTypeTraits traits;
  };
  static constexpr Row kTable[] = {
      {0, {"F32", 1, 4}},         {1, {"F16", 1, 2}},         {2, {"Q4_0", 32, 18}},
      {3, {"Q4_1", 32, 20}},      {6, {"Q5_0", 32, 22}},      {7, {"Q5_1", 32, 24}},
      {8, {"Q8_0", 32, 34}},      {9, {"Q8_1", 32, 40}},      {10, {"Q2_K", 256, 84}},
      {11, {"Q3_K", 256, 110}},   {12, {"Q4_K", 256, 144}},   {13, {"Q5_K", 256, 176}},
      {14, {"Q6_K", 256, 210}},   {15, {"Q8_K", 256, 292}},   {16, {"IQ2_XXS", 256, 66}},
      {17, {"IQ2_XS", 256, 74}},  {18, {"IQ3_XXS", 256, 98}}, {19, {"IQ1_S", 256, 50}},
      {20, {"IQ4_NL", 32, 18}},   {21, {"IQ3_S", 256, 110}},  {22, {"IQ2_S", 256, 82}},
      {23, {"IQ4_XS", 256, 136}}, {24, {"I8", 1, 1}},         {25, {"I16", 1, 2}},
      {26, {"I32", 1, 4}},        {27, {"I64", 1, 8}},        {28, {"F64", 1, 8}},
      {29, {"IQ1_M", 256, 56}},   {30, {"BF16", 1, 2}},       {34, {"TQ1_0", 256, 54}},
      {35, {"TQ2_0", 256, 66}},   {39, {"MXFP4", 32, 17}},
  };
  for (const Row& row : kTable) {
    if (row.id == type) return row.traits;
  }
  return std::nullopt;
}

std::string GgmlTypeName(GgmlType type) {
  const std::optional<GgmlTypeTraits> info = GgmlTypeInfo(static_cast<uint32_t>(type));
  if (info.has_value()) return std::string(info->name);
  return "type " + std::to_string(static_cast<uint32_t>(type));
}

int64_t GgufTensorInfo::num_elements() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;  // validated: the byte size computed from it did not overflow
  return n;
}

Result<std::unique_ptr<GgufFile>> GgufFile::Open(const std::filesystem::path& path) {
  CHUNKSERVE_ASSIGN_OR_RETURN(MappedFile mapped, MappedFile::Open(path));
  std::unique_ptr<GgufFile> file(new GgufFile());
  file->file_ = std::move(mapped);
  const std::span<const std::byte> b = file->file_.bytes();
  file->bytes_ = {reinterpret_cast<const uint8_t*>(b.data()), b.size()};
  file->name_ = path.string();
  CHUNKSERVE_RETURN_IF_ERROR(file->ParseAll());
  return file;
}

Result<std::unique_ptr<GgufFile>> GgufFile::Parse(std::span<const uint8_t> bytes) {
  return Parse(bytes, "<memory>");
}

Result<std::unique_ptr<GgufFile>> GgufFile::Parse(std::span<const uint8_t> bytes,
                                                  std::string_view name) {
  std::unique_ptr<GgufFile> file(new GgufFile());
  file->bytes_ = bytes;
  file->name_ = std::string(name);
  CHUNKSERVE_RETURN_IF_ERROR(file->ParseAll());
  return file;
}

Status GgufFile::ParseAll() {
  const std::string prefix = name_ + ": ";
  auto fail = [&](const std::string& message) { return Status::InvalidArgument(prefix + message); };
  Reader r(bytes_, 0);

  uint32_t magic = 0;
  if (!r.Read(&magic)) return fail("file is too short for the GGUF magic");
  if (magic != kMagic) return fail("not a GGUF file (bad magic)");
  if (!r.Read(&version_)) return fail("truncated before the version");
  if (version_ == 1) return fail("GGUF version 1 is not supported (2 and 3 are)");
  if (version_ != 2 && version_ != 3) {
    // A big-endian file stores 3 as 0x03000000.
    if (__builtin_bswap32(version_) == 2 || __builtin_bswap32(version_) == 3) {
      return fail("big-endian GGUF files are not supported");
    }
    return fail("unsupported GGUF version " + std::to_string(version_) + " (2 and 3 are)");
  }
  uint64_t tensor_count = 0;
  uint64_t kv_count = 0;
  if (!r.Read(&tensor_count) || !r.Read(&kv_count)) return fail("truncated before the counts");
  if (kv_count > r.remaining() / kMinKvBytes) {
    return fail("kv_count " + std::to_string(kv_count) + " cannot fit in the " +
                std::to_string(r.remaining()) + " bytes that remain");
  }
  if (tensor_count > (r.remaining() - kv_count * kMinKvBytes) / kMinTensorInfoBytes) {
    return fail("tensor_count " + std::to_string(tensor_count) + " cannot fit in the " +
                std::to_string(r.remaining()) + " bytes that remain");
  }

  // ---- Metadata
  key_order_.reserve(static_cast<size_t>(kv_count));
  for (uint64_t i = 0; i < kv_count; ++i) {
    std::string_view key;
    if (!r.ReadString(&key)) return fail("truncated in the key of kv " + std::to_string(i));
    if (key.empty()) return fail("kv " + std::to_string(i) + " has an empty key");
    const std::string where = "key " + Quoted(key) + ": ";
    uint32_t raw_type = 0;
    if (!r.Read(&raw_type)) return fail(where + "truncated before the value type");
    if (!KnownValueType(raw_type)) {
      return fail(where + "unknown value type " + std::to_string(raw_type));
    }
    Entry e;
    e.type = static_cast<GgufValueType>(raw_type);
    if (e.type == GgufValueType::kArray) {
      uint32_t raw_element = 0;
      if (!r.Read(&raw_element) || !r.Read(&e.count)) {
        return fail(where + "truncated in the array header");
      }
      if (!KnownValueType(raw_element)) {
        return fail(where + "unknown array element type " + std::to_string(raw_element));
      }
      e.element_type = static_cast<GgufValueType>(raw_element);
      if (e.element_type == GgufValueType::kArray) {
        return fail(where + "arrays of arrays are not supported");
      }
      e.offset = r.pos();
      if (e.element_type == GgufValueType::kString) {
        if (e.count > r.remaining() / 8) {
          return fail(where + "array of " + std::to_string(e.count) +
                      " strings cannot fit in the " + std::to_string(r.remaining()) +
                      " bytes that remain");
        }
        for (uint64_t j = 0; j < e.count; ++j) {
          std::string_view s;
          if (!r.ReadString(&s)) {
            return fail(where + "truncated in string " + std::to_string(j) + " of " +
                        std::to_string(e.count));
          }
        }
      } else {
        const uint64_t size = ScalarSize(e.element_type);
        if (e.count > r.remaining() / size) {
          return fail(where + "array of " + std::to_string(e.count) + " " +
                      std::string(GgufValueTypeName(e.element_type)) + " cannot fit in the " +
                      std::to_string(r.remaining()) + " bytes that remain");
        }
        r.Skip(e.count * size);
      }
    } else {
      e.offset = r.pos();
      if (e.type == GgufValueType::kString) {
        std::string_view s;
        if (!r.ReadString(&s)) return fail(where + "truncated in the string value");
      } else if (!r.Skip(ScalarSize(e.type))) {
        return fail(where + "truncated in the " + std::string(GgufValueTypeName(e.type)) +
                    " value");
      }
    }
    if (!entries_.emplace(std::string(key), e).second) {
      return fail("key " + Quoted(key) + " appears twice");
    }
    key_order_.emplace_back(key);
  }

  if (auto it = entries_.find("general.alignment"); it != entries_.end()) {
    const Entry& e = it->second;
    const std::optional<int64_t> a =
        IsInteger(e.type) ? LoadInt(bytes_, e.offset, e.type) : std::nullopt;
    if (!a.has_value() || *a <= 0 || *a > kGgufMaxAlignment || !std::has_single_bit(
                                                                   static_cast<uint64_t>(*a))) {
      return fail("general.alignment must be a power of two in [1, " +
                  std::to_string(kGgufMaxAlignment) + "]");
    }
    alignment_ = static_cast<uint32_t>(*a);
  }

  // ---- Tensor infos
  tensors_.reserve(static_cast<size_t>(tensor_count));
  for (uint64_t i = 0; i < tensor_count; ++i) {
    GgufTensorInfo t;
    std::string_view name;
    if (!r.ReadString(&name)) return fail("truncated in the name of tensor " + std::to_string(i));
    if (name.empty()) return fail("tensor " + std::to_string(i) + " has an empty name");
    t.name = std::string(name);
    const std::string where = "tensor " + Quoted(name) + ": ";
    uint32_t n_dims = 0;
    if (!r.Read(&n_dims)) return fail(where + "truncated before n_dims");
    if (n_dims < 1 || n_dims > kGgufMaxDims) {
      return fail(where + "n_dims " + std::to_string(n_dims) + " is not in [1, " +
                  std::to_string(kGgufMaxDims) + "]");
    }
    for (uint32_t d = 0; d < n_dims; ++d) {
      uint64_t ne = 0;
      if (!r.Read(&ne)) return fail(where + "truncated in the dims");
      if (ne > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return fail(where + "dim " + std::to_string(d) + " (" + std::to_string(ne) +
                    ") is negative as int64");
      }
      t.dims.push_back(static_cast<int64_t>(ne));
    }
    uint32_t raw_type = 0;
    if (!r.Read(&raw_type) || !r.Read(&t.offset)) {
      return fail(where + "truncated before the type and offset");
    }
    const std::optional<GgmlTypeTraits> traits = GgmlTypeInfo(raw_type);
    if (!traits.has_value()) return fail(where + "unknown ggml type " + std::to_string(raw_type));
    t.type = static_cast<GgmlType>(raw_type);
    if (t.dims[0] % traits->block_size != 0) {
      return fail(where + "ne[0] = " + std::to_string(t.dims[0]) + " is not a multiple of " +
                  std::string(traits->name) + "'s block size " +
                  std::to_string(traits->block_size));
    }
    // Bytes = blocks per row * bytes per block * rows; overflow means "larger than any file".
    uint64_t bytes = static_cast<uint64_t>(t.dims[0] / traits->block_size);
    bool overflow =
        __builtin_mul_overflow(bytes, static_cast<uint64_t>(traits->type_size), &bytes);
    uint64_t elements = static_cast<uint64_t>(t.dims[0]);
    for (size_t d = 1; d < t.dims.size(); ++d) {
      overflow = overflow || __builtin_mul_overflow(bytes, static_cast<uint64_t>(t.dims[d]),
                                                    &bytes);
      overflow = overflow || __builtin_mul_overflow(elements, static_cast<uint64_t>(t.dims[d]),
                                                    &elements);
    }
    if (overflow || elements > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return fail(where + "size overflows");
    }
    t.size_bytes = bytes;
    if (t.offset % alignment_ != 0) {
      return fail(where + "offset " + std::to_string(t.offset) +
                  " is not a multiple of the alignment " + std::to_string(alignment_));
    }
    tensors_.push_back(std::move(t));
  }

  // ---- Data section: starts at the next multiple of the alignment. A file without tensors may
  // end before it.
  const uint64_t end_of_infos = r.pos();
  data_offset_ = (end_of_infos + alignment_ - 1) / alignment_ * alignment_;
  if (data_offset_ > bytes_.size()) {
    if (!tensors_.empty()) {
      return fail("truncated: the data section would start at " + std::to_string(data_offset_) +
                  ", past the end of the file (" + std::to_string(bytes_.size()) + " bytes)");
    }
    data_offset_ = bytes_.size();
  }
  data_size_ = bytes_.size() - data_offset_;

  std::vector<size_t> order;
  order.reserve(tensors_.size());
  for (size_t i = 0; i < tensors_.size(); ++i) {
    GgufTensorInfo& t = tensors_[i];
    if (t.offset > data_size_ || t.size_bytes > data_size_ - t.offset) {
      return fail("tensor " + Quoted(t.name) + ": bytes [" + std::to_string(t.offset) + ", +" +
                  std::to_string(t.size_bytes) + ") run past the data section (" +
                  std::to_string(data_size_) + " bytes): the file is truncated or corrupt");
    }
    t.data = bytes_.data() + data_offset_ + t.offset;
    if (t.size_bytes > 0) order.push_back(i);
  }
  // Overlap: sorted by start, each non-empty tensor starts at or after the previous one's end.
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return tensors_[a].offset != tensors_[b].offset ? tensors_[a].offset < tensors_[b].offset
                                                    : a < b;
  });
  for (size_t i = 1; i < order.size(); ++i) {
    const GgufTensorInfo& prev = tensors_[order[i - 1]];
    const GgufTensorInfo& cur = tensors_[order[i]];
    if (cur.offset < prev.offset + prev.size_bytes) {
      return fail("tensors " + Quoted(prev.name) + " and " + Quoted(cur.name) + " overlap");
    }
  }
  // tensors_ no longer changes, so views of the names stay valid.
  for (size_t i = 0; i < tensors_.size(); ++i) {
    if (!tensor_index_.emplace(tensors_[i].name, i).second) {
      return fail("tensor " + Quoted(tensors_[i].name) + " appears twice");
    }
  }
  return Status::Ok();
}

std::string GgufFile::Where(std::string_view key) const {
  return name_ + ": key " + Quoted(key) + ": ";
}

bool GgufFile::Has(std::string_view key) const { return entries_.find(key) != entries_.end(); }

Result<const GgufFile::Entry*> GgufFile::Lookup(std::string_view key) const {
  auto it = entries_.find(key);
  if (it == entries_.end()) return Status::NotFound(name_ + ": no key " + Quoted(key));
  return &it->second;
}

Result<const GgufFile::Entry*> GgufFile::LookupArray(std::string_view key,
                                                     std::string_view wanted) const {
  CHUNKSERVE_ASSIGN_OR_RETURN(const Entry* e, Lookup(key));
  if (e->type != GgufValueType::kArray) {
    return Status::InvalidArgument(Where(key) + "is a " +
                                   std::string(GgufValueTypeName(e->type)) + ", not an array of " +
                                   std::string(wanted));
  }
  return e;
}

Result<GgufValueType> GgufFile::Type(std::string_view key) const {
  CHUNKSERVE_ASSIGN_OR_RETURN(const Entry* e, Lookup(key));
  return e->type;
}

Result<GgufValueType> GgufFile::ArrayType(std::string_view key) const {
  CHUNKSERVE_ASSIGN_OR_RETURN(const Entry* e, LookupArray(key, "anything"));
  return e->element_type;
}

Result<uint64_t> GgufFile::ArrayLength(std::string_view key) const {
  CHUNKSERVE_ASSIGN_OR_RETURN(const Entry* e, LookupArray(key, "anything"));
  return e->count;
}

Result<std::string> GgufFile::GetString(std::string_view key) const {
  CHUNKSERVE_ASSIGN_OR_RETURN(const Entry* e, Lookup(key));
  if (e->type != GgufValueType::kString) {
    return Status::InvalidArgument(Where(key) + "is a " +
                                   std::string(GgufValueTypeName(e->type)) + ", not a string");
  }
  size_t next = 0;
  return std::string(LoadString(bytes_, e->offset, &next));
}

Result<int64_t> GgufFile::GetInt(std::string_view key) const {
  CHUNKSERVE_ASSIGN_OR_RETURN(const Entry* e, Lookup(key));
  if (!IsInteger(e->type)) {
    return Status::InvalidArgument(Where(key) + "is a " +
                                   std::string(GgufValueTypeName(e->type)) + ", not an integer");
  }
  const std::optional<int64_t> v = LoadInt(bytes_, e->offset, e->type);
  if (!v.has_value()) {
    return Status::InvalidArgument(Where(key) + "uint64 value " +
                                   std::to_string(Load<uint64_t>(bytes_, e->offset)) +
                                   " does not fit in int64");
  }
  return *v;
}

Result<double> GgufFile::GetFloat(std::string_view key) const {
  CHUNKSERVE_ASSIGN_OR_RETURN(const Entry* e, Lookup(key));
  if (e->type == GgufValueType::kFloat32) return static_cast<double>(Load<float>(bytes_, e->offset));
  if (e->type == GgufValueType::kFloat64) return Load<double>(bytes_, e->offset);
  return Status::InvalidArgument(Where(key) + "is a " + std::string(GgufValueTypeName(e->type)) +
                                 ", not a float32 or float64");
}

Result<bool> GgufFile::GetBool(std::string_view key) const {
  CHUNKSERVE_ASSIGN_OR_RETURN(const Entry* e, Lookup(key));
  if (e->type != GgufValueType::kBool) {
    return Status::InvalidArgument(Where(key) + "is a " +
                                   std::string(GgufValueTypeName(e->type)) + ", not a bool");
  }
  return Load<uint8_t>(bytes_, e->offset) != 0;
}

Result<std::vector<std::string>> GgufFile::GetStringArray(std::string_view key) const {
  CHUNKSERVE_ASSIGN_OR_RETURN(const Entry* e, LookupArray(key, "strings"));
  if (e->element_type != GgufValueType::kString) {
    return Status::InvalidArgument(Where(key) + "is an array of " +
                                   std::string(GgufValueTypeName(e->element_type)) +
                                   ", not of strings");
  }
  std::vector<std::string> out;
  out.reserve(static_cast<size_t>(e->count));  // the parser bounded count by the file size
  size_t offset = e->offset;
  for (uint64_t i = 0; i < e->count; ++i) out.emplace_back(LoadString(bytes_, offset, &offset));
  return out;
}

Result<std::vector<int64_t>> GgufFile::GetIntArray(std::string_view key) const {
  CHUNKSERVE_ASSIGN_OR_RETURN(const Entry* e, LookupArray(key, "integers"));
  if (!IsInteger(e->element_type)) {
    return Status::InvalidArgument(Where(key) + "is an array of " +
                                   std::string(GgufValueTypeName(e->element_type)) +
                                   ", not of integers");
  }
  const size_t size = static_cast<size_t>(ScalarSize(e->element_type));
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(e->count));
  for (uint64_t i = 0; i < e->count; ++i) {
    const size_t offset = e->offset + static_cast<size_t>(i) * size;
    const std::optional<int64_t> v = LoadInt(bytes_, offset, e->element_type);
    if (!v.has_value()) {
      return Status::InvalidArgument(Where(key) + "element " + std::to_string(i) +
                                     " does not fit in int64");
    }
    out.push_back(*v);
  }
  return out;
}

Result<std::vector<float>> GgufFile::GetFloatArray(std::string_view key) const {
  CHUNKSERVE_ASSIGN_OR_RETURN(const Entry* e, LookupArray(key, "floats"));
  const bool f32 = e->element_type == GgufValueType::kFloat32;
  if (!f32 && e->element_type != GgufValueType::kFloat64) {
    return Status::InvalidArgument(Where(key) + "is an array of " +
                                   std::string(GgufValueTypeName(e->element_type)) +
                                   ", not of float32 or float64");
  }
  std::vector<float> out;
  out.reserve(static_cast<size_t>(e->count));
  for (uint64_t i = 0; i < e->count; ++i) {
    const size_t offset = e->offset + static_cast<size_t>(i) * (f32 ? 4 : 8);
    out.push_back(f32 ? Load<float>(bytes_, offset)
                      : static_cast<float>(Load<double>(bytes_, offset)));
  }
  return out;
}

const GgufTensorInfo* GgufFile::FindTensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

Result<const GgufTensorInfo*> GgufFile::GetTensor(std::string_view name) const {
  const GgufTensorInfo* t = FindTensor(name);
  if (t == nullptr) return Status::NotFound(name_ + ": no tensor " + Quoted(name));
  return t;
}

}  // namespace chunkserve::model
