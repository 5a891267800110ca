#include "runtime/tokenizer/normalizer.h"

#include "runtime/tokenizer/utf8.h"

namespace chunkserve::tokenizer {
namespace {

void Strip(bool left, bool right, std::string* text) {
  size_t begin = 0, end = text->size();
  if (left) {
    while (begin < end) {
      char32_t cp;
      const size_t n = DecodeUtf8(*text, begin, &cp);
      if (!IsUnicodeWhitespace(cp)) break;
      begin += n;
    }
  }
  if (right) {
    while (end > begin) {
      size_t start = end - 1;
      while (start > begin && (static_cast<unsigned char>((*text)[start]) & 0xC0) == 0x80) --start;
      char32_t cp;
      DecodeUtf8(*text, start, &cp);
      if (!IsUnicodeWhitespace(cp)) break;
      end = start;
    }
  }
  *text = text->substr(begin, end - begin);
}

}  // namespace

Status Normalizer::Apply(std::string* text) const {
  for (const NormalizerStep& step : steps_) {
    switch (step.kind) {
      case NormalizerStep::Kind::kPrepend:
        if (!text->empty()) *text = step.text + *text;
        break;
      case NormalizerStep::Kind::kReplace: {
        std::vector<std::pair<size_t, size_t>> matches;
        CHUNKSERVE_RETURN_IF_ERROR(step.pattern.FindAll(*text, &matches));
        if (matches.empty()) break;
        std::string out;
        size_t pos = 0;
        for (const auto& [b, e] : matches) {
          out.append(*text, pos, b - pos);
          out += step.text;
          pos = e;
        }
        out.append(*text, pos);
        *text = std::move(out);
        break;
      }
      case NormalizerStep::Kind::kStrip:
        Strip(step.left, step.right, text);
        break;
    }
  }
  return Status::Ok();
}

}  // namespace chunkserve::tokenizer
