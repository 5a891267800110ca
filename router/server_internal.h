// The router server's internals, shared by the files that implement it (not a public header):
//   server.cc           lifecycle, the listener and accepted connections (clients and workers)
//   server_workers.cc   worker registration, control and data links, load reports, KV events,
//                       leases, liveness
//   server_requests.cc  requests: admission, dispatch and failover across legs, streaming back
//   server_metrics.cc   the HTTP probes and Prometheus metrics
// One Server object runs on one io_context thread (router/server.h).
#ifndef CHUNKSERVE_ROUTER_SERVER_INTERNAL_H_
#define CHUNKSERVE_ROUTER_SERVER_INTERNAL_H_

#include <capnp/message.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "router/server.h"
#include "runtime/base/logging.h"
#include "runtime/kvcache/chunk_hash.h"
#include "runtime/wire/client_protocol.h"
#include "runtime/wire/framing.h"
#include "runtime/http/server.h"
#include "runtime/openai/front_door.h"
#include "runtime/wire/listen.h"
#include "runtime/wire/messages.h"

namespace chunkserve::router::server_internal {

using Clock = std::chrono::steady_clock;
using wire::schema::Envelope;

inline RouterTime Now() { return Clock::now().time_since_epoch(); }

// One client request as the router carries it across legs (one leg per worker it runs on).
struct Pending {
  uint64_t client_connection = 0;
  uint64_t client_request_id = 0;
  std::vector<TokenId> prompt;
  std::optional<wire::SamplingMessage> sampling;  // absent: greedy
  int32_t max_new_tokens = 16;
  std::vector<TokenId> stop_tokens;
  bool has_deadline = false;
  Clock::time_point deadline;
  int32_t priority = 0;
  int32_t logprobs = -1;  // -1: none; else the alternatives each token carries

  std::vector<TokenId> sent;  // tokens streamed to the client so far (all legs)
  WorkerId worker;            // current leg's worker
  uint64_t upstream = 0;      // current leg's request id on the worker link; 0 = none
  bool leg_started = false;   // current leg produced its first token
  // Current leg's prompt tokens (prompt + tokens sent before it) the router expected to be
  // uncached on its worker (less the predicted cached tokens): what it added to the worker's
  // pending prefill at the pick (LoadTracker::OnPicked) and takes off its last report at the
  // first token (CorrectReported).
  int64_t leg_uncached = 0;
  int32_t attempts = 0;
  Clock::time_point leg_sent;  // when the current leg was forwarded
  std::set<WorkerId> refused;  // workers that refused or failed this request
  bool cancelled = false;
  bool client_gone = false;
  bool done = false;
  Clock::time_point received;
};

// One accepted connection: a client, or a worker's control link (decided by its first message).
struct Peer {
  enum class Kind { kUnknown, kClient, kWorker };
  std::shared_ptr<wire::Connection> connection;
  Kind kind = Kind::kUnknown;
  WorkerId worker;                                                  // kWorker
  std::unordered_map<uint64_t, std::shared_ptr<Pending>> requests;  // kClient, by client id
};

// A member's connections and the requests on it.
struct WorkerLinks {
  std::shared_ptr<wire::Connection> control;
  std::shared_ptr<wire::Connection> data;  // null until connected
  bool in_core = false;                    // added to RouterCore (routable)
  bool accepting = true;                   // not draining
  uint64_t incarnation = 0;                // distinguishes generations under one WorkerId
  std::set<uint64_t> upstream;             // request ids in flight on it
  // The last load report, corrected for legs that reached their first token or ended since
  // (reports lag; a stale report must not keep a finished request's load on the worker).
  WorkerLoad reported;
  uint64_t reported_progress = 0;  // engineProgress of the last load report
  std::unique_ptr<asio::steady_timer> connect_timer;
};

// Per worker name (stable across generations): what this router sent it.
struct NameStats {
  uint64_t routed = 0;
  uint64_t finished = 0;
  uint64_t prompt_tokens = 0;
  uint64_t cached_tokens = 0;
  uint64_t predicted_tokens = 0;
  uint64_t generated_tokens = 0;
};

class Server final : public RouterServer {
 public:
  Server(asio::io_context& io, const RouterOptions& options)
      : io_(io),
        options_(options),
        membership_(options.model, std::chrono::duration_cast<RouterTime>(options.lease)),
        acceptor_(io),
        http_acceptor_(io),
        lease_timer_(io),
        check_timer_(io),
        shutdown_timer_(io),
        liveness_(options.liveness) {}

  Status Init();

  void Start();

  uint16_t port() const override { return acceptor_.local_endpoint().port(); }
  uint16_t http_port() const override {
    return http_acceptor_.is_open() ? http_acceptor_.local_endpoint().port() : 0;
  }
  size_t workers_alive() const override {
    size_t n = 0;
    for (const auto& [id, w] : workers_) n += w.in_core;
    return n;
  }

  void Shutdown(std::function<void()> done) override;

 private:
  // --- accepted connections -------------------------------------------------------------------

  void Accept();

  void OnPeerClose(uint64_t id, const Status& reason);

  void OnPeerMessage(Peer& peer, wire::DecodedMessage& message);

  // Router-wide counters in the worker's Stats shape (engine fields the router lacks are 0).
  void SendStats(Peer& peer);

  // --- workers: registration, control link, data link -----------------------------------------

  void OnWorkerMessage(Peer& peer, Envelope::Reader root);

  void Refuse(Peer& peer, const std::string& reason);

  void OnRegister(Peer& peer, wire::schema::Register::Reader r);

