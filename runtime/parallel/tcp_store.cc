#include "runtime/parallel/tcp_store.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace chunkserve::parallel {
namespace {

constexpr uint8_t kSet = 1;
constexpr uint8_t kGet = 2;
constexpr uint32_t kMaxKey = 4096;
constexpr uint32_t kMaxValue = 16u << 20;

std::string Errno(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

// Waits until fd is readable / writable or the deadline passes. `stop` (optional) is polled
// every 100 ms so a server thread can be ended.
Status WaitFd(int fd, short events, Deadline deadline, const std::atomic<bool>* stop) {
  for (;;) {
    if (stop != nullptr && stop->load()) return Status::Cancelled("store shutting down");
    if (deadline.Passed()) return Status::DeadlineExceeded("store: timed out");
    pollfd p{fd, events, 0};
    const int wait_ms = static_cast<int>(std::min<int64_t>(deadline.Remaining().count(), 100));
    const int r = ::poll(&p, 1, wait_ms);
    if (r > 0) return Status::Ok();
    if (r < 0 && errno != EINTR) return Status::Unavailable(Errno("store: poll"));
  }
}

Status ReadAll(int fd, void* buf, size_t n, Deadline deadline,
               const std::atomic<bool>* stop = nullptr) {
  auto* p = static_cast<char*>(buf);
  while (n > 0) {
    CHUNKSERVE_RETURN_IF_ERROR(WaitFd(fd, POLLIN, deadline, stop));
    const ssize_t r = ::recv(fd, p, n, 0);
    if (r == 0) return Status::Unavailable("store: connection closed by peer");
    if (r < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return Status::Unavailable(Errno("store: recv"));
    }
    p += r;
    n -= static_cast<size_t>(r);
  }
  return Status::Ok();
}

Status WriteAll(int fd, const void* buf, size_t n, Deadline deadline) {
  const auto* p = static_cast<const char*>(buf);
  while (n > 0) {
    CHUNKSERVE_RETURN_IF_ERROR(WaitFd(fd, POLLOUT, deadline, nullptr));
    const ssize_t r = ::send(fd, p, n, MSG_NOSIGNAL);
    if (r < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return Status::Unavailable(Errno("store: send"));
    }
    p += r;
    n -= static_cast<size_t>(r);
  }
  return Status::Ok();
}

void AppendU32(std::vector<char>* out, uint32_t v) {
  char b[4];
  std::memcpy(b, &v, 4);  // little-endian hosts only (x86-64, aarch64)
  out->insert(out->end(), b, b + 4);
}

Result<sockaddr_storage> Resolve(const std::string& host, uint16_t port, socklen_t* len) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  const int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &res);
  if (rc != 0 || res == nullptr) {
    return Status::InvalidArgument("store: cannot resolve '" + host + "': " + gai_strerror(rc));
  }
  sockaddr_storage addr{};
  std::memcpy(&addr, res->ai_addr, res->ai_addrlen);
  *len = res->ai_addrlen;
  ::freeaddrinfo(res);
  return addr;
}

}  // namespace

Status ParseHostPort(const std::string& text, std::string* host, uint16_t* port) {
  const size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return Status::InvalidArgument("expected HOST:PORT, got '" + text + "'");
  }
  char* end = nullptr;
  const long p = std::strtol(text.c_str() + colon + 1, &end, 10);
  if (end == text.c_str() + colon + 1 || *end != '\0' || p < 0 || p > 65535) {
    return Status::InvalidArgument("bad port in '" + text + "'");
  }
  *host = text.substr(0, colon);
  *port = static_cast<uint16_t>(p);
  return Status::Ok();
}

Result<std::unique_ptr<TcpStoreServer>> TcpStoreServer::Start(const std::string& host,
                                                              uint16_t port) {
  socklen_t len = 0;
  CHUNKSERVE_ASSIGN_OR_RETURN(sockaddr_storage addr, Resolve(host, port, &len));
  const int fd = ::socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::Unavailable(Errno("store: socket"));
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 || ::listen(fd, 64) != 0) {
    const Status s = Status::Unavailable(
        Errno(("store: cannot listen on " + host + ":" + std::to_string(port)).c_str()));
    ::close(fd);
    return s;
  }
  sockaddr_storage bound{};
  socklen_t bound_len = sizeof(bound);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &bound_len);
  std::unique_ptr<TcpStoreServer> server(new TcpStoreServer());
  server->listen_fd_ = fd;
  server->port_ =
      ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                        : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  server->accept_thread_ = std::thread([s = server.get()] { s->AcceptLoop(); });
  return server;
}

TcpStoreServer::~TcpStoreServer() {
  stop_ = true;
  cv_.notify_all();
  if (accept_thread_.joinable()) accept_thread_.join();
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (int fd : client_fds_) ::shutdown(fd, SHUT_RDWR);
  }
  for (std::thread& t : client_threads_) t.join();
  for (int fd : client_fds_) ::close(fd);
  if (listen_fd_ >= 0) ::close(listen_fd_);
}

void TcpStoreServer::AcceptLoop() {
  while (!stop_) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    std::lock_guard<std::mutex> lock(mu_);
    client_fds_.push_back(fd);
    client_threads_.emplace_back([this, fd] { Serve(fd); });
  }
}

