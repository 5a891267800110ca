// UTF-8 helpers shared by the tokenizer stages: decoding one code point, the whitespace test HF
// tokenizers uses (Rust's char::is_whitespace), lossy repair of byte strings, and GPT-2's
// byte <-> printable-character table used by byte-level BPE.
//
// Thread safety: all functions are pure; the byte-level tables are immutable statics.
#ifndef CHUNKSERVE_RUNTIME_TOKENIZER_UTF8_H_
#define CHUNKSERVE_RUNTIME_TOKENIZER_UTF8_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace chunkserve::tokenizer {

inline constexpr char32_t kReplacementChar = 0xFFFD;

// Decodes the code point starting at s[pos]. Returns its length in bytes (>= 1 when pos <
// s.size()); an invalid or truncated sequence yields U+FFFD with length 1.
size_t DecodeUtf8(std::string_view s, size_t pos, char32_t* cp);

// Appends the UTF-8 encoding of cp (U+FFFD for surrogates and values past U+10FFFF).
void AppendUtf8(char32_t cp, std::string* out);

// Length of the longest prefix of `s` that is valid UTF-8.
size_t ValidUtf8Prefix(std::string_view s);
bool IsValidUtf8(std::string_view s);

// `s` with every maximal invalid subsequence replaced by one U+FFFD, as Rust's
// String::from_utf8_lossy (and so HF tokenizers' decoders) does.
std::string Utf8Lossy(std::string_view s);

// Number of bytes at the end of `s` that start a UTF-8 character whose continuation bytes have
// not arrived yet (0 when `s` ends on a character boundary or in invalid bytes).
size_t IncompleteUtf8Tail(std::string_view s);

// Rust's char::is_whitespace: the Unicode White_Space property.
bool IsUnicodeWhitespace(char32_t cp);

// GPT-2's reversible byte -> printable character map (bytes 33..126, 161..172, 174..255 map to
// themselves, the others to U+0100 + n in order), as UTF-8 strings, and its inverse.
const std::array<std::string, 256>& ByteLevelEncodeTable();
// The byte a byte-level character stands for, or -1 for characters outside the table.
int ByteLevelDecodeChar(char32_t cp);

// Replaces every occurrence of `from` (non-empty; empty: nothing happens) in `text` by `to`, left
// to right, without rescanning what was put in.
void ReplaceAll(std::string* text, std::string_view from, std::string_view to);

}  // namespace chunkserve::tokenizer

#endif  // CHUNKSERVE_RUNTIME_TOKENIZER_UTF8_H_
