// TLS for wire links: OpenSSL through Asio's ssl support, TLS 1.2 or later.
//
// A cluster has one certificate authority (the CA file). Routers and workers each hold a
// certificate it signed (cert and key files) whose subject alternative names cover the addresses
// others dial (the router's --listen host as clients and workers reach it, the worker's
// --advertise host). Then:
//  - a server context presents its certificate; it verifies a certificate the peer presents
//    against the CA (a peer presenting none is accepted at this layer: clients need none);
//  - a client context verifies the server's certificate against the CA and against the host name
//    or address it dialled, and presents its own certificate when it has one (mutual TLS: a
//    router admits a worker only with a certificate the CA verified, Transport::peer_certified).
// Issue certificates from the cluster CA to routers and workers only: any holder of one counts as
// a cluster member.
//
// Thread safety: a context is immutable once created and shared by every link of a process.
#ifndef CHUNKSERVE_RUNTIME_WIRE_TLS_H_
#define CHUNKSERVE_RUNTIME_WIRE_TLS_H_

#include <memory>
#include <string>

#include "runtime/base/status.h"

namespace boost::asio::ssl {
class context;
}  // namespace boost::asio::ssl

namespace chunkserve::wire {

// PEM files. `ca_file` set = TLS on.
struct TlsFiles {
  std::string cert_file;  // this process's certificate chain
  std::string key_file;   // its private key
  std::string ca_file;    // the cluster CA: verifies peers
  bool enabled() const { return !ca_file.empty(); }
};

class TlsContext {
 public:
  enum class Side { kServer, kClient };

  // A server context needs all three files; a client context needs the CA, and the certificate
  // and key together or neither. InvalidArgument naming the file that cannot be used.
  static Result<std::shared_ptr<TlsContext>> Create(Side side, const TlsFiles& files);
  ~TlsContext();

  Side side() const { return side_; }
  boost::asio::ssl::context& native() { return *context_; }

 private:
  TlsContext(Side side, std::unique_ptr<boost::asio::ssl::context> context);
  const Side side_;
  std::unique_ptr<boost::asio::ssl::context> context_;
};

// What a process needs for its links: a server context for what it accepts and a client context
// for what it dials (null when TLS is off).
struct TlsContexts {
  std::shared_ptr<TlsContext> server;
  std::shared_ptr<TlsContext> client;
  bool enabled() const { return server != nullptr; }
};
Result<TlsContexts> MakeTlsContexts(const TlsFiles& files);

}  // namespace chunkserve::wire

#endif  // CHUNKSERVE_RUNTIME_WIRE_TLS_H_
