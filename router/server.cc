#include "router/server.h"

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

#include "runtime/base/logging.h"
#include "runtime/kvcache/chunk_hash.h"
#include "runtime/wire/client_protocol.h"
#include "runtime/wire/framing.h"
#include "runtime/wire/http_probe.h"
#include "runtime/wire/listen.h"
#include "runtime/wire/messages.h"

namespace chunkserve::router {
namespace {

using Clock = std::chrono::steady_clock;
using wire::schema::Envelope;

RouterTime Now() { return Clock::now().time_since_epoch(); }

// Prometheus label values: escape backslash, quote and newline.
std::string Label(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out.push_back('\\');
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out.push_back(c);
  }
  return out;
}

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

  std::vector<TokenId> sent;  // tokens streamed to the client so far (all legs)
  WorkerId worker;             // current leg's worker
  uint64_t upstream = 0;       // current leg's request id on the worker link; 0 = none
  bool leg_started = false;    // current leg produced its first token
  int64_t leg_prompt = 0;      // current leg's prompt tokens (prompt + tokens sent before it)
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

  Status Init() {
    CHUNKSERVE_ASSIGN_OR_RETURN(PolicyKind kind, ParsePolicyKind(options_.policy));
    RouterCoreOptions core = options_.core;
    core.policy_kind = kind;
    if (membership_.model_known()) core.chain_seeds = {membership_.chain_seed()};
    CHUNKSERVE_ASSIGN_OR_RETURN(core_, RouterCore::Create(core));
    if (options_.max_attempts < 1) return Status::InvalidArgument("max_attempts must be >= 1");
    max_connections_ = wire::MaxConnectionsForFdLimit(options_.max_connections);
    if (max_connections_ < options_.max_connections) {
      LOG(WARNING) << "serving at most " << max_connections_ << " connections (of "
                   << options_.max_connections << " asked) within the file descriptor limit";
    }
    CHUNKSERVE_RETURN_IF_ERROR(
        wire::ListenTcp(acceptor_, options_.listen_host, options_.listen_port));
    if (options_.http_port >= 0) {
      CHUNKSERVE_RETURN_IF_ERROR(wire::ListenTcp(http_acceptor_, options_.http_host,
                                                 static_cast<uint16_t>(options_.http_port)));
    }
    return Status::Ok();
  }

  void Start() {
    Accept();
    if (http_acceptor_.is_open()) {
      wire::ServeHttp(http_acceptor_, [this](const std::string& path) { return Probe(path); });
    }
    ScheduleLeaseCheck();
    ScheduleRequestCheck();
  }

  uint16_t port() const override { return acceptor_.local_endpoint().port(); }
  uint16_t http_port() const override {
    return http_acceptor_.is_open() ? http_acceptor_.local_endpoint().port() : 0;
  }
  size_t workers_alive() const override {
    size_t n = 0;
    for (const auto& [id, w] : workers_) n += w.in_core;
    return n;
  }

  void Shutdown(std::function<void()> done) override {
    if (shutting_down_) return;
    shutting_down_ = true;
    asio::error_code ignored;
    acceptor_.close(ignored);
    lease_timer_.cancel();
    check_timer_.cancel();
    // Requests in flight end with `unavailable` (retryable); workers stay up.
    std::vector<std::shared_ptr<Pending>> all;
    for (auto& [id, p] : upstream_) all.push_back(p);
    for (auto& p : all) {
      CancelUpstream(*p);
      EndLeg(*p);
      FinishToClient(*p, FinishReason::kUnavailable, Status::Unavailable("router shutting down"), 0);
    }
    shutdown_timer_.expires_after(std::chrono::milliseconds(200));  // let frames flush
    shutdown_timer_.async_wait([this, done = std::move(done)](const asio::error_code&) {
      asio::error_code e;
      http_acceptor_.close(e);
      for (auto& [id, peer] : peers_) peer->connection->Close(Status::Unavailable("router exit"));
      for (auto& [id, w] : workers_) {
        if (w.data) w.data->Close(Status::Unavailable("router exit"));
      }
      if (done) done();
    });
  }

 private:

  // --- accepted connections -------------------------------------------------------------------

  void Accept() {
    wire::AcceptLoop(acceptor_, [this](asio::ip::tcp::socket socket) {
      connections_total_++;
      if (static_cast<int64_t>(peers_.size()) >= max_connections_) {
        connections_refused_++;
        wire::RefuseSocket(socket, Status::ResourceExhausted(
                                       "router connection limit (" +
                                       std::to_string(max_connections_) + ") reached; retry later"));
        return;
      }
      auto connection = wire::Connection::Create(std::move(socket), options_.connection);
      auto peer = std::make_shared<Peer>();
      peer->connection = connection;
      peers_[connection->id()] = peer;
      std::weak_ptr<Peer> weak = peer;
      connection->Start(
          [this, weak](wire::DecodedMessage& m) {
            if (auto p = weak.lock()) OnPeerMessage(*p, m);
          },
          [this, id = connection->id()](const Status& reason) { OnPeerClose(id, reason); });
    });
  }

  void OnPeerClose(uint64_t id, const Status& reason) {
    auto it = peers_.find(id);
    if (it == peers_.end()) return;
    std::shared_ptr<Peer> peer = it->second;
    peers_.erase(it);
    if (peer->kind == Peer::Kind::kWorker) {
      KillWorker(peer->worker, 0, "control link closed: " + reason.ToString());
      return;
    }
    // A client left: cancel its requests on the workers.
    for (auto& [rid, p] : peer->requests) {
      p->client_gone = true;
      p->cancelled = true;
      CancelUpstream(*p);
    }
  }

