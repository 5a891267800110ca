// TempDir: a fresh directory under the system temp dir, removed with everything in it when the
// object dies. For tests that write files (layering, safetensors, model directories).
#ifndef CHUNKSERVE_TESTS_TESTING_TEMP_DIR_H_
#define CHUNKSERVE_TESTS_TESTING_TEMP_DIR_H_

#include <filesystem>
#include <random>
#include <string>
#include <system_error>

namespace chunkserve::testing {

class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    const auto base = std::filesystem::temp_directory_path();
    for (;;) {
      path_ = base / ("chunkserve-test-" + std::to_string(rd()));
      if (std::filesystem::create_directory(path_)) break;
    }
  }
  ~TempDir() {
    std::error_code ec;  // best effort: a leftover temp dir is not worth failing a test over
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace chunkserve::testing

#endif  // CHUNKSERVE_TESTS_TESTING_TEMP_DIR_H_
