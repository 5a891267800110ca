#include "runtime/wire/http_probe.h"

#include <chrono>
#include <memory>
#include <utility>

namespace chunkserve::wire {
namespace {

constexpr size_t kMaxRequestHead = 8192;
constexpr auto kRequestDeadline = std::chrono::seconds(5);

const char* ReasonPhrase(int status) {
  switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    default: return "Unknown";
  }
}

std::string Render(const HttpReply& reply, bool with_body) {
  std::string out = "HTTP/1.1 " + std::to_string(reply.status) + " " +
                    ReasonPhrase(reply.status) + "\r\nContent-Type: " + reply.content_type +
                    "\r\nContent-Length: " + std::to_string(reply.body.size()) +
                    "\r\nConnection: close\r\n\r\n";
  if (with_body) out += reply.body;
  return out;
}

struct HttpExchange {
  explicit HttpExchange(asio::ip::tcp::socket s)
      : socket(std::move(s)), timer(socket.get_executor()) {}
  void Close() {
    asio::error_code ignored;
    socket.shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
    socket.close(ignored);
    timer.cancel();
  }
  asio::ip::tcp::socket socket;
  asio::steady_timer timer;
  std::string buffer;
  std::string response;
};

void Serve(asio::ip::tcp::socket socket, std::shared_ptr<const HttpHandler> handler) {
  auto x = std::make_shared<HttpExchange>(std::move(socket));
  x->timer.expires_after(kRequestDeadline);
  x->timer.async_wait([x](const asio::error_code& e) {
    if (!e) {
      asio::error_code ignored;
      x->socket.close(ignored);  // a slow or silent peer: give up
    }
  });
  asio::async_read_until(
      x->socket, asio::dynamic_buffer(x->buffer, kMaxRequestHead), "\r\n\r\n",
      [x, handler](const asio::error_code& e, size_t) {
        if (e) {
          x->Close();  // closed early, oversized head or deadline
          return;
        }
        x->response = RenderHttpResponse(x->buffer, *handler);
        asio::async_write(x->socket, asio::buffer(x->response),
                          [x](const asio::error_code&, size_t) { x->Close(); });
      });
}

}  // namespace

std::string RenderHttpResponse(std::string_view request_head, const HttpHandler& handler) {
  const std::string_view line = request_head.substr(0, request_head.find("\r\n"));
  const size_t sp1 = line.find(' ');
  const size_t sp2 = sp1 == std::string_view::npos ? std::string_view::npos : line.find(' ', sp1 + 1);
  if (sp1 == std::string_view::npos || sp2 == std::string_view::npos || sp1 == 0) {
    return Render({400, "text/plain", "bad request\n"}, true);
  }
  const std::string_view method = line.substr(0, sp1);
  if (method != "GET" && method != "HEAD") {
    return Render({405, "text/plain", "only GET and HEAD\n"}, true);
  }
  std::string path(line.substr(sp1 + 1, sp2 - sp1 - 1));
  if (const size_t q = path.find('?'); q != std::string::npos) path.resize(q);
  return Render(handler(path), method == "GET");
}

void ServeHttp(asio::ip::tcp::acceptor& acceptor, HttpHandler handler) {
  auto shared = std::make_shared<const HttpHandler>(std::move(handler));
  AcceptLoop(acceptor, [shared](asio::ip::tcp::socket socket) { Serve(std::move(socket), shared); });
}

}  // namespace chunkserve::wire
