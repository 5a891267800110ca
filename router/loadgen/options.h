// chunkserve-loadgen's command line: the flags (usage in options.cc's kUsage), the workload or
// trace they choose, and the client's key and TLS setup taken from the environment and --tls-ca.
#ifndef CHUNKSERVE_ROUTER_LOADGEN_OPTIONS_H_
#define CHUNKSERVE_ROUTER_LOADGEN_OPTIONS_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "runtime/wire/tls.h"
#include "runtime/workload/workload.h"

namespace chunkserve::router::loadgen {

using workload::TraceOptions;
using workload::WorkloadOptions;

struct Options {
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  std::string http_host = "127.0.0.1";
  uint16_t http_port = 0;  // 0: no metrics
  std::string trace;
  TraceOptions trace_options;
  WorkloadOptions workload;
  int32_t connections = 4;
  std::string json_path;
  std::string label;
  bool control = true;
  double timeout_s = 600;
  std::string tls_ca;    // set: TLS, the server verified against this CA
  std::string auth_key;  // answers the server's challenge (from the environment)
  std::shared_ptr<wire::TlsContext> tls;
};

// Fills `o` from argv: --workload's family defaults first, then every other flag over them; then
// the key that answers a server's challenge ($CHUNKSERVE_CLIENT_TOKEN, else
// $CHUNKSERVE_CLUSTER_SECRET) and the TLS context of --tls-ca. nullopt: run with `o`; otherwise
// the process's exit status, its message already printed (0 for --help, 2 for a bad command line,
// environment or CA file).
std::optional<int> ParseOptions(int argc, char** argv, Options* o);

}  // namespace chunkserve::router::loadgen

#endif  // CHUNKSERVE_ROUTER_LOADGEN_OPTIONS_H_
