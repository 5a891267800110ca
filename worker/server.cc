#include "worker/server.h"

#include <capnp/message.h>

#include <atomic>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "runtime/base/logging.h"
#include "runtime/wire/framing.h"
#include "worker/metrics.h"

namespace chunkserve::worker {
namespace {

using Clock = std::chrono::steady_clock;
using wire::schema::Envelope;

wire::schema::ErrorCode ToWire(StatusCode code) {
  const auto v = static_cast<uint16_t>(code);
  return v <= static_cast<uint16_t>(StatusCode::kAborted) ? static_cast<wire::schema::ErrorCode>(v)
                                                          : wire::schema::ErrorCode::INTERNAL;
}

bool Retryable(StatusCode code) {
  return code == StatusCode::kResourceExhausted || code == StatusCode::kUnavailable;
}

std::vector<uint8_t> Encode(capnp::MallocMessageBuilder& builder) {
  Result<std::vector<uint8_t>> bytes = wire::EncodeFrame(builder);
  return bytes.ok() ? std::move(bytes).value() : std::vector<uint8_t>{};
}

std::vector<uint8_t> ErrorFrame(uint64_t request_id, const Status& status) {
  capnp::MallocMessageBuilder builder;
  auto error = builder.initRoot<Envelope>().initError();
  error.setRequestId(request_id);
  error.setCode(ToWire(status.code()));
  error.setMessage(std::string(status.message()));
  error.setRetryable(Retryable(status.code()));
  return Encode(builder);
}

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// One wire connection and the requests it started (io thread only).
struct Session {
  std::shared_ptr<wire::Connection> connection;
  std::unordered_map<uint64_t, RequestId> requests;  // wire request id -> engine id
};

class Server final : public WorkerServer {
 public:
  Server(asio::io_context& io, const WorkerOptions& options)
      : io_(io), options_(options), acceptor_(io), http_acceptor_(io), drain_timer_(io) {}

  ~Server() override {
    if (engine_) {
      engine_->SetKvEventCallback(nullptr);
      engine_->Shutdown(engine::ShutdownMode::kAbort);
    }
  }

  Status Init() {
    generation_ =
        static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count()) | 1;
    CHUNKSERVE_ASSIGN_OR_RETURN(engine_, engine::Engine::Create(options_.engine));
    engine_->SetKvEventCallback(
        [this](const std::vector<engine::KvEvent>& events) { PublishKvEvents(events); });
    CHUNKSERVE_RETURN_IF_ERROR(Listen(acceptor_, options_.listen_host, options_.listen_port));
    if (options_.http_port >= 0) {
      CHUNKSERVE_RETURN_IF_ERROR(
          Listen(http_acceptor_, options_.http_host, static_cast<uint16_t>(options_.http_port)));
    }
    return Status::Ok();
  }

  void Start() {
    Accept();
    if (http_acceptor_.is_open()) AcceptHttp();
  }

  uint16_t port() const override { return acceptor_.local_endpoint().port(); }
  uint16_t http_port() const override {
    return http_acceptor_.is_open() ? http_acceptor_.local_endpoint().port() : 0;
  }
  uint64_t generation() const override { return generation_; }

  void BeginDrain(std::function<void()> done) override {
    if (draining_.exchange(true)) return;
    drain_done_ = std::move(done);
    asio::error_code ignored;
    acceptor_.close(ignored);
    drain_deadline_ = Clock::now() + options_.drain_timeout;
    PollDrain();
  }

 private:
  static Status Listen(asio::ip::tcp::acceptor& acceptor, const std::string& host, uint16_t port) {
    asio::error_code ec;
    const asio::ip::address address = asio::ip::make_address(host, ec);
    if (ec) return Status::InvalidArgument("bad listen address: " + host);
    const asio::ip::tcp::endpoint endpoint(address, port);
    acceptor.open(endpoint.protocol(), ec);
    if (!ec) acceptor.set_option(asio::ip::tcp::acceptor::reuse_address(true), ec);
    if (!ec) acceptor.bind(endpoint, ec);
    if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) {
      return Status::Unavailable("cannot listen on " + host + ":" + std::to_string(port) + ": " +
                                 ec.message());
    }
    return Status::Ok();
  }

  // --- wire connections ---------------------------------------------------------------------

