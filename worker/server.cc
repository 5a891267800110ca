#include "worker/server.h"

#include <capnp/message.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "runtime/base/logging.h"
#include "runtime/http/server.h"
#include "runtime/kvcache/chunk_hash.h"
#include "runtime/openai/front_door.h"
#include "runtime/wire/client_protocol.h"
#include "runtime/wire/framing.h"
#include "runtime/wire/listen.h"
#include "runtime/wire/messages.h"
#include "worker/metrics.h"
#include "worker/queued_prefill.h"

namespace chunkserve::worker {
namespace {

using Clock = std::chrono::steady_clock;
using wire::schema::Envelope;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// One wire connection and the requests it started (io thread only).
struct Session {
  std::shared_ptr<wire::Connection> connection;
  std::unordered_map<uint64_t, RequestId> requests;  // wire request id -> engine id
};

class Server final : public WorkerServer {
 public:
  Server(asio::io_context& io, const WorkerOptions& options)
      : io_(io),
        options_(options),
        acceptor_(io),
        http_acceptor_(io),
        drain_timer_(io),
        report_timer_(io),
        soon_timer_(io) {}

  ~Server() override {
    front_door_.Stop();
    if (engine_) {
      engine_->SetKvEventCallback(nullptr);
      engine_->Shutdown(engine::ShutdownMode::kAbort);
    }
  }

  Status Init() {
    generation_ =
        static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count()) | 1;
    CHUNKSERVE_ASSIGN_OR_RETURN(engine_, engine::Engine::Create(options_.engine));
    queued_prefill_ = std::make_unique<QueuedPrefill>(
        kv::ChunkHashSeed(engine_->model_fingerprint(), engine_->chunk_size()),
        engine_->chunk_size());
    engine_->SetKvEventCallback(
        [this](const std::vector<engine::KvEvent>& events) { PublishKvEvents(events); });
    CHUNKSERVE_RETURN_IF_ERROR(InitRouterLinks());
    CHUNKSERVE_ASSIGN_OR_RETURN(
        max_connections_,
        wire::ListenServer(acceptor_, options_.listen_host, options_.listen_port, http_acceptor_,
                           options_.http_host, options_.http_port, options_.max_connections));
    return Status::Ok();
  }

  void Start() {
    Accept();
    if (http_acceptor_.is_open()) {
      front_door_.Start(io_, http_acceptor_,
                        {options_.model_text, options_.listen_host, port(), options_.connection,
                         options_.tls_client, options_.api_key},
                        [this](const std::string& path) { return Probe(path); });
    }
    for (auto& link : links_) ConnectRouter(link.get());
    if (!links_.empty()) ScheduleLoadReports();
  }

  uint16_t port() const override { return acceptor_.local_endpoint().port(); }
  uint16_t http_port() const override {
    return http_acceptor_.is_open() ? http_acceptor_.local_endpoint().port() : 0;
  }
  uint64_t generation() const override { return generation_; }
  int registered_routers() const override {
    int n = 0;
    for (const auto& link : links_) n += link->registered;
    return n;
  }

  void BeginDrain(std::function<void()> done) override {
    if (draining_.exchange(true)) return;
    drain_done_ = std::move(done);
    asio::error_code ignored;
    acceptor_.close(ignored);
    drain_deadline_ = Clock::now() + options_.drain_timeout;
    for (auto& link : links_) {
      link->timer.cancel();
      SendLoadReport(*link);  // routers stop sending here at once
    }
    PollDrain();
  }

 private:

  // --- wire connections ---------------------------------------------------------------------

  void Accept() {
    wire::AcceptLoop(acceptor_, [this](asio::ip::tcp::socket socket) {
      metrics_.connections_total.fetch_add(1);
      if (static_cast<int64_t>(sessions_.size()) >= max_connections_) {
        metrics_.connections_refused.fetch_add(1);
        wire::RefuseSocket(socket, Status::ResourceExhausted(
                                       "worker connection limit (" +
                                       std::to_string(max_connections_) + ") reached; retry later"));
        return;
      }
      auto connection = wire::Connection::Create(std::move(socket), options_.connection);
      auto session = std::make_shared<Session>();
      session->connection = connection;
      sessions_[connection->id()] = session;
      std::weak_ptr<Session> weak = session;
      connection->Start(
          [this, weak](wire::DecodedMessage& m) {
            if (auto s = weak.lock()) OnMessage(*s, m);
          },
          [this, id = connection->id()](const Status& reason) { OnClose(id, reason); });
    });
  }

