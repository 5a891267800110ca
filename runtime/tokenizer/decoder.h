// Decoders: turn the vocabulary entries of a token sequence back into text, as HF tokenizers'
// ByteLevel, Replace, ByteFallback, Fuse, Strip and Metaspace (a Sequence is the list itself).
// Each step maps a list of strings to a list of strings; the result is their concatenation. With
// no steps at all the entries are joined with single spaces, as HF does without a decoder.
//
// Byte strings that are not valid UTF-8 (half a character from byte-level BPE or byte fallback)
// become U+FFFD: per maximal invalid subsequence for ByteLevel (Rust's from_utf8_lossy), one per
// byte token for ByteFallback, matching HF.
//
// Thread safety: immutable after construction.
#ifndef CHUNKSERVE_RUNTIME_TOKENIZER_DECODER_H_
#define CHUNKSERVE_RUNTIME_TOKENIZER_DECODER_H_

#include <string>
#include <vector>

#include "runtime/tokenizer/pre_tokenizer.h"

namespace chunkserve::tokenizer {

struct DecoderStep {
  enum class Kind { kByteLevel, kReplace, kByteFallback, kFuse, kStrip, kMetaspace };
  Kind kind = Kind::kByteLevel;
  std::string pattern;      // kReplace: literal to replace; kStrip: the character to strip;
                            // kMetaspace: the replacement character
  std::string content;      // kReplace: replacement
  int start = 0, stop = 0;  // kStrip: how many to strip at the start / end of each token
  PrependScheme prepend_scheme = PrependScheme::kAlways;  // kMetaspace
};

class Decoder {
 public:
  Decoder() = default;
  explicit Decoder(std::vector<DecoderStep> steps) : steps_(std::move(steps)) {}

  // Always valid UTF-8.
  std::string Decode(std::vector<std::string> tokens) const;

  // The raw bytes one vocabulary entry stands for in the middle of a text: the steps applied to
  // it alone, without the start-of-text rules (Strip, Metaspace's first-token space) and without
  // replacing invalid UTF-8 — half a character stays the bytes it is (what logprobs report).
  std::string TokenBytes(const std::string& token) const;

  // True when the text a run of tokens adds in the middle of a sequence is what they decode to
  // on their own, up to the start-of-text rules (Strip, Metaspace's first token) applied at the
  // run's start and half characters at its ends. Every tokenizer in use is; a pipeline is not
  // when a step after a merge (ByteLevel or Fuse: the tokens become one string) looks at that
  // string as a whole: ByteLevel (a token with any character outside its table is kept as its
  // bytes), ByteFallback (a token that is exactly "<0xNN>"), or a Replace of more than one
  // character (a match can span two tokens). StreamDecoder relies on it.
  bool IsLocal() const;

 private:
  std::vector<DecoderStep> steps_;
};

}  // namespace chunkserve::tokenizer

#endif  // CHUNKSERVE_RUNTIME_TOKENIZER_DECODER_H_
