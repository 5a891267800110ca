#include "runtime/wire/tls.h"

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <thread>

#include "runtime/wire/asio.h"
#include <boost/asio/ssl.hpp>
#include <utility>

#include "runtime/base/logging.h"

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

struct StoreFree {
  void operator()(X509_STORE* s) const { X509_STORE_free(s); }
};
struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct CrlFree {
  void operator()(X509_CRL* c) const { X509_CRL_free(c); }
};
using StorePtr = std::unique_ptr<X509_STORE, StoreFree>;
using BioPtr = std::unique_ptr<BIO, BioFree>;
using CrlPtr = std::unique_ptr<X509_CRL, CrlFree>;

// OpenSSL's last queued error, and the queue cleared.
std::string OpenSslError() {
  const unsigned long e = ERR_peek_last_error();
  char text[256] = "unknown error";
  if (e != 0) ERR_error_string_n(e, text, sizeof(text));
  ERR_clear_error();
  return text;
}

std::string NameOf(const X509_NAME* name) {
  char text[256] = "";
  X509_NAME_oneline(name, text, sizeof(text));
  return text;
}

// Revocation lists of the largest public CAs are tens of MiB; beyond this a file is a mistake.
constexpr off_t kMaxCrlFileBytes = off_t{256} << 20;

// The peer-verification store of a context with a CRL file: the CA certificates the context
// trusts (loaded from the CA file when it was made) and the file's revocation lists, with the
// leaf's revocation checked. Each list must be signed by one of those CA certificates and not be
// past its next update (OpenSSL would refuse every peer).
Result<StorePtr> MakeVerifyStore(SSL_CTX* context, const TlsFiles& files, size_t* revoked) {
  const std::string crl_what = "TLS CRL file " + files.crl_file;
  StorePtr store(X509_STORE_new());
  if (store == nullptr)
    return Status::ResourceExhausted("TLS: cannot allocate a certificate store");
  std::unique_ptr<STACK_OF(X509), void (*)(STACK_OF(X509)*)> cas(
      X509_STORE_get1_all_certs(SSL_CTX_get_cert_store(context)),
      [](STACK_OF(X509) * certs) { sk_X509_pop_free(certs, X509_free); });
  if (cas == nullptr) return Status::Internal("TLS: cannot list the CA certificates");
  for (int i = 0; i < sk_X509_num(cas.get()); ++i) {
    if (X509_STORE_add_cert(store.get(), sk_X509_value(cas.get(), i)) != 1) {
      return Status::Internal("TLS: cannot copy the CA certificates: " + OpenSslError());
    }
  }
  // A regular file of bounded size: opening a FIFO that nobody writes to never returns.
  struct stat st {};
  if (::stat(files.crl_file.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return Status::InvalidArgument(crl_what + ": not a readable regular file");
  }
  if (st.st_size > kMaxCrlFileBytes) {
    return Status::InvalidArgument(crl_what + ": larger than " +
                                   std::to_string(kMaxCrlFileBytes >> 20) + " MiB");
  }
  BioPtr bio(BIO_new_file(files.crl_file.c_str(), "r"));
  if (bio == nullptr) return Status::InvalidArgument(crl_what + ": " + OpenSslError());
  size_t lists = 0;
  *revoked = 0;
  for (;;) {
    CrlPtr crl(PEM_read_bio_X509_CRL(bio.get(), nullptr, nullptr, nullptr));
    if (crl == nullptr) {
      const unsigned long e = ERR_peek_last_error();
      if (ERR_GET_REASON(e) == PEM_R_NO_START_LINE) {  // no further list
        ERR_clear_error();
        break;
      }
      return Status::InvalidArgument(crl_what + ": " + OpenSslError());
    }
    const X509_NAME* issuer = X509_CRL_get_issuer(crl.get());
    bool signed_by_ca = false;
    for (int i = 0; i < sk_X509_num(cas.get()) && !signed_by_ca; ++i) {
      X509* ca = sk_X509_value(cas.get(), i);
      signed_by_ca = X509_NAME_cmp(X509_get_subject_name(ca), issuer) == 0 &&
                     X509_CRL_verify(crl.get(), X509_get0_pubkey(ca)) == 1;
    }
    ERR_clear_error();
    if (!signed_by_ca) {
      return Status::InvalidArgument(crl_what + ": the list of " + NameOf(issuer) +
                                     " is not signed by a certificate of the CA file " +
                                     files.ca_file);
    }
    const ASN1_TIME* next = X509_CRL_get0_nextUpdate(crl.get());
    if (next != nullptr && X509_cmp_current_time(next) < 0) {
      return Status::InvalidArgument(crl_what + ": the list of " + NameOf(issuer) +
                                     " is past its next update: publish a fresh one");
    }
    const STACK_OF(X509_REVOKED)* entries = X509_CRL_get_REVOKED(crl.get());
    if (entries != nullptr) *revoked += static_cast<size_t>(sk_X509_REVOKED_num(entries));
    if (X509_STORE_add_crl(store.get(), crl.get()) != 1) {
      return Status::InvalidArgument(crl_what + ": " + OpenSslError());
    }
    ++lists;
  }
  if (lists == 0) return Status::InvalidArgument(crl_what + " holds no revocation list");
  X509_STORE_set_flags(store.get(), X509_V_FLAG_CRL_CHECK);
  return store;
}

}  // namespace

