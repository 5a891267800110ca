// Byte-pair encoding of one pre-tokenized word: the model step of HF tokenizers' BPE and of
// llama.cpp's SentencePiece-style ("llama") vocabularies.
//
// Algorithm (one word):
//  1. With ignore_merges, a word that is itself a vocabulary entry is that one token.
//  2. Split the word into code points. A code point in the vocabulary is one symbol; otherwise,
//     with byte_fallback, its UTF-8 bytes become <0xNN> symbols (when all exist); otherwise the
//     unknown token (consecutive unknowns fused into one with fuse_unk), or nothing without one.
//  3. Repeatedly merge the adjacent pair of lowest rank, leftmost first among equal ranks, until no
//     adjacent pair has a rank. Symbols form a doubly linked list over a vector and candidate
//     pairs sit in a min-heap keyed by (rank, position); a popped pair whose symbols changed since
//     it was pushed is stale and skipped. O(n log n) for a word of n code points.
//
// Ranks come either from a merges list (HF: rank = line number) or, for SentencePiece
// vocabularies, from scores: every split of a vocabulary entry into two entries is a pair whose
// rank orders the entry's score from high to low (equal scores, equal rank), which reproduces
// llama.cpp's "highest score first, then leftmost" loop.
//
// Nothing is cached between calls; Tokenize is const and safe from many threads.
#ifndef CHUNKSERVE_RUNTIME_TOKENIZER_BPE_H_
#define CHUNKSERVE_RUNTIME_TOKENIZER_BPE_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "runtime/base/status.h"

namespace chunkserve::tokenizer {

class BpeModel {
 public:
  struct Options {
    bool byte_fallback = false;
    std::optional<int32_t> unk_id;
    bool fuse_unk = false;
    bool ignore_merges = false;
  };

  BpeModel() = default;

  // `vocab` maps entries to ids (ids need not be dense). Merges are pairs of entries whose
  // concatenation must be an entry; rank = position in `merges`. InvalidArgument on an entry that
  // is missing from the vocabulary.
  static Result<BpeModel> FromMerges(std::unordered_map<std::string, int32_t> vocab,
                                     const std::vector<std::pair<std::string, std::string>>& merges,
                                     Options options);
  // SentencePiece-style: ranks from `scores` (indexed by id; higher merges first). Entries whose
  // `mergeable` flag is false (byte tokens) take part neither as halves nor as results.
  static Result<BpeModel> FromScores(std::unordered_map<std::string, int32_t> vocab,
                                     const std::vector<float>& scores,
                                     const std::vector<bool>& mergeable, Options options);

  // Appends the ids of `word` to `out`.
  void Tokenize(std::string_view word, std::vector<int32_t>* out) const;

  std::optional<int32_t> TokenId(std::string_view token) const;

 private:
  struct Merge {
    int32_t rank;
    int32_t new_id;
  };
  static uint64_t PairKey(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
  }
  const Merge* FindMerge(int32_t left, int32_t right) const;
  void Finish(Options options);

  std::unordered_map<std::string, int32_t> vocab_;
  std::unordered_map<char32_t, int32_t> char_ids_;  // single-code-point entries
  std::unordered_map<uint64_t, Merge> merges_;
  std::array<int32_t, 256> byte_ids_{};  // <0xNN> entries, -1 when absent
  Options options_;
};

}  // namespace chunkserve::tokenizer

#endif  // CHUNKSERVE_RUNTIME_TOKENIZER_BPE_H_
