// HttpServer: HTTP/1.1 on the process's Asio event loop, with Boost.Beast doing the protocol
// (parsing, chunked encoding, keep-alive). One per worker or router process; it serves the
// probes (/livez, /readyz, /metrics) and the OpenAI-compatible API (runtime/openai).
//
//   auto server = http::HttpServer::Start(acceptor, {}, [](http::Request r, auto responder) {
//     responder->Reply({200, "text/plain", "ok\n"});
//   });
//
// A handler gets each request once it has been read whole, and answers through its Responder,
// either once (Reply) or as a stream (StartStream, Write..., End: chunked transfer encoding, as
// server-sent events need). Handlers may answer later (from the loop thread); while a request is
// being answered the connection watches its socket, so a client that goes away is noticed at once
// and the responder's close callback runs (cancelling what the request started).
//
// Bounds (ServerOptions): request head and body sizes (431 / 413), the time to read a request
// (close), the time a client may take to accept written bytes (close), the bytes queued for a slow
// streaming client (the stream is cut, the close callback runs) and the number of connections
// (beyond it: 503 and close). Malformed requests get 400 with a JSON error body and a close.
//
// Thread safety: Start, Stop and every Responder call on the loop thread; connections() and
// requests() from any thread.
#ifndef CHUNKSERVE_RUNTIME_HTTP_SERVER_H_
#define CHUNKSERVE_RUNTIME_HTTP_SERVER_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/wire/asio.h"

namespace chunkserve::http {

struct Request {
  std::string method;  // "GET", "POST", ...
  std::string path;    // the target without the query string
  std::string query;   // after '?', may be empty
  std::string body;
  std::string authorization;  // the Authorization header, may be empty
  std::string content_type;
  uint64_t connection = 0;    // which connection it came on (for logs)
};

struct Reply {
  int status = 200;
  std::string content_type = "text/plain";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // extra headers
};

class Responder {
 public:
  virtual ~Responder() = default;
  // The whole answer. HEAD requests get the headers (with the body's length) only.
  virtual void Reply(Reply reply) = 0;
  // Starts a chunked answer; Write sends one chunk each, End the last chunk.
  virtual void StartStream(int status, std::string content_type) = 0;
  // False when the client is gone or too far behind (the connection is then closed and the
  // close callback has run); the data is dropped.
  virtual bool Write(std::string data) = 0;
  virtual void End() = 0;
  // Runs once if the connection closes before the answer was complete (client disconnect, write
  // timeout, queue over its bound, server stop). Not after a complete answer.
  virtual void OnClose(std::function<void()> callback) = 0;
  virtual bool closed() const = 0;
};

using Handler = std::function<void(Request request, std::shared_ptr<Responder> responder)>;

struct ServerOptions {
  uint32_t max_header_bytes = 16 << 10;
  uint64_t max_body_bytes = 8 << 20;
  std::chrono::milliseconds read_timeout{30000};   // from the first byte of a request to its end
  std::chrono::milliseconds idle_timeout{60000};   // keep-alive: waiting for the next request
  std::chrono::milliseconds write_timeout{30000};  // a client must take written bytes within this
  size_t max_queued_bytes = 4 << 20;               // per streaming response
  size_t max_connections = 16384;
};

class HttpServer {
 public:
  // Serves connections accepted on `acceptor` (already listening, see wire::ListenTcp) until
  // Stop. The acceptor must outlive the server's pending operations.
  static std::shared_ptr<HttpServer> Start(asio::ip::tcp::acceptor& acceptor,
                                           ServerOptions options, Handler handler);
  virtual ~HttpServer() = default;
  // Stops accepting and closes every connection (their close callbacks run).
  virtual void Stop() = 0;
  virtual size_t connections() const = 0;
  virtual uint64_t requests() const = 0;
};

// The JSON error body the project's HTTP endpoints use (OpenAI's shape):
//   {"error": {"message": ..., "type": ..., "param": ..., "code": ...}}  (empty: null)
std::string ErrorBody(std::string_view message, std::string_view type, std::string_view code = "",
                      std::string_view param = "");

}  // namespace chunkserve::http

#endif  // CHUNKSERVE_RUNTIME_HTTP_SERVER_H_
