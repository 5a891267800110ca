// Helpers for the model tests: raw file bytes and hand-made safetensors files.
#ifndef CHUNKSERVE_TESTS_MODEL_TEST_UTIL_H_
#define CHUNKSERVE_TESTS_MODEL_TEST_UTIL_H_

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <string_view>

namespace chunkserve::model::testing {

inline std::string ReadFileBytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

inline void WriteFileBytes(const std::filesystem::path& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

inline std::span<const std::byte> AsBytes(std::string_view s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

// A safetensors file by hand: 8-byte little-endian length (of `header` unless `length` is given),
// the header text, then `data`.
inline std::string RawSafetensors(std::string_view header, std::string_view data,
                                  std::optional<uint64_t> length = std::nullopt) {
  const uint64_t n = length.value_or(header.size());
  std::string out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  out += header;
  out += data;
  return out;
}

}  // namespace chunkserve::model::testing

#endif  // CHUNKSERVE_TESTS_MODEL_TEST_UTIL_H_
