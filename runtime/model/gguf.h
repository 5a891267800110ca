// GGUF: parsing and validating one llama.cpp model file, memory-mapped, without copying tensors.
//
// Format (https://github.com/ggml-org/ggml/blob/master/docs/gguf.md), versions 2 and 3, little
// endian:
//   u32 magic "GGUF" | u32 version | u64 tensor_count | u64 kv_count
//   kv_count x   { string key | u32 value_type | value }
//   tensor_count x { string name | u32 n_dims | u64 ne[n_dims] | u32 ggml_type | u64 offset }
//   padding to general.alignment (default 32) | data section
// where a string is a u64 byte length then the bytes (no terminator), and an array value is
// u32 element type, u64 count, then the elements. Tensor offsets are relative to the data section.
// Dims come in ggml order: ne[0] is the fastest-varying (a row), so a Hugging Face weight of shape
// [rows, cols] is stored with dims {cols, rows}.
//
// Validation done by Parse, which never reads outside `bytes` whatever they hold:
//  - magic, version 2 or 3 (version 1 and big-endian files are rejected by name);
//  - every count and length is checked against the bytes that remain before anything is
//    allocated: a kv needs >= 13 bytes, a tensor info >= 24, an array element >= its size (8 for
//    strings). A hostile header therefore cannot make the parser allocate more than a small
//    multiple of the file's size;
//  - value types are known; arrays of arrays are rejected (no writer produces them); keys and
//    tensor names are unique and non-empty;
//  - general.alignment, when present, is an unsigned integer that is a power of two <= 2^20;
//  - a tensor has 1..4 dims, each >= 0, a known ggml type whose block size divides ne[0], a byte
//    size (ne[0] / block_size * type_size * ne[1] * ...) computed without overflow, an offset that
//    is a multiple of the alignment, and bytes inside the data section that overlap no other
//    tensor's.
// Every error is InvalidArgument and starts with the file name; it names the key or the tensor:
//   "model.gguf: tensor 'blk.0.attn_q.weight': offset 7 is not a multiple of the alignment 32".
// Getters return NotFound naming the file and the key when a key is absent, InvalidArgument when
// it holds another type.
//
// Memory: Open maps the file; metadata values are decoded on demand from the mapping (a 49k-token
// vocabulary is not copied until GetStringArray asks for it). Parse keeps only a few words per
// key and per tensor.
//
// Alignment of tensor data: offsets are multiples of general.alignment relative to the data
// section, which starts at a multiple of it; with Open (page-aligned mapping) every tensor's data
// pointer is therefore aligned to general.alignment. With Parse it is aligned as far as `bytes`
// is.
//
// Thread safety: immutable after Open/Parse; concurrent readers are fine.
#ifndef CHUNKSERVE_RUNTIME_MODEL_GGUF_H_
#define CHUNKSERVE_RUNTIME_MODEL_GGUF_H_

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/base/status.h"
#include "runtime/model/mapped_file.h"

namespace chunkserve::model {

inline constexpr uint32_t kGgufDefaultAlignment = 32;
inline constexpr uint32_t kGgufMaxAlignment = 1u << 20;
inline constexpr int kGgufMaxDims = 4;  // GGML_MAX_DIMS

// Metadata value types, numbered as in the file.
enum class GgufValueType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

// "uint8", ..., "float64"; "unknown" for values outside the enum.
std::string_view GgufValueTypeName(GgufValueType type);

// Tensor element types, numbered as ggml's enum ggml_type. Only the values a reader must know to
// size a tensor are named; any value with GgmlTypeInfo() is accepted by the parser.
enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kBF16 = 30,
};

// A ggml type's storage: elements come in blocks of block_size, each taking type_size bytes.
struct GgmlTypeTraits {
  std::string_view name;  // ggml's: "F32", "Q4_K", ...
  int64_t block_size = 0;
  int64_t type_size = 0;
};

// The traits of ggml type number `type`, or nullopt when it is not a storage type ggml defines
// (including the removed Q4_0_4_4 family, 31..33, and 36..38).
std::optional<GgmlTypeTraits> GgmlTypeInfo(uint32_t type);
// The traits' name, or "type <n>" when unknown.
std::string GgmlTypeName(GgmlType type);

