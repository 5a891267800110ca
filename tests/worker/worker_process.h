// Test helper: a chunkserve-worker child process on 127.0.0.1 with ephemeral ports, and small
// wire/HTTP client helpers to talk to it.
#ifndef CHUNKSERVE_TESTS_WORKER_WORKER_PROCESS_H_
#define CHUNKSERVE_TESTS_WORKER_WORKER_PROCESS_H_

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/base/status.h"
#include "runtime/wire/client.h"

namespace chunkserve::worker::testing {

class WorkerProcess {
 public:
  // Starts the worker with `args` plus --listen/--http on 127.0.0.1:0 and waits (deadline) for
  // it to print its ports.
  static Result<std::unique_ptr<WorkerProcess>> Start(const std::vector<std::string>& args);
  ~WorkerProcess();  // SIGKILL if still running

  uint16_t port() const { return port_; }
  uint16_t http_port() const { return http_port_; }
  pid_t pid() const { return pid_; }

  Status Signal(int signal);
  // Waits for exit up to `timeout`; returns the exit code (or DeadlineExceeded).
  Result<int> Wait(std::chrono::milliseconds timeout);

  Result<std::unique_ptr<wire::WireClient>> Connect();

 private:
  pid_t pid_ = -1;
  int stdout_fd_ = -1;
  uint16_t port_ = 0;
  uint16_t http_port_ = 0;
};

struct HttpResponse {
  int status = 0;
  std::string body;
};
Result<HttpResponse> HttpGet(uint16_t port, const std::string& path);

}  // namespace chunkserve::worker::testing

#endif  // CHUNKSERVE_TESTS_WORKER_WORKER_PROCESS_H_
