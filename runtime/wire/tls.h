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
// Revocation: with a CRL file (the CA's certificate revocation lists, PEM) both sides refuse a peer
// whose certificate is listed, and a peer certificate of that CA is accepted only while a CRL of it
// is loaded and current (OpenSSL's CRL check on the leaf). ReloadCrl() re-reads the file and swaps
// the verify store; handshakes from then on use it, and links already open check their peer again
// at their next read or write (Transport::RecheckPeer) and close if the new lists revoke it.
// CrlWatcher re-reads the file when it changes.
//
// Thread safety: a context is shared by every link of a process; ReloadCrl() may run beside
// handshakes (the store swap and every new stream take the context's lock).
#ifndef CHUNKSERVE_RUNTIME_WIRE_TLS_H_
#define CHUNKSERVE_RUNTIME_WIRE_TLS_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/base/status.h"

namespace boost::asio::ssl {
class context;
}  // namespace boost::asio::ssl
struct ssl_st;         // OpenSSL's SSL
struct x509_store_st;  // OpenSSL's X509_STORE

namespace chunkserve::wire {

// PEM files. `ca_file` set = TLS on.
struct TlsFiles {
  std::string cert_file;  // this process's certificate chain
  std::string key_file;   // its private key
  std::string ca_file;    // the cluster CA: verifies peers
  std::string crl_file;   // optional: the CA's revocation lists
  bool enabled() const { return !ca_file.empty(); }
};

class TlsContext {
 public:
  enum class Side { kServer, kClient };

  // A server context needs all three files; a client context needs the CA, and the certificate
  // and key together or neither. InvalidArgument naming the file that cannot be used; a CRL file
  // must hold at least one CRL, each signed by a certificate of the CA file and not expired.
  static Result<std::shared_ptr<TlsContext>> Create(Side side, const TlsFiles& files);
  ~TlsContext();

  Side side() const { return side_; }
  boost::asio::ssl::context& native() { return *context_; }
  // Held while a stream (an SSL object) is made from native(): ReloadCrl() swaps the verify store
  // under it.
  std::unique_lock<std::mutex> LockForNewStream() { return std::unique_lock<std::mutex>(mu_); }

  // Re-reads the CRL file (no-op without one). On error the context keeps the lists it had.
  Status ReloadCrl();
  // Certificates the loaded lists revoke (0 without a CRL file).
  size_t revoked_count() const;
  // Counts the lists ReloadCrl() installed: a stream made earlier checks its peer again.
  uint64_t crl_generation() const { return crl_generation_.load(std::memory_order_acquire); }
  // Whether the lists loaded now revoke the certificate the peer of `ssl` (a stream of this
  // context, after its handshake) presented: its chain verified again fails as revoked.
  bool Revokes(ssl_st* ssl) const;

 private:
  TlsContext(Side side, TlsFiles files, std::unique_ptr<boost::asio::ssl::context> context);
  const Side side_;
  const TlsFiles files_;
  std::unique_ptr<boost::asio::ssl::context> context_;
  mutable std::mutex mu_;
  size_t revoked_ = 0;              // guarded by mu_
  x509_store_st* store_ = nullptr;  // the verify store with the lists; guarded by mu_, owned
  std::atomic<uint64_t> crl_generation_{0};
};

// Re-reads a CRL file into contexts when it changes (size, time or inode, checked every
// `period`), and logs what it loaded or why it kept the old lists. One thread serves every
// watcher of the process (a program with many clients runs one, not one per client); it runs
// while any watcher exists. Destruction stops watching (a reload that has started may finish
// after it; the watch holds its contexts until then).
class CrlWatcher {
 public:
  CrlWatcher(std::string crl_file, std::vector<std::shared_ptr<TlsContext>> contexts,
             std::chrono::milliseconds period = std::chrono::seconds(1));
  ~CrlWatcher();
  CrlWatcher(const CrlWatcher&) = delete;
  CrlWatcher& operator=(const CrlWatcher&) = delete;

  struct Watch;  // tls.cc

 private:
  std::shared_ptr<Watch> watch_;
};

// Threads the shared watcher has started in this process (tests: one serves many watchers).
size_t CrlWatcherThreadsStarted();

// What a process needs for its links: a server context for what it accepts and a client context
// for what it dials (null when TLS is off).
struct TlsContexts {
  std::shared_ptr<TlsContext> server;
  std::shared_ptr<TlsContext> client;
  std::shared_ptr<CrlWatcher> crl_watcher;  // set with a CRL file: reloads both contexts
  bool enabled() const { return server != nullptr; }
};
Result<TlsContexts> MakeTlsContexts(const TlsFiles& files);

}  // namespace chunkserve::wire

#endif  // CHUNKSERVE_RUNTIME_WIRE_TLS_H_