  void OnClose(uint64_t id, const Status& reason) {
    auto it = sessions_.find(id);
    if (it == sessions_.end()) return;
    if (reason.code() == StatusCode::kDataLoss || reason.code() == StatusCode::kResourceExhausted) {
      metrics_.malformed_frames.fetch_add(1);
    }
    // A disconnect cancels the connection's requests; their private chunks are freed at the
    // engine's next step boundary.
    for (const auto& [wire_id, engine_id] : it->second->requests) {
      (void)engine_->Cancel(engine_id);
    }
    {
      std::lock_guard<std::mutex> lock(kv_mu_);
      kv_subscribers_.erase(id);
    }
    sessions_.erase(it);
    if (RouterLink* link = LinkOf(id)) OnRouterLinkClosed(link, reason);
  }

  void OnMessage(Session& session, wire::DecodedMessage& message) {
    Envelope::Reader root = message.root();
    switch (root.which()) {
      case Envelope::GENERATE:
        OnGenerate(session, root.getGenerate());
        break;
      case Envelope::CANCEL: {
        auto it = session.requests.find(root.getCancel().getRequestId());
        if (it != session.requests.end()) (void)engine_->Cancel(it->second);
        break;
      }
      case Envelope::STATS_REQUEST:
        SendStats(session);
        break;
      case Envelope::HEALTH_REQUEST:
        SendHealth(session);
        break;
      case Envelope::SUBSCRIBE_KV:
        Subscribe(session);
        break;
      case Envelope::REGISTER_ACK:
        OnRegisterAck(session, root.getRegisterAck());
        break;
      case Envelope::ERROR:
        // A peer's complaint about this connection (e.g. the router refusing a frame): logged;
        // the peer closes the connection if it must.
        LOG(WARNING) << "wire error from peer: " << root.getError().getMessage().cStr();
        break;
      default:
        (void)session.connection->SendBytes(
            wire::ErrorFrame(0, Status::Unimplemented("message kind not served by a worker")));
    }
  }

