// WireClient: a small blocking client for one framed connection (tests, tools, the C client).
//
//   ASSIGN_OR_RETURN(auto client, WireClient::Connect("127.0.0.1", port, 5s));
//   capnp::MallocMessageBuilder m; auto g = m.initRoot<schema::Envelope>().initGenerate(); ...
//   RETURN_IF_ERROR(client->Send(m));
//   ASSIGN_OR_RETURN(DecodedMessage reply, client->Receive(5s));
//
// Owns its own io_context; every call blocks the calling thread up to its timeout. Receive
// returns DeadlineExceeded on timeout, Unavailable when the peer closed, DataLoss on a
// malformed frame. Keepalive frames are handled inside Receive (a Ping is answered, a Pong
// skipped). With `auth`, Connect sends a Ping, waits for the server's Challenge and answers it
// before returning: a server that answers the Ping first requires no authentication
// (Unauthenticated at once), one that answers with an Error refused the connection (a TLS server
// to a plaintext client: Unauthenticated, "requires TLS"), and none within the timeout is
// Unauthenticated too; without `auth`, a Challenge makes
// Receive return Unauthenticated. With `tls` (a client TlsContext) the connection is TLS and the
// server's certificate must match `host`; a failed handshake is Unauthenticated.
//
// Thread safety: none; one thread uses a client at a time.
#ifndef CHUNKSERVE_RUNTIME_WIRE_CLIENT_H_
#define CHUNKSERVE_RUNTIME_WIRE_CLIENT_H_

#include <capnp/message.h>

#include <array>
#include "runtime/wire/asio.h"
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/base/status.h"
#include "runtime/wire/auth.h"
#include "runtime/wire/framing.h"
#include "runtime/wire/tls.h"
#include "runtime/wire/transport.h"

namespace chunkserve::wire {

class WireClient {
 public:
  static Result<std::unique_ptr<WireClient>> Connect(const std::string& host, uint16_t port,
                                                     std::chrono::milliseconds timeout,
                                                     ReaderLimits limits = {},
                                                     std::optional<ClientAuth> auth = {},
                                                     std::shared_ptr<TlsContext> tls = nullptr);
  ~WireClient();

  Status Send(capnp::MessageBuilder& message);
  // Writes raw bytes (tests send malformed frames with it).
  Status SendRaw(const std::vector<uint8_t>& bytes);
  Result<DecodedMessage> Receive(std::chrono::milliseconds timeout);
  // The next frame as it arrived, keepalive and authentication frames included.
  Result<DecodedMessage> ReceiveRaw(std::chrono::milliseconds timeout);
  // Closes the socket (the peer sees a disconnect).
  void Close();
  // Whether the server presented a certificate the CA verified (TLS only).
  bool peer_certified() const { return transport_ != nullptr && transport_->peer_certified(); }

 private:
  WireClient(ReaderLimits limits);
  // Runs the loop until `*done` or `timeout`; false on timeout (the operation is then cancelled
  // and has completed).
  bool RunUntil(const bool* done, std::chrono::milliseconds timeout);
  asio::io_context io_;
  std::unique_ptr<Transport> transport_;
  FrameDecoder decoder_;
  std::array<uint8_t, 16384> buffer_{};
  bool open_ = false;
};

}  // namespace chunkserve::wire

#endif  // CHUNKSERVE_RUNTIME_WIRE_CLIENT_H_