  void OnPeerMessage(Peer& peer, wire::DecodedMessage& message) {
    Envelope::Reader root = message.root();
    if (peer.kind == Peer::Kind::kUnknown) {
      peer.kind = root.which() == Envelope::REGISTER ? Peer::Kind::kWorker : Peer::Kind::kClient;
    }
    if (peer.kind == Peer::Kind::kWorker) {
      OnWorkerMessage(peer, root);
      return;
    }
    switch (root.which()) {
      case Envelope::GENERATE:
        OnGenerate(peer, root.getGenerate());
        break;
      case Envelope::CANCEL: {
        auto it = peer.requests.find(root.getCancel().getRequestId());
        if (it != peer.requests.end()) {
          it->second->cancelled = true;
          CancelUpstream(*it->second);
        }
        break;
      }
      case Envelope::HEALTH_REQUEST: {
        capnp::MallocMessageBuilder builder;
        auto h = builder.initRoot<Envelope>().initHealth();
        h.setLive(true);
        h.setReady(Ready());
        h.setDraining(shutting_down_);
        h.setGeneration(0);
        (void)peer.connection->SendBytes(wire::EncodeOrEmpty(builder));
        break;
      }
      case Envelope::STATS_REQUEST:
        SendStats(peer);
        break;
      case Envelope::REGISTER:
        (void)peer.connection->SendBytes(wire::ErrorFrame(
            0, Status::FailedPrecondition("Register must be the first message of a link")));
        break;
      default:
        (void)peer.connection->SendBytes(
            wire::ErrorFrame(0, Status::Unimplemented("message kind not served by a router")));
    }
  }

  // Router-wide counters in the worker's Stats shape (engine fields the router lacks are 0).
  void SendStats(Peer& peer) {
    capnp::MallocMessageBuilder builder;
    auto st = builder.initRoot<Envelope>().initStats();
    st.setRequestsSubmitted(requests_total_);
    st.setRequestsFinished(requests_finished_);
    st.setPromptTokens(prompt_tokens_total_);
    st.setPrefixHitTokens(cached_tokens_total_);
    st.setGeneratedTokens(generated_tokens_total_);
    st.setRunning(static_cast<int32_t>(upstream_.size()));
    (void)peer.connection->SendBytes(wire::EncodeOrEmpty(builder));
  }

  // --- workers: registration, control link, data link -----------------------------------------

  void OnWorkerMessage(Peer& peer, Envelope::Reader root) {
    switch (root.which()) {
      case Envelope::REGISTER:
        OnRegister(peer, root.getRegister());
        break;
      case Envelope::LOAD_REPORT:
        OnLoadReport(peer, root.getLoadReport());
        break;
      case Envelope::KV_EVENTS:
        OnKvEvents(peer, root.getKvEvents());
        break;
      case Envelope::ERROR:
        LOG(WARNING) << "worker error: " << root.getError().getMessage().cStr();
        break;
      default:
        break;  // Health / Stats replies and future kinds: nothing to do
    }
  }

  void Refuse(Peer& peer, const std::string& reason) {
    workers_refused_++;
    LOG(WARNING) << "refusing worker registration: " << reason;
    capnp::MallocMessageBuilder builder;
    auto ack = builder.initRoot<Envelope>().initRegisterAck();
    ack.setAccepted(false);
    ack.setReason(reason);
    (void)peer.connection->SendBytes(wire::EncodeOrEmpty(builder));
    // The worker closes the link when it reads the refusal; close it here too, a little later
    // so the refusal is written first.
    auto timer = std::make_shared<asio::steady_timer>(io_, std::chrono::milliseconds(500));
    std::weak_ptr<wire::Connection> weak = peer.connection;
    peer.kind = Peer::Kind::kClient;  // not a member: closing it kills no worker
    timer->async_wait([timer, weak](const asio::error_code&) {
      if (auto c = weak.lock()) c->Close(Status::FailedPrecondition("registration refused"));
    });
  }

  void OnRegister(Peer& peer, wire::schema::Register::Reader r) {
    if (peer.worker.valid()) {
      Refuse(peer, "duplicate Register on one link");
      return;
    }
    const auto& auth = options_.connection.server_auth;
    if (auth && auth->enabled() && peer.connection->peer_role() != wire::schema::AuthRole::WORKER) {
      Refuse(peer, "only a peer that proved the cluster secret as a worker may register");
      return;
    }
    if (options_.connection.tls != nullptr && !peer.connection->peer_certified()) {
      Refuse(peer,
             "with TLS on, a worker must present a certificate signed by the cluster CA "
             "(mutual TLS: --tls-cert and --tls-key on the worker)");
      return;
    }
    Registration reg;
    reg.name = r.getWorkerId().cStr();
    reg.model_fingerprint = r.getModelFingerprint();
    reg.chunk_size = r.getChunkSize();
    reg.chunk_hash_version = r.getChunkHashVersion();
    reg.capacity_kv_bytes = r.getCapacityKvBytes();
    reg.capacity_slots = r.getCapacitySlots();
    reg.max_batch_size = r.getMaxBatchSize();
    reg.max_queued = r.getMaxQueued();
    reg.generation = r.getGeneration();
    if (Status s = ParseHostPort(r.getAddress().cStr(), &reg.host, &reg.port); !s.ok()) {
      Refuse(peer, std::string(s.message()));
      return;
    }
    const bool had_model = membership_.model_known();
    if (Status s = membership_.Validate(reg); !s.ok()) {
      Refuse(peer, std::string(s.message()));
      return;
    }
    if (!had_model) {
      const uint64_t seed = membership_.chain_seed();
      core_->index().SetChainSeeds(std::span<const uint64_t>(&seed, 1));
    }
    const WorkerId id = Membership::IdFor(reg.name);
    // Another instance under a live worker's id is refused (it would take that worker's traffic);
    // the same instance reconnecting, or a new one once the old is gone, replaces it.
    if (const Member* live = membership_.Find(id);
        live != nullptr && live->registration.generation != reg.generation) {
      auto wit = workers_.find(id);
      const bool alive = wit != workers_.end() && wit->second.control &&
                         !wit->second.control->closed() && live->lease_expiry >= Now();
      if (alive) {
        Refuse(peer, "worker id '" + reg.name + "' belongs to a live instance (generation " +
                         std::to_string(live->registration.generation) +
                         "); another instance may take it only once that one is gone");
        return;
      }
    }
    // A restarted worker (or a reconnect): the old generation goes first, with its requests.
    KillWorker(id, 0, "replaced by generation " + std::to_string(reg.generation));
    membership_.Admit(reg, peer.connection->id(), Now());
    peer.worker = id;
    WorkerLinks& links = workers_[id];
    links.control = peer.connection;
    links.incarnation = next_incarnation_++;
    ConnectData(id, reg.host, reg.port);
  }

