// Listening sockets for every server on the process's Asio event loop (the worker's and the
// router's wire ports, their HTTP probe ports): opening the acceptor and the accept loop.
#ifndef CHUNKSERVE_RUNTIME_WIRE_LISTEN_H_
#define CHUNKSERVE_RUNTIME_WIRE_LISTEN_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include "runtime/wire/asio.h"

#include "runtime/base/status.h"

namespace chunkserve::wire {

// Opens `acceptor` on host:port (port 0: an ephemeral port) with SO_REUSEADDR.
// Errors: InvalidArgument (host is not an IP address), Unavailable (bind or listen failed).
Status ListenTcp(asio::ip::tcp::acceptor& acceptor, const std::string& host, uint16_t port);

// Called on the event loop with each accepted socket.
using SocketHandler = std::function<void(asio::ip::tcp::socket)>;

// Accepts on `acceptor` until it is closed, handing each socket to `on_socket`. A failed accept
// other than the acceptor closing (e.g. out of file descriptors) is logged (at most once every
// 10 s) and retried after kAcceptRetryDelay, not at once, so that it cannot spin the event loop
// while it lasts; serving resumes by itself once descriptors are free again.
// `acceptor` must outlive the loop's pending operations (close it, then let the loop run them out
// or stop the loop).
inline constexpr std::chrono::milliseconds kAcceptRetryDelay{50};
void AcceptLoop(asio::ip::tcp::acceptor& acceptor, SocketHandler on_socket);

// The connections a server may hold: `configured`, lowered to leave kReservedDescriptors of the
// process's file descriptor limit (RLIMIT_NOFILE) for everything else (listeners, HTTP probes,
// outgoing links, files). At least 1.
inline constexpr int64_t kReservedDescriptors = 32;
int64_t MaxConnectionsForFdLimit(int64_t configured);

// What a worker or router opens at start: its wire port and, with http_port >= 0, its HTTP probe
// port (0: ephemeral). Returns the connection cap to serve: `max_connections` kept within the
// descriptor limit (MaxConnectionsForFdLimit), logged when that lowers it.
Result<int64_t> ListenServer(asio::ip::tcp::acceptor& wire, const std::string& host, uint16_t port,
                             asio::ip::tcp::acceptor& http, const std::string& http_host,
                             int32_t http_port, int64_t max_connections);

// Tells an accepted socket why it is not served (an Error frame, requestId 0, written without
// blocking) and closes it.
void RefuseSocket(asio::ip::tcp::socket& socket, const Status& why);

}  // namespace chunkserve::wire

#endif  // CHUNKSERVE_RUNTIME_WIRE_LISTEN_H_
