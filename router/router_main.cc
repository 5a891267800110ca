// chunkserve-router: prefix-aware router in front of chunkserve-worker processes; see
// router/README.md.
#include "runtime/wire/asio.h"
#include <cstdio>
#include <cstdlib>
#include <string>

#include "router/membership.h"
#include "router/server.h"
#include "runtime/base/status.h"
#include "runtime/openai/api_flags.h"
#include "runtime/wire/server_flags.h"

namespace chunkserve::router {
namespace {

bool ParseInt(const std::string& s, long long lo, long long hi, long long* out) {
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 0);
  if (s.empty() || *end != '\0' || v < lo || v > hi) return false;
  *out = v;
  return true;
}

bool ParseDouble(const std::string& s, double lo, double hi, double* out) {
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || *end != '\0' || !(v >= lo && v <= hi)) return false;
  *out = v;
  return true;
}

// Like ParseHostPort, but port 0 (ephemeral) is allowed for listeners.
bool ParseListen(const std::string& s, std::string* host, int32_t* port) {
  const size_t colon = s.rfind(':');
  if (colon == std::string::npos || colon == 0) return false;
  long long p = 0;
  if (!ParseInt(s.substr(colon + 1), 0, 65535, &p)) return false;
  *host = s.substr(0, colon);
  *port = static_cast<int32_t>(p);
  return true;
}

constexpr char kUsage[] =
    "usage: chunkserve-router [--listen HOST:PORT] [--http HOST:PORT] [--policy NAME]\n"
    "         [--lease-ms N] [--model-fingerprint N] [--chunk-size N]\n"
    "         [--max-in-flight-per-worker N] [--max-attempts N] [--load-cap X]\n"
    "         [--index-mb N] [--decision-ttl-ms N] [--stall-timeout-ms N]\n"
    "         [--first-token-timeout-ms N] [--keepalive-ms N] [--link-idle-timeout-ms N]\n"
    "policies: ttft (default), round_robin, least_loaded, consistent_hash,\n"
    "          cache_aware_threshold\n"
    "accepted connections (clients and workers' control links):\n";