  // Opens the data link to the worker's advertised client address; the RegisterAck is sent
  // once the router can reach it (a worker advertising an unreachable address is refused).
  void ConnectData(WorkerId id, const std::string& host, uint16_t port) {
    asio::error_code ec;
    const asio::ip::address address = asio::ip::make_address(host, ec);
    auto socket = std::make_shared<asio::ip::tcp::socket>(io_);
    const uint64_t incarnation = workers_[id].incarnation;
    auto on_connected = [this, id, incarnation, socket](const asio::error_code& e) {
      auto it = workers_.find(id);
      // Died (or was replaced) meanwhile.
      if (it == workers_.end() || it->second.incarnation != incarnation) return;
      it->second.connect_timer.reset();
      if (e) {
        RefuseMember(id, "router cannot reach the advertised address: " + e.message());
        return;
      }
      OnDataConnected(id, std::move(*socket));
    };
    WorkerLinks& links = workers_[id];
    links.connect_timer = std::make_unique<asio::steady_timer>(io_, options_.connect_timeout);
    links.connect_timer->async_wait([socket](const asio::error_code& e) {
      if (!e) {
        asio::error_code ignored;
        socket->close(ignored);  // the connect handler then runs with operation_aborted
      }
    });
    if (!ec) {
      socket->async_connect(asio::ip::tcp::endpoint(address, port), on_connected);
      return;
    }
    // A host name: resolve first.
    auto resolver = std::make_shared<asio::ip::tcp::resolver>(io_);
    resolver->async_resolve(
        host, std::to_string(port),
        [this, id, incarnation, socket, resolver, on_connected](
            const asio::error_code& e, asio::ip::tcp::resolver::results_type results) {
          if (e) {
            auto it = workers_.find(id);
            if (it != workers_.end() && it->second.incarnation == incarnation) {
              RefuseMember(id, "cannot resolve the advertised address: " + e.message());
            }
            return;
          }
          asio::async_connect(
              *socket, results,
              [on_connected](const asio::error_code& ce, const auto&) { on_connected(ce); });
        });
  }

  void RefuseMember(WorkerId id, const std::string& reason) {
    auto it = workers_.find(id);
    if (it == workers_.end()) return;
    std::shared_ptr<wire::Connection> control = it->second.control;
    workers_.erase(it);
    membership_.Remove(id);
    auto peer = peers_.find(control->id());
    if (peer != peers_.end()) {
      peer->second->worker = WorkerId::Invalid();
      Refuse(*peer->second, reason);
    }
  }

  void OnDataConnected(WorkerId id, asio::ip::tcp::socket socket) {
    WorkerLinks& links = workers_[id];
    const Member* member = membership_.Find(id);
    if (member == nullptr) return;
    wire::ConnectionOptions copts = options_.connection;
    copts.server_auth = nullptr;  // we connect: the worker challenges us
    if (!options_.cluster_secret.empty()) {
      copts.client_auth = wire::ClientAuth{options_.cluster_secret, wire::schema::AuthRole::ROUTER};
    }
    copts.handshake_timeout = std::chrono::milliseconds(0);  // the worker speaks when asked
    // A Ping at once meets the worker's handshake deadline; Pings while quiet keep the link from
    // looking idle, and the worker's Pongs prove it is there.
    copts.ping_first = true;
    copts.keepalive_interval = options_.keepalive;
    copts.idle_timeout = options_.link_idle_timeout;
    // TLS: the worker's certificate must match the address it advertised; ours proves membership.
    copts.tls = options_.tls_client;
    copts.tls_host = member->registration.host;
    links.data = wire::Connection::Create(std::move(socket), copts);
    const uint64_t incarnation = links.incarnation;
    links.data->Start([this, id](wire::DecodedMessage& m) { OnUpstreamMessage(id, m); },
                      [this, id, incarnation](const Status& reason) {
                        KillWorker(id, incarnation, "data link closed: " + reason.ToString());
                      });
    WorkerInfo info;
    info.id = id;
    info.name = member->registration.name;
    info.generation = member->registration.generation;
    info.max_batch_size = std::max(1, member->registration.max_batch_size);
    info.max_queued = member->registration.max_queued;
    info.kv_capacity_tokens = member->registration.capacity_slots;
    if (Status s = core_->AddWorker(info); !s.ok()) {
      RefuseMember(id, "router core refused the worker: " + s.ToString());
      return;
    }
    links.in_core = true;
    liveness_.Add(id, Now());
    workers_registered_++;
    name_stats_[info.name];  // listed in metrics from now on
    capnp::MallocMessageBuilder builder;
    auto ack = builder.initRoot<Envelope>().initRegisterAck();
    ack.setAccepted(true);
    (void)links.control->SendBytes(wire::EncodeOrEmpty(builder));
    LOG(INFO) << "worker " << info.name << " generation " << info.generation << " joined as " << id;
  }

  void OnLoadReport(Peer& peer, wire::schema::LoadReport::Reader r) {
    Member* member = membership_.Find(peer.worker);
    auto it = workers_.find(peer.worker);
    if (member == nullptr || it == workers_.end()) return;
    (void)membership_.Renew(peer.worker, Now());
    member->load_reports++;
    member->free_kv_bytes = r.getFreeKvBytes();
    member->reported_in_flight = r.getInFlightRequests();
    member->draining = r.getDraining();
    if (!it->second.in_core) return;
    ApplyLiveness(liveness_.OnReport(peer.worker, r.getEngineProgress(),
                                     r.getInFlightRequests() > 0 || r.getOldestUnservedMs() > 0,
                                     static_cast<int64_t>(it->second.upstream.size()), Now()));
    it = workers_.find(peer.worker);
    if (it == workers_.end()) return;
    WorkerLoad load;
    load.queued_prefill_tokens = r.getQueuedPrefillTokens();
    load.running_sequences = r.getRunningSequences();
    load.queued_requests = r.getQueuedRequests();
    load.free_kv_slots = r.getFreeKvSlots();
    load.prefill_tokens_per_s = r.getPrefillTokensPerS();
    load.decode_tokens_per_s = r.getDecodeTokensPerS();
    load.draining = r.getDraining();
    it->second.reported = load;
    (void)core_->UpdateLoad(peer.worker, load);
    if (it->second.accepting == r.getDraining()) {
      it->second.accepting = !r.getDraining();
      UpdateAccepting(peer.worker);
    }
  }

