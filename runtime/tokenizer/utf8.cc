#include "runtime/tokenizer/utf8.h"

namespace chunkserve::tokenizer {

size_t DecodeUtf8(std::string_view s, size_t pos, char32_t* cp) {
  const auto b = [&](size_t i) { return static_cast<unsigned char>(s[pos + i]); };
  const size_t left = s.size() - pos;
  const unsigned char c0 = b(0);
  if (c0 < 0x80) {
    *cp = c0;
    return 1;
  }
  size_t len;
  char32_t value;
  char32_t min;
  if ((c0 & 0xE0) == 0xC0) {
    len = 2, value = c0 & 0x1F, min = 0x80;
  } else if ((c0 & 0xF0) == 0xE0) {
    len = 3, value = c0 & 0x0F, min = 0x800;
  } else if ((c0 & 0xF8) == 0xF0) {
    len = 4, value = c0 & 0x07, min = 0x10000;
  } else {
    *cp = kReplacementChar;
    return 1;
  }
  if (left < len) {
    *cp = kReplacementChar;
    return 1;
  }
  for (size_t i = 1; i < len; ++i) {
    if ((b(i) & 0xC0) != 0x80) {
      *cp = kReplacementChar;
      return 1;
    }
    value = (value << 6) | (b(i) & 0x3F);
  }
  // Overlong forms, surrogates and values past U+10FFFF are invalid UTF-8.
  if (value < min || value > 0x10FFFF || (value >= 0xD800 && value <= 0xDFFF)) {
    *cp = kReplacementChar;
    return 1;
  }
  *cp = value;
  return len;
}

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) cp = kReplacementChar;
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

namespace {

// Length of the valid sequence at s[pos], or 0 when invalid; *maximal_invalid gets the length of
// the maximal subpart to replace by one U+FFFD (Unicode 3.9 "substitution of maximal subparts",
// which is what from_utf8_lossy implements).
size_t ValidSequenceAt(std::string_view s, size_t pos, size_t* maximal_invalid) {
  const auto b = [&](size_t i) { return static_cast<unsigned char>(s[pos + i]); };
  const unsigned char c0 = b(0);
  *maximal_invalid = 1;
  if (c0 < 0x80) return 1;
  size_t len;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (c0 >= 0xC2 && c0 <= 0xDF) {
    len = 2;
  } else if (c0 >= 0xE0 && c0 <= 0xEF) {
    len = 3;
    if (c0 == 0xE0) lo = 0xA0;
    if (c0 == 0xED) hi = 0x9F;
  } else if (c0 >= 0xF0 && c0 <= 0xF4) {
    len = 4;
    if (c0 == 0xF0) lo = 0x90;
    if (c0 == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  for (size_t i = 1; i < len; ++i) {
    if (pos + i >= s.size()) return 0;
    const unsigned char c = b(i);
    const bool ok = i == 1 ? (c >= lo && c <= hi) : (c >= 0x80 && c <= 0xBF);
    if (!ok) return 0;
    *maximal_invalid = i + 1;
  }
  return len;
}

}  // namespace

size_t ValidUtf8Prefix(std::string_view s) {
  size_t pos = 0;
  while (pos < s.size()) {
    size_t invalid;
    const size_t n = ValidSequenceAt(s, pos, &invalid);
    if (n == 0) return pos;
    pos += n;
  }
  return pos;
}

bool IsValidUtf8(std::string_view s) { return ValidUtf8Prefix(s) == s.size(); }

std::string Utf8Lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  while (pos < s.size()) {
    size_t invalid;
    const size_t n = ValidSequenceAt(s, pos, &invalid);
    if (n > 0) {
      out.append(s.substr(pos, n));
      pos += n;
    } else {
      AppendUtf8(kReplacementChar, &out);
      pos += invalid;
    }
  }
  return out;
}

size_t IncompleteUtf8Tail(std::string_view s) {
  // A character is at most 4 bytes, so only the last 3 can start an unfinished one.
  for (size_t back = 1; back <= 3 && back <= s.size(); ++back) {
    const size_t pos = s.size() - back;
    const unsigned char c = static_cast<unsigned char>(s[pos]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte: look further back
    size_t invalid;
    if (ValidSequenceAt(s, pos, &invalid) == 0 && invalid == back) return back;
    return 0;
  }
  return 0;
}

bool IsUnicodeWhitespace(char32_t cp) {
  switch (cp) {
    case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D: case 0x20: case 0x85: case 0xA0:
    case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

namespace {

struct ByteLevelTables {
  std::array<std::string, 256> encode;
  std::array<char32_t, 256> chars;
  ByteLevelTables() {
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
      chars[b] = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
      AppendUtf8(chars[b], &encode[b]);
    }
  }
};

const ByteLevelTables& Tables() {
  static const ByteLevelTables* tables = new ByteLevelTables();
  return *tables;
}

}  // namespace

const std::array<std::string, 256>& ByteLevelEncodeTable() { return Tables().encode; }

int ByteLevelDecodeChar(char32_t cp) {
  // The table's characters are the bytes themselves or U+0100..U+0143.
  if (cp < 256) {
    const auto& chars = Tables().chars;
    return chars[cp] == cp ? static_cast<int>(cp) : -1;
  }
  if (cp >= 0x100 && cp < 0x100 + 68) {
    static const std::array<int, 68>* inverse = [] {
      auto* inv = new std::array<int, 68>();
      const auto& chars = Tables().chars;
      for (int b = 0; b < 256; ++b) {
        if (chars[b] >= 0x100) (*inv)[chars[b] - 0x100] = b;
      }
      return inv;
    }();
    return (*inverse)[cp - 0x100];
  }
  return -1;
}

void ReplaceAll(std::string* text, std::string_view from, std::string_view to) {
  if (from.empty()) return;
  std::string out;
  size_t pos = 0;
  for (size_t f; (f = text->find(from, pos)) != std::string::npos; pos = f + from.size()) {
    out.append(*text, pos, f - pos);
    out += to;
  }
  if (pos == 0) return;
  out.append(*text, pos);
  *text = std::move(out);
}

}  // namespace chunkserve::tokenizer
