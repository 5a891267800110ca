#include "tests/router/router_process.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <sstream>
#include <thread>

#include "tests/worker/worker_process.h"

namespace chunkserve::router::testing {

using namespace std::chrono_literals;

Result<std::unique_ptr<RouterProcess>> RouterProcess::Start(const std::vector<std::string>& args) {
  int fds[2];
  if (::pipe(fds) != 0) return Status::Internal("pipe failed");
  std::vector<std::string> argv_s = {CHUNKSERVE_ROUTER_BIN, "--listen", "127.0.0.1:0", "--http",
                                     "127.0.0.1:0"};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) return Status::Internal("fork failed");
  if (pid == 0) {
    ::dup2(fds[1], 1);
    ::close(fds[0]);
    ::close(fds[1]);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(fds[1]);
  auto p = std::unique_ptr<RouterProcess>(new RouterProcess());
  p->pid_ = pid;
  p->stdout_fd_ = fds[0];
  std::string out;
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (p->port_ == 0 || p->http_port_ == 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return Status::DeadlineExceeded("router did not print its ports");
    pollfd pfd{p->stdout_fd_, POLLIN, 0};
    if (::poll(&pfd, 1, static_cast<int>(left.count())) <= 0) continue;
    char buf[256];
    const ssize_t n = ::read(p->stdout_fd_, buf, sizeof(buf));
    if (n <= 0) return Status::Unavailable("router exited before listening: " + out);
    out.append(buf, static_cast<size_t>(n));
    for (const char* prefix : {"listening on 127.0.0.1:", "http on 127.0.0.1:"}) {
      const size_t at = out.find(prefix);
      const size_t end = at == std::string::npos ? at : out.find('\n', at);
      if (end == std::string::npos) continue;
      const int port = std::atoi(out.c_str() + at + std::strlen(prefix));
      (prefix[0] == 'l' ? p->port_ : p->http_port_) = static_cast<uint16_t>(port);
    }
  }
  return p;
}

RouterProcess::~RouterProcess() {
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  if (stdout_fd_ >= 0) ::close(stdout_fd_);
}

Status RouterProcess::Signal(int signal) {
  if (pid_ <= 0 || ::kill(pid_, signal) != 0) return Status::FailedPrecondition("not running");
  return Status::Ok();
}

Result<int> RouterProcess::Wait(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    const pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      pid_ = -1;
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    std::this_thread::sleep_for(5ms);
  }
  return Status::DeadlineExceeded("router did not exit");
}

Result<std::unique_ptr<wire::WireClient>> RouterProcess::Connect() {
  return wire::WireClient::Connect("127.0.0.1", port_, 5000ms);
}

Result<double> Metric(uint16_t http_port, const std::string& series) {
  CHUNKSERVE_ASSIGN_OR_RETURN(worker::testing::HttpResponse r,
                              worker::testing::HttpGet(http_port, "/metrics"));
  if (r.status != 200) return Status::Unavailable("metrics answered " + std::to_string(r.status));
  std::istringstream in(r.body);
  std::string line;
  while (std::getline(in, line)) {
    if (line.size() > series.size() && line.compare(0, series.size(), series) == 0 &&
        line[series.size()] == ' ') {
      return std::strtod(line.c_str() + series.size() + 1, nullptr);
    }
  }
  return Status::NotFound("no metric " + series);
}

bool WaitFor(const std::function<bool()>& predicate, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (predicate()) return true;
    std::this_thread::sleep_for(20ms);
  }
  return predicate();
}

Result<double> WaitForMetric(uint16_t http_port, const std::string& series,
                             const std::function<bool(double)>& predicate,
                             std::chrono::milliseconds timeout) {
  Result<double> last = Status::NotFound("not polled");
  WaitFor(
      [&] {
        last = Metric(http_port, series);
        return last.ok() && predicate(last.value());
      },
      timeout);
  return last;
}

}  // namespace chunkserve::router::testing
