#include "runtime/tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

namespace chunkserve::tokenizer {

struct Regex::Code {
  pcre2_code* code = nullptr;
  ~Code() { pcre2_code_free(code); }
};

Result<Regex> Regex::Compile(std::string_view pattern) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                    PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    return Status::InvalidArgument("regex '" + std::string(pattern) + "' does not compile at " +
                                   std::to_string(offset) + ": " +
                                   reinterpret_cast<const char*>(message));
  }
  // Without a JIT (some platforms, or PCRE2 built without it) the interpreter is used; both give
  // the same matches.
  (void)pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  auto owned = std::make_shared<Code>();
  owned->code = code;
  Regex r;
  r.code_ = std::move(owned);
  r.pattern_ = std::string(pattern);
  return r;
}

Result<Regex> Regex::Literal(std::string_view literal) {
  // \Q...\E quotes everything except a literal "\E", which is spliced in escaped.
  std::string pattern;
  size_t pos = 0;
  while (pos <= literal.size()) {
    const size_t e = literal.find("\\E", pos);
    const std::string_view part =
        literal.substr(pos, e == std::string_view::npos ? std::string_view::npos : e - pos);
    if (!part.empty()) pattern += "\\Q" + std::string(part) + "\\E";
    if (e == std::string_view::npos) break;
    pattern += "\\\\E";
    pos = e + 2;
  }
  return Compile(pattern);
}

Status Regex::FindAll(std::string_view text,
                      std::vector<std::pair<size_t, size_t>>* matches) const {
  pcre2_match_data* data = pcre2_match_data_create_from_pattern(code_->code, nullptr);
  if (data == nullptr) return Status::ResourceExhausted("pcre2 match data allocation failed");
  const auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t start = 0;
  // The subject is checked for valid UTF-8 on the first call only: PCRE2 would otherwise re-check
  // the whole subject on every call, making a long text quadratic.
  uint32_t options = 0;
  Status status;
  while (start <= text.size()) {
    const int rc = pcre2_match(code_->code, subject, text.size(), start, options, data, nullptr);
    options = PCRE2_NO_UTF_CHECK;
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof(message));
      status = Status::InvalidArgument("regex '" + pattern_ + "' failed: " +
                                       reinterpret_cast<const char*>(message));
      break;
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data);
    const size_t begin = ovector[0], end = ovector[1];
    if (end > begin) {
      matches->emplace_back(begin, end);
      start = end;
    } else {
      // An empty match: step over one whole character so the next search starts on a boundary.
      if (begin >= text.size()) break;
      start = begin + 1;
      while (start < text.size() && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) {
        ++start;
      }
    }
  }
  pcre2_match_data_free(data);
  return status;
}

}  // namespace chunkserve::tokenizer
