#include "runtime/model/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

namespace chunkserve::model {
namespace {

std::string ErrnoMessage(const std::filesystem::path& path, std::string_view what, int err) {
  return path.string() + ": " + std::string(what) + ": " + std::strerror(err);
}

// Closes the descriptor on every path out of Open.
class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() { ::close(fd_); }
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;

 private:
  int fd_;
};

}  // namespace

Result<MappedFile> MappedFile::Open(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return Status::NotFound(path.string() + ": no such file");
    return Status::Unavailable(ErrnoMessage(path, "open", err));
  }
  FdCloser closer(fd);
  struct stat st;
  if (::fstat(fd, &st) != 0) return Status::Unavailable(ErrnoMessage(path, "fstat", errno));
  if (!S_ISREG(st.st_mode)) return Status::InvalidArgument(path.string() + ": not a regular file");

  MappedFile file;
  file.path_ = path;
  if (st.st_size == 0) return file;  // mmap rejects length 0
  void* p = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
  if (p == MAP_FAILED) return Status::Unavailable(ErrnoMessage(path, "mmap", errno));
  file.data_ = static_cast<const std::byte*>(p);
  file.size_ = static_cast<size_t>(st.st_size);
  return file;
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    Reset();
    path_ = std::move(other.path_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

MappedFile::~MappedFile() { Reset(); }

void MappedFile::Reset() {
  if (data_ != nullptr) {
    // munmap only fails for arguments mmap returned itself; nothing useful to do then.
    ::munmap(const_cast<std::byte*>(data_), size_);
  }
  data_ = nullptr;
  size_ = 0;
}

}  // namespace chunkserve::model
