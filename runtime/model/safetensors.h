// safetensors: parsing, validating, memory-mapping and writing one file.
//
// Format (https://huggingface.co/docs/safetensors): an 8-byte little-endian unsigned header
// length N, N bytes of UTF-8 JSON, then the data section. The JSON object maps each tensor name to
// {"dtype": "F32", "shape": [d0, d1, ...], "data_offsets": [begin, end]} with byte offsets
// relative to the data section; the optional "__metadata__" key maps strings to strings.
//
// Validation done by ParseSafetensorsHeader, which never reads outside `file` whatever its bytes:
//  - 8 <= file size; N <= kMaxSafetensorsHeaderBytes; 8 + N <= file size          (DataLoss)
//  - the header is a well-formed JSON object without duplicate keys               (DataLoss)
//  - each entry has a non-empty name and is an object with a dtype string, a shape of
//    non-negative integers and two data_offsets begin <= end                      (InvalidArgument)
//  - dtype is F32, F16 or BF16; other safetensors dtypes are Unimplemented, unknown strings
//    InvalidArgument
//  - product(shape) * dtype size == end - begin, computed without overflow       (InvalidArgument)
//  - end <= data section size (otherwise the file is truncated)                   (DataLoss)
//  - no two tensors with bytes overlap (entries may come in any order)            (InvalidArgument)
// Gaps between tensors are accepted (the reference implementation rejects them); they cannot make
// a reader leave the file. Unknown keys inside a tensor entry are ignored. Every message starts
// with the file name and names the tensor: "model.safetensors: tensor 'lm_head.weight': ...".
//
// Alignment: a tensor's bytes are aligned to its element size when the data section starts on an
// 8-byte boundary (writers pad the header with spaces for that) and tensors are laid out in
// non-increasing element size, as WriteSafetensors and the Hugging Face writer do. The parser does
// not require it; consumers that read typed elements check it (BindLlamaWeights does).
//
// Thread safety: SafetensorsFile is immutable after Open; concurrent readers are fine.
#ifndef CHUNKSERVE_RUNTIME_MODEL_SAFETENSORS_H_
#define CHUNKSERVE_RUNTIME_MODEL_SAFETENSORS_H_

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/base/status.h"
#include "runtime/model/dtype.h"
#include "runtime/model/mapped_file.h"

namespace chunkserve::model {

// Headers longer than this are rejected before any JSON is parsed (the reference limit).
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

struct SafetensorsTensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  // every dim >= 0; empty = scalar (one element)
  uint64_t begin = 0;          // byte offsets into the data section, begin <= end
  uint64_t end = 0;

  int64_t num_elements() const;
  uint64_t size_bytes() const { return end - begin; }
};

struct SafetensorsHeader {
  uint64_t header_size = 0;  // N, the JSON's length
  uint64_t data_size = 0;    // bytes after the header: file size - 8 - N
  uint64_t data_offset() const { return 8 + header_size; }

  std::vector<SafetensorsTensorInfo> tensors;   // sorted by name; names unique
  std::map<std::string, std::string> metadata;  // "__metadata__"

  // Null when absent. O(log n).
  const SafetensorsTensorInfo* Find(std::string_view name) const;
};

// Parses and validates the header of the safetensors file whose complete contents are `file`
// (see the list at the top). `file_name` only prefixes messages. Never reads outside `file` and
// never throws, aborts or crashes, whatever the bytes: this is the fuzz target's entry point.
Result<SafetensorsHeader> ParseSafetensorsHeader(std::span<const std::byte> file,
                                                 std::string_view file_name);

// A tensor's bytes inside a mapped file. Non-owning: valid while the SafetensorsFile (or the
// WeightStore) it came from lives. Rows are row-major: shape [rows, cols] means element (r, c) is
// at index r * cols + c.
struct TensorView {
  std::string_view name;
  DType dtype = DType::kF32;
  std::span<const int64_t> shape;
  const std::byte* data = nullptr;  // size_bytes bytes; may be null when size_bytes == 0
  size_t size_bytes = 0;

  int64_t num_elements() const;
  std::span<const std::byte> bytes() const { return {data, size_bytes}; }
};

// One memory-mapped, validated safetensors file.
class SafetensorsFile {
 public:
  // Maps and validates `path`. Errors carry the path; see ParseSafetensorsHeader for codes.
  static Result<SafetensorsFile> Open(const std::filesystem::path& path);

  const std::filesystem::path& path() const { return file_.path(); }
  const SafetensorsHeader& header() const { return header_; }
  std::span<const SafetensorsTensorInfo> tensors() const { return header_.tensors; }

  // The tensor's view, or nullopt when the file has no such tensor.
  std::optional<TensorView> Find(std::string_view name) const;
  // NotFound naming the file and the tensor when absent.
  Result<TensorView> Get(std::string_view name) const;
  // `info` must be one of tensors().
  TensorView View(const SafetensorsTensorInfo& info) const;

 private:
  SafetensorsFile(MappedFile file, SafetensorsHeader header)
      : file_(std::move(file)), header_(std::move(header)) {}

  MappedFile file_;
  SafetensorsHeader header_;
};

// A tensor to write: `data` holds product(shape) * DTypeSize(dtype) bytes.
struct TensorToWrite {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::span<const std::byte> data;
};

// A safetensors file's bytes: the header (keys sorted, padded with spaces so the data section
// starts 8-byte aligned), then the tensors' bytes, stably ordered by decreasing element size so
// every tensor is aligned to its element size. InvalidArgument for duplicate, empty or
// "__metadata__" names, names or metadata that are not UTF-8, and data whose size does not match
// the shape.
Result<std::vector<std::byte>> EncodeSafetensors(
    std::span<const TensorToWrite> tensors, const std::map<std::string, std::string>& metadata = {});

// EncodeSafetensors into a file: writes `path` + ".tmp-<pid>" and renames it over `path`, so a
// reader never maps a half-written file. Its errors, and Unavailable for I/O errors.
Status WriteSafetensors(const std::filesystem::path& path, std::span<const TensorToWrite> tensors,
                        const std::map<std::string, std::string>& metadata = {});

}  // namespace chunkserve::model

#endif  // CHUNKSERVE_RUNTIME_MODEL_SAFETENSORS_H_
