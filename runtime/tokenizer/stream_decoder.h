// StreamDecoder: incremental detokenization for streaming generated tokens to a client.
//
// Guarantees: every Push result is valid UTF-8 and never ends in half a character; the
// concatenation of all Push results and Flush equals Tokenizer::Decode of all pushed ids (same
// skip_special_tokens).
//
// Method (as HF's DecodeStream): keep a window of ids starting one token before the text not yet
// emitted. On Push, decode the window with and without the new ids; the difference is new text,
// unless it ends in U+FFFD, which may be a character whose remaining bytes are still to come: then
// nothing is emitted and the window grows. Decoding the window rather than the whole sequence keeps
// Push O(window). After emitting, the window restarts at the tokens just emitted, when they decode
// to non-empty text: position-dependent decoder steps (Strip of leading spaces, Metaspace's first
// token) then act inside that context on both decodes, so the difference is exact. While the
// sequence ends in a <0xNN> byte-fallback token nothing is emitted: HF's ByteFallback turns a
// whole run of byte tokens into U+FFFDs when a later byte makes the run invalid. Tokens Decode
// drops (skipped special tokens, holes) emit nothing and leave such a run open. For a decoder
// that is not local (Decoder::IsLocal: a step after a merge that looks at the merged text as a
// whole, which no tokenizer in use has) every Push returns nothing and Flush all the text, since
// a later token may change text already decoded.
//
// Thread safety: none; one StreamDecoder per sequence. It borrows the Tokenizer, which must
// outlive it.
#ifndef CHUNKSERVE_RUNTIME_TOKENIZER_STREAM_DECODER_H_
#define CHUNKSERVE_RUNTIME_TOKENIZER_STREAM_DECODER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/base/status.h"
#include "runtime/tokenizer/tokenizer.h"

namespace chunkserve::tokenizer {

class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens = true);

  // Newly completed text (maybe empty); InvalidArgument on an out-of-range id.
  Result<std::string> Push(int32_t id);
  // What is left; invalid UTF-8 becomes U+FFFD. The decoder is then empty again.
  std::string Flush();

 private:
  const Tokenizer* tokenizer_;
  bool skip_special_tokens_;
  std::vector<int32_t> ids_;  // the window: ids_[0, read_) are already emitted
  size_t read_ = 0;
  std::string window_text_;   // Decode(ids_[0, read_))
};

}  // namespace chunkserve::tokenizer

#endif  // CHUNKSERVE_RUNTIME_TOKENIZER_STREAM_DECODER_H_
