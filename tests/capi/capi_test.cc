// Every function of the C ABI through libchunkserve.so, happy paths and error paths: null
// pointers, wrong struct_size, bad token ids, cancel after finish, destroying streams with
// requests in flight, destroying the engine under live streams, callbacks, concurrency.
//
// Only the public header is used to drive the library; runtime/model is linked just to write the
// tiny model once per process, so that each test's engine loads it instead of regenerating it.
#include <chunkserve/chunkserve.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstring>
#include <memory>
#include <mutex>
#include <ostream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tests/capi/capi_testing.h"
#include "tests/testing/gpu.h"

namespace chunkserve::capi {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;

// ---- Versions, names, errors --------------------------------------------------------------------

TEST(CapiVersionTest, AbiVersionMatchesHeader) {
  EXPECT_EQ(chunkserve_abi_version(), CHUNKSERVE_ABI_VERSION);
}

TEST(CapiVersionTest, VersionStringMatchesHeaderMacros) {
  const std::string expected = std::to_string(CHUNKSERVE_VERSION_MAJOR) + "." +
                               std::to_string(CHUNKSERVE_VERSION_MINOR) + "." +
                               std::to_string(CHUNKSERVE_VERSION_PATCH);
  EXPECT_EQ(std::string(chunkserve_version()), expected);
}

TEST(CapiVersionTest, StatusNamesAreStable) {
  EXPECT_STREQ(chunkserve_status_name(CHUNKSERVE_STATUS_OK), "OK");
  EXPECT_STREQ(chunkserve_status_name(CHUNKSERVE_STATUS_INVALID_ARGUMENT), "INVALID_ARGUMENT");
  EXPECT_STREQ(chunkserve_status_name(CHUNKSERVE_STATUS_ABORTED), "ABORTED");
  EXPECT_STREQ(chunkserve_status_name(CHUNKSERVE_STATUS_UNAUTHENTICATED), "UNAUTHENTICATED");
  EXPECT_STREQ(chunkserve_status_name(-1), "UNKNOWN");
  EXPECT_STREQ(chunkserve_status_name(15), "UNKNOWN");
}

TEST(CapiVersionTest, FinishReasonNamesAreStable) {
  EXPECT_STREQ(chunkserve_finish_reason_name(CHUNKSERVE_FINISH_STOP_TOKEN), "stop");
  EXPECT_STREQ(chunkserve_finish_reason_name(CHUNKSERVE_FINISH_LENGTH), "length");
  EXPECT_STREQ(chunkserve_finish_reason_name(CHUNKSERVE_FINISH_CANCELLED), "cancelled");
  EXPECT_STREQ(chunkserve_finish_reason_name(CHUNKSERVE_FINISH_DEADLINE), "deadline");
  EXPECT_STREQ(chunkserve_finish_reason_name(CHUNKSERVE_FINISH_ERROR), "error");
  EXPECT_STREQ(chunkserve_finish_reason_name(CHUNKSERVE_FINISH_UNAVAILABLE), "unavailable");
  EXPECT_STREQ(chunkserve_finish_reason_name(99), "unknown");
}

TEST(CapiErrorTest, AccessorsAcceptNull) {
  EXPECT_EQ(chunkserve_error_code(nullptr), CHUNKSERVE_STATUS_OK);
  EXPECT_STREQ(chunkserve_error_message(nullptr), "");
  chunkserve_error_free(nullptr);
}

TEST(CapiErrorTest, FailureReturnsCodeAndErrorObject) {
  chunkserve_error_t* raw = nullptr;
  EXPECT_EQ(chunkserve_engine_create(nullptr, nullptr, &raw), CHUNKSERVE_STATUS_INVALID_ARGUMENT);
  ErrorPtr error(raw);
  ASSERT_NE(error, nullptr);
  EXPECT_EQ(chunkserve_error_code(error.get()), CHUNKSERVE_STATUS_INVALID_ARGUMENT);
  EXPECT_THAT(chunkserve_error_message(error.get()), HasSubstr("out_engine"));
}

TEST(CapiErrorTest, SuccessSetsOutErrorToNull) {
  chunkserve_engine_options_t options;
  chunkserve_error_t* raw = reinterpret_cast<chunkserve_error_t*>(0x1);  // must be overwritten
  EXPECT_EQ(chunkserve_engine_options_init(&options, sizeof(options), &raw), CHUNKSERVE_STATUS_OK);
  EXPECT_EQ(raw, nullptr);
}

TEST(CapiErrorTest, NullOutErrorIsAllowedOnFailure) {
  EXPECT_EQ(chunkserve_engine_options_init(nullptr, sizeof(chunkserve_engine_options_t), nullptr),
            CHUNKSERVE_STATUS_INVALID_ARGUMENT);
}

TEST(CapiErrorTest, DestroyNullIsNoOp) {
  chunkserve_engine_destroy(nullptr);
  chunkserve_stream_destroy(nullptr);
  EXPECT_EQ(chunkserve_stream_id(nullptr), 0u);
}

// ---- Options
// ---------------------------------------------------------------------------------------

TEST(CapiOptionsTest, EngineOptionsInitFillsDefaults) {
  chunkserve_engine_options_t o;
  std::memset(&o, 0xAB, sizeof(o));
  ASSERT_EQ(chunkserve_engine_options_init(&o, sizeof(o), nullptr), CHUNKSERVE_STATUS_OK);
  EXPECT_EQ(o.struct_size, sizeof(o));
  EXPECT_EQ(o.backend, CHUNKSERVE_BACKEND_CPU);
  EXPECT_EQ(o.model_path, nullptr);
  EXPECT_EQ(o.kv_cache_bytes, 256u << 20);
  EXPECT_EQ(o.chunk_size, 64);
  EXPECT_EQ(o.kv_dtype, CHUNKSERVE_DTYPE_F32);
  EXPECT_EQ(o.enable_prefix_sharing, 1);
  EXPECT_EQ(o.num_threads, 0);
  EXPECT_EQ(o.max_batch_size, 64);
  EXPECT_EQ(o.prefill_token_budget, 512);
  EXPECT_EQ(o.max_queued_requests, 4096);
  EXPECT_EQ(o.reserved0, 0);
  EXPECT_EQ(o.tiny_model, 0);
  EXPECT_EQ(o.gguf_dtype, CHUNKSERVE_DTYPE_F32);
}

TEST(CapiOptionsTest, RequestOptionsInitFillsDefaults) {
  chunkserve_request_options_t o;
  std::memset(&o, 0xAB, sizeof(o));
  ASSERT_EQ(chunkserve_request_options_init(&o, sizeof(o), nullptr), CHUNKSERVE_STATUS_OK);
  EXPECT_EQ(o.struct_size, sizeof(o));
  EXPECT_EQ(o.max_new_tokens, 16);
  EXPECT_EQ(o.prompt_tokens, nullptr);
  EXPECT_EQ(o.num_prompt_tokens, 0u);
  EXPECT_EQ(o.stop_tokens, nullptr);
  EXPECT_EQ(o.num_stop_tokens, 0u);
  EXPECT_EQ(o.temperature, 0.0f);
  EXPECT_EQ(o.top_k, 0);
  EXPECT_EQ(o.top_p, 1.0f);
  EXPECT_EQ(o.priority, 0);
  EXPECT_EQ(o.seed, 0u);
  EXPECT_EQ(o.deadline_ms, 0u);
  EXPECT_EQ(o.logprobs, -1);
  EXPECT_EQ(o.reserved0, 0);
}

TEST(CapiOptionsTest, InitRejectsNull) {
  EXPECT_EQ(chunkserve_engine_options_init(nullptr, sizeof(chunkserve_engine_options_t), nullptr),
            CHUNKSERVE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(chunkserve_request_options_init(nullptr, sizeof(chunkserve_request_options_t), nullptr),
            CHUNKSERVE_STATUS_INVALID_ARGUMENT);
}

TEST(CapiOptionsTest, InitRejectsStructSizeOutsideKnownVersions) {
  chunkserve_engine_options_t o;
  // 55: one byte short of version 1 (56 bytes), the smallest size ever published.
  for (uint32_t size : {0u, 4u, 55u, 4097u}) {
    ErrorPtr error;
    EXPECT_EQ(chunkserve_engine_options_init(&o, size, Out(error)),
              CHUNKSERVE_STATUS_INVALID_ARGUMENT)
        << size;
    EXPECT_THAT(chunkserve_error_message(error.get()), HasSubstr("struct_size")) << size;
  }
}

TEST(CapiOptionsTest, InitWritesOnlyStructSizeBytes) {
  // A caller built against a smaller (older) struct passes its own size; nothing past it is
  // written. Version 1 is the only version, so check the exact-size case against a guard area.
  struct Padded {
    chunkserve_request_options_t options;
    unsigned char guard[32];
  } p;
  std::memset(&p, 0x5A, sizeof(p));
  ASSERT_EQ(chunkserve_request_options_init(&p.options, sizeof(p.options), nullptr),
            CHUNKSERVE_STATUS_OK);
  for (unsigned char c : p.guard) ASSERT_EQ(c, 0x5A);
}

// chunkserve_set_log_callback routes the library's log messages to the embedder (here: the
// engine's start-up line), and NULL routes them back to stderr.
struct LogRecorder {
  std::mutex mu;
  std::vector<std::pair<int32_t, std::string>> messages;
  static void OnLog(int32_t severity, const char* message, void* user) {
    auto* self = static_cast<LogRecorder*>(user);
    std::lock_guard<std::mutex> lock(self->mu);
    self->messages.emplace_back(severity, message);
  }
  bool Saw(const std::string& text) {
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& [severity, message] : messages) {
      if (message.find(text) != std::string::npos) return true;
    }
    return false;
  }
};

TEST(CapiLoggingTest, ACallbackReceivesTheLibrarysLogMessages) {
  LogRecorder recorder;
  ASSERT_EQ(chunkserve_set_log_callback(&LogRecorder::OnLog, &recorder, nullptr),
            CHUNKSERVE_STATUS_OK);
  {
    EnginePtr engine = CreateEngineOrDie(SmallEngineOptions());
  }
  ASSERT_EQ(chunkserve_set_log_callback(nullptr, nullptr, nullptr), CHUNKSERVE_STATUS_OK);
  EXPECT_TRUE(recorder.Saw("engine ready: "));
  {
    std::lock_guard<std::mutex> lock(recorder.mu);
    ASSERT_FALSE(recorder.messages.empty());
    EXPECT_EQ(recorder.messages[0].first, CHUNKSERVE_LOG_INFO);
    EXPECT_THAT(recorder.messages[0].second, ::testing::MatchesRegex("[a-z_]+\\.cc:[0-9]+: .*"));
  }
  // Back on stderr: the recorder hears nothing more.
  const size_t before = recorder.messages.size();
  {
    EnginePtr engine = CreateEngineOrDie(SmallEngineOptions());
  }
  EXPECT_EQ(recorder.messages.size(), before);
}

// Every error names the C function it comes from (not a lambda's "operator()").
TEST(CapiErrorTest, MessagesNameTheirCFunction) {
  EnginePtr engine = CreateEngineOrDie(SmallEngineOptions());
  const auto message_of = [](auto call) {
    ErrorPtr error;
    call(Out(error));
    return std::string(error ? chunkserve_error_message(error.get()) : "(no error)");
  };
  chunkserve_engine_options_t eo;
  chunkserve_request_options_t ro;
  chunkserve_client_options_t co;
  chunkserve_engine_stats_t stats{};
  chunkserve_engine_info_t info{};
  chunkserve_stream_event_t ev{};
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"chunkserve_engine_options_init",
       message_of([&](chunkserve_error_t** e) { chunkserve_engine_options_init(&eo, 1, e); })},
      {"chunkserve_engine_create", message_of([&](chunkserve_error_t** e) {
         chunkserve_engine_create(nullptr, nullptr, e);
       })},
      {"chunkserve_engine_shutdown", message_of([&](chunkserve_error_t** e) {
         chunkserve_engine_shutdown(nullptr, CHUNKSERVE_SHUTDOWN_ABORT, e);
       })},
      {"chunkserve_request_options_init",
       message_of([&](chunkserve_error_t** e) { chunkserve_request_options_init(&ro, 1, e); })},
      {"chunkserve_engine_submit", message_of([&](chunkserve_error_t** e) {
         chunkserve_engine_submit(engine.get(), nullptr, nullptr, e);
       })},
      {"chunkserve_engine_cancel",
       message_of([&](chunkserve_error_t** e) { chunkserve_engine_cancel(nullptr, 1, e); })},
      {"chunkserve_engine_stats",
       message_of([&](chunkserve_error_t** e) { chunkserve_engine_stats(nullptr, &stats, e); })},
      {"chunkserve_engine_info",
       message_of([&](chunkserve_error_t** e) { chunkserve_engine_info(nullptr, &info, e); })},
      {"chunkserve_stream_next",
       message_of([&](chunkserve_error_t** e) { chunkserve_stream_next(nullptr, 0, &ev, e); })},
      {"chunkserve_stream_set_callback", message_of([&](chunkserve_error_t** e) {
         chunkserve_stream_set_callback(nullptr, nullptr, nullptr, e);
       })},
      {"chunkserve_stream_cancel",
       message_of([&](chunkserve_error_t** e) { chunkserve_stream_cancel(nullptr, e); })},
      {"chunkserve_client_options_init",
       message_of([&](chunkserve_error_t** e) { chunkserve_client_options_init(&co, 1, e); })},
      {"chunkserve_client_create",
       message_of([&](chunkserve_error_t** e) { chunkserve_client_create(nullptr, nullptr, e); })},
      {"chunkserve_client_submit", message_of([&](chunkserve_error_t** e) {
         chunkserve_client_submit(nullptr, nullptr, nullptr, e);
       })},
      {"chunkserve_client_cancel",
       message_of([&](chunkserve_error_t** e) { chunkserve_client_cancel(nullptr, 1, e); })},
  };
  for (const auto& [function, message] : cases) {
    EXPECT_THAT(message, ::testing::StartsWith(function + ": ")) << function;
  }
}

