// WorkerServer: one Engine served over the wire protocol (runtime/wire) and HTTP probes.
//
// Runs on the caller's asio::io_context (one per process; the caller runs it). Wire clients
// send Generate / Cancel / StatsRequest / HealthRequest / SubscribeKv (runtime/wire/
// chunkserve.capnp); tokens are streamed as the engine produces them. A closed connection
// cancels that connection's requests. Admission is bounded by the engine's queue: beyond it a
// Generate gets a retryable Error (resourceExhausted, "overloaded"). The HTTP listener answers
// GET /metrics, /livez and /readyz and, with `model_text`, the OpenAI API (runtime/openai).
//
// Drain: BeginDrain flips readiness, refuses new requests (retryable unavailable), waits for
// in-flight requests up to the drain deadline (then aborts them with unavailable), flushes the
// connections and calls `done` on the io_context thread.
//
// Router links: see WorkerOptions::routers; each link is a wire session like any other (the
// router may send SubscribeKv / StatsRequest / HealthRequest on it).
//
// Thread safety: Create, BeginDrain and the accessors are called on the io_context thread (or
// before it runs). Engine callbacks hand work to that thread or use thread-safe sends.
#ifndef CHUNKSERVE_WORKER_SERVER_H_
#define CHUNKSERVE_WORKER_SERVER_H_

#include "runtime/wire/asio.h"
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/base/status.h"
#include "runtime/engine/engine.h"
#include "runtime/tokenizer/model_text.h"
#include "runtime/wire/connection.h"

namespace chunkserve::worker {

struct WorkerOptions {
  std::string listen_host = "127.0.0.1";
  uint16_t listen_port = 0;  // 0: ephemeral
  std::string http_host = "127.0.0.1";
  int32_t http_port = -1;  // -1: no HTTP listener; 0: ephemeral
  engine::EngineOptions engine;
  // The OpenAI API on the HTTP port: the model's tokenizer, chat template, EOS ids and name
  // (null: no API, the probes only), and the key its clients present (empty: none).
  std::shared_ptr<const tokenizer::ModelText> model_text;
  std::string api_key;
  std::string worker_id = "worker";
  std::chrono::milliseconds drain_timeout{30000};
  // Accepted connections (clients, routers' data links): limits, deadlines, the byte budget and,
  // with auth enabled, the challenge (set connection.server_auth). Beyond max_connections (also
  // capped below the process's file descriptor limit, see wire/listen.h) a new connection gets a
  // retryable Error and is closed, so the worker keeps its descriptors for the connections it
  // serves and its HTTP probes.
  wire::ConnectionOptions connection;
  int32_t max_connections = 4096;

  // Router links (optional): the worker connects out to each router, sends Register (with
  // `advertise`, or listen_host:port() when empty, as the address clients reach it at), and after
  // the RegisterAck streams KV events (snapshot, then increments) and a LoadReport every
  // `load_report_interval` on that link. A lost link is re-established with exponential backoff
  // (reconnect_min .. reconnect_max); each new link registers again and sends a fresh snapshot.
  std::vector<std::string> routers;  // "host:port" each; empty: no router
  std::string advertise;             // host:port
  std::chrono::milliseconds load_report_interval{200};
  std::chrono::milliseconds reconnect_min{100};
  std::chrono::milliseconds reconnect_max{5000};
  // A connection attempt to a router that does not complete within this is abandoned and
  // retried on the backoff above: a router behind a partition drops the SYNs silently, and the
  // kernel's own SYN retransmissions (1, 2, 4, .. 64 s apart) would otherwise decide when the
  // link comes back after the partition heals.
  std::chrono::milliseconds router_connect_timeout{3000};
  // Router links: the cluster secret proven at registration (empty: none), a Ping when the link
  // is quiet for router_keepalive, and the link closed (then re-established) when nothing
  // arrives for router_idle_timeout.
  std::string cluster_secret;
  // TLS on router links (null: plain TCP): the client side of the process's TLS files; the
  // worker presents its certificate (routers admit workers only with one, mutual TLS).
  std::shared_ptr<wire::TlsContext> tls_client;
  std::chrono::milliseconds router_keepalive{1000};
  std::chrono::milliseconds router_idle_timeout{5000};
};

class WorkerServer {
 public:
  static Result<std::unique_ptr<WorkerServer>> Create(asio::io_context& io,
                                                      const WorkerOptions& options);
  virtual ~WorkerServer() = default;

  virtual uint16_t port() const = 0;
  virtual uint16_t http_port() const = 0;  // 0 when there is no HTTP listener
  virtual uint64_t generation() const = 0;
  // Routers that accepted this worker's registration on their current link.
  virtual int registered_routers() const = 0;

  virtual void BeginDrain(std::function<void()> done) = 0;
};

}  // namespace chunkserve::worker

#endif  // CHUNKSERVE_WORKER_SERVER_H_
