// A small key-value store over TCP for rendezvous: rank 0 hosts it, every rank (rank 0 included)
// connects as a client, publishes its transport address and reads its peers' (Gloo's
// connectFullMesh), or reads the ncclUniqueId rank 0 published. Debian's Gloo has no TCPStore;
// this is its replacement, on plain POSIX sockets so it carries no dependency.
//
// Protocol (one request, one reply, on a persistent connection; integers little-endian):
//   SET: u8 1, u32 key length, key, u32 value length, value  -> u8 0
//   GET: u8 2, u32 key length, key, i64 timeout ms            -> u8 0, u32 length, value
//                                                                 | u8 1 (timed out)
// GET blocks until the key is set or its timeout passes. Keys are at most 4 KiB, values 16 MiB;
// a malformed request closes that connection only. Keys are never deleted (a store serves one
// rendezvous).
//
// Thread safety: the server is internally synchronized (a thread per connection); a client is
// used from one thread at a time.
#ifndef CHUNKSERVE_RUNTIME_PARALLEL_TCP_STORE_H_
#define CHUNKSERVE_RUNTIME_PARALLEL_TCP_STORE_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "runtime/base/status.h"
#include "runtime/parallel/communicator.h"

namespace chunkserve::parallel {

class TcpStoreServer {
 public:
  // Listens on host:port (port 0: ephemeral; see port()). Unavailable when it cannot bind.
  static Result<std::unique_ptr<TcpStoreServer>> Start(const std::string& host, uint16_t port);
  ~TcpStoreServer();  // closes every connection and joins its threads

  uint16_t port() const { return port_; }

 private:
  TcpStoreServer() = default;
  void AcceptLoop();
  void Serve(int fd);

  int listen_fd_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread accept_thread_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::vector<char>> data_;
  std::vector<int> client_fds_;
  std::vector<std::thread> client_threads_;
};

class TcpStoreClient {
 public:
  // Connects, retrying until `deadline` (the server may not be up yet).
  static Result<std::unique_ptr<TcpStoreClient>> Connect(const std::string& host, uint16_t port,
                                                         Deadline deadline);
  ~TcpStoreClient();

  Status Set(const std::string& key, const std::vector<char>& value, Deadline deadline);
  // DeadlineExceeded when the key is not set before the deadline.
  Result<std::vector<char>> Get(const std::string& key, Deadline deadline);

 private:
  explicit TcpStoreClient(int fd) : fd_(fd) {}
  int fd_ = -1;
};

// "host:port" -> host and port; InvalidArgument on anything else.
Status ParseHostPort(const std::string& text, std::string* host, uint16_t* port);

}  // namespace chunkserve::parallel

#endif  // CHUNKSERVE_RUNTIME_PARALLEL_TCP_STORE_H_
