#include "runtime/tokenizer/pre_tokenizer.h"

#include "runtime/tokenizer/utf8.h"

namespace chunkserve::tokenizer {
namespace {

struct Region {
  size_t begin;
  size_t end;
  bool is_match;
};

// The regions of `text` cut at `matches`, then combined per `behavior` (HF's split_off_regions).
std::vector<Region> Combine(size_t size, const std::vector<std::pair<size_t, size_t>>& matches,
                            SplitBehavior behavior, bool invert) {
  std::vector<Region> regions;
  size_t prev = 0;
  for (const auto& [b, e] : matches) {
    if (b > prev) regions.push_back({prev, b, invert});
    regions.push_back({b, e, !invert});
    prev = e;
  }
  if (prev < size) regions.push_back({prev, size, invert});

  std::vector<Region> out;
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::kIsolated:
      return regions;
    case SplitBehavior::kRemoved:
      for (const Region& r : regions) {
        if (!r.is_match) out.push_back(r);
      }
      return out;
    case SplitBehavior::kMergedWithPrevious:
      for (const Region& r : regions) {
        if (r.is_match && !previous_match && !out.empty()) {
          out.back().end = r.end;
        } else {
          out.push_back(r);
        }
        previous_match = r.is_match;
      }
      return out;
    case SplitBehavior::kMergedWithNext:
      for (auto it = regions.rbegin(); it != regions.rend(); ++it) {
        if (it->is_match && !previous_match && !out.empty()) {
          out.back().begin = it->begin;
        } else {
          out.push_back(*it);
        }
        previous_match = it->is_match;
      }
      return {out.rbegin(), out.rend()};
    case SplitBehavior::kContiguous:
      for (const Region& r : regions) {
        if (r.is_match == previous_match && !out.empty()) {
          out.back().end = r.end;
        } else {
          out.push_back(r);
        }
        previous_match = r.is_match;
      }
      return out;
  }
  return regions;
}

Status SplitPieces(const Regex& pattern, SplitBehavior behavior, bool invert,
                   std::vector<Piece>* pieces) {
  std::vector<Piece> out;
  out.reserve(pieces->size());
  std::vector<std::pair<size_t, size_t>> matches;
  for (Piece& piece : *pieces) {
    matches.clear();
    CHUNKSERVE_RETURN_IF_ERROR(pattern.FindAll(piece.text, &matches));
    for (const Region& r : Combine(piece.text.size(), matches, behavior, invert)) {
      if (r.end == r.begin) continue;
      out.push_back({piece.text.substr(r.begin, r.end - r.begin), piece.at_start && r.begin == 0});
    }
  }
  *pieces = std::move(out);
  return Status::Ok();
}

}  // namespace

Status PreTokenizer::Apply(std::vector<Piece>* pieces) const {
  for (const PreTokenizerStep& step : steps_) {
    switch (step.kind) {
      case PreTokenizerStep::Kind::kSplit:
        CHUNKSERVE_RETURN_IF_ERROR(SplitPieces(step.pattern, step.behavior, step.invert, pieces));
        break;
      case PreTokenizerStep::Kind::kByteLevel: {
        if (step.add_prefix_space) {
          for (Piece& p : *pieces) {
            if (!p.text.starts_with(' ')) p.text = " " + p.text;
          }
        }
        if (step.use_regex) {
          CHUNKSERVE_RETURN_IF_ERROR(
              SplitPieces(step.pattern, SplitBehavior::kIsolated, false, pieces));
        }
        const auto& table = ByteLevelEncodeTable();
        for (Piece& p : *pieces) {
          std::string mapped;
          mapped.reserve(p.text.size() * 2);
          for (char c : p.text) mapped += table[static_cast<unsigned char>(c)];
          p.text = std::move(mapped);
        }
        break;
      }
      case PreTokenizerStep::Kind::kMetaspace: {
        for (Piece& p : *pieces) {
          ReplaceAll(&p.text, " ", step.replacement);
          const bool prepend =
              !p.text.starts_with(step.replacement) &&
              (step.prepend_scheme == PrependScheme::kAlways ||
               (step.prepend_scheme == PrependScheme::kFirst && p.at_start));
          if (prepend) p.text = step.replacement + p.text;
        }
        if (step.split) {
          CHUNKSERVE_RETURN_IF_ERROR(
              SplitPieces(step.pattern, SplitBehavior::kMergedWithNext, false, pieces));
        }
        break;
      }
    }
  }
  return Status::Ok();
}

}  // namespace chunkserve::tokenizer
