#include "runtime/wire/transport.h"

#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <boost/asio/ssl.hpp>
#include <cstdint>
#include <mutex>
#include <system_error>
#include <utility>

namespace chunkserve::wire {
namespace {

// The first byte of every TLS record that opens a connection (a handshake record).
constexpr uint8_t kTlsHandshakeRecord = 0x16;

// A peer that closes without TLS's close_notify ends the stream like a TCP close does.
asio::error_code Normalize(const asio::error_code& ec) {
  if (ec == asio::ssl::error::stream_truncated) return asio::error::eof;
  return ec;
}

}  // namespace

struct Transport::Tls {
  Tls(asio::ip::tcp::socket socket, std::shared_ptr<TlsContext> c)
      : context(std::move(c)),
        made(context->LockForNewStream()),
        stream(std::move(socket), context->native()),
        checked_generation(context->crl_generation()) {
    made.unlock();
  }
  std::shared_ptr<TlsContext> context;  // outlives the stream
  std::unique_lock<std::mutex> made;    // held while the stream is made (TlsContext::ReloadCrl)
  asio::ssl::stream<asio::ip::tcp::socket> stream;
  uint64_t checked_generation;  // the lists the peer was last checked against
};

Transport::Transport(asio::ip::tcp::socket socket) : socket_(std::move(socket)) {}

Transport::Transport(asio::ip::tcp::socket socket, std::shared_ptr<TlsContext> tls,
                     const std::string& host)
    : socket_(socket.get_executor()),
      tls_(std::make_unique<Tls>(std::move(socket), std::move(tls))) {
  if (tls_->context->side() != TlsContext::Side::kClient) return;
  SSL* ssl = tls_->stream.native_handle();
  asio::error_code ec;
  (void)asio::ip::make_address(host, ec);
  const bool is_address = !ec;
  // Server name indication for host names (not for addresses, as RFC 6066 says).
  if (!is_address && !host.empty()) SSL_set_tlsext_host_name(ssl, host.c_str());
  tls_->stream.set_verify_callback(asio::ssl::host_name_verification(host), ec);
}

Transport::~Transport() = default;

asio::ip::tcp::socket& Transport::socket() { return tls_ ? tls_->stream.next_layer() : socket_; }

asio::any_io_executor Transport::executor() { return socket().get_executor(); }

void Transport::AsyncHandshake(Done done) {
  if (!tls_) {
    asio::post(executor(), [done = std::move(done)] { done(asio::error_code()); });
    return;
  }
  if (tls_->context->side() == TlsContext::Side::kClient) {
    tls_->stream.async_handshake(asio::ssl::stream_base::client, std::move(done));
    return;
  }
  // Server: look at the first byte before OpenSSL does, to tell a plaintext peer apart.
  socket().async_wait(asio::ip::tcp::socket::wait_read,
                      [this, done = std::move(done)](const asio::error_code& ec) mutable {
                        if (ec) {
                          done(ec);
                          return;
                        }
                        uint8_t first = 0;
                        asio::error_code peek;
                        const size_t n = socket().receive(asio::buffer(&first, 1),
                                                          asio::socket_base::message_peek, peek);
                        if (peek || n == 0) {
                          done(peek ? peek : asio::error::eof);
                          return;
                        }
                        if (first != kTlsHandshakeRecord) {
                          plaintext_peer_ = true;
                          done(boost::system::errc::make_error_code(boost::system::errc::protocol_error));
                          return;
                        }
                        tls_->stream.async_handshake(asio::ssl::stream_base::server,
                                                     std::move(done));
                      });
}

void Transport::AsyncReadSome(asio::mutable_buffer buffer, IoDone done) {
  auto wrapped = [done = std::move(done)](const asio::error_code& ec, size_t n) {
    done(Normalize(ec), n);
  };
  if (tls_) {
    tls_->stream.async_read_some(buffer, std::move(wrapped));
  } else {
    socket_.async_read_some(buffer, std::move(wrapped));
  }
}

void Transport::AsyncWrite(asio::const_buffer buffer, IoDone done) {
  if (tls_) {
    asio::async_write(tls_->stream, buffer, std::move(done));
  } else {
    asio::async_write(socket_, buffer, std::move(done));
  }
}

void Transport::TryWriteRaw(asio::const_buffer buffer) {
  asio::error_code ignored;
  socket().non_blocking(true, ignored);
  asio::write(socket(), buffer, ignored);
}

void Transport::Close() {
  asio::error_code ignored;
  socket().shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
  socket().close(ignored);
}

Status Transport::RecheckPeer() {
  if (!tls_) return Status::Ok();
  const uint64_t generation = tls_->context->crl_generation();
  if (generation == tls_->checked_generation) return Status::Ok();
  tls_->checked_generation = generation;
  if (tls_->context->Revokes(tls_->stream.native_handle())) {
    return Status::Unauthenticated("the peer's TLS certificate has been revoked (--tls-crl)");
  }
  return Status::Ok();
}

std::string Transport::VerifyFailure() const {
  if (!tls_) return "";
  const long result = SSL_get_verify_result(tls_->stream.native_handle());
  if (result == X509_V_OK) return "";
  return std::string(" (") + X509_verify_cert_error_string(result) + ")";
}

bool Transport::peer_certified() const {
  if (!tls_) return false;
  SSL* ssl = tls_->stream.native_handle();
  return SSL_get0_peer_certificate(ssl) != nullptr && SSL_get_verify_result(ssl) == X509_V_OK;
}

}  // namespace chunkserve::wire
