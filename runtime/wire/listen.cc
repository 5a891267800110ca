#include "runtime/wire/listen.h"

#include <memory>
#include <utility>

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

}  // namespace chunkserve::wire
