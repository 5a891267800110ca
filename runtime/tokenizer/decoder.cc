#include "runtime/tokenizer/decoder.h"

#include "runtime/tokenizer/utf8.h"

namespace chunkserve::tokenizer {
namespace {

std::string ByteLevelBytes(const std::string& token) {
  std::string bytes;
  bytes.reserve(token.size());
  for (size_t pos = 0; pos < token.size();) {
    char32_t cp;
    pos += DecodeUtf8(token, pos, &cp);
    const int b = ByteLevelDecodeChar(cp);
    // A token with a character outside the table (an added token such as "<|im end|>" with a
    // space) is kept as its own bytes, as HF does.
    if (b < 0) return token;
    bytes.push_back(static_cast<char>(b));
  }
  return bytes;
}

int ByteFallbackValue(const std::string& t) {
  if (t.size() != 6 || !t.starts_with("<0x") || t[5] != '>') return -1;
  int v = 0;
  for (int i = 3; i < 5; ++i) {
    const char c = t[i];
    int d;
    if (c >= '0' && c <= '9') d = c - '0';
    else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
    else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
    else return -1;
    v = v * 16 + d;
  }
  return v;
}

}  // namespace

std::string Decoder::Decode(std::vector<std::string> tokens) const {
  if (steps_.empty()) {
    std::string joined;
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i > 0) joined += ' ';
      joined += tokens[i];
    }
    return Utf8Lossy(joined);
  }
  for (const DecoderStep& step : steps_) {
    switch (step.kind) {
      case DecoderStep::Kind::kByteLevel: {
        std::string bytes;
        for (const std::string& t : tokens) bytes += ByteLevelBytes(t);
        tokens.assign(1, Utf8Lossy(bytes));
        break;
      }
      case DecoderStep::Kind::kReplace:
        for (std::string& t : tokens) ReplaceAll(&t, step.pattern, step.content);
        break;
      case DecoderStep::Kind::kByteFallback: {
        std::vector<std::string> out;
        std::string pending;
        size_t pending_count = 0;
        const auto flush = [&] {
          if (pending_count == 0) return;
          if (IsValidUtf8(pending)) {
            out.push_back(pending);
          } else {
            for (size_t i = 0; i < pending_count; ++i) out.push_back("\xEF\xBF\xBD");
          }
          pending.clear();
          pending_count = 0;
        };
        for (std::string& t : tokens) {
          const int b = ByteFallbackValue(t);
          if (b >= 0) {
            pending.push_back(static_cast<char>(b));
            ++pending_count;
          } else {
            flush();
            out.push_back(std::move(t));
          }
        }
        flush();
        tokens = std::move(out);
        break;
      }
      case DecoderStep::Kind::kFuse: {
        std::string fused;
        for (const std::string& t : tokens) fused += t;
        tokens.assign(1, std::move(fused));
        break;
      }
      case DecoderStep::Kind::kStrip: {
        for (std::string& t : tokens) {
          size_t begin = 0, end = t.size();
          for (int i = 0; i < step.start && t.compare(begin, step.pattern.size(), step.pattern) == 0 &&
                          begin + step.pattern.size() <= end;
               ++i) {
            begin += step.pattern.size();
          }
          for (int i = 0; i < step.stop && end >= begin + step.pattern.size() &&
                          t.compare(end - step.pattern.size(), step.pattern.size(), step.pattern) == 0;
               ++i) {
            end -= step.pattern.size();
          }
          t = t.substr(begin, end - begin);
        }
        break;
      }
      case DecoderStep::Kind::kMetaspace:
        for (size_t i = 0; i < tokens.size(); ++i) {
          ReplaceAll(&tokens[i], step.pattern, " ");
          if (i == 0 && step.prepend_scheme != PrependScheme::kNever &&
              tokens[i].starts_with(' ')) {
            tokens[i].erase(0, 1);
          }
        }
        break;
    }
  }
  std::string text;
  for (const std::string& t : tokens) text += t;
  return Utf8Lossy(text);
}

bool Decoder::IsLocal() const {
  bool merged = false;
  for (const DecoderStep& step : steps_) {
    switch (step.kind) {
      case DecoderStep::Kind::kByteLevel:
        if (merged) return false;
        merged = true;
        break;
      case DecoderStep::Kind::kFuse:
        merged = true;
        break;
      case DecoderStep::Kind::kByteFallback:
        if (merged) return false;
        break;
      case DecoderStep::Kind::kReplace: {
        char32_t cp;
        if (merged && !step.pattern.empty() &&
            DecodeUtf8(step.pattern, 0, &cp) < step.pattern.size()) {
          return false;
        }
        break;
      }
      case DecoderStep::Kind::kStrip:
      case DecoderStep::Kind::kMetaspace:
        break;
    }
  }
  return true;
}

std::string Decoder::TokenBytes(const std::string& token) const {
  std::string t = token;
  for (const DecoderStep& step : steps_) {
    switch (step.kind) {
      case DecoderStep::Kind::kByteLevel:
        t = ByteLevelBytes(t);
        break;
      case DecoderStep::Kind::kReplace:
        ReplaceAll(&t, step.pattern, step.content);
        break;
      case DecoderStep::Kind::kByteFallback:
        if (const int b = ByteFallbackValue(t); b >= 0) t.assign(1, static_cast<char>(b));
        break;
      case DecoderStep::Kind::kMetaspace:
        ReplaceAll(&t, step.pattern, " ");
        break;
      case DecoderStep::Kind::kFuse:   // one token: nothing to fuse
      case DecoderStep::Kind::kStrip:  // strips the text's ends, not a token's in the middle
        break;
    }
  }
  return t;
}

}  // namespace chunkserve::tokenizer
