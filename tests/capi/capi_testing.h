// Helpers for the C ABI tests: RAII over the C handles, a tiny model written once per process,
// and a pull loop that drains a stream.
#ifndef CHUNKSERVE_TESTS_CAPI_CAPI_TESTING_H_
#define CHUNKSERVE_TESTS_CAPI_CAPI_TESTING_H_

#include <chunkserve/chunkserve.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace chunkserve::capi {

struct ErrorDeleter {
  void operator()(chunkserve_error_t* e) const { chunkserve_error_free(e); }
};
struct EngineDeleter {
  void operator()(chunkserve_engine_t* e) const { chunkserve_engine_destroy(e); }
};
struct StreamDeleter {
  void operator()(chunkserve_stream_t* s) const { chunkserve_stream_destroy(s); }
};
using ErrorPtr = std::unique_ptr<chunkserve_error_t, ErrorDeleter>;
using EnginePtr = std::unique_ptr<chunkserve_engine_t, EngineDeleter>;
using StreamPtr = std::unique_ptr<chunkserve_stream_t, StreamDeleter>;

// Out(error) passes an ErrorPtr as a chunkserve_error_t** out-parameter; the error lands in the
// ErrorPtr at the end of the full expression.
class OutError {
 public:
  explicit OutError(ErrorPtr& target) : target_(target) {}
  ~OutError() { target_.reset(raw_); }
  OutError(const OutError&) = delete;
  OutError& operator=(const OutError&) = delete;
  operator chunkserve_error_t**() { return &raw_; }  // NOLINT(runtime/explicit)

 private:
  ErrorPtr& target_;
  chunkserve_error_t* raw_ = nullptr;
};
inline OutError Out(ErrorPtr& target) { return OutError(target); }

// The built-in tiny model (vocab 1024), written once per process into a temporary directory, so
// that engines load it in milliseconds instead of regenerating 16 MB of weights each time.
const std::string& TinyModelDir();

// Engine options for tests: the tiny model, 16-token chunks, 8 MiB of KV, one thread.
chunkserve_engine_options_t SmallEngineOptions();

// Creates an engine; records a test failure (with the error message) and returns null on error.
EnginePtr CreateEngineOrDie(const chunkserve_engine_options_t& options);

// `n` valid token ids, different for different salts.
std::vector<int32_t> Prompt(int n, int salt);

// Request options pointing at `prompt` (which must outlive the submit call).
chunkserve_request_options_t RequestFor(const std::vector<int32_t>& prompt, int32_t max_new_tokens);

StreamPtr SubmitRequestOrDie(chunkserve_engine_t* engine, const chunkserve_request_options_t& r);
StreamPtr SubmitOrDie(chunkserve_engine_t* engine, const std::vector<int32_t>& prompt,
                      int32_t max_new_tokens);

// What a stream produced: its tokens and its FINISHED event (error message copied out).
struct Outcome {
  std::vector<int32_t> tokens;
  chunkserve_stream_event_t finish{};
  std::string message;
};

// Pulls until the FINISHED event; gives up (with a failure) after 60 s. `pulled`: the tokens the
// caller already took from the stream (indices continue after them; FINISHED counts them too).
Outcome Drain(chunkserve_stream_t* stream, const std::vector<int32_t>& pulled = {});

// Polls `condition` until it holds; fails the test after 30 s.
template <typename Condition>
void WaitFor(Condition condition) {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!condition()) {
    if (std::chrono::steady_clock::now() > give_up) {
      ADD_FAILURE() << "condition not reached within 30 s";
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// Anonymous resident memory of this process (RssAnon in /proc/self/status), in KiB: heap and
// thread stacks, not the file-backed model mappings. -1 when unavailable.
int64_t RssAnonKiB();

}  // namespace chunkserve::capi

#endif  // CHUNKSERVE_TESTS_CAPI_CAPI_TESTING_H_
