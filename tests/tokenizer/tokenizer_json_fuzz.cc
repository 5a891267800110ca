// Fuzz target for Tokenizer::FromJson: any bytes as tokenizer.json must load or yield a Status.
// When one loads, a fixed text is encoded, decoded and streamed, and so are ids taken from the
// input's bytes (streaming must add up to Decode for any ids); for byte-level BPE without
// anything that drops text (see ExpectsRoundTrip) Decode(Encode(s)) == s is the oracle, and a
// failure aborts for the fuzzer. With clang this is the libFuzzer binary
// chunkserve-tokenizer-fuzzer; with every compiler tokenizer_json_fuzz_replay_test.cc drives it
// over tests/tokenizer/fuzz_corpus/ and mutations of it under ASan and UBSan.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/tokenizer/stream_decoder.h"
#include "runtime/tokenizer/tokenizer.h"
#include "runtime/tokenizer/utf8.h"

namespace {

constexpr std::string_view kText =
    "Hello, world! It's 12345 <|endoftext|> <s> \xe4\xbd\xa0\xe5\xa5\xbd \xf0\x9f\x98\x80\n\t x";

// True when the document is plain byte-level BPE whose vocabulary has every byte character: no
// normalizer, a ByteLevel pre-tokenizer (alone or in a Sequence) that adds no prefix space and no
// Split that removes text, a ByteLevel decoder, no added token that strips whitespace, and no id
// given to two different strings.
bool ExpectsRoundTrip(std::string_view data, const chunkserve::tokenizer::Tokenizer& t) {
  const auto j = nlohmann::json::parse(data, nullptr, false);
  if (!j.is_object()) return false;
  const auto type_of = [](const nlohmann::json& v) -> std::string {
    if (!v.is_object() || !v.contains("type") || !v["type"].is_string()) return "";
    return v["type"].get<std::string>();
  };
  if (j.contains("normalizer") && !j["normalizer"].is_null()) return false;
  if (!j.contains("decoder") || type_of(j["decoder"]) != "ByteLevel") return false;
  if (!j.contains("pre_tokenizer")) return false;
  const auto& pre = j["pre_tokenizer"];
  const auto adds_space = [](const nlohmann::json& p) {
    return !p.contains("add_prefix_space") || p["add_prefix_space"] != false;
  };
  bool byte_level = type_of(pre) == "ByteLevel";
  if (byte_level && adds_space(pre)) return false;
  if (type_of(pre) == "Sequence") {
    if (!pre.contains("pretokenizers") || !pre["pretokenizers"].is_array()) return false;
    for (const auto& p : pre["pretokenizers"]) {
      const std::string type = type_of(p);
      if (type == "ByteLevel") {
        if (adds_space(p)) return false;
        byte_level = true;
      }
      if (type == "Split" && (!p.contains("behavior") || p["behavior"] == "Removed")) return false;
      if (type != "ByteLevel" && type != "Split" && type != "Digits") return false;
    }
  }
  if (!byte_level) return false;
  std::map<int64_t, std::string> by_id;
  if (!j.contains("model") || !j["model"].is_object() || !j["model"].contains("vocab") ||
      !j["model"]["vocab"].is_object()) {
    return false;
  }
  for (const auto& [text, id] : j["model"]["vocab"].items()) {
    if (!id.is_number_integer() || !by_id.emplace(id.get<int64_t>(), text).second) return false;
  }
  if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
    for (const auto& a : j["added_tokens"]) {
      if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() ||
          !a.contains("content") || !a["content"].is_string()) {
        return false;
      }
      const auto [it, inserted] = by_id.emplace(a["id"].get<int64_t>(), a["content"]);
      if (!inserted && it->second != a["content"].get<std::string>()) return false;
      for (const char* key : {"lstrip", "rstrip"}) {
        if (a.contains(key) && a[key] != false) return false;
      }
    }
  }
  for (const std::string& c : chunkserve::tokenizer::ByteLevelEncodeTable()) {
    if (!t.TokenId(c)) return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view json(reinterpret_cast<const char*>(data), size);
  auto t = chunkserve::tokenizer::Tokenizer::FromJson(json);
  if (!t.ok()) return 0;
  auto ids = t->Encode(kText, /*add_special_tokens=*/true);
  if (!ids.ok()) return 0;  // a regex may hit PCRE2's match limit: a Status, not a crash
  for (const int32_t id : *ids) {
    if (id < 0 || id >= t->vocab_size()) std::abort();
  }
  auto text = t->Decode(*ids, /*skip_special_tokens=*/false);
  if (!text.ok() || !chunkserve::tokenizer::IsValidUtf8(*text)) std::abort();
  chunkserve::tokenizer::StreamDecoder stream(*t, /*skip_special_tokens=*/false);
  std::string streamed;
  for (const int32_t id : *ids) {
    auto chunk = stream.Push(id);
    if (!chunk.ok() || !chunkserve::tokenizer::IsValidUtf8(*chunk)) std::abort();
    streamed += *chunk;
  }
  streamed += stream.Flush();
  if (streamed != *text) std::abort();
  // Ids no encoder would produce (any order, byte tokens split, special tokens anywhere), taken
  // from the input's own bytes: streamed must still add up to Decode, with and without specials.
  std::vector<int32_t> any_ids;
  for (size_t i = 0; t->vocab_size() > 0 && i + 1 < size && any_ids.size() < 48; i += 7) {
    any_ids.push_back(static_cast<int32_t>((data[i] | (data[i + 1] << 8)) % t->vocab_size()));
  }
  for (const bool skip : {false, true}) {
    auto want = t->Decode(any_ids, skip);
    if (!want.ok()) std::abort();
    chunkserve::tokenizer::StreamDecoder any_stream(*t, skip);
    std::string got;
    for (const int32_t id : any_ids) {
      auto chunk = any_stream.Push(id);
      if (!chunk.ok() || !chunkserve::tokenizer::IsValidUtf8(*chunk)) std::abort();
      got += *chunk;
    }
    got += any_stream.Flush();
    if (got != *want) std::abort();
  }
  if (ExpectsRoundTrip(json, *t)) {
    auto plain = t->Encode(kText, /*add_special_tokens=*/false);
    if (!plain.ok()) return 0;
    auto back = t->Decode(*plain, /*skip_special_tokens=*/false);
    if (!back.ok() || *back != kText) std::abort();
  }
  return 0;
}