// num_threads above the CPUs this process may use is refused at once (it used to be accepted:
// 256 threads on 2 CPUs made a 40-token request take 11 s).
TEST(CapiEngineCreateTest, RejectsMoreThreadsThanCpus) {
  chunkserve_engine_options_t o = SmallEngineOptions();
  for (int32_t threads : {-1, 100000, 4096}) {
    o.num_threads = threads;
    chunkserve_engine_t* raw = nullptr;
    ErrorPtr error;
    EXPECT_EQ(chunkserve_engine_create(&o, &raw, Out(error)), CHUNKSERVE_STATUS_INVALID_ARGUMENT)
        << threads;
    EXPECT_THAT(chunkserve_error_message(error.get()), HasSubstr("num_threads")) << threads;
    EXPECT_EQ(raw, nullptr);
  }
}

// A program built against a newer header passes bigger structs: their extra (newer) fields are
// zero unless it uses them. This library serves it, zeroes what it writes past its own struct,
// and refuses a newer field that is set rather than ignoring it.
template <typename T>
struct Newer {
  T known;
  unsigned char extra[24];
};

TEST(CapiOptionsTest, ANewerCallersBiggerStructsWorkWhileTheirNewFieldsAreZero) {
  constexpr uint32_t kNewerEngineOptions = sizeof(Newer<chunkserve_engine_options_t>);
  Newer<chunkserve_engine_options_t> o;
  std::memset(&o, 0x5A, sizeof(o));
  ASSERT_EQ(chunkserve_engine_options_init(&o.known, kNewerEngineOptions, nullptr),
            CHUNKSERVE_STATUS_OK);
  EXPECT_EQ(o.known.struct_size, kNewerEngineOptions);
  for (unsigned char c : o.extra) ASSERT_EQ(c, 0);  // the newer fields get their zero defaults
  const chunkserve_engine_options_t small = SmallEngineOptions();
  std::memcpy(&o.known.backend, &small.backend,
              sizeof(small) - offsetof(chunkserve_engine_options_t, backend));
  chunkserve_engine_t* raw = nullptr;
  ErrorPtr error;
  ASSERT_EQ(chunkserve_engine_create(&o.known, &raw, Out(error)), CHUNKSERVE_STATUS_OK)
      << chunkserve_error_message(error.get());
  EnginePtr engine(raw);

  Newer<chunkserve_request_options_t> r{};
  ASSERT_EQ(chunkserve_request_options_init(&r.known, sizeof(r), nullptr), CHUNKSERVE_STATUS_OK);
  const std::vector<int32_t> prompt = Prompt(4, 0);
  r.known.prompt_tokens = prompt.data();
  r.known.num_prompt_tokens = static_cast<int32_t>(prompt.size());
  r.known.max_new_tokens = 2;
  chunkserve_stream_t* stream = nullptr;
  ASSERT_EQ(chunkserve_engine_submit(engine.get(), &r.known, &stream, Out(error)),
            CHUNKSERVE_STATUS_OK)
      << chunkserve_error_message(error.get());
  StreamPtr s(stream);
  Newer<chunkserve_stream_event_t> e;
  std::memset(&e, 0x5A, sizeof(e));
  e.known.struct_size = sizeof(e);
  ASSERT_EQ(chunkserve_stream_next(s.get(), 60000, &e.known, nullptr), CHUNKSERVE_STATUS_OK);
  EXPECT_EQ(e.known.struct_size, sizeof(e));
  for (unsigned char c : e.extra) ASSERT_EQ(c, 0);
  Newer<chunkserve_engine_stats_t> stats;
  std::memset(&stats, 0x5A, sizeof(stats));
  stats.known.struct_size = sizeof(stats);
  ASSERT_EQ(chunkserve_engine_stats(engine.get(), &stats.known, nullptr), CHUNKSERVE_STATUS_OK);
  for (unsigned char c : stats.extra) ASSERT_EQ(c, 0);

  // A newer field that is set: refused, saying why.
  r.extra[3] = 1;
  stream = nullptr;
  EXPECT_EQ(chunkserve_engine_submit(engine.get(), &r.known, &stream, Out(error)),
            CHUNKSERVE_STATUS_INVALID_ARGUMENT);
  EXPECT_THAT(chunkserve_error_message(error.get()), HasSubstr("does not know"));
  EXPECT_EQ(stream, nullptr);
}

