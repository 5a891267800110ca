// The operational HTTP endpoint shared by chunkserve-worker and chunkserve-router: /livez,
// /readyz and /metrics for probes and Prometheus, on a port separate from the wire protocol.
//
// Deliberately minimal: one request per connection (Connection: close), GET and HEAD only, a
// request head of at most 8 KiB, 5 s to read it and answer; anything else gets 400/405 or a
// closed socket. It runs on the process's one Asio event loop, so handlers run there too.
#ifndef CHUNKSERVE_RUNTIME_WIRE_HTTP_PROBE_H_
#define CHUNKSERVE_RUNTIME_WIRE_HTTP_PROBE_H_

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "runtime/wire/asio.h"

#include "runtime/base/status.h"
#include "runtime/wire/listen.h"  // ListenTcp, which opens the acceptor ServeHttp takes

namespace chunkserve::wire {

struct HttpReply {
  int status = 200;                        // 200, 404, 503, ...
  std::string content_type = "text/plain";
  std::string body;
};

// Answers one request path (the query string already removed).
using HttpHandler = std::function<HttpReply(const std::string& path)>;

// Parses an HTTP/1.x request head and renders the complete response: 400 for a malformed request
// line, 405 for a method other than GET or HEAD (HEAD gets the headers without the body).
std::string RenderHttpResponse(std::string_view request_head, const HttpHandler& handler);

// Serves requests accepted on `acceptor` until it is closed. `acceptor` must outlive the loop's
// pending operations (close it, then let the loop run them out).
void ServeHttp(asio::ip::tcp::acceptor& acceptor, HttpHandler handler);

}  // namespace chunkserve::wire

#endif  // CHUNKSERVE_RUNTIME_WIRE_HTTP_PROBE_H_