  void Accept() {
    acceptor_.async_accept([this](const asio::error_code& ec, asio::ip::tcp::socket socket) {
      if (ec) {
        if (ec == asio::error::operation_aborted || !acceptor_.is_open()) return;
        Accept();
        return;
      }
      metrics_.connections_total.fetch_add(1);
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
      Accept();
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
      default:
        (void)session.connection->SendBytes(
            ErrorFrame(0, Status::Unimplemented("message kind not served by a worker")));
    }
  }

  void OnGenerate(Session& session, wire::schema::Generate::Reader g) {
    const uint64_t wire_id = g.getRequestId();
    auto reject = [&](const Status& s) {
      if (s.code() == StatusCode::kResourceExhausted) metrics_.rejected_overloaded.fetch_add(1);
      (void)session.connection->SendBytes(ErrorFrame(wire_id, s));
    };
    if (draining_) {
      reject(Status::Unavailable("worker is draining; retry elsewhere"));
      return;
    }
    if (session.requests.count(wire_id) != 0) {
      reject(Status::AlreadyExists("request id already in flight on this connection"));
      return;
    }
    sched::RequestOptions r;
    for (uint32_t t : g.getPrompt()) {
      if (t > static_cast<uint32_t>(INT32_MAX)) {
        reject(Status::InvalidArgument("token id out of range"));
        return;
      }
      r.prompt.push_back(static_cast<TokenId>(t));
    }
    for (uint32_t t : g.getStopTokens()) {
      if (t > static_cast<uint32_t>(INT32_MAX)) {
        reject(Status::InvalidArgument("stop token id out of range"));
        return;
      }
      r.stop_tokens.push_back(static_cast<TokenId>(t));
    }
    if (g.hasSampling()) {
      auto s = g.getSampling();
      r.sampling.temperature = s.getTemperature();
      r.sampling.top_k = s.getTopK();
      r.sampling.top_p = s.getTopP();
      r.sampling.seed = s.getSeed();
    }
    r.max_new_tokens = g.getMaxNewTokens();
    r.priority = g.getPriority();
    const auto received = Clock::now();
    if (g.getDeadlineMs() > 0) r.deadline = received + std::chrono::milliseconds(g.getDeadlineMs());
    Result<std::shared_ptr<sched::RequestStream>> stream = engine_->Submit(std::move(r));
    if (!stream.ok()) {
      reject(stream.status());
      return;
    }
    std::shared_ptr<sched::RequestStream> s = std::move(stream).value();
    session.requests[wire_id] = s->id();
    in_flight_.fetch_add(1);
    std::weak_ptr<wire::Connection> weak = session.connection;
    const uint64_t connection_id = session.connection->id();
    auto last = std::make_shared<Clock::time_point>(received);
    sched::RequestStream* raw = s.get();
    // Runs on the engine's step thread: encode and queue (thread-safe, non-blocking).
    Status set = s->SetCallback(
        [this, weak, wire_id, received, last, raw, connection_id](const sched::StreamEvent& e) {
          const auto now = Clock::now();
          auto connection = weak.lock();
          capnp::MallocMessageBuilder builder;
          if (e.kind == sched::StreamEvent::Kind::kToken) {
            if (e.index == 0) {
              metrics_.ttft.Observe(Seconds(now - received));
              metrics_.queue.Observe(Seconds(now - received));
            } else {
              metrics_.time_per_token.Observe(Seconds(now - *last));
            }
            *last = now;
            auto token = builder.initRoot<Envelope>().initToken();
            token.setRequestId(wire_id);
            token.setToken(static_cast<uint32_t>(e.token));
            token.setIndex(e.index);
            if (connection && !connection->SendBytes(Encode(builder)).ok()) {
              raw->RequestCancel();  // the client does not keep up (or left): stop generating
            }
            return;
          }
          metrics_.e2e.Observe(Seconds(now - received));
          auto finish = builder.initRoot<Envelope>().initFinish();
          finish.setRequestId(wire_id);
          finish.setReason(static_cast<wire::schema::FinishReason>(e.finish.reason));
          finish.setErrorCode(ToWire(e.finish.error.code()));
          finish.setErrorMessage(std::string(e.finish.error.message()));
          finish.setPromptTokens(e.finish.prompt_tokens);
          finish.setCachedTokens(e.finish.cached_tokens);
          finish.setGeneratedTokens(e.finish.generated_tokens);
          if (connection) (void)connection->SendBytes(Encode(builder));
          asio::post(io_, [this, connection_id, wire_id] { OnFinished(connection_id, wire_id); });
        });
    if (!set.ok()) LOG(ERROR) << "stream callback: " << set;
  }

  void OnFinished(uint64_t connection_id, uint64_t wire_id) {
    in_flight_.fetch_sub(1);
    auto it = sessions_.find(connection_id);
    if (it != sessions_.end()) it->second->requests.erase(wire_id);
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
    (void)session.connection->SendBytes(Encode(builder));
  }

  void SendHealth(Session& session) {
    capnp::MallocMessageBuilder builder;
    auto h = builder.initRoot<Envelope>().initHealth();
    h.setLive(true);
    h.setReady(Ready());
    h.setDraining(draining_);
    h.setGeneration(generation_);
    (void)session.connection->SendBytes(Encode(builder));
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
    (void)session.connection->SendBytes(Encode(builder));
    kv_subscribers_[session.connection->id()] = {session.connection, snapshot.sequence};
  }

  // Step thread. Holding kv_mu_ orders these batches with snapshots taken by Subscribe.
  void PublishKvEvents(const std::vector<engine::KvEvent>& events) {
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
        if (!c->SendBytes(Encode(builder)).ok()) {
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

  struct HttpRequest {
    explicit HttpRequest(asio::ip::tcp::socket s)
        : socket(std::move(s)), timer(socket.get_executor()) {}
    asio::ip::tcp::socket socket;
    asio::steady_timer timer;
    std::string buffer;
    std::string response;
  };

  void AcceptHttp() {
    http_acceptor_.async_accept([this](const asio::error_code& ec, asio::ip::tcp::socket socket) {
      if (ec) {
        if (ec == asio::error::operation_aborted || !http_acceptor_.is_open()) return;
        AcceptHttp();
        return;
      }
      auto req = std::make_shared<HttpRequest>(std::move(socket));
      req->timer.expires_after(std::chrono::seconds(5));
      req->timer.async_wait([req](const asio::error_code& e) {
        if (!e) {
          asio::error_code ignored;
          req->socket.close(ignored);
        }
      });
      asio::async_read_until(
          req->socket, asio::dynamic_buffer(req->buffer, 8192), "\r\n\r\n",
          [this, req](const asio::error_code& e, size_t) {
            if (e) {
              asio::error_code ignored;
              req->socket.close(ignored);
              req->timer.cancel();
              return;
            }
            req->response = HandleHttp(req->buffer);
            asio::async_write(req->socket, asio::buffer(req->response),
                              [req](const asio::error_code&, size_t) {
                                asio::error_code ignored;
                                req->socket.shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
                                req->socket.close(ignored);
                                req->timer.cancel();
                              });
          });
      AcceptHttp();
    });
  }

  std::string HandleHttp(const std::string& request) {
    const size_t line_end = request.find("\r\n");
    const std::string line = request.substr(0, line_end);
    const size_t sp1 = line.find(' ');
    const size_t sp2 = sp1 == std::string::npos ? std::string::npos : line.find(' ', sp1 + 1);
    bool head = false;
    auto reply = [&head](int code, const char* reason, const std::string& type,
                         const std::string& body) {
      return "HTTP/1.1 " + std::to_string(code) + " " + reason + "\r\nContent-Type: " + type +
             "\r\nContent-Length: " + std::to_string(body.size()) +
             "\r\nConnection: close\r\n\r\n" + (head ? std::string() : body);
    };
    if (sp1 == std::string::npos || sp2 == std::string::npos) {
      return reply(400, "Bad Request", "text/plain", "bad request\n");
    }
    const std::string method = line.substr(0, sp1);
    head = method == "HEAD";
    std::string path = line.substr(sp1 + 1, sp2 - sp1 - 1);
    if (const size_t q = path.find('?'); q != std::string::npos) path.resize(q);
    if (method != "GET" && method != "HEAD") {
      return reply(405, "Method Not Allowed", "text/plain", "only GET\n");
    }
    if (path == "/livez") return reply(200, "OK", "text/plain", "ok\n");
    if (path == "/readyz") {
      return Ready() ? reply(200, "OK", "text/plain", "ready\n")
                     : reply(503, "Service Unavailable", "text/plain",
                             draining_ ? "draining\n" : "not ready\n");
    }
    if (path == "/metrics") {
      return reply(200, "OK", "text/plain; version=0.0.4",
                   metrics_.Render(engine_->Stats(), Ready(), draining_,
                                   static_cast<int64_t>(sessions_.size())));
    }
    return reply(404, "Not Found", "text/plain", "not found\n");
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
  asio::steady_timer drain_timer_;
  std::unique_ptr<engine::Engine> engine_;
  uint64_t generation_ = 0;
  WorkerMetrics metrics_;
  std::unordered_map<uint64_t, std::shared_ptr<Session>> sessions_;  // io thread
  std::atomic<int64_t> in_flight_{0};
  std::atomic<bool> draining_{false};
  std::function<void()> drain_done_;
  Clock::time_point drain_deadline_;
  Clock::time_point flush_deadline_;
  uint64_t last_steps_ = 0;
  Clock::time_point last_progress_ = Clock::now();

  std::mutex kv_mu_;
  std::unordered_map<uint64_t, KvSubscriber> kv_subscribers_;  // guarded by kv_mu_
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