// ---- Engine creation
// ------------------------------------------------------------------------------

TEST(CapiEngineCreateTest, CreatesOnTheBuiltInTinyModelAndReportsIt) {
  chunkserve_engine_options_t o = SmallEngineOptions();
  o.model_path = nullptr;
  o.tiny_model = 1;  // the built-in model, written to a temporary directory
  EnginePtr engine = CreateEngineOrDie(o);
  chunkserve_engine_info_t info;
  info.struct_size = sizeof(info);
  ASSERT_EQ(chunkserve_engine_info(engine.get(), &info, nullptr), CHUNKSERVE_STATUS_OK);
  EXPECT_EQ(info.vocab_size, 1024);
  EXPECT_EQ(info.chunk_size, 16);
  EXPECT_GT(info.max_context, 1000);
  EXPECT_NE(info.model_fingerprint, 0u);
}

// Random weights only when asked for: version 2 options without a model are refused, and
// tiny_model with a model_path too; a version 1 caller (56 bytes) keeps its meaning (NULL model_path
// = the tiny model), and so does a NULL options pointer.
TEST(CapiEngineCreateTest, TheTinyModelOnlyWhenAskedFor) {
  chunkserve_engine_options_t o = SmallEngineOptions();
  o.model_path = nullptr;
  chunkserve_engine_t* raw = nullptr;
  ErrorPtr error;
  EXPECT_EQ(chunkserve_engine_create(&o, &raw, Out(error)), CHUNKSERVE_STATUS_INVALID_ARGUMENT);
  EXPECT_THAT(chunkserve_error_message(error.get()), HasSubstr("no model"));
  EXPECT_EQ(raw, nullptr);
  o = SmallEngineOptions();
  o.tiny_model = 1;  // and a model_path
  EXPECT_EQ(chunkserve_engine_create(&o, &raw, Out(error)), CHUNKSERVE_STATUS_INVALID_ARGUMENT);
  EXPECT_THAT(chunkserve_error_message(error.get()), HasSubstr("exclude"));
  o = SmallEngineOptions();
  o.model_path = "";
  o.tiny_model = 2;
  EXPECT_EQ(chunkserve_engine_create(&o, &raw, Out(error)), CHUNKSERVE_STATUS_INVALID_ARGUMENT);
  EXPECT_THAT(chunkserve_error_message(error.get()), HasSubstr("tiny_model must be 0 or 1"));

  o = SmallEngineOptions();
  o.model_path = nullptr;
  o.struct_size = 56;  // a caller built against version 1
  ASSERT_EQ(chunkserve_engine_create(&o, &raw, Out(error)), CHUNKSERVE_STATUS_OK)
      << chunkserve_error_message(error.get());
  EnginePtr v1(raw);
  raw = nullptr;
  ASSERT_EQ(chunkserve_engine_create(nullptr, &raw, Out(error)), CHUNKSERVE_STATUS_OK)
      << chunkserve_error_message(error.get());
  EnginePtr defaults(raw);
}

TEST(CapiEngineCreateTest, RejectsNullOutEngine) {
  const chunkserve_engine_options_t o = SmallEngineOptions();
  EXPECT_EQ(chunkserve_engine_create(&o, nullptr, nullptr), CHUNKSERVE_STATUS_INVALID_ARGUMENT);
}

