#include "runtime/tokenizer/bpe.h"

#include <algorithm>
#include <map>
#include <queue>

#include "runtime/tokenizer/utf8.h"

namespace chunkserve::tokenizer {
namespace {

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

}  // namespace

void BpeModel::Finish(Options options) {
  options_ = options;
  byte_ids_.fill(-1);
  for (const auto& [text, id] : vocab_) {
    char32_t cp;
    if (!text.empty() && DecodeUtf8(text, 0, &cp) == text.size() &&
        (cp != kReplacementChar || text == "\xEF\xBF\xBD")) {
      char_ids_[cp] = id;
    }
    if (text.size() == 6 && text.starts_with("<0x") && text[5] == '>') {
      const int hi = HexValue(text[3]), lo = HexValue(text[4]);
      if (hi >= 0 && lo >= 0) byte_ids_[hi * 16 + lo] = id;
    }
  }
}

Result<BpeModel> BpeModel::FromMerges(std::unordered_map<std::string, int32_t> vocab,
                                      const std::vector<std::pair<std::string, std::string>>& merges,
                                      Options options) {
  BpeModel m;
  m.vocab_ = std::move(vocab);
  m.merges_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [a, b] = merges[rank];
    const auto ia = m.vocab_.find(a), ib = m.vocab_.find(b), iab = m.vocab_.find(a + b);
    if (ia == m.vocab_.end() || ib == m.vocab_.end() || iab == m.vocab_.end()) {
      return Status::InvalidArgument("merge " + std::to_string(rank) + " '" + a + " " + b +
                                     "' uses a token missing from the vocabulary");
    }
    // A repeated pair keeps its first (lowest) rank, as HF does.
    m.merges_.emplace(PairKey(ia->second, ib->second),
                      Merge{static_cast<int32_t>(rank), iab->second});
  }
  m.Finish(options);
  return m;
}

Result<BpeModel> BpeModel::FromScores(std::unordered_map<std::string, int32_t> vocab,
                                      const std::vector<float>& scores,
                                      const std::vector<bool>& mergeable, Options options) {
  BpeModel m;
  m.vocab_ = std::move(vocab);
  // Dense ranks of the scores, highest first, so that equal scores compare equal and the heap
  // falls back to the leftmost pair as llama.cpp does.
  std::vector<float> distinct;
  for (const auto& [text, id] : m.vocab_) {
    if (id < 0 || static_cast<size_t>(id) >= scores.size()) {
      return Status::InvalidArgument("token id " + std::to_string(id) + " has no score");
    }
    distinct.push_back(scores[id]);
  }
  std::sort(distinct.begin(), distinct.end(), std::greater<float>());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  const auto rank_of = [&](float s) {
    return static_cast<int32_t>(std::lower_bound(distinct.begin(), distinct.end(), s,
                                                 std::greater<float>()) -
                                distinct.begin());
  };
  const auto is_mergeable = [&](int32_t id) {
    return static_cast<size_t>(id) < mergeable.size() && mergeable[id];
  };
  for (const auto& [text, id] : m.vocab_) {
    if (!is_mergeable(id)) continue;
    size_t pos = 0;
    char32_t cp;
    pos += DecodeUtf8(text, 0, &cp);
    for (; pos < text.size(); pos += DecodeUtf8(text, pos, &cp)) {
      const auto left = m.vocab_.find(text.substr(0, pos));
      const auto right = m.vocab_.find(text.substr(pos));
      if (left == m.vocab_.end() || right == m.vocab_.end()) continue;
      if (!is_mergeable(left->second) || !is_mergeable(right->second)) continue;
      m.merges_.emplace(PairKey(left->second, right->second), Merge{rank_of(scores[id]), id});
    }
  }
  m.Finish(options);
  return m;
}

std::optional<int32_t> BpeModel::TokenId(std::string_view token) const {
  const auto it = vocab_.find(std::string(token));
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const BpeModel::Merge* BpeModel::FindMerge(int32_t left, int32_t right) const {
  const auto it = merges_.find(PairKey(left, right));
  return it == merges_.end() ? nullptr : &it->second;
}

void BpeModel::Tokenize(std::string_view word, std::vector<int32_t>* out) const {
  if (word.empty()) return;
  if (options_.ignore_merges) {
    if (const auto id = TokenId(word)) {
      out->push_back(*id);
      return;
    }
  }
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
    bool alive;
  };
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  bool last_was_unk = false;
  const auto push = [&](int32_t id) {
    const int32_t n = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, n - 1, n + 1, true});
  };
  for (size_t pos = 0; pos < word.size();) {
    char32_t cp;
    const size_t len = DecodeUtf8(word, pos, &cp);
    const std::string_view ch = word.substr(pos, len);
    pos += len;
    // An invalid byte decodes as U+FFFD but is not that character: it only has a byte fallback.
    const bool real_char = cp != kReplacementChar || ch == "\xEF\xBF\xBD";
    if (real_char) {
      const auto it = char_ids_.find(cp);
      if (it != char_ids_.end()) {
        push(it->second);
        last_was_unk = false;
        continue;
      }
    }
    if (options_.byte_fallback &&
        std::all_of(ch.begin(), ch.end(),
                    [&](char c) { return byte_ids_[static_cast<unsigned char>(c)] >= 0; })) {
      for (char c : ch) push(byte_ids_[static_cast<unsigned char>(c)]);
      last_was_unk = false;
      continue;
    }
    if (!options_.unk_id) continue;
    if (!(options_.fuse_unk && last_was_unk)) push(*options_.unk_id);
    last_was_unk = true;
  }
  if (symbols.empty()) return;
  symbols.back().next = -1;

  struct Candidate {
    int32_t rank;
    int32_t pos;
    int32_t left_id;
    int32_t right_id;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  const auto consider = [&](int32_t left) {
    if (left < 0) return;
    const int32_t right = symbols[left].next;
    if (right < 0) return;
    if (const Merge* m = FindMerge(symbols[left].id, symbols[right].id)) {
      queue.push({m->rank, left, symbols[left].id, symbols[right].id});
    }
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(symbols.size()); ++i) consider(i);
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.pos];
    if (!left.alive || left.id != top.left_id || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    if (right.id != top.right_id) continue;
    const Merge* m = FindMerge(left.id, right.id);
    left.id = m->new_id;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.pos;
    consider(left.prev);
    consider(top.pos);
  }
  for (int32_t i = 0; i >= 0; i = symbols[i].next) out->push_back(symbols[i].id);
}

}  // namespace chunkserve::tokenizer
