// Finding added tokens (special tokens such as "<|im_end|>" and user-defined ones) in raw text,
// with HF tokenizers' semantics: leftmost-longest, non-overlapping matches; a single_word token
// matches only when the characters around it are not alphanumeric (a rejected match still
// consumes its span, as HF's Aho-Corasick iteration does); lstrip/rstrip widen a match over the
// Unicode whitespace before/after it, which is then dropped.
//
// All added tokens are matched on the raw text. HF matches tokens with normalized=true on the
// normalized text instead; the two agree for normalizers that leave the tokens' text alone
// (every supported tokenizer we test), and README says so.
//
// Thread safety: immutable after construction.
#ifndef CHUNKSERVE_RUNTIME_TOKENIZER_ADDED_TOKENS_H_
#define CHUNKSERVE_RUNTIME_TOKENIZER_ADDED_TOKENS_H_

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace chunkserve::tokenizer {

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
  bool single_word = false;
};

// A piece of the input: an added token (id >= 0) or text to tokenize (id == -1).
struct Segment {
  size_t begin;
  size_t end;
  int32_t id;
};

class AddedTokenMatcher {
 public:
  AddedTokenMatcher() = default;
  explicit AddedTokenMatcher(std::vector<AddedToken> tokens);

  // The segments covering `text` in order; text segments are non-empty.
  std::vector<Segment> Split(std::string_view text) const;

 private:
  std::vector<AddedToken> tokens_;
  // Indices into tokens_ by first byte, longest content first.
  std::array<std::vector<int32_t>, 256> by_first_byte_;
};

}  // namespace chunkserve::tokenizer

#endif  // CHUNKSERVE_RUNTIME_TOKENIZER_ADDED_TOKENS_H_