TEST(CapiEngineCreateTest, RejectsWrongStructSizeAndClearsOutEngine) {
  for (uint32_t size : {0u, 8u, 4097u}) {
    chunkserve_engine_options_t o = SmallEngineOptions();
    o.struct_size = size;
    chunkserve_engine_t* engine = reinterpret_cast<chunkserve_engine_t*>(0x1);
    ErrorPtr error;
    EXPECT_EQ(chunkserve_engine_create(&o, &engine, Out(error)),
              CHUNKSERVE_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(engine, nullptr);
    EXPECT_THAT(chunkserve_error_message(error.get()), HasSubstr("struct_size"));
  }
}

TEST(CapiEngineCreateTest, RejectsUnknownEnumValues) {
  const auto expect_invalid = [](chunkserve_engine_options_t o, const char* what) {
    chunkserve_engine_t* engine = nullptr;
    ErrorPtr error;
    EXPECT_EQ(chunkserve_engine_create(&o, &engine, Out(error)), CHUNKSERVE_STATUS_INVALID_ARGUMENT)
        << what;
    EXPECT_THAT(chunkserve_error_message(error.get()), HasSubstr(what));
    chunkserve_engine_destroy(engine);
  };
  chunkserve_engine_options_t o = SmallEngineOptions();
  o.backend = 7;
  expect_invalid(o, "backend");
  o = SmallEngineOptions();
  o.kv_dtype = 3;
  expect_invalid(o, "kv_dtype");
  o = SmallEngineOptions();
  o.enable_prefix_sharing = 2;
  expect_invalid(o, "enable_prefix_sharing");
  o = SmallEngineOptions();
  o.num_threads = -1;
  expect_invalid(o, "num_threads");
  o = SmallEngineOptions();
  o.reserved0 = 1;
  expect_invalid(o, "reserved0");
  o = SmallEngineOptions();
  o.gguf_dtype = 3;
  expect_invalid(o, "gguf_dtype");
}

TEST(CapiEngineCreateTest, RejectsOutOfRangeValuesFromTheEngine) {
  chunkserve_engine_options_t o = SmallEngineOptions();
  o.chunk_size = 8;
  ErrorPtr error;
  chunkserve_engine_t* engine = nullptr;
  EXPECT_EQ(chunkserve_engine_create(&o, &engine, Out(error)), CHUNKSERVE_STATUS_INVALID_ARGUMENT);
  EXPECT_THAT(chunkserve_error_message(error.get()), HasSubstr("chunk_size"));
  o = SmallEngineOptions();
  o.kv_cache_bytes = 1024;  // fewer than two chunks
  EXPECT_EQ(chunkserve_engine_create(&o, &engine, Out(error)), CHUNKSERVE_STATUS_INVALID_ARGUMENT);
  EXPECT_THAT(chunkserve_error_message(error.get()), HasSubstr("kv_cache_bytes"));
  EXPECT_EQ(engine, nullptr);
}

TEST(CapiEngineCreateTest, ZeroMeansDefaultForSizes) {
  chunkserve_engine_options_t o = SmallEngineOptions();
  o.chunk_size = 0;
  o.max_batch_size = 0;
  o.max_queued_requests = 0;
  EnginePtr engine = CreateEngineOrDie(o);
  chunkserve_engine_info_t info;
  info.struct_size = sizeof(info);
  ASSERT_EQ(chunkserve_engine_info(engine.get(), &info, nullptr), CHUNKSERVE_STATUS_OK);
  EXPECT_EQ(info.chunk_size, 64);
}

TEST(CapiEngineCreateTest, MissingModelDirectoryFails) {
  chunkserve_engine_options_t o = SmallEngineOptions();
  o.model_path = "/nonexistent/chunkserve-model";
  ErrorPtr error;
  chunkserve_engine_t* engine = nullptr;
  const chunkserve_status_t st = chunkserve_engine_create(&o, &engine, Out(error));
  EXPECT_NE(st, CHUNKSERVE_STATUS_OK);
  EXPECT_EQ(chunkserve_error_code(error.get()), st);
  EXPECT_THAT(chunkserve_error_message(error.get()), HasSubstr("nonexistent"));
  EXPECT_EQ(engine, nullptr);
}

TEST(CapiEngineCreateTest, CudaBackendIsUnimplementedOrRefusedInThisBuild) {
  chunkserve_engine_options_t o = SmallEngineOptions();
  o.backend = CHUNKSERVE_BACKEND_CUDA;
  chunkserve_engine_t* engine = nullptr;
#if defined(CHUNKSERVE_HAVE_CUDA)
  // A CUDA build has the CUDA backend, which refuses f32 KV (the default) before it looks for a
  // device; with f16 KV and no device it is UNAVAILABLE.
  EXPECT_EQ(chunkserve_engine_create(&o, &engine, nullptr), CHUNKSERVE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(engine, nullptr);
  if (::chunkserve::testing::CudaDeviceCount() == 0) {
    o.kv_dtype = CHUNKSERVE_DTYPE_F16;
    EXPECT_EQ(chunkserve_engine_create(&o, &engine, nullptr), CHUNKSERVE_STATUS_UNAVAILABLE);
    EXPECT_EQ(engine, nullptr);
  }
#else
  EXPECT_EQ(chunkserve_engine_create(&o, &engine, nullptr), CHUNKSERVE_STATUS_UNIMPLEMENTED);
  EXPECT_EQ(engine, nullptr);
#endif
}

// ---- Engine queries
// ---------------------------------------------------------------------------------

TEST(CapiEngineTest, InfoAndStatsRejectNullAndBadStructSize) {
  EnginePtr engine = CreateEngineOrDie(SmallEngineOptions());
  chunkserve_engine_info_t info;
  info.struct_size = sizeof(info);
  EXPECT_EQ(chunkserve_engine_info(nullptr, &info, nullptr), CHUNKSERVE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(chunkserve_engine_info(engine.get(), nullptr, nullptr),
            CHUNKSERVE_STATUS_INVALID_ARGUMENT);
  info.struct_size = 4;
  EXPECT_EQ(chunkserve_engine_info(engine.get(), &info, nullptr),
            CHUNKSERVE_STATUS_INVALID_ARGUMENT);
  chunkserve_engine_stats_t stats;
  stats.struct_size = sizeof(stats);
  EXPECT_EQ(chunkserve_engine_stats(nullptr, &stats, nullptr), CHUNKSERVE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(chunkserve_engine_stats(engine.get(), nullptr, nullptr),
            CHUNKSERVE_STATUS_INVALID_ARGUMENT);
  stats.struct_size = 0;
  EXPECT_EQ(chunkserve_engine_stats(engine.get(), &stats, nullptr),
            CHUNKSERVE_STATUS_INVALID_ARGUMENT);
  stats.struct_size = 4097;
  EXPECT_EQ(chunkserve_engine_stats(engine.get(), &stats, nullptr),
            CHUNKSERVE_STATUS_INVALID_ARGUMENT);
}

TEST(CapiEngineTest, StatsCountRequestsAndTokens) {
  EnginePtr engine = CreateEngineOrDie(SmallEngineOptions());
  for (int i = 0; i < 3; ++i) {
    StreamPtr s = SubmitOrDie(engine.get(), Prompt(20, i), /*max_new_tokens=*/4);
    EXPECT_EQ(Drain(s.get()).finish.finish_reason, CHUNKSERVE_FINISH_LENGTH);
  }
  chunkserve_engine_stats_t stats;
  stats.struct_size = sizeof(stats);
  ASSERT_EQ(chunkserve_engine_stats(engine.get(), &stats, nullptr), CHUNKSERVE_STATUS_OK);
  EXPECT_EQ(stats.struct_size, sizeof(stats));
  EXPECT_EQ(stats.requests_submitted, 3u);
  EXPECT_EQ(stats.requests_finished, 3u);
  EXPECT_EQ(stats.generated_tokens, 12u);
  EXPECT_EQ(stats.prompt_tokens, 60u);
  EXPECT_GT(stats.kv_bytes_capacity, 0u);
  EXPECT_LE(stats.kv_bytes_capacity, 8u << 20);
  EXPECT_GT(stats.steps, 0u);
  EXPECT_EQ(stats.running, 0);
}

// ---- Submit
// -----------------------------------------------------------------------------------------

TEST(CapiSubmitTest, StreamsTokensThenOneFinishedEvent) {
  EnginePtr engine = CreateEngineOrDie(SmallEngineOptions());
  const std::vector<int32_t> prompt = Prompt(24, 1);
  StreamPtr s = SubmitOrDie(engine.get(), prompt, 7);
  const Outcome out = Drain(s.get());
  EXPECT_EQ(out.tokens.size(), 7u);
  for (int32_t t : out.tokens) EXPECT_TRUE(t >= 0 && t < 1024) << t;
  EXPECT_EQ(out.finish.kind, CHUNKSERVE_EVENT_FINISHED);
  EXPECT_EQ(out.finish.finish_reason, CHUNKSERVE_FINISH_LENGTH);
  EXPECT_EQ(out.finish.status, CHUNKSERVE_STATUS_OK);
  EXPECT_EQ(out.finish.error_message, nullptr);
  EXPECT_EQ(out.finish.prompt_tokens, 24);
  EXPECT_EQ(out.finish.generated_tokens, 7);
}

// Logprobs in the events of a request that asks for them; none in a version 1 caller's (48-byte)
// event, and none when not asked.
TEST(CapiSubmitTest, TokenEventsCarryLogprobsWhenAsked) {
  EnginePtr engine = CreateEngineOrDie(SmallEngineOptions());
  const std::vector<int32_t> prompt = Prompt(20, 6);
  chunkserve_request_options_t r = RequestFor(prompt, 4);
  r.logprobs = CHUNKSERVE_MAX_TOP_LOGPROBS;
  StreamPtr s = SubmitRequestOrDie(engine.get(), r);
  for (int i = 0; i < 4; ++i) {
    chunkserve_stream_event_t e;
    std::memset(&e, 0x5A, sizeof(e));
    e.struct_size = sizeof(e);
    ASSERT_EQ(chunkserve_stream_next(s.get(), 60000, &e, nullptr), CHUNKSERVE_STATUS_OK);
    ASSERT_EQ(e.kind, CHUNKSERVE_EVENT_TOKEN);
    ASSERT_EQ(e.num_top_logprobs, CHUNKSERVE_MAX_TOP_LOGPROBS);
    EXPECT_EQ(e.top_tokens[0], e.token);  // greedy: the most likely token
    EXPECT_EQ(e.top_logprobs[0], e.logprob);
    EXPECT_LE(e.logprob, 0.0f);
    for (int k = 1; k < CHUNKSERVE_MAX_TOP_LOGPROBS; ++k) {
      EXPECT_LE(e.top_logprobs[k], e.top_logprobs[k - 1]);
      EXPECT_NE(e.top_tokens[k], e.top_tokens[k - 1]);
    }
  }

  r.logprobs = 2;
  StreamPtr old = SubmitRequestOrDie(engine.get(), r);
  chunkserve_stream_event_t v1;
  std::memset(&v1, 0x5A, sizeof(v1));
  v1.struct_size = 48;  // version 1
  ASSERT_EQ(chunkserve_stream_next(old.get(), 60000, &v1, nullptr), CHUNKSERVE_STATUS_OK);
  EXPECT_EQ(v1.kind, CHUNKSERVE_EVENT_TOKEN);
  EXPECT_EQ(v1.num_top_logprobs, 0x5A5A5A5A);  // past the caller's struct: untouched

  r.logprobs = -1;
  StreamPtr none = SubmitRequestOrDie(engine.get(), r);
  chunkserve_stream_event_t e{};
  e.struct_size = sizeof(e);
  ASSERT_EQ(chunkserve_stream_next(none.get(), 60000, &e, nullptr), CHUNKSERVE_STATUS_OK);
  EXPECT_EQ(e.num_top_logprobs, -1);
}

TEST(CapiSubmitTest, GreedyOutputsAreDeterministic) {
  EnginePtr engine = CreateEngineOrDie(SmallEngineOptions());
  StreamPtr a = SubmitOrDie(engine.get(), Prompt(30, 2), 6);
  StreamPtr b = SubmitOrDie(engine.get(), Prompt(30, 2), 6);
  EXPECT_EQ(Drain(a.get()).tokens, Drain(b.get()).tokens);
}

TEST(CapiSubmitTest, SeededSamplingIsReproducible) {
  EnginePtr engine = CreateEngineOrDie(SmallEngineOptions());
  const std::vector<int32_t> prompt = Prompt(12, 3);
  const auto sample = [&](uint64_t seed) {
    chunkserve_request_options_t r = RequestFor(prompt, 8);
    r.temperature = 1.0f;
    r.top_k = 50;
    r.top_p = 0.9f;
    r.seed = seed;
    StreamPtr s = SubmitRequestOrDie(engine.get(), r);
    return Drain(s.get()).tokens;
  };
  EXPECT_EQ(sample(7), sample(7));
}

TEST(CapiSubmitTest, SharedPrefixIsServedFromTheCache) {
  EnginePtr engine = CreateEngineOrDie(SmallEngineOptions());
  std::vector<int32_t> first = Prompt(64, 4);
  std::vector<int32_t> second = first;
  second.push_back(77);
  second.push_back(78);
  StreamPtr a = SubmitOrDie(engine.get(), first, 2);
  ASSERT_EQ(Drain(a.get()).finish.finish_reason, CHUNKSERVE_FINISH_LENGTH);
  StreamPtr b = SubmitOrDie(engine.get(), second, 2);
  const Outcome out = Drain(b.get());
  EXPECT_GE(out.finish.cached_tokens, 48);  // at least the first three full 16-token chunks
  chunkserve_engine_stats_t stats;
  stats.struct_size = sizeof(stats);
  ASSERT_EQ(chunkserve_engine_stats(engine.get(), &stats, nullptr), CHUNKSERVE_STATUS_OK);
  EXPECT_GE(stats.prefix_hit_tokens, 48u);
}

TEST(CapiSubmitTest, StopTokenEndsTheRequest) {
  EnginePtr engine = CreateEngineOrDie(SmallEngineOptions());
  const std::vector<int32_t> prompt = Prompt(16, 5);
  StreamPtr probe = SubmitOrDie(engine.get(), prompt, 3);
  const Outcome greedy = Drain(probe.get());
  ASSERT_EQ(greedy.tokens.size(), 3u);
  chunkserve_request_options_t r = RequestFor(prompt, 50);
  const int32_t stop = greedy.tokens[0];
  r.stop_tokens = &stop;
  r.num_stop_tokens = 1;
  StreamPtr s = SubmitRequestOrDie(engine.get(), r);
  const Outcome out = Drain(s.get());
  EXPECT_EQ(out.finish.finish_reason, CHUNKSERVE_FINISH_STOP_TOKEN);
  EXPECT_EQ(out.tokens, std::vector<int32_t>{stop});
}

TEST(CapiSubmitTest, DeadlineEndsTheRequest) {
  EnginePtr engine = CreateEngineOrDie(SmallEngineOptions());
  const std::vector<int32_t> prompt = Prompt(8, 6);
  chunkserve_request_options_t r = RequestFor(prompt, 1000);
  r.deadline_ms = 30;
  StreamPtr s = SubmitRequestOrDie(engine.get(), r);
  const Outcome out = Drain(s.get());
  EXPECT_EQ(out.finish.finish_reason, CHUNKSERVE_FINISH_DEADLINE);
  EXPECT_LT(out.tokens.size(), 1000u);
}

TEST(CapiSubmitTest, RejectsNullArguments) {
  EnginePtr engine = CreateEngineOrDie(SmallEngineOptions());
  const std::vector<int32_t> prompt = Prompt(4, 0);
  const chunkserve_request_options_t r = RequestFor(prompt, 2);
  chunkserve_stream_t* stream = reinterpret_cast<chunkserve_stream_t*>(0x1);
  EXPECT_EQ(chunkserve_engine_submit(nullptr, &r, &stream, nullptr),
            CHUNKSERVE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(stream, nullptr);
  EXPECT_EQ(chunkserve_engine_submit(engine.get(), nullptr, &stream, nullptr),
            CHUNKSERVE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(chunkserve_engine_submit(engine.get(), &r, nullptr, nullptr),
            CHUNKSERVE_STATUS_INVALID_ARGUMENT);
  chunkserve_request_options_t no_tokens = r;
  no_tokens.prompt_tokens = nullptr;
  ErrorPtr error;
  EXPECT_EQ(chunkserve_engine_submit(engine.get(), &no_tokens, &stream, Out(error)),
            CHUNKSERVE_STATUS_INVALID_ARGUMENT);
  EXPECT_THAT(chunkserve_error_message(error.get()), HasSubstr("prompt_tokens"));
  chunkserve_request_options_t no_stops = r;
  no_stops.num_stop_tokens = 2;
  EXPECT_EQ(chunkserve_engine_submit(engine.get(), &no_stops, &stream, nullptr),
            CHUNKSERVE_STATUS_INVALID_ARGUMENT);
}

TEST(CapiSubmitTest, RejectsWrongStructSize) {
  EnginePtr engine = CreateEngineOrDie(SmallEngineOptions());
  const std::vector<int32_t> prompt = Prompt(4, 0);
  for (uint32_t size : {0u, 16u, 4097u}) {
    chunkserve_request_options_t r = RequestFor(prompt, 2);
    r.struct_size = size;
    chunkserve_stream_t* stream = nullptr;
    ErrorPtr error;
    EXPECT_EQ(chunkserve_engine_submit(engine.get(), &r, &stream, Out(error)),
              CHUNKSERVE_STATUS_INVALID_ARGUMENT);
    EXPECT_THAT(chunkserve_error_message(error.get()), HasSubstr("struct_size"));
    EXPECT_EQ(stream, nullptr);
  }
}

// One invalid request field at a time; each must be INVALID_ARGUMENT naming the problem.
struct BadRequestCase {
  const char* name;
  void (*mutate)(chunkserve_request_options_t* r, std::vector<int32_t>* prompt,
                 std::vector<int32_t>* stops);
  const char* message;
};

// Names the case in test output (and in ctest's test names) instead of dumping its bytes.
void PrintTo(const BadRequestCase& c, std::ostream* os) { *os << c.name; }

class CapiBadRequestTest : public ::testing::TestWithParam<BadRequestCase> {};

TEST_P(CapiBadRequestTest, IsInvalidArgument) {
  EnginePtr engine = CreateEngineOrDie(SmallEngineOptions());
  std::vector<int32_t> prompt = Prompt(6, 0);
  std::vector<int32_t> stops;
  chunkserve_request_options_t r = RequestFor(prompt, 4);
  GetParam().mutate(&r, &prompt, &stops);
  r.prompt_tokens = prompt.data();
  r.num_prompt_tokens = prompt.size();
  if (!stops.empty()) {
    r.stop_tokens = stops.data();
    r.num_stop_tokens = stops.size();
  }
  chunkserve_stream_t* stream = nullptr;
  ErrorPtr error;
  EXPECT_EQ(chunkserve_engine_submit(engine.get(), &r, &stream, Out(error)),
            CHUNKSERVE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(stream, nullptr);
  EXPECT_THAT(chunkserve_error_message(error.get()), HasSubstr(GetParam().message));
}

INSTANTIATE_TEST_SUITE_P(
    Fields, CapiBadRequestTest,
    ::testing::Values(
        BadRequestCase{"empty_prompt", [](auto*, std::vector<int32_t>* p, auto*) { p->clear(); },
                       "empty prompt"},
        BadRequestCase{"token_equal_to_vocab",
                       [](auto*, std::vector<int32_t>* p, auto*) { (*p)[2] = 1024; }, "1024"},
        BadRequestCase{"negative_token",
                       [](auto*, std::vector<int32_t>* p, auto*) { (*p)[0] = -5; }, "-5"},
        BadRequestCase{"stop_token_out_of_range",
                       [](auto*, auto*, std::vector<int32_t>* s) { s->push_back(5000); },
                       "stop token"},
        BadRequestCase{"zero_max_new_tokens",
                       [](chunkserve_request_options_t* r, auto*, auto*) { r->max_new_tokens = 0; },
                       "max_new_tokens"},
        BadRequestCase{"negative_temperature",
                       [](chunkserve_request_options_t* r, auto*, auto*) { r->temperature = -1; },
                       "temperature"},
        BadRequestCase{"negative_top_k",
                       [](chunkserve_request_options_t* r, auto*, auto*) { r->top_k = -1; },
                       "top_k"},
        BadRequestCase{"zero_top_p",
                       [](chunkserve_request_options_t* r, auto*, auto*) { r->top_p = 0; },
                       "top_p"},
        BadRequestCase{"prompt_fills_the_context",
                       [](auto*, std::vector<int32_t>* p, auto*) { p->assign(8192, 1); },
                       "context"},
        BadRequestCase{"logprobs_above_the_limit",
                       [](chunkserve_request_options_t* r, auto*, auto*) { r->logprobs = 21; },
                       "logprobs"},
        BadRequestCase{"logprobs_below_minus_one",
                       [](chunkserve_request_options_t* r, auto*, auto*) { r->logprobs = -2; },
                       "logprobs"},
        BadRequestCase{"reserved_field_set",
                       [](chunkserve_request_options_t* r, auto*, auto*) { r->reserved0 = 1; },
                       "reserved0"}),
    [](const ::testing::TestParamInfo<BadRequestCase>& info) { return info.param.name; });

TEST(CapiSubmitTest, RequestThatCanNeverFitIsResourceExhausted) {
  chunkserve_engine_options_t o = SmallEngineOptions();
  o.kv_cache_bytes = 4 * (64u << 10);  // four 16-token chunks of fp32 KV
  EnginePtr engine = CreateEngineOrDie(o);
  const std::vector<int32_t> prompt = Prompt(2000, 0);
  const chunkserve_request_options_t r = RequestFor(prompt, 4);
  chunkserve_stream_t* stream = nullptr;
  ErrorPtr error;
  EXPECT_EQ(chunkserve_engine_submit(engine.get(), &r, &stream, Out(error)),
            CHUNKSERVE_STATUS_RESOURCE_EXHAUSTED);
  EXPECT_THAT(chunkserve_error_message(error.get()), HasSubstr("never fit"));
}

TEST(CapiSubmitTest, SubmitAfterShutdownIsUnavailable) {
  EnginePtr engine = CreateEngineOrDie(SmallEngineOptions());
  ASSERT_EQ(chunkserve_engine_shutdown(engine.get(), CHUNKSERVE_SHUTDOWN_ABORT, nullptr),
            CHUNKSERVE_STATUS_OK);
  const std::vector<int32_t> prompt = Prompt(4, 0);
  const chunkserve_request_options_t r = RequestFor(prompt, 2);
  chunkserve_stream_t* stream = nullptr;
  EXPECT_EQ(chunkserve_engine_submit(engine.get(), &r, &stream, nullptr),
            CHUNKSERVE_STATUS_UNAVAILABLE);
  EXPECT_EQ(stream, nullptr);
}

// ---- Stream next
// --------------------------------------------------------------------------------------

TEST(CapiStreamTest, NextRejectsNullAndBadStructSize) {
  EnginePtr engine = CreateEngineOrDie(SmallEngineOptions());
  StreamPtr s = SubmitOrDie(engine.get(), Prompt(4, 0), 2);
  chunkserve_stream_event_t e;
  e.struct_size = sizeof(e);
  EXPECT_EQ(chunkserve_stream_next(nullptr, 0, &e, nullptr), CHUNKSERVE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(chunkserve_stream_next(s.get(), 0, nullptr, nullptr),
            CHUNKSERVE_STATUS_INVALID_ARGUMENT);
  e.struct_size = 0;
  EXPECT_EQ(chunkserve_stream_next(s.get(), 0, &e, nullptr), CHUNKSERVE_STATUS_INVALID_ARGUMENT);
  e.struct_size = 4097;
  EXPECT_EQ(chunkserve_stream_next(s.get(), 0, &e, nullptr), CHUNKSERVE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(Drain(s.get()).tokens.size(), 2u);  // nothing was consumed by the failed calls
}

TEST(CapiStreamTest, NextTimesOutWhileThePromptPrefills) {
  // 512 prompt tokens at 16 per step: dozens of steps before the first token.
  chunkserve_engine_options_t o = SmallEngineOptions();
  o.prefill_token_budget = 16;
  EnginePtr engine = CreateEngineOrDie(o);
  StreamPtr s = SubmitOrDie(engine.get(), Prompt(512, 0), 1);
  chunkserve_stream_event_t e;
  e.struct_size = sizeof(e);
  ErrorPtr error;
  EXPECT_EQ(chunkserve_stream_next(s.get(), 0, &e, Out(error)),
            CHUNKSERVE_STATUS_DEADLINE_EXCEEDED);
  EXPECT_EQ(chunkserve_error_code(error.get()), CHUNKSERVE_STATUS_DEADLINE_EXCEEDED);
  EXPECT_EQ(chunkserve_stream_next(s.get(), 5, &e, nullptr), CHUNKSERVE_STATUS_DEADLINE_EXCEEDED);
  EXPECT_EQ(Drain(s.get()).tokens.size(), 1u);
}

TEST(CapiStreamTest, NextAfterTheFinishedEventIsOutOfRange) {
  EnginePtr engine = CreateEngineOrDie(SmallEngineOptions());
  StreamPtr s = SubmitOrDie(engine.get(), Prompt(4, 0), 2);
  Drain(s.get());
  chunkserve_stream_event_t e;
  e.struct_size = sizeof(e);
  EXPECT_EQ(chunkserve_stream_next(s.get(), 0, &e, nullptr), CHUNKSERVE_STATUS_OUT_OF_RANGE);
  EXPECT_EQ(chunkserve_stream_next(s.get(), CHUNKSERVE_WAIT_FOREVER, &e, nullptr),
            CHUNKSERVE_STATUS_OUT_OF_RANGE);
}

TEST(CapiStreamTest, StreamIdsAreDistinctAndNonZero) {
  EnginePtr engine = CreateEngineOrDie(SmallEngineOptions());
  StreamPtr a = SubmitOrDie(engine.get(), Prompt(4, 0), 1);
  StreamPtr b = SubmitOrDie(engine.get(), Prompt(4, 0), 1);
  EXPECT_NE(chunkserve_stream_id(a.get()), 0u);
  EXPECT_NE(chunkserve_stream_id(a.get()), chunkserve_stream_id(b.get()));
}

// ---- Cancellation
// ---------------------------------------------------------------------------------

TEST(CapiCancelTest, StreamCancelEndsWithCancelled) {
  EnginePtr engine = CreateEngineOrDie(SmallEngineOptions());
  StreamPtr s = SubmitOrDie(engine.get(), Prompt(4, 0), 1000);
  ASSERT_EQ(chunkserve_stream_cancel(s.get(), nullptr), CHUNKSERVE_STATUS_OK);
  const Outcome out = Drain(s.get());
  EXPECT_EQ(out.finish.finish_reason, CHUNKSERVE_FINISH_CANCELLED);
  EXPECT_EQ(out.finish.status, CHUNKSERVE_STATUS_OK);
  EXPECT_LT(out.tokens.size(), 1000u);
}

TEST(CapiCancelTest, EngineCancelByIdEndsWithCancelled) {
  EnginePtr engine = CreateEngineOrDie(SmallEngineOptions());
  StreamPtr s = SubmitOrDie(engine.get(), Prompt(4, 0), 1000);
  ASSERT_EQ(chunkserve_engine_cancel(engine.get(), chunkserve_stream_id(s.get()), nullptr),
            CHUNKSERVE_STATUS_OK);
  EXPECT_EQ(Drain(s.get()).finish.finish_reason, CHUNKSERVE_FINISH_CANCELLED);
}

TEST(CapiCancelTest, EngineCancelOfUnknownIdIsNotFound) {
  EnginePtr engine = CreateEngineOrDie(SmallEngineOptions());
  ErrorPtr error;
  EXPECT_EQ(chunkserve_engine_cancel(engine.get(), 987654, Out(error)),
            CHUNKSERVE_STATUS_NOT_FOUND);
  EXPECT_THAT(chunkserve_error_message(error.get()), HasSubstr("987654"));
  EXPECT_EQ(chunkserve_engine_cancel(nullptr, 1, nullptr), CHUNKSERVE_STATUS_INVALID_ARGUMENT);
}

TEST(CapiCancelTest, CancelAfterFinishIsOkOnTheStreamAndNotFoundOnTheEngine) {
  EnginePtr engine = CreateEngineOrDie(SmallEngineOptions());
  StreamPtr s = SubmitOrDie(engine.get(), Prompt(4, 0), 2);
  EXPECT_EQ(Drain(s.get()).finish.finish_reason, CHUNKSERVE_FINISH_LENGTH);
  EXPECT_EQ(chunkserve_stream_cancel(s.get(), nullptr), CHUNKSERVE_STATUS_OK);
  // The engine forgets finished requests at its next step; wait for that rather than sleep.
  WaitFor([&] {
    return chunkserve_engine_cancel(engine.get(), chunkserve_stream_id(s.get()), nullptr) ==
           CHUNKSERVE_STATUS_NOT_FOUND;
  });
  EXPECT_EQ(chunkserve_stream_cancel(nullptr, nullptr), CHUNKSERVE_STATUS_INVALID_ARGUMENT);
}

TEST(CapiCancelTest, DestroyingAStreamInFlightCancelsItAndFreesItsKv) {
  EnginePtr engine = CreateEngineOrDie(SmallEngineOptions());
  for (int i = 0; i < 4; ++i) {
    StreamPtr s = SubmitOrDie(engine.get(), Prompt(40, i), 1000);
    s.reset();  // destroyed while queued or running
  }
  WaitFor([&] {
    chunkserve_engine_stats_t stats;
    stats.struct_size = sizeof(stats);
    EXPECT_EQ(chunkserve_engine_stats(engine.get(), &stats, nullptr), CHUNKSERVE_STATUS_OK);
    return stats.requests_finished == 4 && stats.kv_bytes_referenced == 0;
  });
  // The engine keeps serving.
  StreamPtr s = SubmitOrDie(engine.get(), Prompt(4, 0), 3);
  EXPECT_EQ(Drain(s.get()).tokens.size(), 3u);
}

// ---- Shutdown and engine destruction ------------------------------------------------------------

TEST(CapiShutdownTest, DrainFinishesSubmittedRequests) {
  EnginePtr engine = CreateEngineOrDie(SmallEngineOptions());
  std::vector<StreamPtr> streams;
  for (int i = 0; i < 3; ++i) streams.push_back(SubmitOrDie(engine.get(), Prompt(10, i), 5));
  ASSERT_EQ(chunkserve_engine_shutdown(engine.get(), CHUNKSERVE_SHUTDOWN_DRAIN, nullptr),
            CHUNKSERVE_STATUS_OK);
  for (auto& s : streams) {
    const Outcome out = Drain(s.get());
    EXPECT_EQ(out.finish.finish_reason, CHUNKSERVE_FINISH_LENGTH);
    EXPECT_EQ(out.tokens.size(), 5u);
  }
}

TEST(CapiShutdownTest, AbortEndsRequestsWithUnavailableAndIsIdempotent) {
  EnginePtr engine = CreateEngineOrDie(SmallEngineOptions());
  StreamPtr s = SubmitOrDie(engine.get(), Prompt(10, 0), 1000);
  ASSERT_EQ(chunkserve_engine_shutdown(engine.get(), CHUNKSERVE_SHUTDOWN_ABORT, nullptr),
            CHUNKSERVE_STATUS_OK);
  ASSERT_EQ(chunkserve_engine_shutdown(engine.get(), CHUNKSERVE_SHUTDOWN_DRAIN, nullptr),
            CHUNKSERVE_STATUS_OK);
  EXPECT_EQ(Drain(s.get()).finish.finish_reason, CHUNKSERVE_FINISH_UNAVAILABLE);
  chunkserve_engine_stats_t stats;
  stats.struct_size = sizeof(stats);
  EXPECT_EQ(chunkserve_engine_stats(engine.get(), &stats, nullptr), CHUNKSERVE_STATUS_OK);
}

TEST(CapiShutdownTest, RejectsNullEngineAndUnknownMode) {
  EnginePtr engine = CreateEngineOrDie(SmallEngineOptions());
  EXPECT_EQ(chunkserve_engine_shutdown(nullptr, CHUNKSERVE_SHUTDOWN_DRAIN, nullptr),
            CHUNKSERVE_STATUS_INVALID_ARGUMENT);
  ErrorPtr error;
  EXPECT_EQ(chunkserve_engine_shutdown(engine.get(), 2, Out(error)),
            CHUNKSERVE_STATUS_INVALID_ARGUMENT);
  EXPECT_THAT(chunkserve_error_message(error.get()), HasSubstr("mode"));
}

// A callback of an engine's stream runs on its step thread: shutting that engine down from
// there is refused (it would wait for itself), and destroying it is completed by another thread
// after the callback returns. Neither aborts the process.
struct SelfStopper {
  chunkserve_engine_t* engine = nullptr;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  chunkserve_status_t shutdown_status = CHUNKSERVE_STATUS_OK;
  std::string shutdown_message;

  static void OnEvent(const chunkserve_stream_event_t* e, void* user) {
    auto* self = static_cast<SelfStopper*>(user);
    if (e->kind != CHUNKSERVE_EVENT_TOKEN || self->engine == nullptr) return;
    chunkserve_engine_t* engine = std::exchange(self->engine, nullptr);
    ErrorPtr error;
    const chunkserve_status_t st =
        chunkserve_engine_shutdown(engine, CHUNKSERVE_SHUTDOWN_ABORT, Out(error));
    chunkserve_engine_destroy(engine);
    std::lock_guard<std::mutex> lock(self->mu);
    self->shutdown_status = st;
    self->shutdown_message = error ? chunkserve_error_message(error.get()) : "";
    self->done = true;
    self->cv.notify_all();
  }
};

TEST(CapiShutdownTest, ACallbackMayDestroyItsEngineButNotShutItDown) {
  chunkserve_engine_t* engine = CreateEngineOrDie(SmallEngineOptions()).release();
  ASSERT_NE(engine, nullptr);
  StreamPtr other = SubmitOrDie(engine, Prompt(30, 1), 500);
  StreamPtr s = SubmitOrDie(engine, Prompt(30, 2), 500);
  SelfStopper stopper;
  stopper.engine = engine;
  ASSERT_EQ(chunkserve_stream_set_callback(s.get(), &SelfStopper::OnEvent, &stopper, nullptr),
            CHUNKSERVE_STATUS_OK);
  {
    std::unique_lock<std::mutex> lock(stopper.mu);
    ASSERT_TRUE(stopper.cv.wait_for(lock, std::chrono::seconds(60), [&] { return stopper.done; }));
  }
  EXPECT_EQ(stopper.shutdown_status, CHUNKSERVE_STATUS_FAILED_PRECONDITION);
  EXPECT_THAT(stopper.shutdown_message, ::testing::StartsWith("chunkserve_engine_shutdown: "));
  // The deferred destroy ends the other request like any destroy, in bounded time.
  const Outcome out = Drain(other.get());
  EXPECT_EQ(out.finish.finish_reason, CHUNKSERVE_FINISH_UNAVAILABLE) << out.message;
}

TEST(CapiShutdownTest, EngineDestroyEndsLiveStreamsWithUnavailable) {
  EnginePtr engine = CreateEngineOrDie(SmallEngineOptions());
  std::vector<StreamPtr> streams;
  for (int i = 0; i < 4; ++i) streams.push_back(SubmitOrDie(engine.get(), Prompt(30, i), 1000));
  engine.reset();
  for (auto& s : streams) {
    const Outcome out = Drain(s.get());
    EXPECT_EQ(out.finish.finish_reason, CHUNKSERVE_FINISH_UNAVAILABLE);
    EXPECT_EQ(out.finish.status, CHUNKSERVE_STATUS_UNAVAILABLE);
    EXPECT_THAT(out.message, HasSubstr("shut down"));
    // The stream handle keeps working after its engine is gone.
    EXPECT_EQ(chunkserve_stream_cancel(s.get(), nullptr), CHUNKSERVE_STATUS_OK);
    EXPECT_NE(chunkserve_stream_id(s.get()), 0u);
  }
}

TEST(CapiShutdownTest, StreamsMayBeDestroyedAfterTheEngineWithoutReading) {
  EnginePtr engine = CreateEngineOrDie(SmallEngineOptions());
  StreamPtr s = SubmitOrDie(engine.get(), Prompt(30, 0), 1000);
  engine.reset();
  s.reset();
}

// ---- Callbacks
// ----------------------------------------------------------------------------------------

// Records events from a callback; Wait() blocks until the FINISHED event.
struct Recorder {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<chunkserve_stream_event_t> events;
  std::string message;
  bool finished = false;
  std::thread::id thread;

  static void OnEvent(const chunkserve_stream_event_t* e, void* user_data) {
    auto* self = static_cast<Recorder*>(user_data);
    std::lock_guard<std::mutex> lock(self->mu);
    self->events.push_back(*e);
    self->thread = std::this_thread::get_id();
    if (e->kind == CHUNKSERVE_EVENT_FINISHED) {
      if (e->error_message != nullptr) self->message = e->error_message;
      self->events.back().error_message = nullptr;  // only valid during the call
      self->finished = true;
      self->cv.notify_all();
    }
  }
  void Wait() {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, 60s, [&] { return finished; })) << "no FINISHED event";
  }
};

TEST(CapiCallbackTest, DeliversEveryEventInOrder) {
  EnginePtr engine = CreateEngineOrDie(SmallEngineOptions());
  StreamPtr s = SubmitOrDie(engine.get(), Prompt(12, 0), 6);
  Recorder rec;
  ASSERT_EQ(chunkserve_stream_set_callback(s.get(), &Recorder::OnEvent, &rec, nullptr),
            CHUNKSERVE_STATUS_OK);
  rec.Wait();
  std::lock_guard<std::mutex> lock(rec.mu);
  ASSERT_EQ(rec.events.size(), 7u);
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(rec.events[i].kind, CHUNKSERVE_EVENT_TOKEN);
    EXPECT_EQ(rec.events[i].index, i);
    EXPECT_EQ(rec.events[i].struct_size, sizeof(chunkserve_stream_event_t));
  }
  EXPECT_EQ(rec.events[6].kind, CHUNKSERVE_EVENT_FINISHED);
  EXPECT_EQ(rec.events[6].finish_reason, CHUNKSERVE_FINISH_LENGTH);
}

TEST(CapiCallbackTest, SetAfterTheStreamFinishedReplaysTheBacklogOnTheCallingThread) {
  EnginePtr engine = CreateEngineOrDie(SmallEngineOptions());
  StreamPtr s = SubmitOrDie(engine.get(), Prompt(12, 0), 3);
  // Wait until the request has finished without consuming its events.
  WaitFor([&] {
    chunkserve_engine_stats_t stats;
    stats.struct_size = sizeof(stats);
    EXPECT_EQ(chunkserve_engine_stats(engine.get(), &stats, nullptr), CHUNKSERVE_STATUS_OK);
    return stats.requests_finished == 1;
  });
  Recorder rec;
  ASSERT_EQ(chunkserve_stream_set_callback(s.get(), &Recorder::OnEvent, &rec, nullptr),
            CHUNKSERVE_STATUS_OK);
  std::lock_guard<std::mutex> lock(rec.mu);
  EXPECT_TRUE(rec.finished);
  EXPECT_EQ(rec.events.size(), 4u);
  EXPECT_EQ(rec.thread, std::this_thread::get_id());
}

TEST(CapiCallbackTest, SecondCallbackIsFailedPrecondition) {
  EnginePtr engine = CreateEngineOrDie(SmallEngineOptions());
  StreamPtr s = SubmitOrDie(engine.get(), Prompt(12, 0), 3);
  Recorder rec;
  ASSERT_EQ(chunkserve_stream_set_callback(s.get(), &Recorder::OnEvent, &rec, nullptr),
            CHUNKSERVE_STATUS_OK);
  EXPECT_EQ(chunkserve_stream_set_callback(s.get(), &Recorder::OnEvent, &rec, nullptr),
            CHUNKSERVE_STATUS_FAILED_PRECONDITION);
  rec.Wait();
}

TEST(CapiCallbackTest, RejectsNullStreamAndNullCallback) {
  EnginePtr engine = CreateEngineOrDie(SmallEngineOptions());
  StreamPtr s = SubmitOrDie(engine.get(), Prompt(12, 0), 3);
  EXPECT_EQ(chunkserve_stream_set_callback(nullptr, &Recorder::OnEvent, nullptr, nullptr),
            CHUNKSERVE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(chunkserve_stream_set_callback(s.get(), nullptr, nullptr, nullptr),
            CHUNKSERVE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(Drain(s.get()).tokens.size(), 3u);  // still a pull stream
}

TEST(CapiCallbackTest, NextOnACallbackStreamIsFailedPrecondition) {
  EnginePtr engine = CreateEngineOrDie(SmallEngineOptions());
  StreamPtr s = SubmitOrDie(engine.get(), Prompt(12, 0), 3);
  Recorder rec;
  ASSERT_EQ(chunkserve_stream_set_callback(s.get(), &Recorder::OnEvent, &rec, nullptr),
            CHUNKSERVE_STATUS_OK);
  chunkserve_stream_event_t e;
  e.struct_size = sizeof(e);
  EXPECT_EQ(chunkserve_stream_next(s.get(), 10, &e, nullptr),
            CHUNKSERVE_STATUS_FAILED_PRECONDITION);
  rec.Wait();
}

TEST(CapiCallbackTest, BlockedNextReturnsWhenACallbackIsSet) {
  chunkserve_engine_options_t o = SmallEngineOptions();
  o.prefill_token_budget = 16;
  EnginePtr engine = CreateEngineOrDie(o);
  StreamPtr s = SubmitOrDie(engine.get(), Prompt(512, 0), 1);
  std::atomic<chunkserve_status_t> status{-1};
  std::thread waiter([&] {
    chunkserve_stream_event_t e;
    e.struct_size = sizeof(e);
    status = chunkserve_stream_next(s.get(), CHUNKSERVE_WAIT_FOREVER, &e, nullptr);
  });
  std::this_thread::sleep_for(20ms);  // let the waiter block (harmless if it has not yet)
  Recorder rec;
  ASSERT_EQ(chunkserve_stream_set_callback(s.get(), &Recorder::OnEvent, &rec, nullptr),
            CHUNKSERVE_STATUS_OK);
  waiter.join();
  // The waiter either saw the callback first, or (if it got the first event before the callback
  // was set) got that event.
  EXPECT_THAT(status.load(),
              ::testing::AnyOf(CHUNKSERVE_STATUS_FAILED_PRECONDITION, CHUNKSERVE_STATUS_OK));
  rec.Wait();
}

TEST(CapiCallbackTest, EngineDestroyDeliversUnavailableToTheCallback) {
  EnginePtr engine = CreateEngineOrDie(SmallEngineOptions());
  StreamPtr s = SubmitOrDie(engine.get(), Prompt(12, 0), 1000);
  Recorder rec;
  ASSERT_EQ(chunkserve_stream_set_callback(s.get(), &Recorder::OnEvent, &rec, nullptr),
            CHUNKSERVE_STATUS_OK);
  engine.reset();
  rec.Wait();
  std::lock_guard<std::mutex> lock(rec.mu);
  EXPECT_EQ(rec.events.back().finish_reason, CHUNKSERVE_FINISH_UNAVAILABLE);
  EXPECT_EQ(rec.events.back().status, CHUNKSERVE_STATUS_UNAVAILABLE);
  EXPECT_THAT(rec.message, HasSubstr("shut down"));
}

// After stream_destroy returns the callback never runs again, so user_data may be freed.
TEST(CapiCallbackTest, NoInvocationAfterStreamDestroyReturns) {
  EnginePtr engine = CreateEngineOrDie(SmallEngineOptions());
  for (int i = 0; i < 20; ++i) {
    StreamPtr s = SubmitOrDie(engine.get(), Prompt(8, i), 1000);
    struct Counter {
      std::atomic<int> calls{0};
      std::atomic<bool> dead{false};
      std::atomic<bool> called_after_death{false};
    };
    auto counter = std::make_unique<Counter>();
    const auto on_event = [](const chunkserve_stream_event_t*, void* user_data) {
      auto* c = static_cast<Counter*>(user_data);
      if (c->dead.load()) c->called_after_death = true;
      c->calls++;
      std::this_thread::sleep_for(std::chrono::microseconds(200));  // widen the race window
    };
    ASSERT_EQ(chunkserve_stream_set_callback(s.get(), on_event, counter.get(), nullptr),
              CHUNKSERVE_STATUS_OK);
    WaitFor([&] { return counter->calls.load() >= 2; });
    s.reset();
    counter->dead = true;
    const int calls = counter->calls.load();
    std::this_thread::sleep_for(5ms);
    EXPECT_FALSE(counter->called_after_death.load());
    EXPECT_EQ(counter->calls.load(), calls);
  }
}

TEST(CapiCallbackTest, CallbackMaySubmitAndCancel) {
  EnginePtr engine = CreateEngineOrDie(SmallEngineOptions());
  struct Ctx {
    chunkserve_engine_t* engine = nullptr;
    std::vector<int32_t> prompt;
    chunkserve_stream_t* child = nullptr;
    chunkserve_status_t submit_status = -1;
    Recorder done;
  } ctx;
  ctx.engine = engine.get();
  ctx.prompt = Prompt(6, 9);
  StreamPtr s = SubmitOrDie(engine.get(), Prompt(6, 1), 2);
  const auto on_event = [](const chunkserve_stream_event_t* e, void* user_data) {
    auto* c = static_cast<Ctx*>(user_data);
    if (e->kind == CHUNKSERVE_EVENT_FINISHED) {
      const chunkserve_request_options_t r = RequestFor(c->prompt, 2);
      c->submit_status = chunkserve_engine_submit(c->engine, &r, &c->child, nullptr);
      if (c->child != nullptr) chunkserve_stream_cancel(c->child, nullptr);
    }
    Recorder::OnEvent(e, &c->done);
  };
  ASSERT_EQ(chunkserve_stream_set_callback(s.get(), on_event, &ctx, nullptr), CHUNKSERVE_STATUS_OK);
  ctx.done.Wait();
  EXPECT_EQ(ctx.submit_status, CHUNKSERVE_STATUS_OK);
  ASSERT_NE(ctx.child, nullptr);
  StreamPtr child(ctx.child);
  const Outcome out = Drain(child.get());
  EXPECT_THAT(out.finish.finish_reason,
              ::testing::AnyOf(CHUNKSERVE_FINISH_CANCELLED, CHUNKSERVE_FINISH_LENGTH));
}

// ---- Concurrency
// ----------------------------------------------------------------------------------------

TEST(CapiConcurrencyTest, ManyThreadsSubmitAndPullAtOnce) {
  EnginePtr engine = CreateEngineOrDie(SmallEngineOptions());
  constexpr int kThreads = 8;
  constexpr int kPerThread = 4;
  // Greedy references, computed one at a time.
  std::vector<std::vector<int32_t>> expected;
  for (int p = 0; p < kThreads; ++p) {
    StreamPtr s = SubmitOrDie(engine.get(), Prompt(20, p), 5);
    expected.push_back(Drain(s.get()).tokens);
  }
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        StreamPtr s = SubmitOrDie(engine.get(), Prompt(20, t), 5);
        if (Drain(s.get()).tokens != expected[t]) mismatches++;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
  chunkserve_engine_stats_t stats;
  stats.struct_size = sizeof(stats);
  ASSERT_EQ(chunkserve_engine_stats(engine.get(), &stats, nullptr), CHUNKSERVE_STATUS_OK);
  EXPECT_EQ(stats.requests_finished, static_cast<uint64_t>(kThreads * (kPerThread + 1)));
}

TEST(CapiConcurrencyTest, CancelFromAnotherThreadWakesABlockedNext) {
  EnginePtr engine = CreateEngineOrDie(SmallEngineOptions());
  StreamPtr s = SubmitOrDie(engine.get(), Prompt(8, 0), 1000);
  std::thread canceller([&] {
    std::this_thread::sleep_for(10ms);
    EXPECT_EQ(chunkserve_stream_cancel(s.get(), nullptr), CHUNKSERVE_STATUS_OK);
  });
  chunkserve_stream_event_t e;
  e.struct_size = sizeof(e);
  chunkserve_status_t st;
  do {
    st = chunkserve_stream_next(s.get(), CHUNKSERVE_WAIT_FOREVER, &e, nullptr);
  } while (st == CHUNKSERVE_STATUS_OK && e.kind == CHUNKSERVE_EVENT_TOKEN);
  canceller.join();
  EXPECT_EQ(st, CHUNKSERVE_STATUS_OK);
  EXPECT_EQ(e.finish_reason, CHUNKSERVE_FINISH_CANCELLED);
}

}  // namespace
}  // namespace chunkserve::capi
