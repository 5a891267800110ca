#include "runtime/wire/connection.h"

#include <atomic>
#include <string>
#include <utility>

namespace chunkserve::wire {
namespace {
std::atomic<uint64_t> next_connection_id{1};
}  // namespace

std::shared_ptr<Connection> Connection::Create(asio::ip::tcp::socket socket,
                                               ConnectionOptions options) {
  return std::shared_ptr<Connection>(new Connection(std::move(socket), options));
}

Connection::Connection(asio::ip::tcp::socket socket, ConnectionOptions options)
    : socket_(std::move(socket)),
      timer_(socket_.get_executor()),
      options_(options),
      id_(next_connection_id.fetch_add(1)),
      decoder_(options.limits) {
  asio::error_code ignored;
  socket_.set_option(asio::ip::tcp::no_delay(true), ignored);
}

Connection::~Connection() = default;

void Connection::Start(MessageHandler on_message, CloseHandler on_close) {
  on_message_ = std::move(on_message);
  on_close_ = std::move(on_close);
  ArmTimer(options_.handshake_timeout.count() > 0 ? options_.handshake_timeout
                                                  : options_.idle_timeout);
  DoRead();
}

void Connection::ArmTimer(std::chrono::milliseconds timeout) {
  timer_.cancel();
  if (timeout.count() <= 0) return;
  timer_.expires_after(timeout);
  std::weak_ptr<Connection> weak = weak_from_this();
  const bool handshake = !got_first_message_;
  timer_.async_wait([weak, handshake](const asio::error_code& ec) {
    if (ec) return;  // cancelled or re-armed
    if (auto self = weak.lock()) {
      self->CloseOnLoop(Status::DeadlineExceeded(handshake ? "handshake deadline passed"
                                                           : "idle deadline passed"));
    }
  });
}

void Connection::DoRead() {
  auto self = shared_from_this();
  socket_.async_read_some(asio::buffer(read_buffer_), [self](const asio::error_code& ec, size_t n) {
    if (self->closed()) return;
    if (ec) {
      self->CloseOnLoop(ec == asio::error::eof
                            ? Status::Ok()
                            : Status::Unavailable("connection read failed: " + ec.message()));
      return;
    }
    Status status = self->decoder_.Feed(self->read_buffer_.data(), n);
    DecodedMessage message;
    bool any = false;
    while (!self->closed() && self->decoder_.Next(&message)) {
      any = true;
      self->got_first_message_ = true;
      if (self->on_message_) self->on_message_(message);
    }
    if (self->closed()) return;
    if (!status.ok()) {
      // Tell the peer why, best effort, then close.
      capnp::MallocMessageBuilder builder;
      auto error = builder.initRoot<schema::Envelope>().initError();
      error.setRequestId(0);
      error.setCode(static_cast<schema::ErrorCode>(status.code()));
      error.setMessage(std::string(status.message()));
      error.setRetryable(false);
      Result<std::vector<uint8_t>> bytes = EncodeFrame(builder);
      if (bytes.ok()) {
        asio::error_code ignored;
        self->socket_.non_blocking(true, ignored);  // never block the loop on a bad peer
        asio::write(self->socket_, asio::buffer(bytes.value()), ignored);
      }
      self->CloseOnLoop(status);
      return;
    }
    if (any) self->ArmTimer(self->options_.idle_timeout);
    self->DoRead();
  });
}

Status Connection::Send(capnp::MessageBuilder& message) {
  CHUNKSERVE_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, EncodeFrame(message));
  return SendBytes(std::move(bytes));
}

Status Connection::SendBytes(std::vector<uint8_t> frame) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return Status::Unavailable("connection closed");
    if (outgoing_bytes_ + frame.size() > options_.max_outgoing_bytes) {
      return Status::ResourceExhausted("connection outgoing queue is full");
    }
    outgoing_bytes_ += frame.size();
    outgoing_.push_back(std::move(frame));
  }
  auto self = shared_from_this();
  asio::post(socket_.get_executor(), [self] {
    if (!self->writing_) self->DoWrite();
  });
  return Status::Ok();
}

void Connection::DoWrite() {
  std::vector<uint8_t>* front = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_ || outgoing_.empty()) {
      writing_ = false;
      return;
    }
    front = &outgoing_.front();  // stable: only this loop pops
  }
  writing_ = true;
  auto self = shared_from_this();
  asio::async_write(socket_, asio::buffer(*front), [self](const asio::error_code& ec, size_t) {
    {
      std::lock_guard<std::mutex> lock(self->mu_);
      if (!self->outgoing_.empty()) {
        self->outgoing_bytes_ -= self->outgoing_.front().size();
        self->outgoing_.pop_front();
      }
    }
    if (ec) {
      self->writing_ = false;
      self->CloseOnLoop(Status::Unavailable("connection write failed: " + ec.message()));
      return;
    }
    self->DoWrite();
  });
}

void Connection::Close(const Status& reason) {
  auto self = shared_from_this();
  asio::post(socket_.get_executor(), [self, reason] { self->CloseOnLoop(reason); });
}

void Connection::CloseOnLoop(const Status& reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;
    closed_ = true;
  }
  timer_.cancel();
  asio::error_code ignored;
  socket_.shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
  socket_.close(ignored);
  CloseHandler on_close = std::move(on_close_);
  on_close_ = nullptr;
  on_message_ = nullptr;
  if (on_close) on_close(reason);
}

bool Connection::closed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return closed_;
}

size_t Connection::queued_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return outgoing_bytes_;
}

}  // namespace chunkserve::wire
