// A compiled PCRE2 pattern for the pre-tokenizer and normalizer regexes (\p{L}, \p{N}, (?!\S),
// (?i:...) as HF tokenizers' Oniguruma patterns use them), compiled with PCRE2_UTF | PCRE2_UCP
// and JIT-compiled where the platform has a JIT.
//
// Thread safety: immutable after Compile; FindAll allocates its own match data per call, so one
// Regex may be used from many threads. Copies share the compiled code.
#ifndef CHUNKSERVE_RUNTIME_TOKENIZER_REGEX_H_
#define CHUNKSERVE_RUNTIME_TOKENIZER_REGEX_H_

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "runtime/base/status.h"

namespace chunkserve::tokenizer {

class Regex {
 public:
  // InvalidArgument with PCRE2's message and offset for a pattern that does not compile.
  static Result<Regex> Compile(std::string_view pattern);
  // A pattern that matches `literal` exactly.
  static Result<Regex> Literal(std::string_view literal);

  // Appends the [begin, end) byte ranges of the successive non-overlapping matches in `text`
  // (valid UTF-8). Empty matches are skipped. InvalidArgument when PCRE2 reports an error (for
  // example its match limit on a pathological input).
  Status FindAll(std::string_view text, std::vector<std::pair<size_t, size_t>>* matches) const;

  const std::string& pattern() const { return pattern_; }

 private:
  struct Code;
  std::shared_ptr<const Code> code_;
  std::string pattern_;
};

}  // namespace chunkserve::tokenizer

#endif  // CHUNKSERVE_RUNTIME_TOKENIZER_REGEX_H_
