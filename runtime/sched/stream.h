// RequestStream: the client's end of one request: generated tokens, then one terminal event.
//
// The engine's step thread pushes; any client thread pulls with Next(timeout), or registers a
// callback that is invoked for every event instead (on the pushing thread, so it must be quick
// and must not call back into the engine's blocking APIs). Exactly one terminal event is ever
// delivered; pushes after it are ignored.
//
// Thread safety: all methods are safe from any thread. Lifetime: shared by the engine and the
// client (std::shared_ptr); either side may drop its reference first.
#ifndef CHUNKSERVE_RUNTIME_SCHED_STREAM_H_
#define CHUNKSERVE_RUNTIME_SCHED_STREAM_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>

#include "runtime/base/ids.h"
#include "runtime/base/logprobs.h"
#include "runtime/sched/request.h"

namespace chunkserve::sched {

struct StreamEvent {
  enum class Kind { kToken, kFinished };
  Kind kind = Kind::kToken;
  TokenId token = -1;   // kToken: the generated token
  int32_t index = 0;    // kToken: 0-based position among the generated tokens
  std::optional<TokenLogprobs> logprobs;  // kToken of a request that asked for them
  FinishInfo finish{};  // kFinished
};

class RequestStream {
 public:
  enum class NextResult { kEvent, kTimeout, kEnded };
  using Callback = std::function<void(const StreamEvent&)>;

  explicit RequestStream(RequestId id) : id_(id) {}

  RequestId id() const { return id_; }

  // Waits up to `timeout` for the next event. kEnded once the terminal event has been returned.
  NextResult Next(StreamEvent* event, std::chrono::nanoseconds timeout);

  // Delivers every event (including ones already queued, in order) to `callback` instead of the
  // queue. Set at most once; later calls return FailedPrecondition.
  Status SetCallback(Callback callback);

  // Asks the engine to cancel; the terminal event (kCancelled, or whatever ended it first) still
  // arrives through the stream.
  void RequestCancel() { cancel_requested_.store(true, std::memory_order_relaxed); }
  bool cancel_requested() const { return cancel_requested_.load(std::memory_order_relaxed); }

  // Producer side (the engine).
  void PushToken(TokenId token, int32_t index, std::optional<TokenLogprobs> logprobs = {});
  void PushFinish(const FinishInfo& info);
  bool finished() const;

 private:
  void Deliver(StreamEvent event);

  const RequestId id_;
  std::mutex deliver_mu_;  // serializes callback invocations (taken before mu_)
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<StreamEvent> queue_;
  Callback callback_;
  bool finish_pushed_ = false;
  bool finish_taken_ = false;
  std::atomic<bool> cancel_requested_{false};
};

}  // namespace chunkserve::sched

#endif  // CHUNKSERVE_RUNTIME_SCHED_STREAM_H_
