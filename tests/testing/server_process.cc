#include "tests/testing/server_process.h"

#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "runtime/wire/asio.h"

#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "tests/testing/tls_fixtures.h"

namespace chunkserve::testing {

using namespace std::chrono_literals;

Status ServerProcess::Launch(const std::string& binary, const std::string& what,
                             const std::vector<std::string>& args) {
  what_ = what;
  int fds[2];
  if (::pipe(fds) != 0) return Status::Internal("pipe failed");
  std::vector<std::string> argv_s = {binary, "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0"};
  if (TestTlsMode()) {
    // With the CA's revocation list too (it revokes another certificate): every link checks it.
    const std::vector<std::string> tls = TlsFlags(WithCrl(NodeTlsFiles(), "crl.pem"));
    argv_s.insert(argv_s.end(), tls.begin(), tls.end());
  }
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return Status::Internal("fork failed");
  }
  if (pid == 0) {
    // A test that crashes must not leave its servers behind: they would hold ctest's output pipe
    // open and the test would hang until its timeout. (The signal follows the launching thread;
    // tests launch servers from their main thread.)
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);  // the parent is already gone
    ::dup2(fds[1], 1);
    ::close(fds[0]);
    ::close(fds[1]);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(fds[1]);
  pid_ = pid;
  stdout_fd_ = fds[0];
  std::string out;
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (port_ == 0 || http_port_ == 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return Status::DeadlineExceeded(what_ + " did not print its ports");
    pollfd pfd{stdout_fd_, POLLIN, 0};
    if (::poll(&pfd, 1, static_cast<int>(left.count())) <= 0) continue;
    char buf[256];
    const ssize_t n = ::read(stdout_fd_, buf, sizeof(buf));
    if (n <= 0) return Status::Unavailable(what_ + " exited before listening: " + out);
    out.append(buf, static_cast<size_t>(n));
    for (const char* prefix : {"listening on 127.0.0.1:", "http on 127.0.0.1:"}) {
      const size_t at = out.find(prefix);
      const size_t end = at == std::string::npos ? at : out.find('\n', at);
      if (end == std::string::npos) continue;
      const int port = std::atoi(out.c_str() + at + std::strlen(prefix));
      (prefix[0] == 'l' ? port_ : http_port_) = static_cast<uint16_t>(port);
    }
  }
  return Status::Ok();
}

ServerProcess::~ServerProcess() {
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  if (stdout_fd_ >= 0) ::close(stdout_fd_);
}

Status ServerProcess::Signal(int signal) {
  if (pid_ <= 0 || ::kill(pid_, signal) != 0) return Status::FailedPrecondition("not running");
  return Status::Ok();
}

Result<int> ServerProcess::Wait(std::chrono::milliseconds timeout) {
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
  return Status::DeadlineExceeded(what_ + " did not exit");
}

Result<std::unique_ptr<wire::WireClient>> ServerProcess::Connect() {
  if (!TestTlsMode()) return wire::WireClient::Connect("127.0.0.1", port_, 5000ms);
  static const Result<std::shared_ptr<wire::TlsContext>> tls =
      wire::TlsContext::Create(wire::TlsContext::Side::kClient,
                               WithCrl(ClientTlsFiles(), "crl.pem"));
  if (!tls.ok()) return tls.status();
  return wire::WireClient::Connect("127.0.0.1", port_, 5000ms, {}, std::nullopt, tls.value());
}

Result<HttpResponse> HttpGet(uint16_t port, const std::string& path) {
  namespace bhttp = boost::beast::http;
  try {
    asio::io_context io;
    boost::beast::tcp_stream s(io);
    s.expires_after(std::chrono::seconds(30));
    s.connect(asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), port));
    bhttp::request<bhttp::empty_body> req(bhttp::verb::get, path, 11);
    req.set(bhttp::field::host, "127.0.0.1");
    req.keep_alive(false);
    bhttp::write(s, req);
    boost::beast::flat_buffer buffer;
    bhttp::response<bhttp::string_body> res;
    bhttp::read(s, buffer, res);
    return HttpResponse{static_cast<int>(res.result_int()), std::move(res.body())};
  } catch (const std::exception& e) {
    return Status::Unavailable(e.what());
  }
}

}  // namespace chunkserve::testing