int Main(int argc, char** argv) {
  RouterOptions options;
  wire::ServerFlags server_flags;
  openai::ApiFlags api_flags;
  server_flags.idle_timeout_ms = 60000;  // clients: the C client sends a HealthRequest every 5 s
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      std::fputs(kUsage, stdout);
      std::fputs(wire::ServerFlagsUsage(), stdout);
      std::fputs(openai::ApiFlagsUsage(), stdout);
      return 0;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "missing value for %s\n%s", flag.c_str(), kUsage);
      return 2;
    }
    const std::string value = argv[++i];
    long long n = 0;
    double x = 0;
    bool ok = true;
    if (flag == "--listen") {
      int32_t port = 0;
      ok = ParseListen(value, &options.listen_host, &port);
      options.listen_port = static_cast<uint16_t>(port);
    } else if (flag == "--http") {
      ok = ParseListen(value, &options.http_host, &options.http_port);
    } else if (flag == "--policy") {
      ok = ParsePolicyKind(value).ok();
      options.policy = value;
    } else if (flag == "--lease-ms") {
      ok = ParseInt(value, 50, 3600000, &n);
      options.lease = std::chrono::milliseconds(n);
    } else if (flag == "--model-fingerprint") {
      char* end = nullptr;
      options.model.model_fingerprint = std::strtoull(value.c_str(), &end, 0);
      ok = !value.empty() && *end == '\0';
    } else if (flag == "--chunk-size") {
      ok = ParseInt(value, 1, 4096, &n);
      options.model.chunk_size = static_cast<int32_t>(n);
    } else if (flag == "--max-in-flight-per-worker") {
      ok = ParseInt(value, 0, 1 << 24, &n);
      options.max_in_flight_per_worker = static_cast<int32_t>(n);
    } else if (flag == "--max-attempts") {
      ok = ParseInt(value, 1, 1000, &n);
      options.max_attempts = static_cast<int32_t>(n);
    } else if (flag == "--load-cap") {
      ok = ParseDouble(value, 0.01, 1e6, &x);
      options.core.policy.load_cap = x;
    } else if (flag == "--index-mb") {
      ok = ParseInt(value, 1, 1 << 20, &n);
      options.core.index.byte_budget = static_cast<size_t>(n) << 20;
    } else if (flag == "--decision-ttl-ms") {
      ok = ParseInt(value, 0, 3600000, &n);
      options.core.index.decision_ttl = std::chrono::milliseconds(n);
    } else if (flag == "--stall-timeout-ms") {
      ok = ParseInt(value, 0, 86400000, &n);
      options.liveness.stall_timeout = std::chrono::milliseconds(n);
    } else if (flag == "--first-token-timeout-ms") {
      ok = ParseInt(value, 0, 86400000, &n);
      options.first_token_timeout = std::chrono::milliseconds(n);
    } else if (flag == "--keepalive-ms") {
      ok = ParseInt(value, 10, 3600000, &n);
      options.keepalive = std::chrono::milliseconds(n);
    } else if (flag == "--link-idle-timeout-ms") {
      ok = ParseInt(value, 50, 86400000, &n);
      options.link_idle_timeout = std::chrono::milliseconds(n);
    } else if (openai::IsApiFlag(flag)) {
      if (Status s = openai::ParseApiFlag(flag, value, &api_flags); !s.ok()) {
        std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
        return 2;
      }
    } else if (wire::IsServerFlag(flag)) {
      if (Status s = wire::ParseServerFlag(flag, value, &server_flags); !s.ok()) {
        std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
        return 2;
      }
    } else {
      std::fprintf(stderr, "unknown flag %s\n%s", flag.c_str(), kUsage);
      return 2;
    }
    if (!ok) {
      std::fprintf(stderr, "bad value for %s: %s\n", flag.c_str(), value.c_str());
      return 2;
    }
  }

  Result<wire::ServerConnections> connections = wire::MakeServerConnections(server_flags);
  if (!connections.ok()) {
    std::fprintf(stderr, "chunkserve-router: %s\n", connections.status().ToString().c_str());
    return 2;
  }
  options.connection = connections.value().connection;
  options.cluster_secret = connections.value().cluster_secret;
  options.tls_client = connections.value().tls.client;
  options.max_connections = connections.value().max_connections;
  Result<openai::ApiSetup> api = openai::MakeApiSetup(api_flags, "");
  if (!api.ok()) {
    std::fprintf(stderr, "chunkserve-router: %s\n", api.status().ToString().c_str());
    return 2;
  }
  options.model_text = api.value().model_text;
  options.api_key = api.value().api_key;
  if (options.link_idle_timeout <= options.keepalive) {
    std::fprintf(stderr, "--link-idle-timeout-ms must exceed --keepalive-ms\n");
    return 2;
  }

  asio::io_context io(1);
  Result<std::unique_ptr<RouterServer>> server = RouterServer::Create(io, options);
  if (!server.ok()) {
    std::fprintf(stderr, "chunkserve-router: %s\n", server.status().ToString().c_str());
    return 1;
  }
  std::printf("listening on %s:%u\n", options.listen_host.c_str(), server.value()->port());
  if (options.http_port >= 0) {
    std::printf("http on %s:%u\n", options.http_host.c_str(), server.value()->http_port());
  }
  std::fflush(stdout);

  // Signals are handled here, in the executable only.
  asio::signal_set signals(io, SIGTERM, SIGINT);
  signals.async_wait([&](const asio::error_code& ec, int) {
    if (ec) return;
    server.value()->Shutdown([&io] { io.stop(); });
  });
  io.run();
  server.value().reset();
  return 0;
}

}  // namespace
}  // namespace chunkserve::router

int main(int argc, char** argv) { return chunkserve::router::Main(argc, argv); }
