// The HTTP probes and Prometheus metrics (the Server class: server_internal.h).
#include "router/server_internal.h"

namespace chunkserve::router::server_internal {
namespace {

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

}  // namespace

http::Reply Server::Probe(const std::string& path) {
  if (path == "/livez") return {200, "text/plain", "ok\n", {}};
  if (path == "/readyz") {
    if (Ready()) return {200, "text/plain", "ready\n", {}};
    return {503, "text/plain", shutting_down_ ? "shutting down\n" : "no worker alive\n", {}};
  }
  if (path == "/metrics") return {200, "text/plain; version=0.0.4", Metrics(), {}};
  return {404, "text/plain", "not found\n", {}};
}

std::string Server::Metrics() {
  std::ostringstream o;
  auto counter = [&o](const char* name, const char* help, uint64_t v) {
    o << "# HELP chunkserve_router_" << name << " " << help << "\n# TYPE chunkserve_router_" << name
      << " counter\nchunkserve_router_" << name << " " << v << "\n";
  };
  auto gauge = [&o](const char* name, const char* help, double v) {
    o << "# HELP chunkserve_router_" << name << " " << help << "\n# TYPE chunkserve_router_" << name
      << " gauge\nchunkserve_router_" << name << " " << v << "\n";
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
  gauge("index_chunk_nodes", "Distinct chunk hashes indexed.", static_cast<double>(is.chunk_nodes));
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
    o << "# HELP chunkserve_router_" << name << " " << help << "\n# TYPE chunkserve_router_" << name
      << " counter\n";
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
  // From the last load report of each routable worker: whether a report with the worker's
  // current state (its engine progress) or a measured prefill rate has arrived yet.
  auto per_routable = [&](const char* name, const char* type, const char* help, auto value) {
    o << "# HELP chunkserve_router_" << name << " " << help << "\n# TYPE chunkserve_router_" << name
      << " " << type << "\n";
    for (const auto& [id, m] : membership_.members()) {
      auto it = workers_.find(id);
      if (it == workers_.end() || !it->second.in_core) continue;
      o << "chunkserve_router_" << name << "{worker=\"" << Label(m.registration.name) << "\"} "
        << value(it->second) << "\n";
    }
  };
  per_routable("worker_reported_engine_progress", "gauge",
               "LoadReport.engineProgress of each routable worker's last report (engine steps + "
               "requests ended).",
               [](const WorkerLinks& w) { return w.reported_progress; });
  per_routable("worker_reported_prefill_tokens_per_s", "gauge",
               "LoadReport.prefillTokensPerS of each routable worker's last report (0: not "
               "measured yet; the policy then assumes a default).",
               [](const WorkerLinks& w) { return w.reported.prefill_tokens_per_s; });
  // The load the policy sees when it picks (LoadTracker::Effective): the last report, corrected
  // for the first tokens and ends seen since, merged with this router's own picks.
  auto per_effective = [&](const char* name, const char* help, auto value) {
    o << "# HELP chunkserve_router_" << name << " " << help << "\n# TYPE chunkserve_router_" << name
      << " gauge\n";
    for (const auto& [id, m] : membership_.members()) {
      auto it = workers_.find(id);
      if (it == workers_.end() || !it->second.in_core) continue;
      o << "chunkserve_router_" << name << "{worker=\"" << Label(m.registration.name) << "\"} "
        << value(core_->loads().Effective(id)) << "\n";
    }
  };
  per_effective("worker_queued_prefill_tokens",
                "Prompt tokens awaiting prefill on each routable worker as the routing policy "
                "sees them (last report, corrected since, with this router's picks).",
                [](const WorkerLoad& l) { return l.queued_prefill_tokens; });
  per_effective("worker_running_sequences",
                "Running sequences of each routable worker as the routing policy sees them.",
                [](const WorkerLoad& l) { return l.running_sequences; });
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

}  // namespace chunkserve::router::server_internal
