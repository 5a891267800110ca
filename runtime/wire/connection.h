// Connection: one framed Cap'n Proto connection over a TCP socket on an Asio io_context.
//
// Reads are asynchronous and go through a FrameDecoder (reader limits apply); every decoded
// message is handed to the message handler on the io_context thread. A malformed frame closes
// the connection (after an Error message with requestId 0 is queued, best effort). Writes are
// queued and sent in order; the queue is bounded (bytes), and Send returns ResourceExhausted when
// it is full, so a slow reader cannot make the process buffer without bound. Deadlines: a
// handshake deadline (the first message must arrive in time) and an idle deadline (some message
// must arrive within it); both close the connection with DeadlineExceeded.
//
// The close handler runs exactly once, on the io_context thread, with the reason (OK for an
// orderly close by the peer).
//
// Thread safety: Send and Close are safe from any thread; Start is called once on the io_context
// thread (or before it runs). Lifetime: shared_ptr; pending operations keep it alive.
#ifndef CHUNKSERVE_RUNTIME_WIRE_CONNECTION_H_
#define CHUNKSERVE_RUNTIME_WIRE_CONNECTION_H_

#include <capnp/message.h>

#include <array>
#include <asio.hpp>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "runtime/base/status.h"
#include "runtime/wire/framing.h"

namespace chunkserve::wire {

struct ConnectionOptions {
  ReaderLimits limits;
  size_t max_outgoing_bytes = 32u << 20;           // queued, unsent bytes
  std::chrono::milliseconds handshake_timeout{0};  // first message; 0 = none
  std::chrono::milliseconds idle_timeout{0};       // between messages; 0 = none
};

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  using MessageHandler = std::function<void(DecodedMessage& message)>;
  using CloseHandler = std::function<void(const Status& reason)>;

  static std::shared_ptr<Connection> Create(asio::ip::tcp::socket socket,
                                            ConnectionOptions options);
  ~Connection();

  void Start(MessageHandler on_message, CloseHandler on_close);

  // Queues one frame. ResourceExhausted when the outgoing queue is full; Unavailable once closed.
  Status Send(capnp::MessageBuilder& message);
  Status SendBytes(std::vector<uint8_t> frame);

  // Closes the socket; the close handler runs with `reason`.
  void Close(const Status& reason);

  bool closed() const;
  size_t queued_bytes() const;
  uint64_t id() const { return id_; }

 private:
  Connection(asio::ip::tcp::socket socket, ConnectionOptions options);
  void DoRead();
  void DoWrite();
  void ArmTimer(std::chrono::milliseconds timeout);
  void CloseOnLoop(const Status& reason);

  asio::ip::tcp::socket socket_;
  asio::steady_timer timer_;
  const ConnectionOptions options_;
  const uint64_t id_;
  FrameDecoder decoder_;
  std::array<uint8_t, 16384> read_buffer_;
  MessageHandler on_message_;
  CloseHandler on_close_;
  bool got_first_message_ = false;
  bool writing_ = false;  // loop thread only

  mutable std::mutex mu_;
  std::deque<std::vector<uint8_t>> outgoing_;  // guarded by mu_
  size_t outgoing_bytes_ = 0;                  // guarded by mu_
  bool closed_ = false;                        // guarded by mu_
};

}  // namespace chunkserve::wire

#endif  // CHUNKSERVE_RUNTIME_WIRE_CONNECTION_H_
