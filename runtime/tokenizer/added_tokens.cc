#include "runtime/tokenizer/added_tokens.h"

#include <algorithm>

#include "runtime/tokenizer/regex.h"
#include "runtime/tokenizer/utf8.h"

namespace chunkserve::tokenizer {
namespace {

// Rust's char::is_alphanumeric (Unicode Alphabetic or Numeric), through PCRE2's tables.
bool IsAlphanumeric(std::string_view ch) {
  static const Regex* const kWord = [] {
    auto r = Regex::Compile("^[\\p{L}\\p{N}\\p{Nl}\\p{Mn}\\p{Mc}]");
    return new Regex(std::move(r).value());
  }();
  std::vector<std::pair<size_t, size_t>> m;
  return kWord->FindAll(ch, &m).ok() && !m.empty();
}

std::string_view CharBefore(std::string_view text, size_t pos) {
  if (pos == 0) return {};
  size_t start = pos - 1;
  while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
  return text.substr(start, pos - start);
}

std::string_view CharAt(std::string_view text, size_t pos) {
  if (pos >= text.size()) return {};
  char32_t cp;
  return text.substr(pos, DecodeUtf8(text, pos, &cp));
}

bool IsSpace(std::string_view ch) {
  if (ch.empty()) return false;
  char32_t cp;
  DecodeUtf8(ch, 0, &cp);
  return IsUnicodeWhitespace(cp);
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(std::vector<AddedToken> tokens) : tokens_(std::move(tokens)) {
  for (size_t i = 0; i < tokens_.size(); ++i) {
    if (tokens_[i].content.empty()) continue;
    by_first_byte_[static_cast<unsigned char>(tokens_[i].content[0])].push_back(
        static_cast<int32_t>(i));
  }
  for (auto& bucket : by_first_byte_) {
    std::stable_sort(bucket.begin(), bucket.end(), [&](int32_t a, int32_t b) {
      return tokens_[a].content.size() > tokens_[b].content.size();
    });
  }
}

std::vector<Segment> AddedTokenMatcher::Split(std::string_view text) const {
  std::vector<Segment> out;
  size_t emitted = 0;  // end of the last segment pushed
  size_t pos = 0;
  while (pos < text.size()) {
    const auto& bucket = by_first_byte_[static_cast<unsigned char>(text[pos])];
    const AddedToken* found = nullptr;
    for (int32_t i : bucket) {
      if (text.substr(pos).starts_with(tokens_[i].content)) {
        found = &tokens_[i];
        break;
      }
    }
    if (found == nullptr) {
      ++pos;
      continue;
    }
    size_t begin = pos, end = pos + found->content.size();
    pos = end;
    if (found->single_word &&
        (IsAlphanumeric(CharBefore(text, begin)) || IsAlphanumeric(CharAt(text, end)))) {
      continue;
    }
    if (found->lstrip) {
      while (begin > emitted && IsSpace(CharBefore(text, begin))) {
        begin -= CharBefore(text, begin).size();
      }
    }
    if (found->rstrip) {
      while (end < text.size() && IsSpace(CharAt(text, end))) end += CharAt(text, end).size();
      pos = end;
    }
    if (begin > emitted) out.push_back({emitted, begin, -1});
    out.push_back({begin, end, found->id});
    emitted = end;
  }
  if (emitted < text.size()) out.push_back({emitted, text.size(), -1});
  return out;
}

}  // namespace chunkserve::tokenizer
