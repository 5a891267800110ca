// MappedFile: a whole regular file memory-mapped read-only (mmap, PROT_READ, MAP_PRIVATE).
//
// The bytes stay valid and at the same address until the MappedFile is destroyed; moving a
// MappedFile moves the mapping, not the bytes. An empty file maps to an empty span.
//
// The file must not be truncated or rewritten in place while mapped: the kernel would deliver
// SIGBUS on access to vanished pages. Writers in this project (WriteSafetensors, WriteTinyModel)
// write a temporary file and rename it over the old one, which leaves existing mappings intact.
//
// Thread safety: the bytes are immutable; concurrent readers are fine.
#ifndef CHUNKSERVE_RUNTIME_MODEL_MAPPED_FILE_H_
#define CHUNKSERVE_RUNTIME_MODEL_MAPPED_FILE_H_

#include <cstddef>
#include <filesystem>
#include <span>

#include "runtime/base/status.h"

namespace chunkserve::model {

class MappedFile {
 public:
  // NotFound when the file does not exist, InvalidArgument when it is not a regular file,
  // Unavailable for other open/mmap failures; messages carry the path and strerror.
  static Result<MappedFile> Open(const std::filesystem::path& path);

  MappedFile() = default;  // empty
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  std::span<const std::byte> bytes() const { return {data_, size_}; }
  size_t size() const { return size_; }
  const std::filesystem::path& path() const { return path_; }

 private:
  void Reset();

  std::filesystem::path path_;
  const std::byte* data_ = nullptr;  // null iff size_ == 0
  size_t size_ = 0;
};

}  // namespace chunkserve::model

#endif  // CHUNKSERVE_RUNTIME_MODEL_MAPPED_FILE_H_