  void OnKvEvents(Peer& peer, wire::schema::KvEvents::Reader ev) {
    auto it = workers_.find(peer.worker);
    if (it == workers_.end()) return;
    (void)membership_.Renew(peer.worker, Now());
    KvEventBatch batch;
    batch.generation = ev.getGeneration();
    batch.sequence = ev.getSequence();
    batch.snapshot = ev.getSnapshot();
    batch.stored.reserve(ev.getStored().size());
    for (auto s : ev.getStored()) batch.stored.push_back({s.getHash(), s.getParentHash()});
    batch.evicted.reserve(ev.getEvicted().size());
    for (uint64_t h : ev.getEvicted()) batch.evicted.push_back(h);
    kv_batches_++;
    Result<KvApplyOutcome> outcome = core_->ApplyKvEvents(peer.worker, batch);
    if (!outcome.ok()) {
      LOG(WARNING) << "bad KV events from " << peer.worker << ": " << outcome.status();
      return;
    }
    if (outcome.value() == KvApplyOutcome::kNeedSnapshot) {
      kv_resubscribes_++;
      capnp::MallocMessageBuilder builder;
      builder.initRoot<Envelope>().initSubscribeKv().setLastGeneration(batch.generation);
      (void)peer.connection->SendBytes(wire::EncodeOrEmpty(builder));
    }
  }

  // A worker generation is gone: drop it everywhere at once and move its requests. With
  // incarnation != 0 only that incarnation is killed (a late close of an older link is ignored).
  void KillWorker(WorkerId id, uint64_t incarnation, const std::string& why) {
    auto it = workers_.find(id);
    if (it == workers_.end()) return;
    if (incarnation != 0 && it->second.incarnation != incarnation) return;
    WorkerLinks links = std::move(it->second);
    workers_.erase(it);
    const Member* member = membership_.Find(id);
    const std::string name = member ? member->registration.name : "?";
    membership_.Remove(id);
    liveness_.Remove(id);
    if (links.in_core) {
      (void)core_->RemoveWorker(id);
      workers_dead_++;
    }
    LOG(WARNING) << "worker " << name << " (" << id << ") removed: " << why;
    if (links.connect_timer) links.connect_timer->cancel();
    if (links.control) links.control->Close(Status::Unavailable("worker removed: " + why));
    if (links.data) links.data->Close(Status::Unavailable("worker removed: " + why));
    auto peer = links.control ? peers_.find(links.control->id()) : peers_.end();
    if (peer != peers_.end()) peer->second->worker = WorkerId::Invalid();
    for (uint64_t up : links.upstream) {
      auto pit = upstream_.find(up);
      if (pit == upstream_.end()) continue;
      std::shared_ptr<Pending> p = pit->second;
      EndLeg(*p);
      MoveElsewhere(p, id);
    }
  }

  // The request's leg on `from` is over (EndLeg done): it continues on another worker, migrated
  // with the tokens already sent when there are any.
  void MoveElsewhere(const std::shared_ptr<Pending>& p, WorkerId from) {
    p->refused.insert(from);
    if (p->sent.empty()) {
      rerouted_++;
    } else {
      migrated_++;
    }
    Dispatch(p);
  }

  void ScheduleLeaseCheck() {
    const auto period = std::max(std::chrono::milliseconds(20), options_.lease / 4);
    lease_timer_.expires_after(period);
    lease_timer_.async_wait([this](const asio::error_code& ec) {
      if (ec || shutting_down_) return;
      for (WorkerId id : membership_.Expired(Now())) {
        workers_expired_++;
        KillWorker(id, 0, "lease expired (no load report)");
      }
      core_->index().ExpireDecisions(Now());
      ScheduleLeaseCheck();
    });
  }

  // --- liveness, deadlines --------------------------------------------------------------------

  // The core may pick a worker that is not draining and that liveness allows.
  void UpdateAccepting(WorkerId id) {
    auto it = workers_.find(id);
    if (it == workers_.end() || !it->second.in_core) return;
    (void)core_->SetAccepting(id, it->second.accepting && liveness_.routable(id));
  }

  void ApplyLiveness(const std::vector<Liveness::Change>& changes) {
    for (const Liveness::Change& c : changes) {
      auto it = workers_.find(c.id);
      if (it == workers_.end()) continue;
      const Member* m = membership_.Find(c.id);
      LOG(WARNING) << "worker " << (m ? m->registration.name : "?") << " (" << c.id << ") "
                   << (c.routable ? "routable again: " : "not routable: ") << c.why;
      UpdateAccepting(c.id);
      if (!c.migrate) continue;
      // Its requests continue elsewhere (tokens already sent are kept, as on death).
      const std::set<uint64_t> legs = it->second.upstream;
      for (uint64_t up : legs) {
        std::shared_ptr<Pending> p = FindUpstream(up);
        if (!p) continue;
        CancelUpstream(*p);
        EndLeg(*p);
        MoveElsewhere(p, c.id);
      }
    }
  }