TlsContext::TlsContext(Side side, TlsFiles files, std::unique_ptr<asio::ssl::context> context)
    : side_(side), files_(std::move(files)), context_(std::move(context)) {}

TlsContext::~TlsContext() {
  if (store_ != nullptr) X509_STORE_free(store_);
}

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
  std::shared_ptr<TlsContext> out(new TlsContext(side, files, std::move(context)));
  CHUNKSERVE_RETURN_IF_ERROR(out->ReloadCrl());
  return out;
}

Status TlsContext::ReloadCrl() {
  if (files_.crl_file.empty()) return Status::Ok();
  size_t revoked = 0;
  CHUNKSERVE_ASSIGN_OR_RETURN(StorePtr store,
                              MakeVerifyStore(context_->native_handle(), files_, &revoked));
  std::lock_guard<std::mutex> lock(mu_);
  // Streams made from now on verify against the new store; each stream holds a reference to the
  // store it was made with (OpenSSL copies the context's certificate settings into every SSL).
  if (SSL_CTX_set1_verify_cert_store(context_->native_handle(), store.get()) != 1) {
    return Status::Internal("TLS: cannot install the verify store: " + OpenSslError());
  }
  revoked_ = revoked;
  if (store_ != nullptr) X509_STORE_free(store_);
  store_ = store.release();
  crl_generation_.fetch_add(1, std::memory_order_release);
  return Status::Ok();
}

bool TlsContext::Revokes(SSL* ssl) const {
  X509* leaf = SSL_get0_peer_certificate(ssl);
  if (leaf == nullptr) return false;  // a client without a certificate: nothing to revoke
  StorePtr store;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (store_ == nullptr || X509_STORE_up_ref(store_) != 1) return false;
    store.reset(store_);
  }
  std::unique_ptr<X509_STORE_CTX, void (*)(X509_STORE_CTX*)> check(X509_STORE_CTX_new(),
                                                                   &X509_STORE_CTX_free);
  bool revoked = false;
  if (check != nullptr &&
      X509_STORE_CTX_init(check.get(), store.get(), leaf, SSL_get_peer_cert_chain(ssl)) == 1) {
    revoked = X509_verify_cert(check.get()) != 1 &&
              X509_STORE_CTX_get_error(check.get()) == X509_V_ERR_CERT_REVOKED;
  }
  ERR_clear_error();
  return revoked;
}

size_t TlsContext::revoked_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return revoked_;
}

namespace {

// What tells a rewritten file apart: size, modification time and inode (a file moved into place).
struct FileStamp {
  bool ok = false;
  off_t size = 0;
  int64_t mtime_ns = 0;
  ino_t inode = 0;
  bool operator==(const FileStamp& o) const {
    return ok == o.ok && size == o.size && mtime_ns == o.mtime_ns && inode == o.inode;
  }
};

FileStamp Stamp(const std::string& path) {
  struct stat st {};
  FileStamp s;
  if (::stat(path.c_str(), &st) != 0) return s;
  s.ok = true;
  s.size = st.st_size;
  s.mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  s.inode = st.st_ino;
  return s;
}

}  // namespace

struct CrlWatcher::Watch {
  std::string file;
  std::vector<std::shared_ptr<TlsContext>> contexts;
  std::chrono::milliseconds period;
  std::chrono::steady_clock::time_point next;  // guarded by the registry's lock
  std::mutex mu;                                // one check at a time
  FileStamp seen;                               // guarded by mu
};

