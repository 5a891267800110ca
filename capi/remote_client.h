// RemoteClient: the C ABI's chunkserve_client_t, a connection to a router or worker speaking the
// client protocol of runtime/wire/chunkserve.capnp (Generate -> Token* Finish | Error; Cancel).
//
// Each request gets a sched::RequestStream, the same object the in-process engine hands out, so
// the C stream functions work unchanged; the client's network thread (one Asio io_context per
// client, running a wire::Connection) is the producer that pushes Token / Finish events into it.
// Server-side rejections (Error with the request's id) become the stream's terminal event. When
// the connection ends for any reason, every live stream ends with kUnavailable (retryable: the
// caller may submit it again) and, with `reconnect`, the client connects again with exponential
// backoff (reconnect_min .. reconnect_max) until it is destroyed; Submit answers Unavailable
// ("reconnecting") meanwhile. A cancelled request whose Finish does not arrive within a few
// seconds is ended locally (kCancelled), and a request with a deadline that the server has not
// ended a second after it is ended locally (kDeadline), so no stream waits forever on a server.
//
// Authentication: when the server challenges (wire/auth.h), the client proves `auth_key` as a
// client; by default that is $CHUNKSERVE_CLIENT_TOKEN, else $CHUNKSERVE_CLUSTER_SECRET (neither
// set: no key, and a challenging server refuses the client). A refusal for credentials ends live
// streams with kError / Unauthenticated (not retryable as is) and Submit answers Unauthenticated
// until a connection is up again.
//
// TLS: with `tls.ca_file` every connection (reconnects too) is TLS; the server's certificate
// must be signed by that CA and name `host`. Connect completes the first handshake within
// connect_timeout, so a wrong CA or a plaintext server is Connect's Unauthenticated error. With
// `tls.crl_file` a server whose certificate the CA's lists revoke is refused too; the file is
// re-read when it changes and an open connection to a newly revoked server closes.
//
// Lifetime: streams keep a std::weak_ptr to the shared ClientCore (to send Cancel and to forget
// their id when destroyed), so they may outlive the client; the io_context lives in the core and
// the network thread is joined by ~RemoteClient before the client lets go of the core.
//
// Thread safety: Submit / Cancel / Forget from any thread; the destructor must not overlap them.
#ifndef CHUNKSERVE_CAPI_REMOTE_CLIENT_H_
#define CHUNKSERVE_CAPI_REMOTE_CLIENT_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "runtime/base/status.h"
#include "runtime/sched/request.h"
#include "runtime/sched/stream.h"
#include "runtime/wire/tls.h"

namespace chunkserve::capi {

struct RemoteClientOptions {
  std::string host;
  uint16_t port = 0;
  std::chrono::milliseconds connect_timeout{5000};
  std::chrono::milliseconds keepalive_interval{5000};  // 0: no keepalive probes
  bool reconnect = true;
  std::chrono::milliseconds reconnect_min{100};
  std::chrono::milliseconds reconnect_max{5000};
  std::string auth_key;        // empty: from the environment (see above) when auth_from_env
  bool auth_from_env = true;
  wire::TlsFiles tls;          // ca_file set: TLS, the server's certificate must name `host`
};

// A request as sent: the engine's options plus the relative deadline the wire carries.
struct RemoteRequest {
  sched::RequestOptions options;  // `deadline` is ignored; see deadline_ms
  uint32_t deadline_ms = 0;       // 0: none
};

class ClientCore;

class RemoteClient {
 public:
  static Result<std::unique_ptr<RemoteClient>> Connect(const RemoteClientOptions& options);
  ~RemoteClient();

  RemoteClient(const RemoteClient&) = delete;
  RemoteClient& operator=(const RemoteClient&) = delete;

  // Sends the request; the stream's id is the wire request id.
  Result<std::shared_ptr<sched::RequestStream>> Submit(const RemoteRequest& request);
  // NotFound when no live request has that id.
  Status Cancel(uint64_t request_id);

  // For the streams: the core, to cancel or forget their request after the client is gone.
  std::weak_ptr<ClientCore> core() const;

 private:
  RemoteClient() = default;
  std::shared_ptr<ClientCore> core_;
  std::thread thread_;
};

// Called by streams through their weak_ptr. Cancel sends a Cancel for a live request (no-op
// otherwise); Forget also stops delivering to the request (its stream is being destroyed).
void CoreCancel(ClientCore& core, uint64_t request_id);
void CoreForget(ClientCore& core, uint64_t request_id);

}  // namespace chunkserve::capi

#endif  // CHUNKSERVE_CAPI_REMOTE_CLIENT_H_
