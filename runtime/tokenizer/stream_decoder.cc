#include "runtime/tokenizer/stream_decoder.h"

#include <optional>
#include <string_view>

namespace chunkserve::tokenizer {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

// A byte-fallback token "<0xNN>".
bool IsByteToken(std::optional<std::string_view> text) {
  if (!text || text->size() != 6 || !text->starts_with("<0x") || (*text)[5] != '>') return false;
  const auto hex = [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'F') || (c >= 'a' && c <= 'f');
  };
  return hex((*text)[3]) && hex((*text)[4]);
}

}  // namespace

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(&tokenizer), skip_special_tokens_(skip_special_tokens) {}

Result<std::string> StreamDecoder::Push(int32_t id) {
  if (id < 0 || id >= tokenizer_->vocab_size()) {
    return Status::InvalidArgument("token id " + std::to_string(id) + " outside [0, " +
                                   std::to_string(tokenizer_->vocab_size()) + ")");
  }
  ids_.push_back(id);
  // A token Decode drops (a hole in the vocabulary, a skipped special token) adds no text, and
  // does not end a run of byte tokens either: the runs on its two sides decode as one.
  const std::optional<std::string_view> token = tokenizer_->TokenText(id);
  if (!token || (skip_special_tokens_ && tokenizer_->IsSpecial(id))) return std::string();
  // ByteFallback decodes a run of byte tokens as a whole: valid UTF-8 as is, otherwise one U+FFFD
  // per byte. A later byte token can still turn the run invalid, so nothing is emitted while the
  // sequence ends in one.
  if (IsByteToken(token)) return std::string();
  // A decoder whose steps look at the whole text can change any of it with a later token: hold
  // everything for Flush rather than emit text the final decode does not have.
  if (!tokenizer_->DecodesLocally()) return std::string();
  CHUNKSERVE_ASSIGN_OR_RETURN(std::string text, tokenizer_->Decode(ids_, skip_special_tokens_));
  if (text.size() <= window_text_.size() || !text.starts_with(window_text_) ||
      text.ends_with(kReplacement)) {
    return std::string();
  }
  std::string fresh = text.substr(window_text_.size());
  // Slide the window to start at the tokens just emitted, but only when they decode to some text:
  // a Strip (or Metaspace) at the window's start then stops inside that context and cannot
  // reach the next tokens' text, which it would not touch in the decode of the whole sequence.
  // Context that decodes to nothing (skipped special tokens, a lone stripped space) keeps the
  // window where it was.
  std::vector<int32_t> slid(ids_.begin() + static_cast<std::ptrdiff_t>(read_), ids_.end());
  CHUNKSERVE_ASSIGN_OR_RETURN(std::string slid_text,
                              tokenizer_->Decode(slid, skip_special_tokens_));
  if (!slid_text.empty()) {
    ids_ = std::move(slid);
    window_text_ = std::move(slid_text);
  } else {
    window_text_ = std::move(text);
  }
  read_ = ids_.size();
  return fresh;
}

std::string StreamDecoder::Flush() {
  std::string rest;
  auto text = tokenizer_->Decode(ids_, skip_special_tokens_);
  // Every id was range-checked by Push, so Decode cannot fail here.
  if (text.ok() && text->size() > window_text_.size() && text->starts_with(window_text_)) {
    rest = text->substr(window_text_.size());
  }
  ids_.clear();
  read_ = 0;
  window_text_.clear();
  return rest;
}

}  // namespace chunkserve::tokenizer
