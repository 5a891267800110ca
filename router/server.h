// RouterServer: the chunkserve-router process body -- client listener, worker membership and
// links, routing through RouterCore (router/routing.h), failover, HTTP probes and metrics.
//
// One listener serves both roles: a connection whose first message is Register is a worker's
// control link (RegisterAck, then KV events and LoadReports from the worker, SubscribeKv from the
// router after a sequence gap); any other connection is a client speaking the worker's client
// protocol (Generate -> Token* Finish | Error, Cancel, HealthRequest), so a client can talk to a
// router or a worker alike.
//
// For every accepted worker generation the router opens a data link to the worker's advertised
// client address and forwards requests on it under router-chosen request ids. Per Generate: the
// prompt's full leading chunks are hashed (kv::FullChunkHashes with the cluster seed), the policy
// picks (RouterCore::Route counts the request at pick time), the request is forwarded, tokens are
// streamed back with the client's request id. Cancel and client disconnect are propagated.
//
// Failover: a worker whose control or data link drops, or whose lease (LoadReports) lapses, is
// dead: its index entries and load are dropped at once, and every request on it is routed again.
// A request that had streamed k tokens migrates: the new worker gets prompt + those k tokens with
// maxNewTokens reduced by k, and its token indices are shifted by k, so the client sees each
// token exactly once with continuous indices (with greedy sampling the output is the same as an
// uninterrupted run). A retryable refusal (resourceExhausted / unavailable) or an `unavailable`
// Finish before completion also moves the request elsewhere. Attempts are bounded; when no
// worker can take a request it gets a retryable Error (never queued at the router).
//
// Overload: besides the policy's load cap, `max_in_flight_per_worker` (> 0) is a hard bound on
// this router's requests in flight per worker; workers at it are not picked.
//
// Liveness (router/liveness.h): a worker whose engine makes no progress while it has work for
// `liveness.stall_timeout` stops receiving requests and its requests move elsewhere; it is
// readmitted when it progresses. Consecutive failed legs eject a worker with backoff. The router
// ends a request at its deadline (Finish deadline) and moves a leg that produced no first token
// within `first_token_timeout` (counted as a failed leg). Data links ping when quiet and, like
// control links, are declared dead after `link_idle_timeout` of silence.
//
// Authentication (wire/auth.h): with `connection.server_auth` enabled every peer must answer the
// router's challenge; Register needs the worker role (the cluster secret), and a registration
// under the id of a live instance with another generation is refused until that one is gone.
// Data links prove `cluster_secret` to the workers as role router.
//
// TLS (wire/tls.h): with `connection.tls` set every accepted connection must speak TLS, and
// Register also needs a certificate the cluster CA verified (mutual TLS); data links use
// `tls_client` and verify the worker's certificate against its advertised host.
//
// Bounds: at most `max_connections` accepted connections (further ones get a retryable Error and
// are closed; also capped below the descriptor limit, so the HTTP probes and data links always
// have descriptors); the frame, frame-time and byte-budget bounds of `connection`.
//
// Thread safety: everything runs on the caller's io_context thread (Create before it runs).
#ifndef CHUNKSERVE_ROUTER_SERVER_H_
#define CHUNKSERVE_ROUTER_SERVER_H_

#include "runtime/wire/asio.h"
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "router/liveness.h"
#include "router/membership.h"
#include "router/routing.h"
#include "runtime/base/status.h"
#include "runtime/tokenizer/model_text.h"
#include "runtime/wire/connection.h"

namespace chunkserve::router {

struct RouterOptions {
  std::string listen_host = "127.0.0.1";
  uint16_t listen_port = 0;  // 0: ephemeral
  std::string http_host = "127.0.0.1";
  int32_t http_port = -1;  // -1: no HTTP listener; 0: ephemeral

  std::string policy = "ttft";
  RouterCoreOptions core;  // policy_kind is set from `policy`
  ClusterModel model;      // 0 fields: adopted from the first worker
  std::chrono::milliseconds lease{3000};
  int32_t max_in_flight_per_worker = 0;  // 0: no hard bound (the policy's load cap applies)
  int32_t max_attempts = 6;              // picks per request (refusals + failovers)
  std::chrono::milliseconds connect_timeout{3000};  // data link to a worker
  wire::ConnectionOptions connection;               // client and worker connections
  int32_t max_connections = 4096;                   // accepted connections
  std::string cluster_secret;                       // proven on data links (empty: none)
  std::shared_ptr<wire::TlsContext> tls_client;     // TLS on data links (null: plain TCP)
  std::chrono::milliseconds keepalive{1000};        // data links: Ping when quiet
  std::chrono::milliseconds link_idle_timeout{5000};  // data and control links: dead when silent
  std::chrono::milliseconds first_token_timeout{120000};  // 0: none
  LivenessOptions liveness;
  // The OpenAI API on the HTTP port (null: the probes only): the model's tokenizer, chat template,
  // EOS ids and name, and the key HTTP clients present (empty: none). Text is tokenized here and
  // routed by its token ids.
  std::shared_ptr<const tokenizer::ModelText> model_text;
  std::string api_key;
};

class RouterServer {
 public:
  static Result<std::unique_ptr<RouterServer>> Create(asio::io_context& io,
                                                      const RouterOptions& options);
  virtual ~RouterServer() = default;

  virtual uint16_t port() const = 0;
  virtual uint16_t http_port() const = 0;  // 0 when there is no HTTP listener
  virtual size_t workers_alive() const = 0;

  // Stops accepting, ends requests in flight with `unavailable`, closes every connection and
  // calls `done` on the io_context thread.
  virtual void Shutdown(std::function<void()> done) = 0;
};

}  // namespace chunkserve::router

#endif  // CHUNKSERVE_ROUTER_SERVER_H_
