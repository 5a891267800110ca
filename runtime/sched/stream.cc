#include "runtime/sched/stream.h"

#include <utility>

namespace chunkserve::sched {

RequestStream::NextResult RequestStream::Next(StreamEvent* event,
                                              std::chrono::nanoseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, timeout, [&] { return !queue_.empty() || finish_taken_; })) {
    return NextResult::kTimeout;
  }
  if (queue_.empty()) return NextResult::kEnded;
  *event = std::move(queue_.front());
  queue_.pop_front();
  if (event->kind == StreamEvent::Kind::kFinished) {
    finish_taken_ = true;
    cv_.notify_all();  // other waiters learn the stream has ended
  }
  return NextResult::kEvent;
}

Status RequestStream::SetCallback(Callback callback) {
  if (!callback) return Status::InvalidArgument("empty stream callback");
  // deliver_mu_ is held while the backlog drains, so an event pushed meanwhile waits for it and
  // the callback sees every event in push order.
  std::lock_guard<std::mutex> delivering(deliver_mu_);
  std::deque<StreamEvent> backlog;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (callback_) return Status::FailedPrecondition("stream callback already set");
    callback_ = std::move(callback);
    backlog.swap(queue_);
    if (finish_pushed_) finish_taken_ = true;
  }
  cv_.notify_all();  // pullers blocked in Next() see the stream drained to the callback
  for (const StreamEvent& e : backlog) callback_(e);
  return Status::Ok();
}

void RequestStream::Deliver(StreamEvent event) {
  std::lock_guard<std::mutex> delivering(deliver_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (finish_pushed_) return;  // exactly one terminal event; later pushes are dropped
    if (event.kind == StreamEvent::Kind::kFinished) finish_pushed_ = true;
    if (!callback_) {
      queue_.push_back(std::move(event));
      cv_.notify_all();
      return;
    }
    if (event.kind == StreamEvent::Kind::kFinished) finish_taken_ = true;
  }
  callback_(event);  // callback_ never changes once set
}

void RequestStream::PushToken(TokenId token, int32_t index,
                              std::optional<TokenLogprobs> logprobs) {
  StreamEvent e;
  e.kind = StreamEvent::Kind::kToken;
  e.token = token;
  e.index = index;
  e.logprobs = std::move(logprobs);
  Deliver(std::move(e));
}

void RequestStream::PushFinish(const FinishInfo& info) {
  StreamEvent e;
  e.kind = StreamEvent::Kind::kFinished;
  e.finish = info;
  Deliver(std::move(e));
}

bool RequestStream::finished() const {
  std::lock_guard<std::mutex> lock(mu_);
  return finish_pushed_;
}

}  // namespace chunkserve::sched