  void OnGenerate(Session& session, wire::schema::Generate::Reader g) {
    const uint64_t wire_id = g.getRequestId();
    auto reject = [&](const Status& s) {
      if (s.code() == StatusCode::kResourceExhausted) metrics_.rejected_overloaded.fetch_add(1);
      (void)session.connection->SendBytes(wire::ErrorFrame(wire_id, s));
    };
    if (draining_) {
      reject(Status::Unavailable("worker is draining; retry elsewhere"));
      return;
    }
    if (session.requests.count(wire_id) != 0) {
      reject(Status::AlreadyExists("request id already in flight on this connection"));
      return;
    }
    Result<wire::GenerateMessage> decoded = wire::DecodeGenerate(g);
    if (!decoded.ok()) {
      reject(decoded.status());
      return;
    }
    wire::GenerateMessage& m = decoded.value();
    sched::RequestOptions r;
    r.prompt = std::move(m.prompt);
    r.stop_tokens = std::move(m.stop_tokens);
    if (m.sampling) {
      r.sampling.temperature = m.sampling->temperature;
      r.sampling.top_k = m.sampling->top_k;
      r.sampling.top_p = m.sampling->top_p;
      r.sampling.seed = m.sampling->seed;
    }
    r.max_new_tokens = m.max_new_tokens;
    r.priority = m.priority;
    r.logprobs = m.logprobs;
    const auto received = Clock::now();
    if (m.deadline_ms > 0) r.deadline = received + std::chrono::milliseconds(m.deadline_ms);
    // Its prompt counts as queued prefill until the request's first event (its first token or
    // its end), less what the engine has cached or will compute once for a request ahead of it
    // (queued_prefill.h): the load a router needs to predict time to first token here.
    const uint64_t unserved_key = next_unserved_++;
    queued_prefill_->Add(unserved_key, r.prompt);
    Result<std::shared_ptr<sched::RequestStream>> stream = engine_->Submit(std::move(r));
    if (!stream.ok()) {
      queued_prefill_->Remove(unserved_key);
      reject(stream.status());
      return;
    }
    std::shared_ptr<sched::RequestStream> s = std::move(stream).value();
    session.requests[wire_id] = s->id();
    {
      std::lock_guard<std::mutex> lock(unserved_mu_);
      unserved_.emplace(unserved_key, received);
    }
    in_flight_.fetch_add(1);
    LoadReportSoon();
    auto prefill_pending = std::make_shared<std::atomic<bool>>(true);
    auto ttft_s = std::make_shared<double>(0.0);  // step thread only
    std::weak_ptr<wire::Connection> weak = session.connection;
    const uint64_t connection_id = session.connection->id();
    auto last = std::make_shared<Clock::time_point>(received);
    sched::RequestStream* raw = s.get();
    // Runs on the engine's step thread: encode and queue (thread-safe, non-blocking).
    Status set = s->SetCallback(
        [this, weak, wire_id, received, last, raw, connection_id, prefill_pending, ttft_s,
         unserved_key](const sched::StreamEvent& e) {
          const auto now = Clock::now();
          if (prefill_pending->exchange(false)) {
            queued_prefill_->Remove(unserved_key);
            {
              std::lock_guard<std::mutex> lock(unserved_mu_);
              unserved_.erase(unserved_key);
            }
            // Its prefill left the queue: routers that did not send it (and so see no first
            // token) learn it now, not a report period later.
            asio::post(io_, [this] { LoadReportSoon(); });
          }
          auto connection = weak.lock();
          if (e.kind == sched::StreamEvent::Kind::kToken) {
            if (e.index == 0) {
              metrics_.ttft.Observe(Seconds(now - received));
              *ttft_s = Seconds(now - received);
            } else {
              metrics_.time_per_token.Observe(Seconds(now - *last));
            }
            *last = now;
            if (connection && !connection
                                   ->SendBytes(wire::EncodeToken(
                                       {wire_id, e.token, e.index, e.logprobs}))
                                   .ok()) {
              raw->RequestCancel();  // the client does not keep up (or left): stop generating
            }
            return;
          }
          metrics_.e2e.Observe(Seconds(now - received));
          RecordPrefillSample(e.finish.prompt_tokens - e.finish.cached_tokens, *ttft_s);
          if (e.finish.queue_seconds >= 0) metrics_.queue.Observe(e.finish.queue_seconds);
          if (connection) {
            (void)connection->SendBytes(wire::EncodeFinish(
                {.request_id = wire_id,
                 .reason = e.finish.reason,
                 .error = e.finish.error,
                 .prompt_tokens = e.finish.prompt_tokens,
                 .cached_tokens = e.finish.cached_tokens,
                 .generated_tokens = e.finish.generated_tokens}));
          }
          asio::post(io_, [this, connection_id, wire_id] { OnFinished(connection_id, wire_id); });
        });
    if (!set.ok()) {
      LOG(ERROR) << "stream callback: " << set;
      queued_prefill_->Remove(unserved_key);
    }
  }

  void OnFinished(uint64_t connection_id, uint64_t wire_id) {
    in_flight_.fetch_sub(1);
    auto it = sessions_.find(connection_id);
    if (it != sessions_.end()) it->second->requests.erase(wire_id);
    LoadReportSoon();
  }