  // Every 50 ms: liveness timers, request deadlines and first-token timeouts. No request waits
  // past its deadline here, whatever its worker does.
  void ScheduleRequestCheck() {
    check_timer_.expires_after(std::chrono::milliseconds(50));
    check_timer_.async_wait([this](const asio::error_code& ec) {
      if (ec || shutting_down_) return;
      ApplyLiveness(liveness_.Tick(Now()));
      const auto now = Clock::now();
      std::vector<std::shared_ptr<Pending>> expired, slow;
      for (const auto& [up, p] : upstream_) {
        if (p->done) continue;
        if (p->has_deadline && now >= p->deadline) {
          expired.push_back(p);
        } else if (options_.first_token_timeout.count() > 0 && !p->leg_started &&
                   now - p->leg_sent >= options_.first_token_timeout) {
          slow.push_back(p);
        }
      }
      for (auto& p : expired) {
        deadline_ended_++;
        CancelUpstream(*p);
        EndLeg(*p);
        FinishToClient(*p, FinishReason::kDeadline, Status::DeadlineExceeded("deadline passed"), 0);
      }
      for (auto& p : slow) {
        first_token_timeouts_++;
        const WorkerId w = p->worker;
        CancelUpstream(*p);
        EndLeg(*p);
        ApplyLiveness(liveness_.OnLegFailed(w, Now()));
        MoveElsewhere(p, w);
      }
      ScheduleRequestCheck();
    });
  }

  // --- requests -------------------------------------------------------------------------------

  void OnGenerate(Peer& peer, wire::schema::Generate::Reader g) {
    const uint64_t rid = g.getRequestId();
    requests_total_++;
    auto reject = [&](const Status& s) {
      requests_rejected_++;
      (void)peer.connection->SendBytes(wire::ErrorFrame(rid, s));
    };
    if (shutting_down_) return reject(Status::Unavailable("router is shutting down"));
    if (peer.requests.count(rid) != 0) {
      return reject(Status::AlreadyExists("request id already in flight on this connection"));
    }
    Result<wire::GenerateMessage> decoded = wire::DecodeGenerate(g);
    if (!decoded.ok()) return reject(decoded.status());
    wire::GenerateMessage& m = decoded.value();
    auto p = std::make_shared<Pending>();
    p->client_connection = peer.connection->id();
    p->client_request_id = rid;
    p->received = Clock::now();
    p->prompt = std::move(m.prompt);
    p->stop_tokens = std::move(m.stop_tokens);
    p->sampling = m.sampling;
    p->max_new_tokens = m.max_new_tokens;
    p->priority = m.priority;
    if (m.deadline_ms > 0) {
      p->has_deadline = true;
      p->deadline = p->received + std::chrono::milliseconds(m.deadline_ms);
    }
    prompt_tokens_total_ += p->prompt.size();
    peer.requests[rid] = p;
    Dispatch(p);
  }