namespace {

// Stats the watch's file and reloads its contexts when the file changed.
void Check(CrlWatcher::Watch& w) {
  std::lock_guard<std::mutex> lock(w.mu);
  const FileStamp now = Stamp(w.file);
  if (now == w.seen) return;
  w.seen = now;
  if (!now.ok) {
    LOG(WARNING) << "TLS CRL file " << w.file << " cannot be read; keeping the lists loaded";
    return;
  }
  Status status = Status::Ok();
  for (const auto& context : w.contexts) {
    Status s = context->ReloadCrl();
    if (!s.ok()) status = s;
  }
  if (status.ok()) {
    LOG(INFO) << "TLS CRL file " << w.file << " reloaded: "
              << (w.contexts.empty() ? 0 : w.contexts.front()->revoked_count())
              << " certificates revoked";
  } else {
    LOG(WARNING) << status.ToString() << "; keeping the lists loaded before";
  }
}

// The process's watches and the one thread that checks them. The thread runs while there are
// watches: the last one removed stops it (and waits for it), the next one added starts another.
// Each thread has its own stop flag, so one that is stopping never outlives its flag's meaning.
class CrlWatchers {
 public:
  static CrlWatchers& Get() {
    static CrlWatchers* watchers = new CrlWatchers();  // never destroyed: no thread outlives use
    return *watchers;
  }

  void Add(std::shared_ptr<CrlWatcher::Watch> w) {
    std::lock_guard<std::mutex> lock(mu_);
    w->next = std::chrono::steady_clock::now() + w->period;
    watches_.push_back(std::move(w));
    if (!thread_.joinable()) {
      stop_ = std::make_shared<bool>(false);
      thread_ = std::thread([this, stop = stop_] { Run(stop); });
    }
    cv_.notify_all();
  }

  void Remove(const std::shared_ptr<CrlWatcher::Watch>& w) {
    std::thread ending;
    {
      std::lock_guard<std::mutex> lock(mu_);
      watches_.erase(std::remove(watches_.begin(), watches_.end(), w), watches_.end());
      if (watches_.empty() && thread_.joinable()) {
        *stop_ = true;
        ending = std::move(thread_);
      }
    }
    cv_.notify_all();
    if (ending.joinable()) ending.join();
  }

  size_t threads_started() const { return threads_started_.load(); }

 private:
  void Run(const std::shared_ptr<bool>& stop) {
    threads_started_.fetch_add(1);
    std::unique_lock<std::mutex> lock(mu_);
    while (!*stop) {
      const auto now = std::chrono::steady_clock::now();
      std::vector<std::shared_ptr<CrlWatcher::Watch>> due;
      auto wake = now + std::chrono::seconds(1);
      for (const auto& w : watches_) {
        if (w->next <= now) {
          due.push_back(w);
          w->next = now + w->period;
        }
        wake = std::min(wake, w->next);
      }
      if (!due.empty()) {
        lock.unlock();  // reloading parses files: not under the registry's lock
        for (const auto& w : due) Check(*w);
        lock.lock();
        continue;
      }
      cv_.wait_until(lock, wake);
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::shared_ptr<CrlWatcher::Watch>> watches_;  // guarded by mu_
  std::thread thread_;                                       // guarded by mu_
  std::shared_ptr<bool> stop_;                               // the running thread's; mu_
  std::atomic<size_t> threads_started_{0};
};

}  // namespace

CrlWatcher::CrlWatcher(std::string crl_file, std::vector<std::shared_ptr<TlsContext>> contexts,
                       std::chrono::milliseconds period)
    : watch_(std::make_shared<Watch>()) {
  watch_->file = std::move(crl_file);
  watch_->contexts = std::move(contexts);
  watch_->period = period;
  watch_->seen = Stamp(watch_->file);  // what the contexts were created from
  CrlWatchers::Get().Add(watch_);
}

CrlWatcher::~CrlWatcher() { CrlWatchers::Get().Remove(watch_); }

size_t CrlWatcherThreadsStarted() { return CrlWatchers::Get().threads_started(); }

Result<TlsContexts> MakeTlsContexts(const TlsFiles& files) {
  TlsContexts out;
  if (!files.enabled()) {
    if (!files.crl_file.empty()) {
      return Status::InvalidArgument("a TLS CRL without --tls-ca: set the CA, certificate and key");
    }
    if (!files.cert_file.empty() || !files.key_file.empty()) {
      return Status::InvalidArgument("a TLS certificate or key without --tls-ca: set all three");
    }
    return out;
  }
  CHUNKSERVE_ASSIGN_OR_RETURN(out.server, TlsContext::Create(TlsContext::Side::kServer, files));
  CHUNKSERVE_ASSIGN_OR_RETURN(out.client, TlsContext::Create(TlsContext::Side::kClient, files));
  if (!files.crl_file.empty()) {
    out.crl_watcher = std::make_shared<CrlWatcher>(
        files.crl_file, std::vector<std::shared_ptr<TlsContext>>{out.server, out.client});
  }
  return out;
}

}  // namespace chunkserve::wire
