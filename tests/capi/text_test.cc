// The text functions of the C ABI (since 0.3) through libchunkserve.so: chunkserve_tokenize,
// chunkserve_detokenize, the streaming detokenizer, chunkserve_apply_chat_template and
// chunkserve_engine_eos_ids.
//
// With SmolLM2-135M-Instruct's GGUF (tests/testing/model_cache.h; skipped, saying why, when it is
// absent) the results are checked against transformers' own (tests/tokenizer/data/
// reference_smollm2.json, which tests/tokenizer checks the C++ tokenizer against too), and the
// sizing contract, argument checks and lifetimes are exercised. Without a tokenizer (the built-in
// tiny model, a safetensors folder) every call must fail with a clear status.
#include <chunkserve/chunkserve.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tests/capi/capi_testing.h"
#include "tests/testing/model_cache.h"
#include "tests/tokenizer/test_util.h"

namespace chunkserve::capi {
namespace {

using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::StartsWith;
using tokenizer::testing::LoadReference;
using tokenizer::testing::ReferenceRow;

struct DetokenizerDeleter {
  void operator()(chunkserve_detokenizer_t* d) const { chunkserve_detokenizer_destroy(d); }
};
using DetokenizerPtr = std::unique_ptr<chunkserve_detokenizer_t, DetokenizerDeleter>;

std::string MessageOf(const ErrorPtr& error) {
  return error ? chunkserve_error_message(error.get()) : "(no error object)";
}

// Whether `s` is well-formed UTF-8 (no overlongs, no surrogates, nothing above U+10FFFF), and
// does not end inside a character.
bool IsValidUtf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto b = static_cast<unsigned char>(s[i]);
    size_t n;
    uint32_t cp;
    if (b < 0x80) {
      ++i;
      continue;
    } else if ((b & 0xE0) == 0xC0) {
      n = 1, cp = b & 0x1F;
    } else if ((b & 0xF0) == 0xE0) {
      n = 2, cp = b & 0x0F;
    } else if ((b & 0xF8) == 0xF0) {
      n = 3, cp = b & 0x07;
    } else {
      return false;
    }
    for (size_t k = 1; k <= n; ++k) {
      if (i + k >= s.size()) return false;
      const auto c = static_cast<unsigned char>(s[i + k]);
      if ((c & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (c & 0x3F);
    }
    const uint32_t min[] = {0, 0x80, 0x800, 0x10000};
    if (cp < min[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n + 1;
  }
  return true;
}

// The engine on the real model, created once for the suite (loading the GGUF takes a while).
class CapiTextTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const auto path = ::chunkserve::testing::CachedModelPath(::chunkserve::testing::kSmolLM2Gguf);
    if (!path.ok()) {
      *skip_reason_ = std::string(path.status().message());
      return;
    }
    *model_path_ = path->string();
    chunkserve_engine_options_t o = GgufOptions();
    engine_ = CreateEngineOrDie(o).release();
  }
  static void TearDownTestSuite() {
    chunkserve_engine_destroy(engine_);
    engine_ = nullptr;
  }
  void SetUp() override {
    if (engine_ == nullptr) GTEST_SKIP() << *skip_reason_;
  }

  static chunkserve_engine_options_t GgufOptions() {
    chunkserve_engine_options_t o;
    EXPECT_EQ(chunkserve_engine_options_init(&o, sizeof o, nullptr), CHUNKSERVE_STATUS_OK);
    o.model_path = model_path_->c_str();
    o.chunk_size = 16;
    o.kv_cache_bytes = 8u << 20;
    o.num_threads = 1;
    return o;
  }

  // Tokenize with a buffer that fits (sized by a first, failing call).
  static std::vector<int32_t> Tokenize(const std::string& text, int32_t add_special) {
    size_t n = 0;
    chunkserve_status_t st = chunkserve_tokenize(engine_, text.data(), text.size(), add_special,
                                                 nullptr, 0, &n, nullptr);
    if (st == CHUNKSERVE_STATUS_OK) return {};
    EXPECT_EQ(st, CHUNKSERVE_STATUS_OUT_OF_RANGE);
    std::vector<int32_t> ids(n);
    ErrorPtr error;
    st = chunkserve_tokenize(engine_, text.data(), text.size(), add_special, ids.data(), ids.size(),
                             &n, Out(error));
    EXPECT_EQ(st, CHUNKSERVE_STATUS_OK) << MessageOf(error);
    ids.resize(n);
    return ids;
  }

  static std::string Detokenize(const std::vector<int32_t>& ids, int32_t skip_special) {
    size_t len = 0;
    chunkserve_status_t st = chunkserve_detokenize(engine_, ids.data(), ids.size(), skip_special,
                                                   nullptr, 0, &len, nullptr);
    if (st == CHUNKSERVE_STATUS_OK) return "";
    EXPECT_EQ(st, CHUNKSERVE_STATUS_OUT_OF_RANGE);
    std::string text(len, '\0');
    ErrorPtr error;
    st = chunkserve_detokenize(engine_, ids.data(), ids.size(), skip_special, text.data(),
                               text.size(), &len, Out(error));
    EXPECT_EQ(st, CHUNKSERVE_STATUS_OK) << MessageOf(error);
    text.resize(len);
    return text;
  }

  // The ids through a detokenizer, one push each (every piece checked to be valid UTF-8), then
  // flush.
  static std::string Stream(const std::vector<int32_t>& ids, int32_t skip_special) {
    chunkserve_detokenizer_t* raw = nullptr;
    ErrorPtr error;
    EXPECT_EQ(chunkserve_detokenizer_create(engine_, skip_special, &raw, Out(error)),
              CHUNKSERVE_STATUS_OK)
        << MessageOf(error);
    DetokenizerPtr d(raw);
    std::string streamed;
    char piece[256];
    size_t len = 0;
    for (const int32_t id : ids) {
      EXPECT_EQ(chunkserve_detokenizer_push(d.get(), id, piece, sizeof piece, &len, Out(error)),
                CHUNKSERVE_STATUS_OK)
          << MessageOf(error);
      const std::string s(piece, len);
      EXPECT_TRUE(IsValidUtf8(s)) << "piece after id " << id;
      streamed += s;
    }
    EXPECT_EQ(chunkserve_detokenizer_flush(d.get(), piece, sizeof piece, &len, Out(error)),
              CHUNKSERVE_STATUS_OK);
    return streamed.append(piece, len);
  }

  static inline chunkserve_engine_t* engine_ = nullptr;
  static inline std::string* skip_reason_ = new std::string();
  static inline std::string* model_path_ = new std::string();
};

const ReferenceRow& Row(size_t index) {
  static const auto* rows = new std::vector<ReferenceRow>(LoadReference("smollm2"));
  return rows->at(index);
}

// Corpus lines of reference_smollm2.json, by index: ASCII, CJK, emoji (with ZWJ sequences), and
// special tokens written in the text.
struct CorpusLine {
  const char* name;
  size_t index;
};

class CapiTextCorpusTest : public CapiTextTest, public ::testing::WithParamInterface<CorpusLine> {};

TEST_P(CapiTextCorpusTest, TokenizeEqualsTheTransformersReference) {
  const ReferenceRow& row = Row(GetParam().index);
  EXPECT_EQ(Tokenize(row.text, 1), row.ids_special) << row.text;
  EXPECT_EQ(Tokenize(row.text, 0), row.ids) << row.text;
}

TEST_P(CapiTextCorpusTest, DetokenizeRoundTrips) {
  const ReferenceRow& row = Row(GetParam().index);
  EXPECT_EQ(Detokenize(row.ids_special, 0), row.decoded);
  EXPECT_EQ(Detokenize(row.ids_special, 1), row.decoded_skip);
  EXPECT_EQ(Detokenize(Tokenize(row.text, 0), 0), row.text);
}

TEST_P(CapiTextCorpusTest, StreamedPiecesAreValidUtf8AndConcatenateToDetokenize) {
  const ReferenceRow& row = Row(GetParam().index);
  EXPECT_EQ(Stream(row.ids_special, 0), Detokenize(row.ids_special, 0));
  EXPECT_EQ(Stream(row.ids_special, 1), Detokenize(row.ids_special, 1));
}

INSTANTIATE_TEST_SUITE_P(
    Smollm2, CapiTextCorpusTest,
    ::testing::Values(CorpusLine{"hello_world", 1}, CorpusLine{"quick_brown_fox", 7},
                      CorpusLine{"chinese", 46}, CorpusLine{"japanese_mixed", 51},
                      CorpusLine{"emoji_in_text", 75}, CorpusLine{"emoji_zwj_family", 76},
                      CorpusLine{"chatml_special_tokens", 107}),
    [](const auto& info) { return std::string(info.param.name); });

TEST_F(CapiTextTest, TokenizeTooSmallCapacityReportsTheNeededCount) {
  const std::string text = "The quick brown fox jumps over the lazy dog.";
  size_t n = 12345;
  ErrorPtr error;
  EXPECT_EQ(chunkserve_tokenize(engine_, text.data(), text.size(), 0, nullptr, 0, &n, Out(error)),
            CHUNKSERVE_STATUS_OUT_OF_RANGE);
  EXPECT_EQ(n, 10u);
  EXPECT_THAT(MessageOf(error), StartsWith("chunkserve_tokenize: "));
  // One short: nothing is written.
  std::vector<int32_t> ids(10, -7);
  EXPECT_EQ(chunkserve_tokenize(engine_, text.data(), text.size(), 0, ids.data(), 9, &n, nullptr),
            CHUNKSERVE_STATUS_OUT_OF_RANGE);
  EXPECT_EQ(n, 10u);
  EXPECT_EQ(ids, std::vector<int32_t>(10, -7));
  EXPECT_EQ(
      chunkserve_tokenize(engine_, text.data(), text.size(), 0, ids.data(), 10, &n, Out(error)),
      CHUNKSERVE_STATUS_OK);
  EXPECT_EQ(error, nullptr);
  EXPECT_EQ(n, 10u);
  EXPECT_EQ(ids, Row(7).ids);
  // Empty text: zero ids, OK with no buffer at all.
  EXPECT_EQ(chunkserve_tokenize(engine_, nullptr, 0, 0, nullptr, 0, &n, nullptr),
            CHUNKSERVE_STATUS_OK);
  EXPECT_EQ(n, 0u);
}

TEST_F(CapiTextTest, DetokenizeTooSmallCapacityReportsTheNeededBytesAndNulIsOptional) {
  const ReferenceRow& row = Row(46);  // 你好，世界！: 18 bytes
  const size_t want = row.decoded.size();
  size_t len = 0;
  EXPECT_EQ(
      chunkserve_detokenize(engine_, row.ids.data(), row.ids.size(), 0, nullptr, 0, &len, nullptr),
      CHUNKSERVE_STATUS_OUT_OF_RANGE);
  EXPECT_EQ(len, want);
  std::string buffer(want + 4, '#');
  EXPECT_EQ(chunkserve_detokenize(engine_, row.ids.data(), row.ids.size(), 0, buffer.data(),
                                  want - 1, &len, nullptr),
            CHUNKSERVE_STATUS_OUT_OF_RANGE);
  EXPECT_EQ(buffer, std::string(want + 4, '#'));  // nothing written
  // Exactly the text's size: OK, and no NUL (no room for it).
  EXPECT_EQ(chunkserve_detokenize(engine_, row.ids.data(), row.ids.size(), 0, buffer.data(), want,
                                  &len, nullptr),
            CHUNKSERVE_STATUS_OK);
  EXPECT_EQ(len, want);
  EXPECT_EQ(buffer.substr(0, want), row.decoded);
  EXPECT_EQ(buffer[want], '#');
  // One more byte: a C string.
  EXPECT_EQ(chunkserve_detokenize(engine_, row.ids.data(), row.ids.size(), 0, buffer.data(),
                                  want + 1, &len, nullptr),
            CHUNKSERVE_STATUS_OK);
  EXPECT_STREQ(buffer.c_str(), row.decoded.c_str());
}

// A too-small buffer leaves the detokenizer as it was: the same push, repeated with the size it
// asked for, gives the same text as if it had fitted the first time.
TEST_F(CapiTextTest, DetokenizerPushThatDoesNotFitTakesNothingAndCanBeRepeated) {
  const ReferenceRow& row = Row(75);  // Hello 👋 world 🌍
  chunkserve_detokenizer_t* raw = nullptr;
  ASSERT_EQ(chunkserve_detokenizer_create(engine_, 1, &raw, nullptr), CHUNKSERVE_STATUS_OK);
  DetokenizerPtr d(raw);
  std::string streamed;
  size_t len = 0;
  int refused = 0;
  for (const int32_t id : row.ids) {
    chunkserve_status_t st = chunkserve_detokenizer_push(d.get(), id, nullptr, 0, &len, nullptr);
    if (st == CHUNKSERVE_STATUS_OUT_OF_RANGE) {
      ++refused;
      ASSERT_GT(len, 0u);
      std::string piece(len, '\0');
      ASSERT_EQ(chunkserve_detokenizer_push(d.get(), id, piece.data(), piece.size(), &len, nullptr),
                CHUNKSERVE_STATUS_OK);
      ASSERT_EQ(len, piece.size());
      streamed += piece;
    } else {
      ASSERT_EQ(st, CHUNKSERVE_STATUS_OK);
      ASSERT_EQ(len, 0u);  // the id completed no text yet (half an emoji)
    }
  }
  EXPECT_GT(refused, 0);
  char rest[64];
  ASSERT_EQ(chunkserve_detokenizer_flush(d.get(), rest, sizeof rest, &len, nullptr),
            CHUNKSERVE_STATUS_OK);
  streamed.append(rest, len);
  EXPECT_EQ(streamed, row.decoded_skip);
}

TEST_F(CapiTextTest, NullArgumentsAreInvalidArgumentNamingTheFunction) {
  const int32_t id = 19556;
  int32_t ids[4];
  char text[16];
  size_t n = 0;
  chunkserve_detokenizer_t* d = nullptr;
  const char* role = "user";
  const char* null_role[] = {nullptr};
  std::string last_message;
  // `call` gets the out_error parameter; its error lands in an ErrorPtr after it returns.
  const auto expect_invalid = [&](const char* function, auto call) {
    ErrorPtr error;
    const chunkserve_status_t st = call(Out(error));
    EXPECT_EQ(st, CHUNKSERVE_STATUS_INVALID_ARGUMENT) << function;
    last_message = MessageOf(error);
    EXPECT_THAT(last_message, StartsWith(std::string(function) + ": "));
  };
  expect_invalid("chunkserve_tokenize", [&](chunkserve_error_t** err) {
    return chunkserve_tokenize(nullptr, "a", 1, 0, ids, 4, &n, err);
  });
  expect_invalid("chunkserve_tokenize", [&](chunkserve_error_t** err) {
    return chunkserve_tokenize(engine_, "a", 1, 0, ids, 4, nullptr, err);
  });
  expect_invalid("chunkserve_tokenize", [&](chunkserve_error_t** err) {
    return chunkserve_tokenize(engine_, nullptr, 1, 0, ids, 4, &n, err);
  });
  expect_invalid("chunkserve_tokenize", [&](chunkserve_error_t** err) {
    return chunkserve_tokenize(engine_, "a", 1, 0, nullptr, 4, &n, err);
  });
  expect_invalid("chunkserve_tokenize", [&](chunkserve_error_t** err) {
    return chunkserve_tokenize(engine_, "a", 1, 2, ids, 4, &n, err);
  });
  expect_invalid("chunkserve_detokenize", [&](chunkserve_error_t** err) {
    return chunkserve_detokenize(nullptr, &id, 1, 0, text, 16, &n, err);
  });
  expect_invalid("chunkserve_detokenize", [&](chunkserve_error_t** err) {
    return chunkserve_detokenize(engine_, nullptr, 1, 0, text, 16, &n, err);
  });
  expect_invalid("chunkserve_detokenize", [&](chunkserve_error_t** err) {
    return chunkserve_detokenize(engine_, &id, 1, 0, nullptr, 16, &n, err);
  });
  expect_invalid("chunkserve_detokenize", [&](chunkserve_error_t** err) {
    return chunkserve_detokenize(engine_, &id, 1, 0, text, 16, nullptr, err);
  });
  expect_invalid("chunkserve_detokenize", [&](chunkserve_error_t** err) {
    return chunkserve_detokenize(engine_, &id, 1, -1, text, 16, &n, err);
  });
  expect_invalid("chunkserve_detokenizer_create", [&](chunkserve_error_t** err) {
    return chunkserve_detokenizer_create(nullptr, 0, &d, err);
  });
  expect_invalid("chunkserve_detokenizer_create", [&](chunkserve_error_t** err) {
    return chunkserve_detokenizer_create(engine_, 0, nullptr, err);
  });
  expect_invalid("chunkserve_detokenizer_create", [&](chunkserve_error_t** err) {
    return chunkserve_detokenizer_create(engine_, 7, &d, err);
  });
  EXPECT_EQ(d, nullptr);
  expect_invalid("chunkserve_detokenizer_push", [&](chunkserve_error_t** err) {
    return chunkserve_detokenizer_push(nullptr, id, text, 16, &n, err);
  });
  expect_invalid("chunkserve_detokenizer_flush", [&](chunkserve_error_t** err) {
    return chunkserve_detokenizer_flush(nullptr, text, 16, &n, err);
  });
  expect_invalid("chunkserve_apply_chat_template", [&](chunkserve_error_t** err) {
    return chunkserve_apply_chat_template(nullptr, &role, &role, 1, 1, text, 16, &n, err);
  });
  expect_invalid("chunkserve_apply_chat_template", [&](chunkserve_error_t** err) {
    return chunkserve_apply_chat_template(engine_, nullptr, &role, 1, 1, text, 16, &n, err);
  });
  expect_invalid("chunkserve_apply_chat_template", [&](chunkserve_error_t** err) {
    return chunkserve_apply_chat_template(engine_, &role, nullptr, 1, 1, text, 16, &n, err);
  });
  expect_invalid("chunkserve_apply_chat_template", [&](chunkserve_error_t** err) {
    return chunkserve_apply_chat_template(engine_, null_role, &role, 1, 1, text, 16, &n, err);
  });
  EXPECT_THAT(last_message, HasSubstr("roles[0]"));
  expect_invalid("chunkserve_apply_chat_template", [&](chunkserve_error_t** err) {
    return chunkserve_apply_chat_template(engine_, &role, &role, 1, 1, text, 16, nullptr, err);
  });
  expect_invalid("chunkserve_engine_eos_ids", [&](chunkserve_error_t** err) {
    return chunkserve_engine_eos_ids(nullptr, ids, 4, &n, err);
  });
  expect_invalid("chunkserve_engine_eos_ids", [&](chunkserve_error_t** err) {
    return chunkserve_engine_eos_ids(engine_, nullptr, 4, &n, err);
  });
  expect_invalid("chunkserve_engine_eos_ids", [&](chunkserve_error_t** err) {
    return chunkserve_engine_eos_ids(engine_, ids, 4, nullptr, err);
  });
  chunkserve_detokenizer_destroy(nullptr);  // a no-op
}

TEST_F(CapiTextTest, OutOfRangeIdsAndInvalidUtf8AreInvalidArgument) {
  char text[64];
  size_t n = 0;
  ErrorPtr error;
  for (const int32_t bad : {-1, 49152, INT32_MAX}) {
    const int32_t ids[] = {19556, bad};
    EXPECT_EQ(chunkserve_detokenize(engine_, ids, 2, 0, text, sizeof text, &n, Out(error)),
              CHUNKSERVE_STATUS_INVALID_ARGUMENT)
        << bad;
    EXPECT_THAT(MessageOf(error), StartsWith("chunkserve_detokenize: "));
  }
  // A refused id is not taken: the detokenizer goes on as if it had never been pushed.
  chunkserve_detokenizer_t* raw = nullptr;
  ASSERT_EQ(chunkserve_detokenizer_create(engine_, 1, &raw, nullptr), CHUNKSERVE_STATUS_OK);
  DetokenizerPtr d(raw);
  EXPECT_EQ(chunkserve_detokenizer_push(d.get(), -5, text, sizeof text, &n, Out(error)),
            CHUNKSERVE_STATUS_INVALID_ARGUMENT);
  EXPECT_THAT(MessageOf(error), StartsWith("chunkserve_detokenizer_push: "));
  ASSERT_EQ(chunkserve_detokenizer_push(d.get(), 19556, text, sizeof text, &n, nullptr),
            CHUNKSERVE_STATUS_OK);
  EXPECT_EQ(std::string(text, n), "Hello");

  const char invalid[] = {'a', '\xC3', '(', 'b'};
  int32_t ids[16];
  EXPECT_EQ(chunkserve_tokenize(engine_, invalid, sizeof invalid, 0, ids, 16, &n, Out(error)),
            CHUNKSERVE_STATUS_INVALID_ARGUMENT);
  EXPECT_THAT(MessageOf(error), StartsWith("chunkserve_tokenize: "));
}

TEST_F(CapiTextTest, ChatTemplateRendersSmolLM2WithTheGenerationPrompt) {
  const char* roles[] = {"system", "user"};
  const char* contents[] = {"You are terse.", "What is 2+2?"};
  size_t len = 0;
  ASSERT_EQ(
      chunkserve_apply_chat_template(engine_, roles, contents, 2, 1, nullptr, 0, &len, nullptr),
      CHUNKSERVE_STATUS_OUT_OF_RANGE);
  std::string text(len + 1, '#');
  ErrorPtr error;
  ASSERT_EQ(chunkserve_apply_chat_template(engine_, roles, contents, 2, 1, text.data(), text.size(),
                                           &len, Out(error)),
            CHUNKSERVE_STATUS_OK)
      << MessageOf(error);
  text.resize(len);
  EXPECT_THAT(text, StartsWith("<|im_start|>system\nYou are terse.<|im_end|>\n"));
  EXPECT_THAT(text, HasSubstr("<|im_start|>user\nWhat is 2+2?<|im_end|>\n"));
  EXPECT_THAT(text, EndsWith("<|im_start|>assistant\n"));

  // Without the generation prompt, and with SmolLM2's default system message when none is given.
  char buffer[512];
  ASSERT_EQ(chunkserve_apply_chat_template(engine_, roles + 1, contents + 1, 1, 0, buffer,
                                           sizeof buffer, &len, Out(error)),
            CHUNKSERVE_STATUS_OK)
      << MessageOf(error);
  const std::string user_only(buffer, len);
  EXPECT_THAT(user_only, StartsWith("<|im_start|>system\n"));
  EXPECT_THAT(user_only, HasSubstr("SmolLM"));
  EXPECT_THAT(user_only, EndsWith("What is 2+2?<|im_end|>\n"));
  // The rendered prompt tokenizes with the special tokens as single ids.
  const std::vector<int32_t> ids = Tokenize(text, 0);
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids.front(), 1);  // <|im_start|>
}

TEST_F(CapiTextTest, EosIdsContainImEnd) {
  const std::vector<int32_t> im_end = Tokenize("<|im_end|>", 0);
  ASSERT_EQ(im_end.size(), 1u);
  size_t n = 0;
  ASSERT_EQ(chunkserve_engine_eos_ids(engine_, nullptr, 0, &n, nullptr),
            CHUNKSERVE_STATUS_OUT_OF_RANGE);  // SmolLM2 has EOS ids, so they do not fit in 0
  ASSERT_GT(n, 0u);
  std::vector<int32_t> eos(n);
  ASSERT_EQ(chunkserve_engine_eos_ids(engine_, eos.data(), eos.size(), &n, nullptr),
            CHUNKSERVE_STATUS_OK);
  EXPECT_THAT(eos, ::testing::Contains(im_end[0]));
}

// Its own engine: the detokenizer keeps the tokenizer alive after the engine is destroyed, and
// the engine's first text calls race from several threads (the model text loads once).
TEST_F(CapiTextTest, DetokenizerOutlivesItsEngineAndTheFirstLoadIsThreadSafe) {
  EnginePtr engine = CreateEngineOrDie(GgufOptions());
  ASSERT_NE(engine, nullptr);
  const std::string text = Row(48).text;
  std::vector<std::vector<int32_t>> results(4);
  std::vector<std::thread> threads;
  for (auto& result : results) {
    threads.emplace_back([&engine, &text, &result] {
      result.resize(64);
      size_t n = 0;
      if (chunkserve_tokenize(engine.get(), text.data(), text.size(), 0, result.data(),
                              result.size(), &n, nullptr) == CHUNKSERVE_STATUS_OK) {
        result.resize(n);
      } else {
        result.clear();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& result : results) EXPECT_EQ(result, Row(48).ids);

  chunkserve_detokenizer_t* raw = nullptr;
  ASSERT_EQ(chunkserve_detokenizer_create(engine.get(), 1, &raw, nullptr), CHUNKSERVE_STATUS_OK);
  DetokenizerPtr d(raw);
  engine.reset();
  std::string streamed;
  char piece[256];
  size_t len = 0;
  for (const int32_t id : Row(48).ids) {
    ASSERT_EQ(chunkserve_detokenizer_push(d.get(), id, piece, sizeof piece, &len, nullptr),
              CHUNKSERVE_STATUS_OK);
    streamed.append(piece, len);
  }
  ASSERT_EQ(chunkserve_detokenizer_flush(d.get(), piece, sizeof piece, &len, nullptr),
            CHUNKSERVE_STATUS_OK);
  streamed.append(piece, len);
  EXPECT_EQ(streamed, text);
}

// ---- Engines without a tokenizer ----------------------------------------------------------------

// Every text function on an engine without tokenizer files fails with `code`, naming itself and
// what is missing.
void ExpectEveryTextCallFails(chunkserve_engine_t* engine, chunkserve_status_t code,
                              const std::string& missing) {
  int32_t ids[4];
  char text[16];
  size_t n = 0;
  const int32_t id = 1;
  const char* role = "user";
  chunkserve_detokenizer_t* d = nullptr;
  // `call` gets the out_error parameter; its error lands in an ErrorPtr after it returns.
  const auto expect = [&](const char* function, auto call) {
    ErrorPtr error;
    const chunkserve_status_t st = call(Out(error));
    EXPECT_EQ(st, code) << function << ": " << MessageOf(error);
    EXPECT_THAT(MessageOf(error), StartsWith(std::string(function) + ": "));
    EXPECT_THAT(MessageOf(error), HasSubstr(missing));
  };
  for (int twice = 0; twice < 2; ++twice) {  // the remembered failure is the same
    expect("chunkserve_tokenize", [&](chunkserve_error_t** err) {
      return chunkserve_tokenize(engine, "hi", 2, 0, ids, 4, &n, err);
    });
  }
  expect("chunkserve_detokenize", [&](chunkserve_error_t** err) {
    return chunkserve_detokenize(engine, &id, 1, 0, text, 16, &n, err);
  });
  expect("chunkserve_detokenizer_create", [&](chunkserve_error_t** err) {
    return chunkserve_detokenizer_create(engine, 0, &d, err);
  });
  EXPECT_EQ(d, nullptr);
  expect("chunkserve_apply_chat_template", [&](chunkserve_error_t** err) {
    return chunkserve_apply_chat_template(engine, &role, &role, 1, 1, text, 16, &n, err);
  });
  expect("chunkserve_engine_eos_ids", [&](chunkserve_error_t** err) {
    return chunkserve_engine_eos_ids(engine, ids, 4, &n, err);
  });
}

TEST(CapiTextNoTokenizerTest, TheBuiltInTinyModelIsFailedPrecondition) {
  chunkserve_engine_options_t o = SmallEngineOptions();
  o.model_path = nullptr;
  o.tiny_model = 1;
  EnginePtr engine = CreateEngineOrDie(o);
  ASSERT_NE(engine, nullptr);
  ExpectEveryTextCallFails(engine.get(), CHUNKSERVE_STATUS_FAILED_PRECONDITION,
                           "built-in tiny model");
}

TEST(CapiTextNoTokenizerTest, AModelFolderWithoutTokenizerJsonIsNotFound) {
  EnginePtr engine = CreateEngineOrDie(SmallEngineOptions());  // config.json + safetensors only
  ASSERT_NE(engine, nullptr);
  ExpectEveryTextCallFails(engine.get(), CHUNKSERVE_STATUS_NOT_FOUND, "tokenizer.json");
}

}  // namespace
// gguf_dtype reaches the loader: the same GGUF dequantized to bf16 is another set of weights (its
// fingerprint differs, so its chunks never mix with the f32 engine's) and still serves text.
TEST_F(CapiTextTest, GgufDtypeBf16LoadsTheModelInBf16) {
  chunkserve_engine_options_t o = GgufOptions();
  o.gguf_dtype = CHUNKSERVE_DTYPE_BF16;
  EnginePtr bf16 = CreateEngineOrDie(o);
  chunkserve_engine_info_t f32_info, bf16_info;
  f32_info.struct_size = bf16_info.struct_size = sizeof(chunkserve_engine_info_t);
  ASSERT_EQ(chunkserve_engine_info(engine_, &f32_info, nullptr), CHUNKSERVE_STATUS_OK);
  ASSERT_EQ(chunkserve_engine_info(bf16.get(), &bf16_info, nullptr), CHUNKSERVE_STATUS_OK);
  EXPECT_NE(f32_info.model_fingerprint, bf16_info.model_fingerprint);
  EXPECT_EQ(f32_info.vocab_size, bf16_info.vocab_size);
}

}  // namespace chunkserve::capi