  void SendStats(Session& session) {
    const engine::EngineStats s = engine_->Stats();
    capnp::MallocMessageBuilder builder;
    auto st = builder.initRoot<Envelope>().initStats();
    st.setRequestsSubmitted(s.requests_submitted);
    st.setRequestsFinished(s.requests_finished);
    st.setPromptTokens(s.prompt_tokens);
    st.setPrefixHitTokens(s.prefix_hit_tokens);
    st.setGeneratedTokens(s.generated_tokens);
    st.setEvictedChunks(s.evicted_chunks);
    st.setPreemptions(s.preemptions);
    st.setRunning(s.running);
    st.setQueued(s.queued);
    st.setKvBytesUsed(s.kv_bytes_used);
    st.setKvBytesReferenced(s.kv_bytes_referenced);
    st.setKvBytesCapacity(s.kv_bytes_capacity);
    st.setChunksTotal(s.chunks_total);
    st.setChunksShared(s.chunks_shared);
    st.setChunksRetained(s.chunks_retained);
    st.setSteps(s.steps);
    (void)session.connection->SendBytes(wire::EncodeOrEmpty(builder));
  }

  void SendHealth(Session& session) {
    capnp::MallocMessageBuilder builder;
    auto h = builder.initRoot<Envelope>().initHealth();
    h.setLive(true);
    h.setReady(Ready());
    h.setDraining(draining_);
    h.setGeneration(generation_);
    (void)session.connection->SendBytes(wire::EncodeOrEmpty(builder));
  }

  // Prefill rate for load reports. The engine's prefill_tokens_per_s is throughput over a
  // window: near 0 on a worker that mostly hits its cache, which would make a router think the
  // worker is slow exactly when it is the best place to go. Routers need capacity, so each
  // request with a real prefill contributes uncached tokens / TTFT, and the report carries the
  // best of the last kPrefillSamples (the least queued, closest to capacity), or the engine's
  // window figure when that is higher.
  static constexpr size_t kPrefillSamples = 32;
  void RecordPrefillSample(int64_t uncached_tokens, double ttft_s) {
    if (uncached_tokens < 16 || ttft_s <= 0) return;  // too small to time meaningfully
    std::lock_guard<std::mutex> lock(prefill_mu_);
    prefill_samples_[prefill_next_++ % kPrefillSamples] =
        static_cast<double>(uncached_tokens) / ttft_s;
  }
  double PrefillRate(double engine_window_rate) {
    std::lock_guard<std::mutex> lock(prefill_mu_);
    double best = engine_window_rate;
    for (double r : prefill_samples_) best = std::max(best, r);
    return best;
  }

  // --- router links ---------------------------------------------------------------------------

  // One outgoing link to a router (io thread only).
  struct RouterLink {
    explicit RouterLink(asio::io_context& io) : resolver(io), timer(io), connect_timer(io) {}
    std::string host;
    uint16_t port = 0;
    asio::ip::tcp::resolver resolver;
    asio::steady_timer timer;          // the reconnect backoff
    asio::steady_timer connect_timer;  // bounds one connection attempt
    std::shared_ptr<Session> session;  // null while disconnected
    bool registered = false;
    std::chrono::milliseconds backoff{0};
  };

  Status InitRouterLinks() {
    for (const std::string& r : options_.routers) {
      const size_t colon = r.rfind(':');
      if (colon == std::string::npos || colon == 0) {
        return Status::InvalidArgument("router address must be host:port: " + r);
      }
      const int port = std::atoi(r.c_str() + colon + 1);
      if (port <= 0 || port > 65535) return Status::InvalidArgument("bad router port: " + r);
      auto link = std::make_unique<RouterLink>(io_);
      link->host = r.substr(0, colon);
      link->port = static_cast<uint16_t>(port);
      links_.push_back(std::move(link));
    }
    return Status::Ok();
  }

  void ConnectRouter(RouterLink* link) {
    if (draining_) return;
    link->resolver.async_resolve(
        link->host, std::to_string(link->port),
        [this, link](const asio::error_code& ec, asio::ip::tcp::resolver::results_type results) {
          if (draining_) return;
          if (ec) {
            LOG(WARNING) << "router address " << link->host << ": " << ec.message();
            ScheduleRouterReconnect(link);
            return;
          }
          auto socket = std::make_shared<asio::ip::tcp::socket>(io_);
          // Closing the socket at the deadline ends the attempt (operation_aborted): a silent
          // router is retried on the link's backoff, not on the kernel's SYN schedule.
          link->connect_timer.expires_after(options_.router_connect_timeout);
          link->connect_timer.async_wait([socket](const asio::error_code& e) {
            if (e) return;
            asio::error_code ignored;
            socket->close(ignored);
          });
          asio::async_connect(*socket, results,
                              [this, link, socket](const asio::error_code& e, const auto&) {
                                link->connect_timer.cancel();
                                if (draining_) return;
                                if (e || !socket->is_open()) {
                                  ScheduleRouterReconnect(link);
                                  return;
                                }
                                OnRouterConnected(link, std::move(*socket));
                              });
        });
  }

