// Pre-tokenizers: split a normalized segment into the words BPE sees, as HF tokenizers' Split,
// ByteLevel, Digits and Metaspace (a Sequence is the list itself), and llama.cpp's per-`pre`
// regex lists (a Split per regex with Isolated behaviour, then ByteLevel without its regex).
//
// Split behaviours, over the string cut into alternating matches and gaps (invert swaps them):
//   Removed: the gaps only; Isolated: matches and gaps each alone; MergedWithPrevious: each match
//   joins the gap before it; MergedWithNext: each match joins the gap after it; Contiguous:
//   adjacent matches join into one. Empty pieces are dropped.
//
// Thread safety: immutable after construction; Apply is const and reentrant.
#ifndef CHUNKSERVE_RUNTIME_TOKENIZER_PRE_TOKENIZER_H_
#define CHUNKSERVE_RUNTIME_TOKENIZER_PRE_TOKENIZER_H_

#include <string>
#include <vector>

#include "runtime/base/status.h"
#include "runtime/tokenizer/regex.h"

namespace chunkserve::tokenizer {

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };
enum class PrependScheme { kFirst, kAlways, kNever };

// GPT-2's pattern, which ByteLevel(use_regex=true) applies.
inline constexpr const char* kGpt2Pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

struct PreTokenizerStep {
  enum class Kind { kSplit, kByteLevel, kMetaspace };
  Kind kind = Kind::kSplit;
  Regex pattern;  // kSplit; kByteLevel with use_regex; kMetaspace: the replacement, literally
  SplitBehavior behavior = SplitBehavior::kIsolated;  // kSplit
  bool invert = false;                              // kSplit
  bool add_prefix_space = false;                    // kByteLevel
  bool use_regex = false;                           // kByteLevel
  std::string replacement;                          // kMetaspace, UTF-8 of one character
  PrependScheme prepend_scheme = PrependScheme::kAlways;  // kMetaspace
  bool split = true;                                // kMetaspace
};

struct Piece {
  std::string text;
  bool at_start = false;  // begins at offset 0 of the whole input (Metaspace's "first" scheme)
};

class PreTokenizer {
 public:
  PreTokenizer() = default;
  explicit PreTokenizer(std::vector<PreTokenizerStep> steps) : steps_(std::move(steps)) {}

  // Replaces `pieces` by their pre-tokenized words.
  Status Apply(std::vector<Piece>* pieces) const;

 private:
  std::vector<PreTokenizerStep> steps_;
};

}  // namespace chunkserve::tokenizer

#endif  // CHUNKSERVE_RUNTIME_TOKENIZER_PRE_TOKENIZER_H_
