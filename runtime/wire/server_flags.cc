#include "runtime/wire/server_flags.h"

#include <cstdlib>
#include <memory>

#include "runtime/base/logging.h"

namespace chunkserve::wire {
namespace {

bool ParseInt(const std::string& s, long long lo, long long hi, int64_t* out) {
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || v < lo || v > hi) return false;
  *out = v;
  return true;
}

}  // namespace

bool IsServerFlag(const std::string& flag) {
  return flag == "--secret-file" || flag == "--client-token-file" || flag == "--max-connections" ||
         flag == "--max-frame-bytes" || flag == "--frame-timeout-ms" ||
         flag == "--buffer-budget-mb" || flag == "--handshake-timeout-ms" ||
         flag == "--idle-timeout-ms" || flag == "--tls-cert" || flag == "--tls-key" ||
         flag == "--tls-ca" || flag == "--tls-crl";
}

Status ParseServerFlag(const std::string& flag, const std::string& value, ServerFlags* f) {
  auto range = [&](const char* r) {
    return Status::InvalidArgument("bad value for " + flag + ": " + value + " (" + r + ")");
  };
  if (flag == "--secret-file") {
    f->secret_file = value;
  } else if (flag == "--client-token-file") {
    f->client_token_file = value;
  } else if (flag == "--tls-cert") {
    f->tls.cert_file = value;
  } else if (flag == "--tls-key") {
    f->tls.key_file = value;
  } else if (flag == "--tls-ca") {
    f->tls.ca_file = value;
  } else if (flag == "--tls-crl") {
    f->tls.crl_file = value;
  } else if (flag == "--max-connections") {
    if (!ParseInt(value, 1, 1 << 20, &f->max_connections)) return range("1 .. 1048576");
  } else if (flag == "--max-frame-bytes") {
    if (!ParseInt(value, 4096, 1ll << 30, &f->max_frame_bytes)) return range("4096 .. 2^30");
  } else if (flag == "--frame-timeout-ms") {
    if (!ParseInt(value, 0, 86400000, &f->frame_timeout_ms)) return range("0 .. 86400000");
  } else if (flag == "--buffer-budget-mb") {
    if (!ParseInt(value, 1, 1 << 20, &f->buffer_budget_mb)) return range("1 .. 1048576");
  } else if (flag == "--handshake-timeout-ms") {
    if (!ParseInt(value, 0, 86400000, &f->handshake_timeout_ms)) return range("0 .. 86400000");
  } else if (flag == "--idle-timeout-ms") {
    if (!ParseInt(value, 0, 86400000, &f->idle_timeout_ms)) return range("0 .. 86400000");
  } else {
    return Status::InvalidArgument("not a server connection flag: " + flag);
  }
  return Status::Ok();
}

Result<ServerConnections> MakeServerConnections(const ServerFlags& f) {
  ServerConnections out;
  CHUNKSERVE_ASSIGN_OR_RETURN(std::string secret, LoadSecret(f.secret_file, kClusterSecretEnv));
  CHUNKSERVE_ASSIGN_OR_RETURN(std::string token, LoadSecret(f.client_token_file, kClientTokenEnv));
  if (secret.empty() && !token.empty()) {
    return Status::InvalidArgument(
        "a client token without a cluster secret protects nothing: set the cluster secret too");
  }
  ConnectionOptions& c = out.connection;
  c.limits.max_message_bytes = static_cast<size_t>(f.max_frame_bytes);
  c.frame_timeout = std::chrono::milliseconds(f.frame_timeout_ms);
  c.handshake_timeout = std::chrono::milliseconds(f.handshake_timeout_ms);
  c.idle_timeout = std::chrono::milliseconds(f.idle_timeout_ms);
  c.idle_counts_sends = true;  // a client reading a long stream is not idle
  c.budget = std::make_shared<ByteBudget>(static_cast<size_t>(f.buffer_budget_mb) << 20);
  if (!secret.empty()) {
    auto keys = std::make_shared<AuthKeys>();
    keys->cluster_secret = secret;
    keys->client_token = token;
    c.server_auth = keys;
  }
  CHUNKSERVE_ASSIGN_OR_RETURN(out.tls, MakeTlsContexts(f.tls));
  c.tls = out.tls.server;
  if (out.tls.enabled()) {
    LOG(INFO) << "wire links use TLS; peers are verified against " << f.tls.ca_file;
    if (!f.tls.crl_file.empty()) {
      LOG(INFO) << "TLS CRL " << f.tls.crl_file << ": " << out.tls.server->revoked_count()
                << " certificates revoked (re-read when the file changes)";
    }
  }
  out.cluster_secret = std::move(secret);
  out.max_connections = static_cast<int32_t>(f.max_connections);
  return out;
}

const char* ServerFlagsUsage() {
  return "  [--secret-file PATH] [--client-token-file PATH] [--max-connections N]\n"
         "  [--max-frame-bytes N] [--frame-timeout-ms N] [--buffer-budget-mb N]\n"
         "  [--handshake-timeout-ms N] [--idle-timeout-ms N]\n"
         "  [--tls-cert PEM --tls-key PEM --tls-ca PEM [--tls-crl PEM]]\n"
         "secrets: also $CHUNKSERVE_CLUSTER_SECRET / $CHUNKSERVE_CLIENT_TOKEN (never a flag "
         "value)\n";
}

}  // namespace chunkserve::wire