void TcpStoreServer::Serve(int fd) {
  // Reads wait without a deadline of their own (a rank may sit connected for the whole
  // rendezvous); shutdown of the socket or stop_ ends them.
  const Deadline forever{Clock::time_point::max()};
  for (;;) {
    uint8_t op = 0;
    uint32_t key_len = 0;
    if (!ReadAll(fd, &op, 1, forever, &stop_).ok()) return;
    if (!ReadAll(fd, &key_len, 4, forever, &stop_).ok() || key_len > kMaxKey) return;
    std::string key(key_len, '\0');
    if (!ReadAll(fd, key.data(), key_len, forever, &stop_).ok()) return;
    if (op == kSet) {
      uint32_t len = 0;
      if (!ReadAll(fd, &len, 4, forever, &stop_).ok() || len > kMaxValue) return;
      std::vector<char> value(len);
      if (!ReadAll(fd, value.data(), len, forever, &stop_).ok()) return;
      {
        std::lock_guard<std::mutex> lock(mu_);
        data_[key] = std::move(value);
      }
      cv_.notify_all();
      const uint8_t ok = 0;
      if (!WriteAll(fd, &ok, 1, Deadline::After(std::chrono::seconds(30))).ok()) return;
    } else if (op == kGet) {
      int64_t timeout_ms = 0;
      if (!ReadAll(fd, &timeout_ms, 8, forever, &stop_).ok()) return;
      const auto until = Clock::now() + std::chrono::milliseconds(std::max<int64_t>(0, timeout_ms));
      std::vector<char> reply;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait_until(lock, until, [&] { return stop_.load() || data_.contains(key); });
        if (stop_) return;
        auto it = data_.find(key);
        if (it == data_.end()) {
          reply.push_back(1);
        } else {
          reply.push_back(0);
          AppendU32(&reply, static_cast<uint32_t>(it->second.size()));
          reply.insert(reply.end(), it->second.begin(), it->second.end());
        }
      }
      if (!WriteAll(fd, reply.data(), reply.size(), Deadline::After(std::chrono::seconds(30)))
               .ok()) {
        return;
      }
    } else {
      return;  // malformed: drop this connection only
    }
  }
}

Result<std::unique_ptr<TcpStoreClient>> TcpStoreClient::Connect(const std::string& host,
                                                                uint16_t port, Deadline deadline) {
  socklen_t len = 0;
  CHUNKSERVE_ASSIGN_OR_RETURN(sockaddr_storage addr, Resolve(host, port, &len));
  std::string last = "no attempt";
  while (!deadline.Passed()) {
    const int fd = ::socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return Status::Unavailable(Errno("store: socket"));
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), len) == 0) {
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      return std::unique_ptr<TcpStoreClient>(new TcpStoreClient(fd));
    }
    last = std::strerror(errno);
    ::close(fd);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the server is starting
  }
  return Status::DeadlineExceeded("store: cannot connect to " + host + ":" + std::to_string(port) +
                                  " before the deadline (" + last + ")");
}

TcpStoreClient::~TcpStoreClient() {
  if (fd_ >= 0) ::close(fd_);
}

Status TcpStoreClient::Set(const std::string& key, const std::vector<char>& value,
                           Deadline deadline) {
  if (key.size() > kMaxKey || value.size() > kMaxValue) {
    return Status::InvalidArgument("store: key or value too large");
  }
  std::vector<char> req;
  req.push_back(static_cast<char>(kSet));
  AppendU32(&req, static_cast<uint32_t>(key.size()));
  req.insert(req.end(), key.begin(), key.end());
  AppendU32(&req, static_cast<uint32_t>(value.size()));
  req.insert(req.end(), value.begin(), value.end());
  CHUNKSERVE_RETURN_IF_ERROR(WriteAll(fd_, req.data(), req.size(), deadline));
  uint8_t ok = 1;
  CHUNKSERVE_RETURN_IF_ERROR(ReadAll(fd_, &ok, 1, deadline));
  if (ok != 0) return Status::Internal("store: SET refused");
  return Status::Ok();
}

Result<std::vector<char>> TcpStoreClient::Get(const std::string& key, Deadline deadline) {
  if (key.size() > kMaxKey) return Status::InvalidArgument("store: key too large");
  std::vector<char> req;
  req.push_back(static_cast<char>(kGet));
  AppendU32(&req, static_cast<uint32_t>(key.size()));
  req.insert(req.end(), key.begin(), key.end());
  const int64_t timeout_ms = deadline.Remaining().count();
  char t[8];
  std::memcpy(t, &timeout_ms, 8);
  req.insert(req.end(), t, t + 8);
  CHUNKSERVE_RETURN_IF_ERROR(WriteAll(fd_, req.data(), req.size(), deadline));
  // The server answers by the deadline; allow a little slack for the reply to travel.
  const Deadline reply_deadline{deadline.at + std::chrono::seconds(2)};
  uint8_t status = 1;
  CHUNKSERVE_RETURN_IF_ERROR(ReadAll(fd_, &status, 1, reply_deadline));
  if (status != 0) {
    return Status::DeadlineExceeded("store: key '" + key + "' was not set before the deadline");
  }
  uint32_t len = 0;
  CHUNKSERVE_RETURN_IF_ERROR(ReadAll(fd_, &len, 4, reply_deadline));
  if (len > kMaxValue) return Status::DataLoss("store: oversized value");
  std::vector<char> value(len);
  CHUNKSERVE_RETURN_IF_ERROR(ReadAll(fd_, value.data(), len, reply_deadline));
  return value;
}

}  // namespace chunkserve::parallel
