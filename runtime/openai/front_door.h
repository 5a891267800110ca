// The HTTP front door of a worker or router process: one HTTP port answering the probes
// (/livez, /readyz, /metrics) and, when the process knows its model's tokenizer, the OpenAI API
// (gateway.h). Without a tokenizer the /v1 paths answer 404 saying so.
#ifndef CHUNKSERVE_RUNTIME_OPENAI_FRONT_DOOR_H_
#define CHUNKSERVE_RUNTIME_OPENAI_FRONT_DOOR_H_

#include <functional>
#include <memory>
#include <string>

#include "runtime/http/server.h"
#include "runtime/openai/gateway.h"
#include "runtime/tokenizer/model_text.h"
#include "runtime/wire/connection.h"

namespace chunkserve::openai {

// The gateway's options for a process serving its wire port at `host`:`port` with the
// server-side connection options `wire_side` (a client token or cluster secret there is what the
// gateway proves), the TLS client context `tls` (null: plain; needed when the port requires TLS)
// and the API key HTTP clients must present (empty: none).
GatewayOptions GatewayOptionsFor(tokenizer::ModelText model, const std::string& host,
                                 uint16_t port, const wire::ConnectionOptions& wire_side,
                                 std::shared_ptr<wire::TlsContext> tls, std::string api_key);

// The probe answers of the process, by path ("/livez", "/readyz", "/metrics"; others 404).
using ProbeHandler = std::function<http::Reply(const std::string& path)>;

// The handler to serve: /v1/... through `gateway` (may be null), GET/HEAD probes, 405 for other
// methods on probe paths. /metrics gets the gateway's counters appended.
http::Handler FrontDoorHandler(std::shared_ptr<Gateway> gateway, ProbeHandler probes);

}  // namespace chunkserve::openai

#endif  // CHUNKSERVE_RUNTIME_OPENAI_FRONT_DOOR_H_