struct GgufTensorInfo {
  std::string name;
  GgmlType type = GgmlType::kF32;
  std::vector<int64_t> dims;         // GGUF order: dims[0] (ne[0]) varies fastest; 1..4 entries
  uint64_t offset = 0;               // into the data section; a multiple of the alignment
  const uint8_t* data = nullptr;     // size_bytes bytes inside the file
  uint64_t size_bytes = 0;

  int64_t num_elements() const;      // product of dims (validated to fit)
  std::span<const uint8_t> bytes() const { return {data, static_cast<size_t>(size_bytes)}; }
};

class GgufFile {
 public:
  // Maps and parses `path`. NotFound when the file does not exist; messages start with the path.
  static Result<std::unique_ptr<GgufFile>> Open(const std::filesystem::path& path);
  // Parses bytes already in memory, without copying them: `bytes` must outlive the GgufFile.
  // Never reads outside `bytes`, never throws or aborts: this is the fuzz target's entry point.
  // Messages start with `name` ("<memory>" for the one-argument form).
  static Result<std::unique_ptr<GgufFile>> Parse(std::span<const uint8_t> bytes);
  static Result<std::unique_ptr<GgufFile>> Parse(std::span<const uint8_t> bytes,
                                                 std::string_view name);

  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  // The path given to Open, or the name given to Parse.
  const std::string& name() const { return name_; }
  uint32_t version() const { return version_; }
  uint32_t alignment() const { return alignment_; }
  // Offset of the data section in the file, and its size (up to the end of the file).
  uint64_t data_offset() const { return data_offset_; }
  uint64_t data_size() const { return data_size_; }

  // ---- Metadata
  bool Has(std::string_view key) const;
  // Every key, in file order.
  const std::vector<std::string>& keys() const { return key_order_; }
  // The value's type; for arrays kArray (see ArrayType). NotFound when absent.
  Result<GgufValueType> Type(std::string_view key) const;
  // An array's element type and length. NotFound / InvalidArgument (not an array).
  Result<GgufValueType> ArrayType(std::string_view key) const;
  Result<uint64_t> ArrayLength(std::string_view key) const;

  Result<std::string> GetString(std::string_view key) const;
  // Any integer type; a uint64 above INT64_MAX is InvalidArgument.
  Result<int64_t> GetInt(std::string_view key) const;
  Result<double> GetFloat(std::string_view key) const;  // float32 or float64
  Result<bool> GetBool(std::string_view key) const;
  Result<std::vector<std::string>> GetStringArray(std::string_view key) const;
  Result<std::vector<int64_t>> GetIntArray(std::string_view key) const;   // any integer elements
  Result<std::vector<float>> GetFloatArray(std::string_view key) const;   // float32 or float64

  // ---- Tensors
  // In file order.
  std::span<const GgufTensorInfo> tensors() const { return tensors_; }
  // Null when absent.
  const GgufTensorInfo* FindTensor(std::string_view name) const;
  // NotFound naming the file and the tensor when absent.
  Result<const GgufTensorInfo*> GetTensor(std::string_view name) const;

 private:
  struct Entry {
    GgufValueType type = GgufValueType::kUint8;
    GgufValueType element_type = GgufValueType::kUint8;  // arrays only
    uint64_t count = 0;                                  // arrays only
    size_t offset = 0;  // of the value (for arrays: of the first element) in bytes_
  };

  GgufFile() = default;
  Status ParseAll();
  Result<const Entry*> Lookup(std::string_view key) const;
  Result<const Entry*> LookupArray(std::string_view key, std::string_view wanted) const;
  std::string Where(std::string_view key) const;

  MappedFile file_;  // empty for Parse
  std::span<const uint8_t> bytes_;
  std::string name_;
  uint32_t version_ = 0;
  uint32_t alignment_ = kGgufDefaultAlignment;
  uint64_t data_offset_ = 0;
  uint64_t data_size_ = 0;
  std::map<std::string, Entry, std::less<>> entries_;
  std::vector<std::string> key_order_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string_view, size_t, std::less<>> tensor_index_;  // name -> tensors_ index
};

}  // namespace chunkserve::model

#endif  // CHUNKSERVE_RUNTIME_MODEL_GGUF_H_