  void ScheduleRouterReconnect(RouterLink* link) {
    if (draining_) return;
    link->backoff = link->backoff.count() == 0
                        ? options_.reconnect_min
                        : std::min(link->backoff * 2, options_.reconnect_max);
    link->timer.expires_after(link->backoff);
    link->timer.async_wait([this, link](const asio::error_code& ec) {
      if (!ec) ConnectRouter(link);
    });
  }

  RouterLink* LinkOf(uint64_t connection_id) {
    for (auto& link : links_) {
      if (link->session && link->session->connection->id() == connection_id) return link.get();
    }
    return nullptr;
  }

  void OnRouterConnected(RouterLink* link, asio::ip::tcp::socket socket) {
    wire::ConnectionOptions copts = options_.connection;
    copts.server_auth = nullptr;  // we connect: the router challenges us
    if (!options_.cluster_secret.empty()) {
      copts.client_auth = wire::ClientAuth{options_.cluster_secret, wire::schema::AuthRole::WORKER};
    }
    copts.keepalive_interval = options_.router_keepalive;
    copts.idle_timeout = options_.router_idle_timeout;  // the router pings a quiet link
    copts.idle_counts_sends = false;  // our reports must not keep a silent router's link alive
    // TLS: the router's certificate must match the address dialled; ours proves membership.
    copts.tls = options_.tls_client;
    copts.tls_host = link->host;
    auto connection = wire::Connection::Create(std::move(socket), copts);
    auto session = std::make_shared<Session>();
    session->connection = connection;
    sessions_[connection->id()] = session;
    link->session = session;
    link->registered = false;
    std::weak_ptr<Session> weak = session;
    connection->Start(
        [this, weak](wire::DecodedMessage& m) {
          if (auto s = weak.lock()) OnMessage(*s, m);
        },
        [this, id = connection->id()](const Status& reason) { OnClose(id, reason); });

    const engine::EngineStats stats = engine_->Stats();
    capnp::MallocMessageBuilder builder;
    auto r = builder.initRoot<Envelope>().initRegister();
    r.setWorkerId(options_.worker_id);
    r.setModelFingerprint(engine_->model_fingerprint());
    r.setChunkSize(engine_->chunk_size());
    r.setChunkHashVersion(kv::kHashVersion);
    r.setCapacityKvBytes(stats.kv_bytes_capacity);
    // Slots on the wire are tokens (the engine's slots are chunks of chunk_size tokens).
    r.setCapacitySlots(static_cast<int32_t>(
        std::min<int64_t>(stats.kv_capacity_tokens, std::numeric_limits<int32_t>::max())));
    r.setMaxBatchSize(options_.engine.max_batch_size);
    r.setMaxQueued(options_.engine.max_queued_requests);
    r.setGeneration(generation_);
    r.setAddress(options_.advertise.empty()
                     ? options_.listen_host + ":" + std::to_string(port())
                     : options_.advertise);
    (void)connection->SendBytes(wire::EncodeOrEmpty(builder));
  }

  void OnRouterLinkClosed(RouterLink* link, const Status& reason) {
    link->session.reset();
    link->registered = false;
    LOG(WARNING) << "router link " << link->host << ":" << link->port << " closed: " << reason;
    ScheduleRouterReconnect(link);
  }

