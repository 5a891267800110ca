// Connection: one framed Cap'n Proto connection over a TCP socket, plain or TLS (transport.h),
// on an Asio io_context.
//
// Reads are asynchronous and go through a FrameDecoder (reader limits apply); every decoded
// message is handed to the message handler on the io_context thread. A malformed frame closes
// the connection (after an Error message with requestId 0 is queued, best effort). Writes are
// queued and sent in order; the queue is bounded (bytes), and Send returns ResourceExhausted when
// it is full, so a slow reader cannot make the process buffer without bound.
//
// Bounds and deadlines, each closing the connection with a Status naming it:
//  - handshake: the first message must arrive within handshake_timeout (DeadlineExceeded);
//  - idle: some message must arrive within idle_timeout (DeadlineExceeded); with
//    idle_counts_sends, or some frame be written to the peer;
//  - frame: a frame, once its first byte arrived, must complete within frame_timeout
//    (DeadlineExceeded), so a peer cannot hold a partial frame (and its memory) forever;
//  - budget: bytes of partial frames are reserved in a ByteBudget shared by every connection of
//    the process (ResourceExhausted when it is spent).
//
// Unacknowledged data: sent bytes the peer has not acknowledged for unacked_timeout close the
// connection (TCP_USER_TIMEOUT), so a peer that vanished while this side streams to it is
// noticed without waiting for it to speak.
//
// Keepalive: with keepalive_interval > 0 the connection sends a Ping whenever nothing has been
// received for that long (ping_first: also at once on Start, so the peer's handshake deadline is
// met by a link that has nothing to say yet). Ping is answered with Pong here; neither reaches the
// message handler, both count as traffic. With idle_timeout a few times the peer's keepalive
// interval, an idle link is never closed and a dead peer is detected within idle_timeout.
//
// Authentication (auth.h): with server_auth enabled, Start sends a Challenge and every frame before
// a valid Auth is refused (Error unauthenticated, then close); the handshake deadline applies to
// it (10 s when none is set). With client_auth, the connection holds what the application sends
// until the peer's Challenge arrived and was answered with Auth. It sends a Ping at Start, so a
// server that answers with a Pong before any Challenge (it requires no authentication) or with
// an Error for the connection (a TLS server to a plaintext peer, a refusal) closes it at once
// with Unauthenticated or the Error's code; one that sends nothing within the handshake deadline
// (10 s when none is set) closes it with Unauthenticated too. Without client_auth, a Challenge
// closes the connection with Unauthenticated. Once authenticated as worker or router, the frame
// limit rises to trusted_max_message_bytes.
//
// TLS: with `tls` set the connection runs the TLS handshake first (within the handshake
// deadline) and only then reads and writes frames; a client side verifies the server against
// `tls_host`. A plaintext peer of a TLS server gets an Error frame in plaintext saying that TLS is
// required (Unauthenticated), a failed handshake closes with Unauthenticated. peer_certified()
// tells whether the peer presented a certificate the cluster CA verified (mutual TLS).
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
#include "runtime/wire/asio.h"
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "runtime/base/status.h"
#include "runtime/wire/auth.h"
#include "runtime/wire/budget.h"
#include "runtime/wire/framing.h"
#include "runtime/wire/tls.h"
#include "runtime/wire/transport.h"

