#include "runtime/wire/tls.h"

#include <openssl/ssl.h>

#include "runtime/wire/asio.h"
#include <boost/asio/ssl.hpp>
#include <utility>

namespace chunkserve::wire {
namespace {

// Applies `load` and turns an Asio error into InvalidArgument naming `what`.
template <typename Load>
Status Use(const std::string& what, const std::string& file, Load load) {
  asio::error_code ec;
  load(ec);
  if (ec) return Status::InvalidArgument("TLS " + what + " " + file + ": " + ec.message());
  return Status::Ok();
}

}  // namespace

TlsContext::TlsContext(Side side, std::unique_ptr<asio::ssl::context> context)
    : side_(side), context_(std::move(context)) {}

TlsContext::~TlsContext() = default;

Result<std::shared_ptr<TlsContext>> TlsContext::Create(Side side, const TlsFiles& files) {
  if (files.ca_file.empty()) return Status::InvalidArgument("TLS needs the cluster CA file");
  if (files.cert_file.empty() != files.key_file.empty()) {
    return Status::InvalidArgument("TLS needs a certificate and its key together");
  }
  if (side == Side::kServer && files.cert_file.empty()) {
    return Status::InvalidArgument("a TLS server needs a certificate and key");
  }
  auto context = std::make_unique<asio::ssl::context>(
      side == Side::kServer ? asio::ssl::context::tls_server : asio::ssl::context::tls_client);
  SSL_CTX* native = context->native_handle();
  if (SSL_CTX_set_min_proto_version(native, TLS1_2_VERSION) != 1) {
    return Status::Internal("TLS: cannot require TLS 1.2 or later");
  }
  asio::error_code ec;
  context->set_options(asio::ssl::context::default_workarounds | asio::ssl::context::no_compression,
                       ec);
  CHUNKSERVE_RETURN_IF_ERROR(Use("CA file", files.ca_file, [&](asio::error_code& e) {
    context->load_verify_file(files.ca_file, e);
  }));
  if (!files.cert_file.empty()) {
    CHUNKSERVE_RETURN_IF_ERROR(Use("certificate file", files.cert_file, [&](asio::error_code& e) {
      context->use_certificate_chain_file(files.cert_file, e);
    }));
    CHUNKSERVE_RETURN_IF_ERROR(Use("key file", files.key_file, [&](asio::error_code& e) {
      context->use_private_key_file(files.key_file, asio::ssl::context::pem, e);
    }));
    if (SSL_CTX_check_private_key(native) != 1) {
      return Status::InvalidArgument("TLS key file " + files.key_file +
                                     " does not match the certificate " + files.cert_file);
    }
  }
  // Servers verify a certificate when the peer presents one (and accept peers without: clients);
  // clients always verify the server.
  context->set_verify_mode(asio::ssl::verify_peer, ec);
  if (ec) return Status::Internal("TLS: " + ec.message());
  return std::shared_ptr<TlsContext>(new TlsContext(side, std::move(context)));
}

Result<TlsContexts> MakeTlsContexts(const TlsFiles& files) {
  TlsContexts out;
  if (!files.enabled()) {
    if (!files.cert_file.empty() || !files.key_file.empty()) {
      return Status::InvalidArgument("a TLS certificate or key without --tls-ca: set all three");
    }
    return out;
  }
  CHUNKSERVE_ASSIGN_OR_RETURN(out.server, TlsContext::Create(TlsContext::Side::kServer, files));
  CHUNKSERVE_ASSIGN_OR_RETURN(out.client, TlsContext::Create(TlsContext::Side::kClient, files));
  return out;
}

}  // namespace chunkserve::wire
