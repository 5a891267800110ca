// Helpers for the tokenizer tests: the committed test data and the HF reference outputs that
// tests/tokenizer/make_reference.py writes.
#ifndef CHUNKSERVE_TESTS_TOKENIZER_TEST_UTIL_H_
#define CHUNKSERVE_TESTS_TOKENIZER_TEST_UTIL_H_

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace chunkserve::tokenizer::testing {

inline std::filesystem::path DataDir() {
  return std::filesystem::path(CHUNKSERVE_SOURCE_DIR) / "tests" / "tokenizer" / "data";
}

inline std::string ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// One corpus line and what HF tokenizers made of it.
struct ReferenceRow {
  std::string text;
  std::vector<int32_t> ids;          // add_special_tokens = false
  std::vector<int32_t> ids_special;  // add_special_tokens = true
  std::string decoded;               // Decode(ids_special, skip_special_tokens = false)
  std::string decoded_skip;          // Decode(ids_special, skip_special_tokens = true)
};

inline std::vector<ReferenceRow> LoadReference(const std::string& name) {
  const auto j = nlohmann::json::parse(ReadFile(DataDir() / ("reference_" + name + ".json")));
  std::vector<ReferenceRow> rows;
  for (const auto& r : j) {
    rows.push_back({r.at("text").get<std::string>(), r.at("ids").get<std::vector<int32_t>>(),
                    r.at("ids_special").get<std::vector<int32_t>>(),
                    r.at("decoded").get<std::string>(), r.at("decoded_skip").get<std::string>()});
  }
  return rows;
}

// "[12 34 56]" with the first differing position marked, for failure messages.
inline std::string DiffIds(const std::vector<int32_t>& want, const std::vector<int32_t>& got) {
  size_t first = 0;
  while (first < want.size() && first < got.size() && want[first] == got[first]) ++first;
  const auto show = [&](const std::vector<int32_t>& v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) {
      if (i > 0) s += ' ';
      if (i == first) s += ">>";
      s += std::to_string(v[i]);
    }
    return s + "]";
  };
  return "first difference at token " + std::to_string(first) + "\n  want " + show(want) +
         "\n  got  " + show(got);
}

}  // namespace chunkserve::tokenizer::testing

#endif  // CHUNKSERVE_TESTS_TOKENIZER_TEST_UTIL_H_