namespace chunkserve::wire {

struct ConnectionOptions {
  ReaderLimits limits;
  size_t max_outgoing_bytes = 32u << 20;           // queued, unsent bytes
  std::chrono::milliseconds handshake_timeout{0};  // first message; 0 = none
  std::chrono::milliseconds idle_timeout{0};       // between messages; 0 = none
  // The idle deadline also runs from the last frame this side wrote: a peer that only reads
  // (a client streaming a long answer) is not idle while it is streamed to; if it vanished,
  // unacked_timeout notices. Servers set it for the connections they accept.
  bool idle_counts_sends = false;
  std::chrono::milliseconds frame_timeout{0};      // complete a started frame; 0 = none
  std::chrono::milliseconds keepalive_interval{0};  // Ping after this long without traffic
  // Sent data the peer has not acknowledged for this long closes the connection (the kernel's
  // TCP_USER_TIMEOUT; 0: the kernel's default, retransmissions for about 15 minutes). A peer cut
  // off silently while this side streams to it (a partition, a host gone) is noticed then,
  // and what runs for it is cancelled; a live peer acknowledges within round trips, also one
  // that reads slowly (its zero-window probes are acknowledged).
  std::chrono::milliseconds unacked_timeout{10000};
  bool ping_first = false;                          // Ping at Start
  std::shared_ptr<ByteBudget> budget;               // partial-frame bytes, process-wide
  std::shared_ptr<const AuthKeys> server_auth;      // challenge the peer (when enabled)
  std::optional<ClientAuth> client_auth;            // answer the peer's challenge
  size_t trusted_max_message_bytes = 64u << 20;     // frame limit once a worker/router proved
  std::shared_ptr<TlsContext> tls;                  // TLS on this side of the link (null: plain)
  std::string tls_host;                             // client side: the name the server must hold
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
  // Started, and the TLS handshake (if any) completed: frames flow. Any thread.
  bool established() const { return established_.load(std::memory_order_acquire); }
  size_t queued_bytes() const;
  uint64_t id() const { return id_; }
  // The role the peer proved (loop thread); nullopt while unauthenticated or when the server
  // requires no authentication.
  std::optional<schema::AuthRole> peer_role() const { return peer_role_; }
  // Whether the peer presented a certificate the cluster CA verified (loop thread; false on plain
  // TCP and before the TLS handshake completed).
  bool peer_certified() const { return peer_certified_; }

 private:
  Connection(asio::ip::tcp::socket socket, ConnectionOptions options);
  void DoRead();
  void DoWrite();
  void ArmTimer(std::chrono::milliseconds timeout);
  void ArmKeepalive();
  void AccountBuffered();
  // Handles connection-level frames (keepalive, authentication, and while it waits for the
  // server's Challenge the answers that say none will come); true when consumed.
  bool HandleControl(DecodedMessage& message);
  bool Gated() const;  // client_auth, and the server's Challenge not answered yet
  void RefuseAndClose(const Status& status);
  // Queues a frame past the authentication gate (keepalive and authentication frames).
  Status Enqueue(std::vector<uint8_t> frame, bool bypass_gate);
  void CloseOnLoop(const Status& reason);
  // Starts the protocol once the transport is ready (after the TLS handshake).
  void Begin();
  bool ending() const;  // closed, or refusing (a TLS refusal waits for its Error to be written)

  std::unique_ptr<Transport> transport_;
  asio::steady_timer timer_;
  asio::steady_timer frame_timer_;
  asio::steady_timer keepalive_timer_;
  const ConnectionOptions options_;
  const uint64_t id_;
  FrameDecoder decoder_;
  std::array<uint8_t, 16384> read_buffer_;
  MessageHandler on_message_;
  CloseHandler on_close_;
  bool got_first_message_ = false;
  bool writing_ = false;  // loop thread only
  bool frame_timer_armed_ = false;
  size_t reserved_ = 0;  // bytes held in options_.budget
  std::chrono::steady_clock::time_point last_received_;
  std::chrono::steady_clock::time_point last_sent_;  // a write completed (loop thread)
  std::vector<uint8_t> challenge_;  // server side: the nonce sent; empty once authenticated
  bool awaiting_auth_ = false;
  std::optional<schema::AuthRole> peer_role_;
  uint64_t next_ping_ = 1;
  bool peer_certified_ = false;
  std::atomic<bool> established_{false};
  bool refusing_ = false;  // loop thread: an Error is being flushed before the close
  Status refusal_;         // loop thread: the close reason once it is

  mutable std::mutex mu_;
  std::deque<std::vector<uint8_t>> outgoing_;  // guarded by mu_
  std::deque<std::vector<uint8_t>> held_;      // guarded by mu_; sent once authenticated
  bool gated_ = false;                         // guarded by mu_; client_auth, not yet challenged
  size_t outgoing_bytes_ = 0;                  // guarded by mu_ (held_ included)
  bool closed_ = false;                        // guarded by mu_
};

}  // namespace chunkserve::wire

#endif  // CHUNKSERVE_RUNTIME_WIRE_CONNECTION_H_
