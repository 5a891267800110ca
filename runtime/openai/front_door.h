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

// What a process serves on its HTTP acceptor: the HTTP server, and the gateway when it knows its
// model's text. Start and Stop on the loop thread; Stop (also on destruction) closes every HTTP
// connection and fails the API requests in flight.
class FrontDoor {
 public:
  struct Options {
    std::shared_ptr<const tokenizer::ModelText> model_text;  // null: probes only
    std::string wire_host;                                   // the process's wire port
    uint16_t wire_port = 0;
    wire::ConnectionOptions wire_side;  // its server-side options (client token, TLS)
    std::shared_ptr<wire::TlsContext> tls_client;
    std::string api_key;
  };
  FrontDoor() = default;
  FrontDoor(const FrontDoor&) = delete;
  FrontDoor& operator=(const FrontDoor&) = delete;
  ~FrontDoor() { Stop(); }

  void Start(asio::io_context& io, asio::ip::tcp::acceptor& acceptor, const Options& options,
             ProbeHandler probes);
  void Stop();

 private:
  std::shared_ptr<http::HttpServer> http_;
  std::shared_ptr<Gateway> gateway_;
};

}  // namespace chunkserve::openai

#endif  // CHUNKSERVE_RUNTIME_OPENAI_FRONT_DOOR_H_
