// Workers: registration, control and data links, load reports, KV events, leases, liveness (the
// Server class: server_internal.h).
#include "router/server_internal.h"

namespace chunkserve::router::server_internal {

void Server::OnWorkerMessage(Peer& peer, Envelope::Reader root) {
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

void Server::Refuse(Peer& peer, const std::string& reason) {
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

void Server::OnRegister(Peer& peer, wire::schema::Register::Reader r) {
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

void Server::ConnectData(WorkerId id, const std::string& host, uint16_t port) {
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

void Server::RefuseMember(WorkerId id, const std::string& reason) {
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

void Server::OnDataConnected(WorkerId id, asio::ip::tcp::socket socket) {
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
  copts.idle_counts_sends = false;  // our Pings must not keep a silent worker's link alive
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

void Server::OnLoadReport(Peer& peer, wire::schema::LoadReport::Reader r) {
  Member* member = membership_.Find(peer.worker);
  auto it = workers_.find(peer.worker);
  if (member == nullptr || it == workers_.end()) return;
  (void)membership_.Renew(peer.worker, Now());
  member->load_reports++;
  it->second.reported_progress = r.getEngineProgress();
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

void Server::OnKvEvents(Peer& peer, wire::schema::KvEvents::Reader ev) {
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

void Server::KillWorker(WorkerId id, uint64_t incarnation, const std::string& why) {
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

void Server::MoveElsewhere(const std::shared_ptr<Pending>& p, WorkerId from) {
  p->refused.insert(from);
  if (p->sent.empty()) {
    rerouted_++;
  } else {
    migrated_++;
  }
  Dispatch(p);
}

void Server::ScheduleLeaseCheck() {
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

void Server::UpdateAccepting(WorkerId id) {
  auto it = workers_.find(id);
  if (it == workers_.end() || !it->second.in_core) return;
  (void)core_->SetAccepting(id, it->second.accepting && liveness_.routable(id));
}

void Server::ApplyLiveness(const std::vector<Liveness::Change>& changes) {
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

void Server::ScheduleRequestCheck() {
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

}  // namespace chunkserve::router::server_internal
