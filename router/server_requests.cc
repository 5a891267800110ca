// Requests: admission, dispatch and failover across legs, tokens and finishes back to clients (the
// Server class: server_internal.h).
#include "router/server_internal.h"

namespace chunkserve::router::server_internal {

void Server::OnGenerate(Peer& peer, wire::schema::Generate::Reader g) {
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
  p->logprobs = m.logprobs;
  if (m.deadline_ms > 0) {
    p->has_deadline = true;
    p->deadline = p->received + std::chrono::milliseconds(m.deadline_ms);
  }
  prompt_tokens_total_ += p->prompt.size();
  peer.requests[rid] = p;
  Dispatch(p);
}

void Server::Dispatch(const std::shared_ptr<Pending>& p) {
  if (p->done) return;
  if (p->cancelled || p->client_gone) {
    FinishToClient(*p, FinishReason::kCancelled, Status::Ok(), 0);
    return;
  }
  if (!p->sent.empty() && std::find(p->stop_tokens.begin(), p->stop_tokens.end(), p->sent.back()) !=
                              p->stop_tokens.end()) {
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
  Result<RoutingRequest> rr =
      MakeRoutingRequest(membership_.chain_seed(), membership_.model().chunk_size, full, remaining);
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
                            .priority = p->priority,
                            .logprobs = p->logprobs});
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
  p->leg_uncached =
      std::max<int64_t>(0, static_cast<int64_t>(full.size()) - d.predicted_cached_tokens);
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

void Server::CorrectReported(const Pending& p, bool first_token, bool ended) {
  auto wit = workers_.find(p.worker);
  if (wit == workers_.end() || !wit->second.in_core) return;
  WorkerLoad& l = wit->second.reported;
  if (first_token) {
    // The worker counts only a prompt's uncached tokens (and a prefix shared by queued prompts
    // once): taking the whole prompt off would show a worker that serves cached prefixes as
    // less loaded than it is until its next report. The estimate is the one the pick added.
    const auto prefill = static_cast<uint64_t>(p.leg_uncached);
    l.queued_prefill_tokens -= std::min(l.queued_prefill_tokens, prefill);
  }
  if (ended && l.running_sequences > 0) l.running_sequences--;
  (void)core_->UpdateLoad(p.worker, l, /*fresh=*/false);
}

void Server::EndLeg(Pending& p, std::optional<int64_t> reported_cached,
                    std::optional<int32_t> output_tokens) {
  if (p.upstream == 0) return;
  CorrectReported(p, !p.leg_started, true);
  (void)core_->OnFinished(RequestId(p.upstream), reported_cached, output_tokens);
  auto wit = workers_.find(p.worker);
  if (wit != workers_.end()) wit->second.upstream.erase(p.upstream);
  upstream_.erase(p.upstream);
  p.upstream = 0;
}

void Server::CancelUpstream(Pending& p) {
  if (p.upstream == 0) return;
  auto wit = workers_.find(p.worker);
  if (wit == workers_.end() || !wit->second.data) return;
  (void)wit->second.data->SendBytes(wire::EncodeCancel(p.upstream));
}

Peer* Server::ClientOf(const Pending& p) {
  auto it = peers_.find(p.client_connection);
  return it == peers_.end() ? nullptr : it->second.get();
}

void Server::Fail(Pending& p, const Status& status) {
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
  FinishToClient(
      p, wire::IsRetryable(status.code()) ? FinishReason::kUnavailable : FinishReason::kError,
      status, 0);
}

void Server::FinishToClient(Pending& p, FinishReason reason, const Status& error, int32_t cached) {
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

void Server::OnUpstreamMessage(WorkerId worker, wire::DecodedMessage& message) {
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

std::shared_ptr<Pending> Server::FindUpstream(uint64_t up) {
  auto it = upstream_.find(up);
  return it == upstream_.end() ? nullptr : it->second;
}

void Server::OnUpstreamToken(const wire::TokenMessage& t) {
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
  if (!c->connection
           ->SendBytes(wire::EncodeToken({p->client_request_id, t.token, index, t.logprobs}))
           .ok()) {
    // The client does not keep up: stop generating for it.
    p->cancelled = true;
    CancelUpstream(*p);
  }
}

void Server::OnUpstreamFinish(WorkerId worker, const wire::FinishMessage& f) {
  std::shared_ptr<Pending> p = FindUpstream(f.request_id);
  if (!p) return;
  const int32_t cached = std::max(0, f.cached_tokens);
  const bool reroute = f.reason == FinishReason::kUnavailable && !p->cancelled && !p->client_gone;
  // A re-routed leg's report does not count (the request is not done), nor does a leg
  // cancelled before its prefill (the worker never looked its prompt up).
  std::optional<int64_t> reported;
  if (!reroute && (p->leg_started || f.reason != FinishReason::kCancelled)) reported = cached;
  // Its length (every leg's tokens) when it ended on its own: what the next requests' slot
  // waits are predicted with.
  std::optional<int32_t> output;
  if (f.reason == FinishReason::kLength || f.reason == FinishReason::kStopToken) {
    output = static_cast<int32_t>(p->sent.size());
  }
  EndLeg(*p, reported, output);
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

void Server::OnUpstreamError(WorkerId worker, wire::schema::Error::Reader e) {
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
  Fail(*p, Status(wire::FromWireErrorCode(e.getCode()), e.getMessage().cStr()));
}

}  // namespace chunkserve::router::server_internal