  void OnRegisterAck(Session& session, wire::schema::RegisterAck::Reader ack) {
    RouterLink* link = LinkOf(session.connection->id());
    if (link == nullptr) return;  // not a router link: ignore
    if (!ack.getAccepted()) {
      // A refused worker keeps trying at the slowest pace: the operator may fix the router.
      LOG(ERROR) << "router refused registration: " << ack.getReason().cStr();
      std::fprintf(stderr, "router %s:%u refused registration: %s\n", link->host.c_str(),
                   link->port, ack.getReason().cStr());
      link->backoff = options_.reconnect_max;
      session.connection->Close(Status::FailedPrecondition("registration refused"));
      return;
    }
    link->registered = true;
    link->backoff = std::chrono::milliseconds(0);
    Subscribe(session);  // snapshot, then increments on this link
    SendLoadReport(*link);
  }

  void ScheduleLoadReports() {
    report_timer_.expires_after(options_.load_report_interval);
    report_timer_.async_wait([this](const asio::error_code& ec) {
      if (ec) return;
      for (auto& link : links_) SendLoadReport(*link);
      if (!draining_) ScheduleLoadReports();
    });
  }

  // Load changed (a request arrived or ended): report within a few milliseconds instead of
  // waiting for the period, so routers do not act on a load that is gone. Coalesced.
  void LoadReportSoon() {
    if (links_.empty() || report_soon_pending_) return;
    report_soon_pending_ = true;
    soon_timer_.expires_after(std::chrono::milliseconds(5));
    soon_timer_.async_wait([this](const asio::error_code& ec) {
      report_soon_pending_ = false;
      if (ec) return;
      for (auto& link : links_) SendLoadReport(*link);
    });
  }

  // Age of the oldest admitted request that has no first event yet (0: none). With a step counter
  // that does not move, it tells a router that this engine is frozen, not just idle.
  uint32_t OldestUnservedMs() {
    std::lock_guard<std::mutex> lock(unserved_mu_);
    Clock::time_point oldest = Clock::time_point::max();
    for (const auto& [key, t] : unserved_) oldest = std::min(oldest, t);
    if (oldest == Clock::time_point::max()) return 0;
    const auto ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - oldest).count();
    return static_cast<uint32_t>(std::clamp<int64_t>(ms, 1, UINT32_MAX));
  }

  // What the requests without a first token need (QueuedPrefill), less what the engine has
  // computed of it: a 100k-token prefill half done reads as 50k, not 100k until its first token.
  // A first token leaves QueuedPrefill during its step, its progress leaves the engine's stats
  // when they are published after the step: a report taken in between reads low; never below 0.
  int64_t QueuedPrefillTokens(const engine::EngineStats& s) const {
    return std::max<int64_t>(0, queued_prefill_->tokens() - s.prefill_progress_tokens);
  }

  void SendLoadReport(RouterLink& link) {
    if (!link.session || !link.registered) return;
    const engine::EngineStats s = engine_->Stats();
    const uint64_t free_bytes =
        s.kv_bytes_capacity > s.kv_bytes_referenced ? s.kv_bytes_capacity - s.kv_bytes_referenced
                                                    : 0;
    capnp::MallocMessageBuilder builder;
    auto r = builder.initRoot<Envelope>().initLoadReport();
    r.setGeneration(generation_);
    r.setQueuedPrefillTokens(static_cast<uint64_t>(QueuedPrefillTokens(s)));
    r.setRunningSequences(s.running);
    r.setQueuedRequests(s.queued);
    // Whole free engine slots (chunks), in tokens.
    r.setFreeKvSlots(s.kv_bytes_per_slot > 0 ? free_bytes / s.kv_bytes_per_slot *
                                                   static_cast<uint64_t>(engine_->chunk_size())
                                             : 0);
    r.setFreeKvBytes(free_bytes);
    r.setPrefillTokensPerS(PrefillRate(s.prefill_tokens_per_s));
    r.setDecodeTokensPerS(s.decode_tokens_per_busy_s);
    r.setDraining(draining_);
    r.setInFlightRequests(static_cast<int32_t>(in_flight_.load()));
    r.setEngineProgress(s.steps + s.requests_finished);  // a cancel-only pass is progress too
    r.setOldestUnservedMs(OldestUnservedMs());
    (void)link.session->connection->SendBytes(wire::EncodeOrEmpty(builder));
  }

