// Normalizers: text rewrites applied to each segment between added tokens before
// pre-tokenization, as HF tokenizers' Prepend, Replace and Strip (a Sequence is the list itself).
// NFC/NFD/NFKC/NFKD need Unicode composition tables (ICU, which chunkserve does not take on), so
// tokenizer.json files that use them are rejected as Unimplemented when loaded.
//
// Thread safety: immutable after construction.
#ifndef CHUNKSERVE_RUNTIME_TOKENIZER_NORMALIZER_H_
#define CHUNKSERVE_RUNTIME_TOKENIZER_NORMALIZER_H_

#include <string>
#include <vector>

#include "runtime/base/status.h"
#include "runtime/tokenizer/regex.h"

namespace chunkserve::tokenizer {

struct NormalizerStep {
  enum class Kind { kPrepend, kReplace, kStrip };
  Kind kind = Kind::kPrepend;
  std::string text;           // kPrepend: what to prepend (only to non-empty text); kReplace: the
                              // replacement
  Regex pattern;              // kReplace: what to replace (a literal or a regex)
  bool left = false;          // kStrip: strip Unicode whitespace at the start
  bool right = false;         // kStrip: and/or at the end
};

class Normalizer {
 public:
  Normalizer() = default;
  explicit Normalizer(std::vector<NormalizerStep> steps) : steps_(std::move(steps)) {}

  bool empty() const { return steps_.empty(); }
  Status Apply(std::string* text) const;

 private:
  std::vector<NormalizerStep> steps_;
};

}  // namespace chunkserve::tokenizer

#endif  // CHUNKSERVE_RUNTIME_TOKENIZER_NORMALIZER_H_
