// Where the tests find the real models that .ci/fetch-models downloads: $CHUNKSERVE_MODEL_CACHE,
// else ~/.cache/chunkserve/models. A test that needs one skips, saying why, when it is absent:
//
//   const auto path = testing::CachedModelPath(testing::kSmolLM2Gguf);
//   if (!path.ok()) GTEST_SKIP() << path.status().message();
#ifndef CHUNKSERVE_TESTS_TESTING_MODEL_CACHE_H_
#define CHUNKSERVE_TESTS_TESTING_MODEL_CACHE_H_

#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>

#include "runtime/base/status.h"

namespace chunkserve::testing {

// SmolLM2-135M-Instruct, Llama architecture, Q4_1 GGUF (tokenizer in the metadata).
inline constexpr std::string_view kSmolLM2Gguf = "SmolLM2-135M-Instruct.Q4_1.gguf";

inline std::filesystem::path ModelCacheDir() {
  if (const char* env = std::getenv("CHUNKSERVE_MODEL_CACHE"); env != nullptr && *env != '\0') {
    return env;
  }
  const char* home = std::getenv("HOME");
  return std::filesystem::path(home != nullptr ? home : "") / ".cache" / "chunkserve" / "models";
}

// The model's path, or NotFound saying where it was looked for and how to fetch it.
inline Result<std::filesystem::path> CachedModelPath(std::string_view file_name) {
  const std::filesystem::path path = ModelCacheDir() / file_name;
  std::error_code ec;
  if (std::filesystem::is_regular_file(path, ec)) return path;
  return Status::NotFound(path.string() +
                          " is absent (run .ci/fetch-models, or set CHUNKSERVE_MODEL_CACHE)");
}

}  // namespace chunkserve::testing

#endif  // CHUNKSERVE_TESTS_TESTING_MODEL_CACHE_H_