  // --- KV events ------------------------------------------------------------------------------

  void Subscribe(Session& session) {
    std::lock_guard<std::mutex> lock(kv_mu_);
    const engine::KvSnapshot snapshot = engine_->GetKvSnapshot();
    capnp::MallocMessageBuilder builder;
    auto ev = builder.initRoot<Envelope>().initKvEvents();
    ev.setGeneration(generation_);
    ev.setSequence(snapshot.sequence);
    ev.setSnapshot(true);
    auto stored = ev.initStored(static_cast<unsigned>(snapshot.chunks.size()));
    for (size_t i = 0; i < snapshot.chunks.size(); ++i) {
      stored[static_cast<unsigned>(i)].setHash(snapshot.chunks[i].hash);
      stored[static_cast<unsigned>(i)].setParentHash(snapshot.chunks[i].parent_hash);
    }
    ev.initEvicted(0);
    (void)session.connection->SendBytes(wire::EncodeOrEmpty(builder));
    kv_subscribers_[session.connection->id()] = {session.connection, snapshot.sequence};
  }

  // Step thread. Holding kv_mu_ orders these batches with snapshots taken by Subscribe.
  void PublishKvEvents(const std::vector<engine::KvEvent>& events) {
    for (const auto& e : events) {
      if (e.kind == engine::KvEvent::Kind::kStored) {
        queued_prefill_->Stored(e.hash);
      } else {
        queued_prefill_->Evicted(e.hash);
      }
    }
    std::lock_guard<std::mutex> lock(kv_mu_);
    for (auto& [id, sub] : kv_subscribers_) {
      std::vector<const engine::KvEvent*> fresh;
      for (const auto& e : events) {
        if (e.sequence > sub.after) fresh.push_back(&e);
      }
      if (fresh.empty()) continue;
      size_t n_stored = 0;
      for (auto* e : fresh) n_stored += e->kind == engine::KvEvent::Kind::kStored;
      capnp::MallocMessageBuilder builder;
      auto ev = builder.initRoot<Envelope>().initKvEvents();
      ev.setGeneration(generation_);
      ev.setSequence(fresh.back()->sequence);
      ev.setSnapshot(false);
      auto stored = ev.initStored(static_cast<unsigned>(n_stored));
      auto evicted = ev.initEvicted(static_cast<unsigned>(fresh.size() - n_stored));
      unsigned si = 0, ei = 0;
      for (auto* e : fresh) {
        if (e->kind == engine::KvEvent::Kind::kStored) {
          stored[si].setHash(e->hash);
          stored[si].setParentHash(e->parent_hash);
          ++si;
        } else {
          evicted.set(ei++, e->hash);
        }
      }
      sub.after = fresh.back()->sequence;
      if (auto c = sub.connection.lock()) {
        // A subscriber that does not keep up loses its connection; it resubscribes for a
        // fresh snapshot.
        if (!c->SendBytes(wire::EncodeOrEmpty(builder)).ok()) {
          c->Close(Status::ResourceExhausted("KV event subscriber too slow"));
        }
      }
    }
  }

  // --- HTTP probes ----------------------------------------------------------------------------

  bool Ready() {
    if (draining_) return false;
    const engine::EngineStats s = engine_->Stats();
    const auto now = Clock::now();
    if (s.steps != last_steps_ || (s.running == 0 && s.queued == 0)) {
      last_steps_ = s.steps;
      last_progress_ = now;
    }
    return now - last_progress_ < std::chrono::seconds(30);
  }

  // /livez: the process answers; /readyz: see Ready(); /metrics: Prometheus text.
  http::Reply Probe(const std::string& path) {
    if (path == "/livez") return {200, "text/plain", "ok\n", {}};
    if (path == "/readyz") {
      if (Ready()) return {200, "text/plain", "ready\n", {}};
      return {503, "text/plain", draining_ ? "draining\n" : "not ready\n", {}};
    }
    if (path == "/metrics") {
      const engine::EngineStats s = engine_->Stats();
      return {200, "text/plain; version=0.0.4",
              metrics_.Render(s, Ready(), draining_, static_cast<int64_t>(sessions_.size()),
                              QueuedPrefillTokens(s)),
              {}};
    }
    return {404, "text/plain", "not found\n", {}};
  }

