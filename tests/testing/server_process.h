// Test helper: a chunkserve server process (worker or router) as a real child process on
// 127.0.0.1 with ephemeral ports. It is started with `--listen 127.0.0.1:0 --http 127.0.0.1:0`
// and the caller's flags (later flags win), and is ready once it has printed
// "listening on 127.0.0.1:P" and "http on 127.0.0.1:Q" on stdout. SIGKILLed when destroyed.
#ifndef CHUNKSERVE_TESTS_TESTING_SERVER_PROCESS_H_
#define CHUNKSERVE_TESTS_TESTING_SERVER_PROCESS_H_

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/base/status.h"
#include "runtime/wire/client.h"

namespace chunkserve::testing {

class ServerProcess {
 public:
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;
  virtual ~ServerProcess();  // SIGKILL if still running

  uint16_t port() const { return port_; }
  uint16_t http_port() const { return http_port_; }
  pid_t pid() const { return pid_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

  Status Signal(int signal);
  // Waits for exit up to `timeout`; returns the exit code, or 128 + the signal that killed it
  // (DeadlineExceeded when it is still running).
  Result<int> Wait(std::chrono::milliseconds timeout);
  // A blocking wire client connected to the process's listen port.
  Result<std::unique_ptr<wire::WireClient>> Connect();

 protected:
  ServerProcess() = default;
  // Forks and execs `binary` and waits up to 60 s for both ports; `what` names it in errors.
  Status Launch(const std::string& binary, const std::string& what,
                const std::vector<std::string>& args);

 private:
  std::string what_;
  pid_t pid_ = -1;
  int stdout_fd_ = -1;
  uint16_t port_ = 0;
  uint16_t http_port_ = 0;
};

struct HttpResponse {
  int status = 0;
  std::string body;
};
// GET http://127.0.0.1:port/path with a fresh connection.
Result<HttpResponse> HttpGet(uint16_t port, const std::string& path);

}  // namespace chunkserve::testing

#endif  // CHUNKSERVE_TESTS_TESTING_SERVER_PROCESS_H_
