#include "runtime/tokenizer/tokenizer.h"

#include <fstream>
#include <sstream>

#include "runtime/tokenizer/tokenizer_impl.h"
#include "runtime/tokenizer/utf8.h"

namespace chunkserve::tokenizer {
namespace {

// Ids are int32_t; more entries than this is a malformed file, not a vocabulary.
constexpr int64_t kMaxVocabSize = 1 << 24;

}  // namespace

Result<Tokenizer> MakeTokenizer(std::shared_ptr<const Tokenizer::Impl> impl) {
  return Tokenizer(std::move(impl));
}

Status BuildIdTables(const std::unordered_map<std::string, int32_t>& vocab,
                     const std::vector<AddedToken>& added, Tokenizer::Impl* impl) {
  int64_t size = 0;
  for (const auto& [text, id] : vocab) {
    if (id < 0 || id >= kMaxVocabSize) {
      return Status::InvalidArgument("token '" + text + "' has id " + std::to_string(id) +
                                     " outside [0, " + std::to_string(kMaxVocabSize) + ")");
    }
    size = std::max<int64_t>(size, id + 1);
  }
  for (const AddedToken& t : added) {
    if (t.id < 0 || t.id >= kMaxVocabSize) {
      return Status::InvalidArgument("added token '" + t.content + "' has id " +
                                     std::to_string(t.id) + " outside [0, " +
                                     std::to_string(kMaxVocabSize) + ")");
    }
    size = std::max<int64_t>(size, t.id + 1);
  }
  impl->id_to_token.assign(static_cast<size_t>(size), {});
  impl->present.assign(static_cast<size_t>(size), false);
  impl->special.assign(static_cast<size_t>(size), false);
  impl->token_to_id = vocab;
  for (const auto& [text, id] : vocab) {
    impl->id_to_token[id] = text;
    impl->present[id] = true;
  }
  for (const AddedToken& t : added) {
    impl->id_to_token[t.id] = t.content;
    impl->present[t.id] = true;
    impl->special[t.id] = t.special;
    impl->token_to_id[t.content] = t.id;
  }
  return Status::Ok();
}

Result<Tokenizer> Tokenizer::FromJsonFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::NotFound("cannot open " + path.string());
  std::ostringstream text;
  text << in.rdbuf();
  if (!in && !in.eof()) return Status::DataLoss("cannot read " + path.string());
  auto tokenizer = FromJson(text.str());
  if (!tokenizer.ok()) return tokenizer.status().Annotate(path.string());
  return tokenizer;
}

Result<std::vector<int32_t>> Tokenizer::Encode(std::string_view text,
                                               bool add_special_tokens) const {
  const size_t valid = ValidUtf8Prefix(text);
  if (valid != text.size()) {
    return Status::InvalidArgument("text is not valid UTF-8 at byte " + std::to_string(valid));
  }
  const Impl& impl = *impl_;
  std::vector<int32_t> ids;
  if (add_special_tokens) ids = impl.prefix_ids;
  std::vector<Piece> pieces;
  for (const Segment& seg : impl.added.Split(text)) {
    if (seg.id >= 0) {
      ids.push_back(seg.id);
      continue;
    }
    std::string normalized(text.substr(seg.begin, seg.end - seg.begin));
    CHUNKSERVE_RETURN_IF_ERROR(impl.normalizer.Apply(&normalized));
    pieces.clear();
    pieces.push_back({std::move(normalized), seg.begin == 0});
    CHUNKSERVE_RETURN_IF_ERROR(impl.pre_tokenizer.Apply(&pieces));
    for (const Piece& p : pieces) impl.model.Tokenize(p.text, &ids);
  }
  if (add_special_tokens) ids.insert(ids.end(), impl.suffix_ids.begin(), impl.suffix_ids.end());
  return ids;
}

Result<std::string> Tokenizer::Decode(std::span<const int32_t> ids,
                                      bool skip_special_tokens) const {
  const Impl& impl = *impl_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (const int32_t id : ids) {
    if (id < 0 || id >= vocab_size()) {
      return Status::InvalidArgument("token id " + std::to_string(id) + " outside [0, " +
                                     std::to_string(vocab_size()) + ")");
    }
    // Holes in a sparse vocabulary have no text; HF skips ids it cannot map, and so do we.
    if (!impl.present[id]) continue;
    if (skip_special_tokens && impl.special[id]) continue;
    tokens.push_back(impl.id_to_token[id]);
  }
  return impl.decoder.Decode(std::move(tokens));
}

Result<std::string> Tokenizer::TokenBytes(int32_t id) const {
  const Impl& impl = *impl_;
  if (id < 0 || id >= vocab_size()) {
    return Status::InvalidArgument("token id " + std::to_string(id) + " outside [0, " +
                                   std::to_string(vocab_size()) + ")");
  }
  if (!impl.present[id]) return std::string();
  // Added tokens stand for their content as it is (HF decodes them without the decoder's
  // byte mapping when they are not in the model's vocabulary, and their content is text).
  if (impl.special[id]) return impl.id_to_token[id];
  return impl.decoder.TokenBytes(impl.id_to_token[id]);
}

int32_t Tokenizer::vocab_size() const {
  return static_cast<int32_t>(impl_->id_to_token.size());
}

std::optional<int32_t> Tokenizer::TokenId(std::string_view token) const {
  const auto it = impl_->token_to_id.find(std::string(token));
  if (it == impl_->token_to_id.end()) return std::nullopt;
  return it->second;
}

std::optional<std::string_view> Tokenizer::TokenText(int32_t id) const {
  if (id < 0 || id >= vocab_size() || !impl_->present[id]) return std::nullopt;
  return impl_->id_to_token[id];
}

std::optional<int32_t> Tokenizer::bos_id() const { return impl_->bos_id; }
std::optional<int32_t> Tokenizer::eos_id() const { return impl_->eos_id; }

bool Tokenizer::IsSpecial(int32_t id) const {
  return id >= 0 && id < vocab_size() && impl_->special[id];
}

bool Tokenizer::DecodesLocally() const { return impl_->decoder.IsLocal(); }

}  // namespace chunkserve::tokenizer