  // --- drain ----------------------------------------------------------------------------------

  void PollDrain() {
    const bool idle = in_flight_.load() == 0;
    if (!idle && Clock::now() < drain_deadline_) {
      drain_timer_.expires_after(std::chrono::milliseconds(10));
      drain_timer_.async_wait([this](const asio::error_code& ec) {
        if (!ec) PollDrain();
      });
      return;
    }
    engine_->SetKvEventCallback(nullptr);
    // Past the deadline: end what is left with kUnavailable (the Finish frames are queued).
    engine_->Shutdown(idle ? engine::ShutdownMode::kDrain : engine::ShutdownMode::kAbort);
    flush_deadline_ = Clock::now() + std::chrono::seconds(2);
    PollFlush();
  }

  void PollFlush() {
    bool pending = false;
    for (auto& [id, s] : sessions_) pending |= s->connection->queued_bytes() > 0;
    if (pending && Clock::now() < flush_deadline_) {
      drain_timer_.expires_after(std::chrono::milliseconds(5));
      drain_timer_.async_wait([this](const asio::error_code& ec) {
        if (!ec) PollFlush();
      });
      return;
    }
    asio::error_code ignored;
    http_acceptor_.close(ignored);
    front_door_.Stop();
    for (auto& [id, s] : sessions_) s->connection->Close(Status::Unavailable("worker drained"));
    if (drain_done_) drain_done_();
  }

  struct KvSubscriber {
    std::weak_ptr<wire::Connection> connection;
    uint64_t after = 0;  // last sequence sent
  };

  asio::io_context& io_;
  const WorkerOptions options_;
  asio::ip::tcp::acceptor acceptor_;
  asio::ip::tcp::acceptor http_acceptor_;
  openai::FrontDoor front_door_;  // after http_acceptor_: destroyed (stopped) before it
  asio::steady_timer drain_timer_;
  std::unique_ptr<engine::Engine> engine_;
  uint64_t generation_ = 0;
  WorkerMetrics metrics_;
  std::unordered_map<uint64_t, std::shared_ptr<Session>> sessions_;  // io thread
  std::atomic<int64_t> in_flight_{0};
  int64_t max_connections_ = 0;
  // Admitted requests without their first event: key -> submission time.
  std::mutex unserved_mu_;
  std::unordered_map<uint64_t, Clock::time_point> unserved_;  // guarded by unserved_mu_
  uint64_t next_unserved_ = 1;                                  // io thread
  std::atomic<bool> draining_{false};
  std::function<void()> drain_done_;
  Clock::time_point drain_deadline_;
  Clock::time_point flush_deadline_;
  uint64_t last_steps_ = 0;
  Clock::time_point last_progress_ = Clock::now();

  std::mutex kv_mu_;
  std::unordered_map<uint64_t, KvSubscriber> kv_subscribers_;  // guarded by kv_mu_

  // Router links (io thread).
  std::vector<std::unique_ptr<RouterLink>> links_;
  asio::steady_timer report_timer_;
  asio::steady_timer soon_timer_;
  bool report_soon_pending_ = false;
  std::mutex prefill_mu_;
  std::array<double, kPrefillSamples> prefill_samples_{};  // guarded by prefill_mu_
  size_t prefill_next_ = 0;                                 // guarded by prefill_mu_
  std::unique_ptr<QueuedPrefill> queued_prefill_;  // set in Init, before any request
};

}  // namespace

Result<std::unique_ptr<WorkerServer>> WorkerServer::Create(asio::io_context& io,
                                                           const WorkerOptions& options) {
  auto server = std::make_unique<Server>(io, options);
  CHUNKSERVE_RETURN_IF_ERROR(server->Init());
  server->Start();
  return std::unique_ptr<WorkerServer>(std::move(server));
}

}  // namespace chunkserve::worker
