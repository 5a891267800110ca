// The command-line flags every chunkserve server (worker, router) takes for the connections it
// accepts, parsed in one place:
//
//   --secret-file PATH          cluster secret (else $CHUNKSERVE_CLUSTER_SECRET; none: no auth)
//   --client-token-file PATH    client token (else $CHUNKSERVE_CLIENT_TOKEN); clients prove it or
//                               the cluster secret
//   --max-connections N         accepted connections (default 4096, also kept below the
//                               descriptor limit)
//   --max-frame-bytes N         largest frame from an unauthenticated or client peer (4 MiB)
//   --frame-timeout-ms N        a started frame must complete within this (10000)
//   --buffer-budget-mb N        partly received frames across all connections (256)
//   --handshake-timeout-ms N    first frame (10000)
//   --idle-timeout-ms N         silence before a connection is closed (server's default)
//   --tls-cert/--tls-key/--tls-ca PATH   TLS on every link (tls.h): this process's certificate
//                               and key, and the cluster CA; accepted connections must speak
//                               TLS, dialled links use it too
//   --tls-crl PATH              the CA's revocation lists (PEM): a listed peer certificate is
//                               refused; re-read within a second of the file changing
//
// Secrets are read from files or the environment only, never from a flag value (`ps` shows
// those), and are not logged.
#ifndef CHUNKSERVE_RUNTIME_WIRE_SERVER_FLAGS_H_
#define CHUNKSERVE_RUNTIME_WIRE_SERVER_FLAGS_H_

#include <chrono>
#include <cstdint>
#include <string>

#include "runtime/base/status.h"
#include "runtime/wire/connection.h"
#include "runtime/wire/tls.h"

namespace chunkserve::wire {

struct ServerFlags {
  std::string secret_file;
  std::string client_token_file;
  int64_t max_connections = 4096;
  int64_t max_frame_bytes = 4 << 20;
  int64_t frame_timeout_ms = 10000;
  int64_t buffer_budget_mb = 256;
  int64_t handshake_timeout_ms = 10000;
  int64_t idle_timeout_ms = 0;
  TlsFiles tls;
};

// Whether `flag` is one of the flags above.
bool IsServerFlag(const std::string& flag);

// Parses one of them; InvalidArgument naming the flag and its range.
Status ParseServerFlag(const std::string& flag, const std::string& value, ServerFlags* flags);

// What the flags make: options for accepted connections (limits, deadlines, budget, the
// challenge when a secret is set), the cluster secret the server proves on its own outgoing
// links, and the connection cap. InvalidArgument for an unreadable or too short secret.
struct ServerConnections {
  ConnectionOptions connection;  // .tls: the server context when TLS is on
  TlsContexts tls;               // both contexts; .client for the links this process dials
  std::string cluster_secret;
  int32_t max_connections = 4096;
};
Result<ServerConnections> MakeServerConnections(const ServerFlags& flags);

// The usage lines of the flags above.
const char* ServerFlagsUsage();

}  // namespace chunkserve::wire

#endif  // CHUNKSERVE_RUNTIME_WIRE_SERVER_FLAGS_H_
