#include "runtime/wire/listen.h"

#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <utility>

#include "runtime/base/logging.h"
#include "runtime/wire/messages.h"

namespace chunkserve::wire {
namespace {

void Accept(asio::ip::tcp::acceptor& acceptor, std::shared_ptr<const SocketHandler> on_socket) {
  acceptor.async_accept([&acceptor, on_socket](const asio::error_code& ec,
                                               asio::ip::tcp::socket socket) {
    if (!ec) {
      (*on_socket)(std::move(socket));
      Accept(acceptor, on_socket);
      return;
    }
    if (ec == asio::error::operation_aborted || !acceptor.is_open()) return;
    static std::atomic<int64_t> last_log_s{0};
    const int64_t now_s = std::chrono::duration_cast<std::chrono::seconds>(
                              std::chrono::steady_clock::now().time_since_epoch())
                              .count();
    int64_t last = last_log_s.load();
    if (now_s - last >= 10 && last_log_s.compare_exchange_strong(last, now_s)) {
      LOG(WARNING) << "accept failed: " << ec.message()
                   << (ec == asio::error::no_descriptors
                           ? " (out of file descriptors: existing connections are still served; "
                             "accepting resumes once descriptors are free)"
                           : "")
                   << "; retrying every " << kAcceptRetryDelay.count() << " ms";
    }
    auto timer = std::make_shared<asio::steady_timer>(acceptor.get_executor(), kAcceptRetryDelay);
    timer->async_wait([&acceptor, on_socket, timer](const asio::error_code& e) {
      if (!e && acceptor.is_open()) Accept(acceptor, on_socket);
    });
  });
}

}  // namespace

Status ListenTcp(asio::ip::tcp::acceptor& acceptor, const std::string& host, uint16_t port) {
  asio::error_code ec;
  const asio::ip::address address = asio::ip::make_address(host, ec);
  if (ec) return Status::InvalidArgument("bad listen address: " + host);
  const asio::ip::tcp::endpoint endpoint(address, port);
  acceptor.open(endpoint.protocol(), ec);
  if (!ec) acceptor.set_option(asio::ip::tcp::acceptor::reuse_address(true), ec);
  if (!ec) acceptor.bind(endpoint, ec);
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return Status::Unavailable("cannot listen on " + host + ":" + std::to_string(port) + ": " +
                               ec.message());
  }
  return Status::Ok();
}

void AcceptLoop(asio::ip::tcp::acceptor& acceptor, SocketHandler on_socket) {
  Accept(acceptor, std::make_shared<const SocketHandler>(std::move(on_socket)));
}

Result<int64_t> ListenServer(asio::ip::tcp::acceptor& wire, const std::string& host, uint16_t port,
                             asio::ip::tcp::acceptor& http, const std::string& http_host,
                             int32_t http_port, int64_t max_connections) {
  const int64_t cap = MaxConnectionsForFdLimit(max_connections);
  if (cap < max_connections) {
    LOG(WARNING) << "serving at most " << cap << " connections (of " << max_connections
                 << " asked) within the file descriptor limit";
  }
  CHUNKSERVE_RETURN_IF_ERROR(ListenTcp(wire, host, port));
  if (http_port >= 0) {
    CHUNKSERVE_RETURN_IF_ERROR(ListenTcp(http, http_host, static_cast<uint16_t>(http_port)));
  }
  return cap;
}

int64_t MaxConnectionsForFdLimit(int64_t configured) {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) {
    return std::max<int64_t>(1, configured);
  }
  const int64_t room = static_cast<int64_t>(limit.rlim_cur) - kReservedDescriptors;
  return std::max<int64_t>(1, std::min(configured, room));
}

void RefuseSocket(asio::ip::tcp::socket& socket, const Status& why) {
  const std::vector<uint8_t> frame = ErrorFrame(0, why);
  asio::error_code ignored;
  socket.non_blocking(true, ignored);
  asio::write(socket, asio::buffer(frame), ignored);
  socket.shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
  socket.close(ignored);
}

}  // namespace chunkserve::wire