  // Routes (or re-routes) a request to a worker and forwards it there. Ends it when it cannot.
  void Dispatch(const std::shared_ptr<Pending>& p) {
    if (p->done) return;
    if (p->cancelled || p->client_gone) {
      FinishToClient(*p, FinishReason::kCancelled, Status::Ok(), 0);
      return;
    }
    if (!p->sent.empty() && std::find(p->stop_tokens.begin(), p->stop_tokens.end(),
                                      p->sent.back()) != p->stop_tokens.end()) {
      // The stop token reached the client; only the Finish was lost with the worker.
      FinishToClient(*p, FinishReason::kStopToken, Status::Ok(), 0);
      return;
    }
    const int32_t remaining = p->max_new_tokens - static_cast<int32_t>(p->sent.size());
    if (remaining <= 0) {  // every token arrived; only the Finish was lost with the worker
      FinishToClient(*p, FinishReason::kLength, Status::Ok(), 0);
      return;
    }
    int32_t deadline_ms = 0;
    if (p->has_deadline) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(p->deadline - Clock::now());
      if (left.count() <= 0) {
        FinishToClient(*p, FinishReason::kDeadline, Status::DeadlineExceeded("deadline passed"), 0);
        return;
      }
      deadline_ms = static_cast<int32_t>(std::min<int64_t>(left.count(), INT32_MAX));
    }
    if (++p->attempts > options_.max_attempts) {
      Fail(*p, Status::ResourceExhausted("no worker could take the request after " +
                                         std::to_string(options_.max_attempts) + " attempts"));
      return;
    }
    if (!membership_.model_known() || workers_alive() == 0) {
      Fail(*p, Status::Unavailable("no workers available"));
      return;
    }
    std::vector<TokenId> full = p->prompt;
    full.insert(full.end(), p->sent.begin(), p->sent.end());
    Result<RoutingRequest> rr = MakeRoutingRequest(membership_.chain_seed(),
                                                   membership_.model().chunk_size, full, remaining);
    if (!rr.ok()) {
      Fail(*p, rr.status());
      return;
    }
    // Workers that refused this request, and (with a hard bound) workers at it, sit this pick
    // out; their accepting flags are restored right after.
    std::vector<WorkerId> excluded;
    bool capped = false;
    for (const WorkerState& w : core_->workers()) {
      if (!w.accepting) continue;
      const bool at_cap = options_.max_in_flight_per_worker > 0 &&
                          core_->loads().InFlight(w.info.id) >= options_.max_in_flight_per_worker;
      capped |= at_cap;
      if (at_cap || p->refused.count(w.info.id) != 0) excluded.push_back(w.info.id);
    }
    for (WorkerId w : excluded) (void)core_->SetAccepting(w, false);
    const uint64_t up = next_upstream_++;
    Result<RoutingDecision> decision = core_->Route(RequestId(up), rr.value(), Now());
    for (WorkerId w : excluded) (void)core_->SetAccepting(w, true);
    if (!decision.ok()) {
      if (capped || !p->refused.empty()) {
        overloaded_++;
        Fail(*p, Status::ResourceExhausted("every worker is at its load cap or refused; retry"));
      } else {
        Fail(*p, Status::Unavailable("no workers accepting: " + decision.status().ToString()));
      }
      return;
    }
    const RoutingDecision& d = decision.value();
    auto wit = workers_.find(d.worker);
    if (wit == workers_.end() || !wit->second.data) {
      (void)core_->OnFinished(RequestId(up));
      p->refused.insert(d.worker);
      Dispatch(p);
      return;
    }
    const std::vector<uint8_t> frame =
        wire::EncodeGenerate({.request_id = up,
                              .prompt = full,
                              .sampling = p->sampling,
                              .max_new_tokens = remaining,
                              .stop_tokens = p->stop_tokens,
                              .deadline_ms = static_cast<uint32_t>(deadline_ms),
                              .priority = p->priority});
    if (!wit->second.data->SendBytes(frame).ok()) {
      (void)core_->OnFinished(RequestId(up));
      p->refused.insert(d.worker);
      Dispatch(p);
      return;
    }
    p->worker = d.worker;
    p->upstream = up;
    p->leg_sent = Clock::now();
    p->leg_started = false;
    p->leg_prompt = static_cast<int64_t>(full.size());
    upstream_[up] = p;
    wit->second.upstream.insert(up);
    const Member* member = membership_.Find(d.worker);
    if (member != nullptr) {
      NameStats& ns = name_stats_[member->registration.name];
      ns.routed++;
      ns.predicted_tokens += static_cast<uint64_t>(std::max<int64_t>(0, d.predicted_cached_tokens));
    }
    decisions_[std::string(DecisionReasonName(d.reason))]++;
  }

  // Takes a leg's share out of the worker's last reported load (see WorkerLinks::reported):
  // its pending prefill at the first token, its sequence when it ends.
  void CorrectReported(const Pending& p, bool first_token, bool ended) {
    auto wit = workers_.find(p.worker);
    if (wit == workers_.end() || !wit->second.in_core) return;
    WorkerLoad& l = wit->second.reported;
    if (first_token) {
      const auto prefill = static_cast<uint64_t>(p.leg_prompt);
      l.queued_prefill_tokens -= std::min(l.queued_prefill_tokens, prefill);
    }
    if (ended && l.running_sequences > 0) l.running_sequences--;
    (void)core_->UpdateLoad(p.worker, l);
  }

  // Detaches the current leg (worker-side bookkeeping); the request itself lives on.
  // `reported_cached` is the worker's Finish.cachedTokens when the leg ended with a meaningful
  // one: the core then adds the leg's prediction vs this report to its precision figure.
  void EndLeg(Pending& p, std::optional<int64_t> reported_cached = {}) {
    if (p.upstream == 0) return;
    CorrectReported(p, !p.leg_started, true);
    (void)core_->OnFinished(RequestId(p.upstream), reported_cached);
    auto wit = workers_.find(p.worker);
    if (wit != workers_.end()) wit->second.upstream.erase(p.upstream);
    upstream_.erase(p.upstream);
    p.upstream = 0;
  }

  void CancelUpstream(Pending& p) {
    if (p.upstream == 0) return;
    auto wit = workers_.find(p.worker);
    if (wit == workers_.end() || !wit->second.data) return;
    (void)wit->second.data->SendBytes(wire::EncodeCancel(p.upstream));
  }

  Peer* ClientOf(const Pending& p) {
    auto it = peers_.find(p.client_connection);
    return it == peers_.end() ? nullptr : it->second.get();
  }

  // Ends a request that was never admitted anywhere with an Error, or one that streamed with a
  // Finish carrying the error.
  void Fail(Pending& p, const Status& status) {
    if (p.sent.empty()) {
      if (p.done) return;
      p.done = true;
      requests_rejected_++;
      if (Peer* c = ClientOf(p)) {
        (void)c->connection->SendBytes(wire::ErrorFrame(p.client_request_id, status));
        c->requests.erase(p.client_request_id);
      }
      return;
    }
    FinishToClient(p,
                   wire::IsRetryable(status.code()) ? FinishReason::kUnavailable : FinishReason::kError,
                   status, 0);
  }

  void FinishToClient(Pending& p, FinishReason reason, const Status& error, int32_t cached) {
    if (p.done) return;
    p.done = true;
    requests_finished_++;
    Peer* c = ClientOf(p);
    if (c == nullptr) return;
    (void)c->connection->SendBytes(
        wire::EncodeFinish({.request_id = p.client_request_id,
                            .reason = reason,
                            .error = error,
                            .prompt_tokens = static_cast<int32_t>(p.prompt.size()),
                            .cached_tokens = cached,
                            .generated_tokens = static_cast<int32_t>(p.sent.size())}));
    c->requests.erase(p.client_request_id);
  }

  void OnUpstreamMessage(WorkerId worker, wire::DecodedMessage& message) {
    Envelope::Reader root = message.root();
    switch (root.which()) {
      case Envelope::TOKEN:
        if (Result<wire::TokenMessage> t = wire::DecodeToken(root.getToken()); t.ok()) {
          OnUpstreamToken(t.value());
        } else {
          LOG(WARNING) << "worker " << worker << " sent a bad token: " << t.status();
        }
        break;
      case Envelope::FINISH:
        OnUpstreamFinish(worker, wire::DecodeFinish(root.getFinish()));
        break;
      case Envelope::ERROR:
        OnUpstreamError(worker, root.getError());
        break;
      default:
        break;
    }
  }

  std::shared_ptr<Pending> FindUpstream(uint64_t up) {
    auto it = upstream_.find(up);
    return it == upstream_.end() ? nullptr : it->second;
  }

  void OnUpstreamToken(const wire::TokenMessage& t) {
    std::shared_ptr<Pending> p = FindUpstream(t.request_id);
    if (!p || p->done) return;
    if (!p->leg_started) {
      p->leg_started = true;
      // Releases the leg's pending prefill in the load tracker. Precision is accounted at the
      // leg's Finish, the only message that carries the worker's cached tokens.
      (void)core_->OnFirstToken(RequestId(p->upstream));
      CorrectReported(*p, true, false);
    }
    if (p->client_gone) return;
    const auto index = static_cast<int32_t>(p->sent.size());
    p->sent.push_back(t.token);
    generated_tokens_total_++;
    Peer* c = ClientOf(*p);
    if (c == nullptr) return;
    if (!c->connection->SendBytes(wire::EncodeToken({p->client_request_id, t.token, index})).ok()) {
      // The client does not keep up: stop generating for it.
      p->cancelled = true;
      CancelUpstream(*p);
    }
  }

  void OnUpstreamFinish(WorkerId worker, const wire::FinishMessage& f) {
    std::shared_ptr<Pending> p = FindUpstream(f.request_id);
    if (!p) return;
    const int32_t cached = std::max(0, f.cached_tokens);
    const bool reroute = f.reason == FinishReason::kUnavailable && !p->cancelled && !p->client_gone;
    // A re-routed leg's report does not count (the request is not done), nor does a leg
    // cancelled before its prefill (the worker never looked its prompt up).
    std::optional<int64_t> reported;
    if (!reroute && (p->leg_started || f.reason != FinishReason::kCancelled)) reported = cached;
    EndLeg(*p, reported);
    if (reroute || f.reason == FinishReason::kError) {
      ApplyLiveness(liveness_.OnLegFailed(worker, Now()));
    } else if (f.reason == FinishReason::kLength || f.reason == FinishReason::kStopToken) {
      ApplyLiveness(liveness_.OnLegSucceeded(worker));
    }
    if (reroute) {
      // The worker is going away (drain deadline, failure): continue elsewhere.
      MoveElsewhere(p, worker);
      return;
    }
    const int32_t prompt_tokens = std::max(0, f.prompt_tokens);
    if (const Member* m = membership_.Find(worker)) {
      NameStats& ns = name_stats_[m->registration.name];
      ns.finished++;
      ns.prompt_tokens += static_cast<uint64_t>(prompt_tokens);
      ns.cached_tokens += static_cast<uint64_t>(cached);
      ns.generated_tokens += static_cast<uint64_t>(std::max(0, f.generated_tokens));
    }
    cached_tokens_total_ += static_cast<uint64_t>(cached);
    worker_prompt_tokens_total_ += static_cast<uint64_t>(prompt_tokens);
    // Cached tokens are reported against the original prompt (a migrated leg's prompt is
    // longer: its extra tokens are not prompt tokens to the client).
    FinishToClient(*p, f.reason, f.error, std::min(cached, static_cast<int32_t>(p->prompt.size())));
  }

  void OnUpstreamError(WorkerId worker, wire::schema::Error::Reader e) {
    if (e.getRequestId() == 0) {
      LOG(WARNING) << "worker " << worker << " link error: " << e.getMessage().cStr();
      return;
    }
    std::shared_ptr<Pending> p = FindUpstream(e.getRequestId());
    if (!p) return;
    EndLeg(*p);
    if (e.getRetryable() && !p->cancelled && !p->client_gone) {
      worker_refusals_++;
      p->refused.insert(worker);
      Dispatch(p);
      return;
    }
    if (p->cancelled || p->client_gone) {
      FinishToClient(*p, FinishReason::kCancelled, Status::Ok(), 0);
      return;
    }
    Fail(*p, Status(static_cast<StatusCode>(e.getCode()), e.getMessage().cStr()));
  }

  // --- HTTP -----------------------------------------------------------------------------------

  bool Ready() const { return !shutting_down_ && workers_alive() > 0; }

  // /livez: the process answers; /readyz: see Ready(); /metrics: Prometheus text.
  wire::HttpReply Probe(const std::string& path) {
    if (path == "/livez") return {200, "text/plain", "ok\n"};
    if (path == "/readyz") {
      if (Ready()) return {200, "text/plain", "ready\n"};
      return {503, "text/plain", shutting_down_ ? "shutting down\n" : "no worker alive\n"};
    }
    if (path == "/metrics") return {200, "text/plain; version=0.0.4", Metrics()};
    return {404, "text/plain", "not found\n"};
  }

  std::string Metrics() {
    std::ostringstream o;
    auto counter = [&o](const char* name, const char* help, uint64_t v) {
      o << "# HELP chunkserve_router_" << name << " " << help << "\n# TYPE chunkserve_router_"
        << name << " counter\nchunkserve_router_" << name << " " << v << "\n";
    };
    auto gauge = [&o](const char* name, const char* help, double v) {
      o << "# HELP chunkserve_router_" << name << " " << help << "\n# TYPE chunkserve_router_"
        << name << " gauge\nchunkserve_router_" << name << " " << v << "\n";
    };
    counter("requests_total", "Generate requests received from clients.", requests_total_);
    counter("requests_finished_total", "Requests that ended with a Finish.", requests_finished_);
    counter("requests_rejected_total", "Requests answered with an Error (not admitted).",
            requests_rejected_);
    counter("requests_overloaded_total",
            "Requests refused because every worker was at its load cap or refused.", overloaded_);
    counter("requests_rerouted_total",
            "Unstarted requests routed again after their worker died or went away.", rerouted_);
    counter("requests_migrated_total",
            "Streaming requests moved to another worker (prompt + sent tokens).", migrated_);
    counter("worker_refusals_total", "Retryable refusals by workers (retried elsewhere).",
            worker_refusals_);
    counter("prompt_tokens_total", "Prompt tokens of client requests.", prompt_tokens_total_);
    counter("generated_tokens_total", "Tokens streamed to clients.", generated_tokens_total_);
    counter("reported_cached_tokens_total",
            "Prompt tokens the workers reported as prefix-cache hits (Finish.cachedTokens).",
            core_->precision().reported_tokens);
    counter("predicted_cached_tokens_total", "Prompt tokens the router predicted as cached.",
            core_->precision().predicted_tokens);
    counter("overlap_cached_tokens_total", "Sum of min(predicted, reported) cached tokens.",
            core_->precision().overlap_tokens);
    gauge("routing_precision", "overlap / predicted cached tokens (1 when none predicted).",
          core_->precision().Precision());
    gauge("routing_recall", "overlap / reported cached tokens (1 when none reported).",
          core_->precision().Recall());
    gauge("prefix_hit_rate", "Reported cached tokens / prompt tokens of finished legs.",
          worker_prompt_tokens_total_ == 0 ? 0.0
                                           : static_cast<double>(cached_tokens_total_) /
                                                 static_cast<double>(worker_prompt_tokens_total_));
    const PrefixIndexStats is = core_->index().Stats();
    gauge("index_bytes", "Accounted bytes of the prefix index (chunks + decisions).",
          static_cast<double>(is.bytes_used + is.decision_bytes));
    gauge("index_chunk_nodes", "Distinct chunk hashes indexed.",
          static_cast<double>(is.chunk_nodes));
    gauge("index_holder_entries", "(chunk hash, worker) pairs indexed.",
          static_cast<double>(is.holder_entries));
    counter("index_gaps_total", "KV event sequence gaps detected.", is.gaps);
    counter("kv_event_batches_total", "KV event batches received.", kv_batches_);
    counter("kv_resubscribes_total", "SubscribeKv sent after a gap.", kv_resubscribes_);
    gauge("workers_alive", "Worker generations registered and routable.",
          static_cast<double>(workers_alive()));
    counter("workers_registered_total", "Worker registrations accepted.", workers_registered_);
    counter("workers_refused_total", "Worker registrations refused.", workers_refused_);
    counter("workers_dead_total", "Worker generations dropped (link lost, lease, replaced).",
            workers_dead_);
    counter("workers_lease_expired_total", "Workers dropped because their lease expired.",
            workers_expired_);
    gauge("in_flight", "Requests forwarded to workers and not finished.",
          static_cast<double>(upstream_.size()));
    counter("connections_total", "Connections accepted.", connections_total_);
    counter("connections_refused_total", "Connections refused at the connection limit.",
            connections_refused_);
    counter("workers_stalled_total",
            "Times a worker's engine made no progress while it had work (its requests moved).",
            liveness_.stalls());
    counter("workers_ejected_total", "Times a worker was ejected after consecutive failures.",
            liveness_.ejections());
    counter("requests_deadline_total", "Requests the router ended at their deadline.",
            deadline_ended_);
    counter("first_token_timeouts_total",
            "Legs moved because no first token came within the first-token timeout.",
            first_token_timeouts_);
    o << "# HELP chunkserve_router_decisions_total Routing decisions by reason.\n"
      << "# TYPE chunkserve_router_decisions_total counter\n";
    for (const auto& [reason, n] : decisions_) {
      o << "chunkserve_router_decisions_total{reason=\"" << Label(reason) << "\"} " << n << "\n";
    }
    auto per_worker = [&](const char* name, const char* help, uint64_t NameStats::*field) {
      o << "# HELP chunkserve_router_" << name << " " << help << "\n# TYPE chunkserve_router_"
        << name << " counter\n";
      for (const auto& [worker, ns] : name_stats_) {
        o << "chunkserve_router_" << name << "{worker=\"" << Label(worker) << "\"} " << ns.*field
          << "\n";
      }
    };
    per_worker("worker_routed_total", "Requests (legs) routed to each worker.", &NameStats::routed);
    per_worker("worker_finished_total", "Legs finished by each worker.", &NameStats::finished);
    per_worker("worker_prompt_tokens_total", "Prompt tokens of legs finished by each worker.",
               &NameStats::prompt_tokens);
    per_worker("worker_cached_tokens_total", "Cached prompt tokens reported by each worker.",
               &NameStats::cached_tokens);
    per_worker("worker_predicted_cached_tokens_total",
               "Cached prompt tokens predicted for each worker.", &NameStats::predicted_tokens);
    per_worker("worker_generated_tokens_total", "Tokens generated by each worker.",
               &NameStats::generated_tokens);
    o << "# HELP chunkserve_router_worker_up 1 while a generation of the worker is routable.\n"
      << "# TYPE chunkserve_router_worker_up gauge\n";
    for (const auto& [worker, ns] : name_stats_) {
      int up = 0;
      for (const auto& [id, m] : membership_.members()) {
        auto it = workers_.find(id);
        up |= m.registration.name == worker && it != workers_.end() && it->second.in_core;
      }
      o << "chunkserve_router_worker_up{worker=\"" << Label(worker) << "\"} " << up << "\n";
    }
    // From the routable workers' registrations, as the core sees them (WorkerInfo).
    o << "# HELP chunkserve_router_worker_kv_capacity_tokens KV capacity of each routable worker "
         "in tokens (Register.capacitySlots).\n"
      << "# TYPE chunkserve_router_worker_kv_capacity_tokens gauge\n";
    for (const WorkerState& w : core_->workers()) {
      o << "chunkserve_router_worker_kv_capacity_tokens{worker=\"" << Label(w.info.name) << "\"} "
        << w.info.kv_capacity_tokens << "\n";
    }
    o << "# HELP chunkserve_router_worker_accepting 1 while the core may pick the worker (0: "
         "draining).\n"
      << "# TYPE chunkserve_router_worker_accepting gauge\n";
    for (const WorkerState& w : core_->workers()) {
      o << "chunkserve_router_worker_accepting{worker=\"" << Label(w.info.name) << "\"} "
        << (w.accepting ? 1 : 0) << "\n";
    }
    o << "# HELP chunkserve_router_worker_kv_capacity_bytes KV arena bytes of each routable "
         "worker (Register.capacityKvBytes).\n"
      << "# TYPE chunkserve_router_worker_kv_capacity_bytes gauge\n";
    for (const auto& [id, m] : membership_.members()) {
      auto it = workers_.find(id);
      if (it == workers_.end() || !it->second.in_core) continue;
      o << "chunkserve_router_worker_kv_capacity_bytes{worker=\"" << Label(m.registration.name)
        << "\"} " << m.registration.capacity_kv_bytes << "\n";
    }
    return o.str();
  }

  asio::io_context& io_;
  const RouterOptions options_;
  Membership membership_;
  std::unique_ptr<RouterCore> core_;
  asio::ip::tcp::acceptor acceptor_;
  asio::ip::tcp::acceptor http_acceptor_;
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

}  // namespace

Result<std::unique_ptr<RouterServer>> RouterServer::Create(asio::io_context& io,
                                                           const RouterOptions& options) {
  auto server = std::make_unique<Server>(io, options);
  CHUNKSERVE_RETURN_IF_ERROR(server->Init());
  server->Start();
  return std::unique_ptr<RouterServer>(std::move(server));
}

}  // namespace chunkserve::router
