// Listening sockets for every server on the process's Asio event loop (the worker's and the
// router's wire ports, their HTTP probe ports): opening the acceptor and the accept loop.
#ifndef CHUNKSERVE_RUNTIME_WIRE_LISTEN_H_
#define CHUNKSERVE_RUNTIME_WIRE_LISTEN_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include <asio.hpp>

#include "runtime/base/status.h"

namespace chunkserve::wire {

// Opens `acceptor` on host:port (port 0: an ephemeral port) with SO_REUSEADDR.
// Errors: InvalidArgument (host is not an IP address), Unavailable (bind or listen failed).
Status ListenTcp(asio::ip::tcp::acceptor& acceptor, const std::string& host, uint16_t port);

// Called on the event loop with each accepted socket.
using SocketHandler = std::function<void(asio::ip::tcp::socket)>;

// Accepts on `acceptor` until it is closed, handing each socket to `on_socket`. A failed accept
// other than the acceptor closing (e.g. out of file descriptors) is retried after
// kAcceptRetryDelay, not at once, so that it cannot spin the event loop while it lasts.
// `acceptor` must outlive the loop's pending operations (close it, then let the loop run them out
// or stop the loop).
inline constexpr std::chrono::milliseconds kAcceptRetryDelay{50};
void AcceptLoop(asio::ip::tcp::acceptor& acceptor, SocketHandler on_socket);

}  // namespace chunkserve::wire

#endif  // CHUNKSERVE_RUNTIME_WIRE_LISTEN_H_
