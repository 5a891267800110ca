#include "tests/capi/capi_testing.h"

#include <fstream>
#include <sstream>

#include "runtime/model/tiny_model.h"
#include "tests/testing/temp_dir.h"

namespace chunkserve::capi {

const std::string& TinyModelDir() {
  static const std::string* dir = [] {
    static testing::TempDir temp;  // removed at exit
    const Status s = model::WriteTinyModel(temp.path(), model::TinyModelOptions::Default());
    if (!s.ok()) ADD_FAILURE() << "cannot write the tiny model: " << s;
    return new std::string(temp.path().string());
  }();
  return *dir;
}

chunkserve_engine_options_t SmallEngineOptions() {
  chunkserve_engine_options_t o;
  const chunkserve_status_t st = chunkserve_engine_options_init(&o, sizeof(o), nullptr);
  EXPECT_EQ(st, CHUNKSERVE_STATUS_OK);
  o.model_path = TinyModelDir().c_str();
  o.chunk_size = 16;
  o.kv_cache_bytes = 8u << 20;
  o.num_threads = 1;
  return o;
}

EnginePtr CreateEngineOrDie(const chunkserve_engine_options_t& options) {
  chunkserve_engine_t* engine = nullptr;
  ErrorPtr error;
  const chunkserve_status_t st = chunkserve_engine_create(&options, &engine, Out(error));
  EXPECT_EQ(st, CHUNKSERVE_STATUS_OK) << chunkserve_error_message(error.get());
  return EnginePtr(engine);
}

std::vector<int32_t> Prompt(int n, int salt) {
  std::vector<int32_t> p(n);
  for (int i = 0; i < n; ++i) p[i] = (i * 131 + salt * 977 + 7) % 1024;
  return p;
}

chunkserve_request_options_t RequestFor(const std::vector<int32_t>& prompt,
                                        int32_t max_new_tokens) {
  chunkserve_request_options_t r;
  const chunkserve_status_t st = chunkserve_request_options_init(&r, sizeof(r), nullptr);
  EXPECT_EQ(st, CHUNKSERVE_STATUS_OK);
  r.prompt_tokens = prompt.data();
  r.num_prompt_tokens = prompt.size();
  r.max_new_tokens = max_new_tokens;
  return r;
}

StreamPtr SubmitRequestOrDie(chunkserve_engine_t* engine, const chunkserve_request_options_t& r) {
  chunkserve_stream_t* stream = nullptr;
  ErrorPtr error;
  const chunkserve_status_t st = chunkserve_engine_submit(engine, &r, &stream, Out(error));
  EXPECT_EQ(st, CHUNKSERVE_STATUS_OK) << chunkserve_error_message(error.get());
  return StreamPtr(stream);
}

StreamPtr SubmitOrDie(chunkserve_engine_t* engine, const std::vector<int32_t>& prompt,
                      int32_t max_new_tokens) {
  return SubmitRequestOrDie(engine, RequestFor(prompt, max_new_tokens));
}

Outcome Drain(chunkserve_stream_t* stream, const std::vector<int32_t>& pulled) {
  Outcome out;
  out.tokens = pulled;
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  chunkserve_stream_event_t e;
  e.struct_size = sizeof(e);
  while (std::chrono::steady_clock::now() < give_up) {
    ErrorPtr error;
    const chunkserve_status_t st = chunkserve_stream_next(stream, 100, &e, Out(error));
    if (st == CHUNKSERVE_STATUS_DEADLINE_EXCEEDED) continue;
    if (st != CHUNKSERVE_STATUS_OK) {
      ADD_FAILURE() << "stream_next: " << chunkserve_status_name(st) << ": "
                    << chunkserve_error_message(error.get());
      return out;
    }
    if (e.kind == CHUNKSERVE_EVENT_TOKEN) {
      EXPECT_EQ(e.index, static_cast<int32_t>(out.tokens.size()));
      out.tokens.push_back(e.token);
      continue;
    }
    out.finish = e;
    if (e.error_message != nullptr) out.message = e.error_message;
    EXPECT_EQ(e.generated_tokens, static_cast<int32_t>(out.tokens.size()));
    return out;
  }
  ADD_FAILURE() << "stream did not finish within 60 s";
  return out;
}

int64_t RssAnonKiB() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("RssAnon:", 0) == 0) {
      std::istringstream fields(line.substr(8));
      int64_t kib = -1;
      fields >> kib;
      return kib;
    }
  }
  return -1;
}

}  // namespace chunkserve::capi
