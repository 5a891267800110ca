// The tables behind a Tokenizer, shared by the loaders (tokenizer_json.cc, tokenizer_vocab.cc)
// and the encode/decode code (tokenizer.cc). Internal to runtime/tokenizer.
#ifndef CHUNKSERVE_RUNTIME_TOKENIZER_TOKENIZER_IMPL_H_
#define CHUNKSERVE_RUNTIME_TOKENIZER_TOKENIZER_IMPL_H_

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/tokenizer/added_tokens.h"
#include "runtime/tokenizer/bpe.h"
#include "runtime/tokenizer/decoder.h"
#include "runtime/tokenizer/normalizer.h"
#include "runtime/tokenizer/pre_tokenizer.h"
#include "runtime/tokenizer/tokenizer.h"

namespace chunkserve::tokenizer {

struct Tokenizer::Impl {
  BpeModel model;
  Normalizer normalizer;
  PreTokenizer pre_tokenizer;
  Decoder decoder;
  AddedTokenMatcher added;

  // Indexed by id, size vocab_size(); ids that no entry has are !present.
  std::vector<std::string> id_to_token;
  std::vector<bool> present;
  std::vector<bool> special;
  std::unordered_map<std::string, int32_t> token_to_id;  // vocabulary and added tokens

  // With add_special_tokens: these ids before and after the encoded text.
  std::vector<int32_t> prefix_ids;
  std::vector<int32_t> suffix_ids;
  std::optional<int32_t> bos_id;
  std::optional<int32_t> eos_id;
};

// Wraps a finished Impl (the Tokenizer constructor is private).
Result<Tokenizer> MakeTokenizer(std::shared_ptr<const Tokenizer::Impl> impl);

// Fills id_to_token / present / token_to_id from the model vocabulary plus `added` (an added
// token may reuse a vocabulary id), sizing the tables to the largest id + 1. InvalidArgument on a
// negative id or one past `max_ids`.
Status BuildIdTables(const std::unordered_map<std::string, int32_t>& vocab,
                     const std::vector<AddedToken>& added, Tokenizer::Impl* impl);

}  // namespace chunkserve::tokenizer

#endif  // CHUNKSERVE_RUNTIME_TOKENIZER_TOKENIZER_IMPL_H_
