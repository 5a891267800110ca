// Transport: the byte stream under a wire link, plain TCP or TLS over TCP (tls.h), behind one
// asynchronous interface, so that Connection and WireClient do not care which.
//
// A TLS server first checks that the peer speaks TLS: a peer whose first byte is not a TLS
// record fails the handshake with plaintext_peer() set, so that the caller can tell it, in its own
// framing, that TLS is required. A peer that closes without a TLS close_notify is reported as an
// orderly end of stream (asio::error::eof), as on plain TCP.
//
// Thread safety: none; one io_context thread drives a transport.
#ifndef CHUNKSERVE_RUNTIME_WIRE_TRANSPORT_H_
#define CHUNKSERVE_RUNTIME_WIRE_TRANSPORT_H_

#include "runtime/wire/asio.h"
#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "runtime/base/status.h"
#include "runtime/wire/tls.h"

namespace chunkserve::wire {

class Transport {
 public:
  using Done = std::function<void(const asio::error_code&)>;
  using IoDone = std::function<void(const asio::error_code&, size_t)>;

  // Plain TCP.
  explicit Transport(asio::ip::tcp::socket socket);
  // TLS over `socket` on the side `tls` was made for; a client verifies the server's certificate
  // against `host` (the name or address it dialled).
  Transport(asio::ip::tcp::socket socket, std::shared_ptr<TlsContext> tls, const std::string& host);
  ~Transport();
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  bool tls() const { return tls_ != nullptr; }
  asio::ip::tcp::socket& socket();
  asio::any_io_executor executor();

  // The TLS handshake; completes at once on plain TCP.
  void AsyncHandshake(Done done);
  void AsyncReadSome(asio::mutable_buffer buffer, IoDone done);
  // Writes all of `buffer`.
  void AsyncWrite(asio::const_buffer buffer, IoDone done);
  // Writes what the socket takes now, without blocking and beneath TLS (plain TCP, or a TLS
  // server telling a plaintext peer that TLS is required). Best effort.
  void TryWriteRaw(asio::const_buffer buffer);
  // Closes the socket; pending operations complete with operation_aborted.
  void Close();

  // TLS, after the handshake: the peer presented a certificate the cluster CA verified.
  bool peer_certified() const;
  // TLS, after a failed handshake: why this side refused the peer's certificate (" (certificate
  // revoked)", " (unable to get local issuer certificate)", ...), or "" when it did not.
  std::string VerifyFailure() const;
  // TLS, after the handshake: Unauthenticated once the context's revocation lists, reloaded since
  // this link was made, revoke the peer's certificate (checked once per reload; cheap otherwise).
  Status RecheckPeer();
  // TLS server, after a failed handshake: the peer's first byte was not a TLS record.
  bool plaintext_peer() const { return plaintext_peer_; }

 private:
  struct Tls;
  asio::ip::tcp::socket socket_;  // plain TCP; moved into tls_ otherwise
  std::unique_ptr<Tls> tls_;
  bool plaintext_peer_ = false;
};

}  // namespace chunkserve::wire

#endif  // CHUNKSERVE_RUNTIME_WIRE_TRANSPORT_H_
