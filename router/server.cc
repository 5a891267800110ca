// The router server: lifecycle, the listener and accepted connections (the Server class:
// server_internal.h).
#include "router/server_internal.h"

namespace chunkserve::router::server_internal {

Status Server::Init() {
  CHUNKSERVE_ASSIGN_OR_RETURN(PolicyKind kind, ParsePolicyKind(options_.policy));
  RouterCoreOptions core = options_.core;
  core.policy_kind = kind;
  if (membership_.model_known()) core.chain_seeds = {membership_.chain_seed()};
  CHUNKSERVE_ASSIGN_OR_RETURN(core_, RouterCore::Create(core));
  if (options_.max_attempts < 1) return Status::InvalidArgument("max_attempts must be >= 1");
  CHUNKSERVE_ASSIGN_OR_RETURN(
      max_connections_,
      wire::ListenServer(acceptor_, options_.listen_host, options_.listen_port, http_acceptor_,
                         options_.http_host, options_.http_port, options_.max_connections));
  return Status::Ok();
}

void Server::Start() {
  Accept();
  if (http_acceptor_.is_open()) {
    front_door_.Start(io_, http_acceptor_,
                      {options_.model_text, options_.listen_host, port(), options_.connection,
                       options_.tls_client, options_.api_key},
                      [this](const std::string& path) { return Probe(path); });
  }
  ScheduleLeaseCheck();
  ScheduleRequestCheck();
}

void Server::Shutdown(std::function<void()> done) {
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
    front_door_.Stop();
    for (auto& [id, peer] : peers_) peer->connection->Close(Status::Unavailable("router exit"));
    for (auto& [id, w] : workers_) {
      if (w.data) w.data->Close(Status::Unavailable("router exit"));
    }
    if (done) done();
  });
}

void Server::Accept() {
  wire::AcceptLoop(acceptor_, [this](asio::ip::tcp::socket socket) {
    connections_total_++;
    if (static_cast<int64_t>(peers_.size()) >= max_connections_) {
      connections_refused_++;
      wire::RefuseSocket(socket, Status::ResourceExhausted("router connection limit (" +
                                                           std::to_string(max_connections_) +
                                                           ") reached; retry later"));
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

void Server::OnPeerClose(uint64_t id, const Status& reason) {
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

void Server::OnPeerMessage(Peer& peer, wire::DecodedMessage& message) {
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

void Server::SendStats(Peer& peer) {
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

}  // namespace chunkserve::router::server_internal

namespace chunkserve::router {

Result<std::unique_ptr<RouterServer>> RouterServer::Create(asio::io_context& io,
                                                           const RouterOptions& options) {
  auto server = std::make_unique<server_internal::Server>(io, options);
  CHUNKSERVE_RETURN_IF_ERROR(server->Init());
  server->Start();
  return std::unique_ptr<RouterServer>(std::move(server));
}

}  // namespace chunkserve::router