  // Opens the data link to the worker's advertised client address; the RegisterAck is sent
  // once the router can reach it (a worker advertising an unreachable address is refused).
  void ConnectData(WorkerId id, const std::string& host, uint16_t port);

  void RefuseMember(WorkerId id, const std::string& reason);

  void OnDataConnected(WorkerId id, asio::ip::tcp::socket socket);

  void OnLoadReport(Peer& peer, wire::schema::LoadReport::Reader r);

  void OnKvEvents(Peer& peer, wire::schema::KvEvents::Reader ev);

  // A worker generation is gone: drop it everywhere at once and move its requests. With
  // incarnation != 0 only that incarnation is killed (a late close of an older link is ignored).
  void KillWorker(WorkerId id, uint64_t incarnation, const std::string& why);

  // The request's leg on `from` is over (EndLeg done): it continues on another worker, migrated
  // with the tokens already sent when there are any.
  void MoveElsewhere(const std::shared_ptr<Pending>& p, WorkerId from);

  void ScheduleLeaseCheck();

  // --- liveness, deadlines --------------------------------------------------------------------

  // The core may pick a worker that is not draining and that liveness allows.
  void UpdateAccepting(WorkerId id);

  void ApplyLiveness(const std::vector<Liveness::Change>& changes);

  // Every 50 ms: liveness timers, request deadlines and first-token timeouts. No request waits
  // past its deadline here, whatever its worker does.
  void ScheduleRequestCheck();

  // --- requests -------------------------------------------------------------------------------

  void OnGenerate(Peer& peer, wire::schema::Generate::Reader g);

  // Routes (or re-routes) a request to a worker and forwards it there. Ends it when it cannot.
  void Dispatch(const std::shared_ptr<Pending>& p);

  // Takes a leg's share out of the worker's last reported load (see WorkerLinks::reported):
  // its pending prefill at the first token, its sequence when it ends.
  void CorrectReported(const Pending& p, bool first_token, bool ended);

  // Detaches the current leg (worker-side bookkeeping); the request itself lives on.
  // `reported_cached` is the worker's Finish.cachedTokens when the leg ended with a meaningful
  // one: the core then adds the leg's prediction vs this report to its precision figure.
  // `output_tokens`: the request's length when it ended on its own (RouterCore::OnFinished).
  void EndLeg(Pending& p, std::optional<int64_t> reported_cached = {},
              std::optional<int32_t> output_tokens = {});

  void CancelUpstream(Pending& p);

  Peer* ClientOf(const Pending& p);

  // Ends a request that was never admitted anywhere with an Error, or one that streamed with a
  // Finish carrying the error.
  void Fail(Pending& p, const Status& status);

  void FinishToClient(Pending& p, FinishReason reason, const Status& error, int32_t cached);

  void OnUpstreamMessage(WorkerId worker, wire::DecodedMessage& message);

  std::shared_ptr<Pending> FindUpstream(uint64_t up);

  void OnUpstreamToken(const wire::TokenMessage& t);

  void OnUpstreamFinish(WorkerId worker, const wire::FinishMessage& f);

  void OnUpstreamError(WorkerId worker, wire::schema::Error::Reader e);

  // --- HTTP -----------------------------------------------------------------------------------

  bool Ready() const { return !shutting_down_ && workers_alive() > 0; }

  // /livez: the process answers; /readyz: see Ready(); /metrics: Prometheus text.
  http::Reply Probe(const std::string& path);

  std::string Metrics();

  asio::io_context& io_;
  const RouterOptions options_;
  Membership membership_;
  std::unique_ptr<RouterCore> core_;
  asio::ip::tcp::acceptor acceptor_;
  asio::ip::tcp::acceptor http_acceptor_;
  openai::FrontDoor front_door_;  // after http_acceptor_: destroyed (stopped) before it
  asio::steady_timer lease_timer_;
  asio::steady_timer check_timer_;
  asio::steady_timer shutdown_timer_;
  Liveness liveness_;
  int64_t max_connections_ = 0;
  bool shutting_down_ = false;

  std::unordered_map<uint64_t, std::shared_ptr<Peer>> peers_;  // by connection id
  std::map<WorkerId, WorkerLinks> workers_;
  std::unordered_map<uint64_t, std::shared_ptr<Pending>> upstream_;  // by upstream request id
  uint64_t next_upstream_ = 1;
  uint64_t next_incarnation_ = 1;

  std::map<std::string, NameStats> name_stats_;
  std::map<std::string, uint64_t> decisions_;
  uint64_t requests_total_ = 0;
  uint64_t requests_finished_ = 0;
  uint64_t requests_rejected_ = 0;
  uint64_t overloaded_ = 0;
  uint64_t rerouted_ = 0;
  uint64_t migrated_ = 0;
  uint64_t worker_refusals_ = 0;
  uint64_t prompt_tokens_total_ = 0;
  uint64_t generated_tokens_total_ = 0;
  uint64_t cached_tokens_total_ = 0;
  uint64_t worker_prompt_tokens_total_ = 0;
  uint64_t kv_batches_ = 0;
  uint64_t kv_resubscribes_ = 0;
  uint64_t workers_registered_ = 0;
  uint64_t workers_refused_ = 0;
  uint64_t workers_dead_ = 0;
  uint64_t workers_expired_ = 0;
  uint64_t connections_total_ = 0;
  uint64_t connections_refused_ = 0;
  uint64_t deadline_ended_ = 0;
  uint64_t first_token_timeouts_ = 0;
};

}  // namespace chunkserve::router::server_internal

#endif  // CHUNKSERVE_ROUTER_SERVER_INTERNAL_H_
