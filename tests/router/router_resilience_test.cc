// The cluster under hostile conditions, with real router and worker processes on 127.0.0.1:
// a frozen engine (its process and links alive), an idle cluster, peers that hold partial frames
// or trickle bytes (slowloris), a router at its file descriptor limit, and peers without the
// cluster secret or a cluster certificate. Every wait is bounded; the numbers each test prints are in router/README.md.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "tests/router/router_test_util.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/tls_fixtures.h"

namespace chunkserve::router {
namespace {

using namespace testing;  // NOLINT: the router test helpers
using ::chunkserve::testing::HttpGet;
using ::chunkserve::testing::HttpResponse;

// Resident memory of a process in KiB (VmRSS), 0 when unreadable.
int64_t RssKib(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::atoll(line.c_str() + 6);
  }
  return 0;
}

// A worker whose engine freezes while `stall_file` exists (the engine's test hook).
Result<std::unique_ptr<WorkerProcess>> StartStallableWorker(const std::string& router,
                                                            const std::string& name,
                                                            const std::string& stall_file) {
  ::setenv("CHUNKSERVE_TEST_STALL_FILE", stall_file.c_str(), 1);  // inherited by the child only
  auto w = StartWorker(router, name);
  ::unsetenv("CHUNKSERVE_TEST_STALL_FILE");
  return w;
}

void Touch(const std::string& path) { std::ofstream(path) << "stall\n"; }

std::vector<uint8_t> PartialFrame(uint32_t words, size_t body_bytes) {
  std::vector<uint8_t> bytes(8 + body_bytes, 0x5a);
  for (int i = 0; i < 4; ++i) {
    bytes[i] = 0;
    bytes[4 + i] = static_cast<uint8_t>(words >> (8 * i));
  }
  return bytes;
}

// A bare TCP connection (one descriptor, no event loop), for peers that only trickle bytes.
class RawPeer {
 public:
  explicit RawPeer(uint16_t port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd_ >= 0 && ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
      ::close(fd_);
      fd_ = -1;
    }
  }
  ~RawPeer() {
    if (fd_ >= 0) ::close(fd_);
  }
  bool ok() const { return fd_ >= 0; }
  void Send(uint8_t byte) { (void)::send(fd_, &byte, 1, MSG_NOSIGNAL); }
  // Whether the peer closed the connection within `limit` (data before the close is skipped).
  bool ClosedWithin(std::chrono::milliseconds limit) {
    const auto give_up = std::chrono::steady_clock::now() + limit;
    char buf[4096];
    while (std::chrono::steady_clock::now() < give_up) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      const ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) return true;
    }
    return false;
  }

 private:
  int fd_ = -1;
};

Status SendHealth(WireClient& c) {
  capnp::MallocMessageBuilder b;
  b.initRoot<Envelope>().initHealthRequest();
  return c.Send(b);
}

TEST(RouterResilienceTest, FrozenEngineGetsNoNewRequestsAndItsRequestsFinishElsewhere) {
  ::chunkserve::testing::TempDir dir;
  const std::string stall = (dir.path() / "stall").string();
  std::vector<std::vector<uint32_t>> prompts;
  for (int i = 1; i <= 16; ++i) prompts.push_back(Tokens(30, i));
  ASSERT_OK_AND_ASSIGN(const auto solo, SoloGreedy(prompts, 8));
  ASSERT_OK_AND_ASSIGN(auto router,
                       RouterProcess::Start({"--stall-timeout-ms", "2000", "--policy",
                                             "round_robin"}));
  ASSERT_OK_AND_ASSIGN(auto frozen, StartStallableWorker(router->address(), "frozen", stall));
  ASSERT_OK_AND_ASSIGN(auto healthy, StartWorker(router->address(), "healthy"));
  ExpectWorkersAlive(*router, 2);
  Touch(stall);  // the frozen worker's engine stops stepping; its process and links stay up
  ASSERT_OK_AND_ASSIGN(auto client, router->Connect());
  std::vector<uint64_t> ids;
  const auto start = std::chrono::steady_clock::now();
  for (uint64_t i = 1; i <= 16; ++i) {
    ASSERT_OK(SendGenerate(*client, i, prompts[i - 1], 8));
    ids.push_back(i);
  }
  const std::map<uint64_t, Outcome> outcomes = ReceiveAll(*client, ids);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (uint64_t id : ids) {
    const Outcome& o = outcomes.at(id);
    EXPECT_TRUE(o.finished) << "request " << id;
    EXPECT_EQ(o.reason, FinishReason::LENGTH) << "request " << id;
    // Moved off the frozen engine or not, the tokens of the prompt's solo run, none twice.
    EXPECT_EQ(o.tokens, solo[id - 1]) << "request " << id << " differs from a solo run";
    EXPECT_TRUE(o.indices_continuous) << "request " << id;
  }
  ASSERT_OK_AND_ASSIGN(double stalled,
                       Metric(router->http_port(), "chunkserve_router_workers_stalled_total"));
  EXPECT_GE(stalled, 1);
  // Once stalled, nothing new goes there.
  const double routed_frozen = RoutedTo(*router, "frozen");
  for (uint64_t i = 101; i <= 104; ++i) {
    const Outcome o = RunOne(*client, i, Tokens(20, static_cast<int>(i)), 4);
    EXPECT_EQ(o.reason, FinishReason::LENGTH);
  }
  EXPECT_EQ(RoutedTo(*router, "frozen"), routed_frozen);
  std::printf("16 requests, half first routed to a frozen engine, all finished in %.1f s; "
              "stalls detected %.0f\n",
              took, stalled);
  // The engine moves again: the worker is routable again.
  std::filesystem::remove(stall);
  const auto thawed = std::chrono::steady_clock::now();
  const Result<double> back = WaitForMetric(
      router->http_port(), "chunkserve_router_worker_accepting{worker=\"frozen\"}",
      [](double v) { return v == 1; }, 30s);
  ASSERT_OK(back.status());
  EXPECT_EQ(back.value(), 1);
  std::printf("the thawed engine is routable again after %.1f s\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - thawed).count());
}

TEST(RouterResilienceTest, TheRouterEndsARequestAtItsDeadlineWhateverTheWorkerDoes) {
  ::chunkserve::testing::TempDir dir;
  const std::string stall = (dir.path() / "stall").string();
  // The stall bound is far away: only the deadline can end the request.
  ASSERT_OK_AND_ASSIGN(auto router, RouterProcess::Start({"--stall-timeout-ms", "600000"}));
  ASSERT_OK_AND_ASSIGN(auto frozen, StartStallableWorker(router->address(), "frozen", stall));
  ExpectWorkersAlive(*router, 1);
  Touch(stall);
  ASSERT_OK_AND_ASSIGN(auto client, router->Connect());
  capnp::MallocMessageBuilder b;
  auto g = b.initRoot<Envelope>().initGenerate();
  g.setRequestId(1);
  auto prompt = g.initPrompt(10);
  for (unsigned i = 0; i < 10; ++i) prompt.set(i, 5 + i);
  g.setMaxNewTokens(4);
  g.setDeadlineMs(1500);
  const auto start = std::chrono::steady_clock::now();
  ASSERT_OK(client->Send(b));
  const std::map<uint64_t, Outcome> outcomes = ReceiveAll(*client, {1});
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(outcomes.at(1).reason, FinishReason::DEADLINE);
  EXPECT_GE(took, 1400ms);
  EXPECT_LT(took, 4s);
  std::printf("deadline 1500 ms on a frozen engine: ended after %.0f ms\n",
              std::chrono::duration<double, std::milli>(took).count());
}

// An idle cluster used to drop every worker every ~10 s: the router's data link said nothing and
// the worker's handshake deadline closed it.
TEST(RouterResilienceTest, AnIdleClusterKeepsItsWorkers) {
  ASSERT_OK_AND_ASSIGN(auto router, RouterProcess::Start({}));
  ASSERT_OK_AND_ASSIGN(auto w0, StartWorker(router->address(), "w0"));
  ASSERT_OK_AND_ASSIGN(auto w1, StartWorker(router->address(), "w1"));
  ExpectWorkersAlive(*router, 2);
  std::this_thread::sleep_for(60s);
  ASSERT_OK_AND_ASSIGN(double dead,
                       Metric(router->http_port(), "chunkserve_router_workers_dead_total"));
  ASSERT_OK_AND_ASSIGN(double registered,
                       Metric(router->http_port(), "chunkserve_router_workers_registered_total"));
  EXPECT_EQ(dead, 0);
  EXPECT_EQ(registered, 2);
  ExpectWorkersAlive(*router, 2);
  // And still serving.
  ASSERT_OK_AND_ASSIGN(auto client, router->Connect());
  EXPECT_EQ(RunOne(*client, 1, Tokens(20, 3), 4).reason, FinishReason::LENGTH);
}

// A router behind a partition drops the worker's SYNs without an answer; here a listener whose
// accept queue is full (backlog 0, one connection nobody accepts) does the same on 127.0.0.1.
// After 40 s the real router starts on that port: the worker must register within its reconnect
// backoff (5 s) plus its connect timeout (3 s). Before the worker bounded its connection attempts,
// the kernel's SYN retransmissions decided (Linux 6.x: 1, 2, 3, 4, 5, 7, 11, 19, 35, 67 s after
// the first, giving up after about 2 minutes), and the worker came back about 27 s later.
TEST(RouterResilienceTest, AWorkerRejoinsSoonAfterARouterStopsDroppingItsSyns) {
  // Close-on-exec: the worker started below must not inherit (and keep) the listener.
  const int hole = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(hole, 0);
  const int one = 1;
  ASSERT_EQ(::setsockopt(hole, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)), 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(hole, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(::listen(hole, 0), 0);
  socklen_t len = sizeof(a);
  ASSERT_EQ(::getsockname(hole, reinterpret_cast<sockaddr*>(&a), &len), 0);
  const uint16_t port = ntohs(a.sin_port);
  const int filler = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);  // fills the queue
  ASSERT_EQ(::connect(filler, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  const std::string address = "127.0.0.1:" + std::to_string(port);
  ASSERT_OK_AND_ASSIGN(auto w0, StartWorker(address, "w0"));
  std::this_thread::sleep_for(40s);
  ::close(filler);
  ::close(hole);
  ASSERT_OK_AND_ASSIGN(auto router, RouterProcess::Start({"--listen", address}));
  const auto back = std::chrono::steady_clock::now();
  ExpectWorkersAlive(*router, 1);
  const double rejoined =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - back).count();
  std::printf("SYNs dropped for 40 s: the worker registered %.1f s after the router came back\n",
              rejoined);
  EXPECT_LT(rejoined, 15.0);
  ASSERT_OK_AND_ASSIGN(auto client, router->Connect());
  EXPECT_EQ(RunOne(*client, 1, Tokens(20, 3), 4).reason, FinishReason::LENGTH);
}

// 20 peers each send one valid frame (so they are past the handshake deadline), then 3 MiB of a
// frame that announces 4 MiB, and stop. The server at `port` (process `pid`, started with a 16 MiB
// buffer budget and a 2 s frame deadline) must close every one of them and hold no more than the
// budget meanwhile.
void HoldPartialFrames(const char* what, pid_t pid, uint16_t port) {
  const int64_t rss_before = RssKib(pid);
  std::vector<std::unique_ptr<WireClient>> holders;
  for (int i = 0; i < 20; ++i) {
    ASSERT_OK_AND_ASSIGN(auto c, WireClient::Connect("127.0.0.1", port, 10s));
    ASSERT_OK(SendHealth(*c));
    ASSERT_OK(c->Receive(10s).status());
    // The server may refuse (and close) while this is still being sent: not an error here.
    (void)c->SendRaw(PartialFrame((4u << 20) / 8 - 16, 3u << 20));
    holders.push_back(std::move(c));
  }
  std::this_thread::sleep_for(500ms);
  const int64_t rss_peak = RssKib(pid);
  // Every one of them is closed: refused by the budget at once, or by the frame deadline.
  const auto start = std::chrono::steady_clock::now();
  int closed = 0;
  for (auto& c : holders) {
    for (int k = 0; k < 4; ++k) {
      Result<DecodedMessage> m = c->Receive(10s);
      if (!m.ok()) {
        closed += m.status().code() == StatusCode::kUnavailable;
        break;
      }
    }
  }
  const auto closed_after = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(closed, 20);
  EXPECT_LT(closed_after, 10s);
  // At most the 16 MiB budget plus 4 MiB for the connections themselves, not 20 x 3 MiB.
  EXPECT_LT(rss_peak - rss_before, 20 * 1024) << "KiB";
  std::printf("%s, 20 partial 4 MiB frames: RSS %lld -> %lld KiB (budget 16 MiB); all closed "
              "%.1f s after the last byte\n",
              what, static_cast<long long>(rss_before), static_cast<long long>(rss_peak),
              std::chrono::duration<double>(closed_after).count());
}

TEST(RouterResilienceTest, PartialFramesAreBoundedAndClosedAndSlowlorisIsShedded) {
  // A 16 MiB budget for partial frames across all connections, 2 s to complete a frame.
  ASSERT_OK_AND_ASSIGN(auto router, RouterProcess::Start({"--buffer-budget-mb", "16",
                                                          "--frame-timeout-ms", "2000"}));
  ASSERT_OK_AND_ASSIGN(auto w0, StartWorker(router->address(), "w0"));
  ExpectWorkersAlive(*router, 1);
  HoldPartialFrames("router", router->pid(), router->port());

  // Slowloris: 500 connections trickle a segment table one byte at a time. A client alongside is
  // served normally, and every slow connection is closed by the frame deadline.
  std::vector<std::unique_ptr<RawPeer>> slow;
  for (int i = 0; i < 500; ++i) {
    auto p = std::make_unique<RawPeer>(router->port());
    ASSERT_TRUE(p->ok());
    p->Send(0);
    slow.push_back(std::move(p));
  }
  ASSERT_OK_AND_ASSIGN(auto legit, router->Connect());
  const auto legit_start = std::chrono::steady_clock::now();
  for (uint64_t i = 1; i <= 5; ++i) {
    EXPECT_EQ(RunOne(*legit, i, Tokens(20, static_cast<int>(i)), 4).reason, FinishReason::LENGTH);
  }
  const double legit_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - legit_start).count();
  int slow_closed = 0;
  for (auto& p : slow) {
    p->Send(0);  // keeps trickling; the deadline counts from the frame's first byte
    slow_closed += p->ClosedWithin(10s);
  }
  EXPECT_EQ(slow_closed, 500);
  EXPECT_LT(legit_s, 20);
  std::printf("slowloris x500: 5 legitimate requests in %.2f s alongside; %d of 500 closed\n",
              legit_s, slow_closed);
}

TEST(RouterResilienceTest, AWorkerBoundsPartialFramesToo) {
  std::vector<std::string> args = kWorkerArgs;
  args.insert(args.end(), {"--buffer-budget-mb", "16", "--frame-timeout-ms", "2000"});
  ASSERT_OK_AND_ASSIGN(auto worker, WorkerProcess::Start(args));
  HoldPartialFrames("worker", worker->pid(), worker->port());
  // And it still serves.
  ASSERT_OK_AND_ASSIGN(auto client, WireClient::Connect("127.0.0.1", worker->port(), 10s));
  EXPECT_EQ(RunOne(*client, 1, Tokens(20, 3), 4).reason, FinishReason::LENGTH);
}

TEST(RouterResilienceTest, AtItsDescriptorLimitTheRouterKeepsItsProbesAndRecovers) {
  // The router starts with 96 descriptors: it serves at most 64 connections and keeps the rest.
  rlimit saved{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &saved), 0);
  rlimit low = saved;
  low.rlim_cur = 96;
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
  auto started = RouterProcess::Start({});
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &saved), 0);
  ASSERT_OK_AND_ASSIGN(auto router, std::move(started));
  ASSERT_OK_AND_ASSIGN(auto w0, StartWorker(router->address(), "w0"));
  ExpectWorkersAlive(*router, 1);
  std::vector<std::unique_ptr<WireClient>> idle;
  for (int i = 0; i < 120; ++i) {
    ASSERT_OK_AND_ASSIGN(auto c, router->Connect());
    ASSERT_OK(SendHealth(*c));
    idle.push_back(std::move(c));
  }
  int served = 0, refused = 0;
  for (auto& c : idle) {
    Result<DecodedMessage> m = c->Receive(10s);
    if (m.ok() && m.value().root().which() == Envelope::HEALTH) {
      ++served;
    } else if (m.ok() && m.value().root().which() == Envelope::ERROR) {
      EXPECT_EQ(m.value().root().getError().getCode(), wire::schema::ErrorCode::RESOURCE_EXHAUSTED);
      EXPECT_TRUE(m.value().root().getError().getRetryable());
      ++refused;
    }
  }
  EXPECT_GT(served, 30);
  EXPECT_GT(refused, 30);
  EXPECT_EQ(served + refused, 120);
  // The probes still answer, and the worker is still there.
  ASSERT_OK_AND_ASSIGN(HttpResponse ready, HttpGet(router->http_port(), "/readyz"));
  EXPECT_EQ(ready.status, 200);
  ASSERT_OK(HttpGet(router->http_port(), "/metrics").status());
  // Closing the idle connections frees the router: a new client is served.
  idle.clear();
  const bool recovered = WaitFor(
      [&] {
        auto c = router->Connect();
        if (!c.ok()) return false;
        return RunOne(*c.value(), 1, Tokens(20, 9), 4).reason == FinishReason::LENGTH;
      },
      30s);
  EXPECT_TRUE(recovered);
  std::printf("at 96 descriptors: %d connections served, %d refused, probes up, recovered\n",
              served, refused);
}

TEST(RouterResilienceTest, OnlyPeersWithTheSecretRegisterAndSubmit) {
  ::chunkserve::testing::TempDir dir;
  const std::string secret = (dir.path() / "secret").string();
  const std::string token = (dir.path() / "token").string();
  const std::string wrong = (dir.path() / "wrong").string();
  std::ofstream(secret) << "0123456789abcdef0123456789abcdef\n";
  std::ofstream(token) << "client-token-0123456789abcdef\n";
  std::ofstream(wrong) << "fedcba9876543210fedcba9876543210\n";
  ASSERT_OK_AND_ASSIGN(auto router, RouterProcess::Start({"--secret-file", secret,
                                                          "--client-token-file", token}));
  ASSERT_OK_AND_ASSIGN(auto good, StartWorker(router->address(), "good", {"--secret-file", secret}));
  ASSERT_OK_AND_ASSIGN(auto liar, StartWorker(router->address(), "liar", {"--secret-file", wrong}));
  ASSERT_OK_AND_ASSIGN(auto none, StartWorker(router->address(), "none"));
  ExpectWorkersAlive(*router, 1);
  std::this_thread::sleep_for(2s);  // the others keep retrying, and keep failing
  ExpectWorkersAlive(*router, 1);

  // Clients: the token works, nothing else does.
  ASSERT_OK_AND_ASSIGN(
      auto client, WireClient::Connect("127.0.0.1", router->port(), 10s, {},
                                       wire::ClientAuth{"client-token-0123456789abcdef",
                                                        wire::schema::AuthRole::CLIENT}));
  EXPECT_EQ(RunOne(*client, 1, Tokens(20, 1), 4).reason, FinishReason::LENGTH);
  ASSERT_OK_AND_ASSIGN(auto anonymous, router->Connect());
  ASSERT_OK(SendGenerate(*anonymous, 1, Tokens(20, 1), 4));
  EXPECT_EQ(anonymous->Receive(10s).status().code(), StatusCode::kUnauthenticated);
  // The worker challenges its own connections too: an anonymous client there is refused.
  ASSERT_OK_AND_ASSIGN(auto direct, WireClient::Connect("127.0.0.1", good->port(), 10s));
  ASSERT_OK(SendGenerate(*direct, 1, Tokens(20, 1), 4));
  EXPECT_EQ(direct->Receive(10s).status().code(), StatusCode::kUnauthenticated);
  // The client token does not make a worker.
  ASSERT_OK_AND_ASSIGN(
      auto pretender, WireClient::Connect("127.0.0.1", router->port(), 10s, {},
                                          wire::ClientAuth{"client-token-0123456789abcdef",
                                                           wire::schema::AuthRole::WORKER}));
  ASSERT_OK_AND_ASSIGN(DecodedMessage refused, pretender->Receive(10s));
  ASSERT_EQ(refused.root().which(), Envelope::ERROR);
  EXPECT_EQ(refused.root().getError().getCode(), wire::schema::ErrorCode::UNAUTHENTICATED);

  // Another instance under the live worker's id is refused; once the first is gone, it joins.
  ASSERT_OK_AND_ASSIGN(const double refused_before,
                       Metric(router->http_port(), "chunkserve_router_workers_refused_total"));
  ASSERT_OK_AND_ASSIGN(auto twin,
                       StartWorker(router->address(), "good", {"--secret-file", secret}));
  const Result<double> refusals = WaitForMetric(
      router->http_port(), "chunkserve_router_workers_refused_total",
      [refused_before](double v) { return v > refused_before; }, 30s);
  ASSERT_OK(refusals.status()) << "the twin's registration was not refused";
  ASSERT_OK_AND_ASSIGN(double registered,
                       Metric(router->http_port(), "chunkserve_router_workers_registered_total"));
  EXPECT_EQ(registered, 1);
  ASSERT_OK(good->Signal(SIGKILL));
  const Result<double> joined = WaitForMetric(
      router->http_port(), "chunkserve_router_workers_registered_total",
      [](double v) { return v >= 2; }, 30s);
  ASSERT_OK(joined.status());
  EXPECT_GE(joined.value(), 2);
  ExpectWorkersAlive(*router, 1);
  EXPECT_EQ(RunOne(*client, 2, Tokens(20, 2), 4).reason, FinishReason::LENGTH);
}


// With TLS on (mutual TLS between router and workers): only a worker with a certificate from the
// cluster CA joins; a worker with another authority's certificate, a plaintext worker and a
// plaintext client are refused with a clear error; a client holding only the CA is served.
TEST(RouterResilienceTest, WithTlsOnlyCertifiedWorkersJoinAndPlaintextPeersAreRefused) {
  using ::chunkserve::testing::ClientTlsFiles;
  using ::chunkserve::testing::NodeTlsFiles;
  using ::chunkserve::testing::RogueTlsFiles;
  using ::chunkserve::testing::TlsFlags;
  if (::chunkserve::testing::TestTlsMode()) GTEST_SKIP() << "sets up its own TLS";
  ASSERT_OK_AND_ASSIGN(auto router, RouterProcess::Start(TlsFlags(NodeTlsFiles())));
  ASSERT_OK_AND_ASSIGN(auto good, StartWorker(router->address(), "good", TlsFlags(NodeTlsFiles())));
  ASSERT_OK_AND_ASSIGN(auto rogue,
                       StartWorker(router->address(), "rogue", TlsFlags(RogueTlsFiles())));
  ASSERT_OK_AND_ASSIGN(auto plain, StartWorker(router->address(), "plain"));
  ExpectWorkersAlive(*router, 1);
  std::this_thread::sleep_for(2s);  // the others keep retrying, and keep failing
  ExpectWorkersAlive(*router, 1);
  ASSERT_OK_AND_ASSIGN(double registered,
                       Metric(router->http_port(), "chunkserve_router_workers_registered_total"));
  EXPECT_EQ(registered, 1);

  ASSERT_OK_AND_ASSIGN(auto ca_only,
                       wire::TlsContext::Create(wire::TlsContext::Side::kClient, ClientTlsFiles()));
  ASSERT_OK_AND_ASSIGN(auto client, WireClient::Connect("127.0.0.1", router->port(), 10s, {},
                                                        std::nullopt, ca_only));
  EXPECT_EQ(RunOne(*client, 1, Tokens(20, 1), 4).reason, FinishReason::LENGTH);

  // A plaintext peer, on the router and on the worker: an Error saying TLS is required.
  auto expect_tls_required = [](uint16_t port) {
    ASSERT_OK_AND_ASSIGN(auto c, WireClient::Connect("127.0.0.1", port, 10s));
    ASSERT_OK(SendGenerate(*c, 1, Tokens(20, 1), 4));
    Result<DecodedMessage> m = c->Receive(10s);
    if (m.ok()) {
      ASSERT_EQ(m.value().root().which(), Envelope::ERROR);
      EXPECT_EQ(m.value().root().getError().getCode(), wire::schema::ErrorCode::UNAUTHENTICATED);
      EXPECT_NE(std::string(m.value().root().getError().getMessage().cStr()).find("TLS"),
                std::string::npos);
    } else {
      EXPECT_EQ(m.status().code(), StatusCode::kUnauthenticated) << m.status();
    }
  };
  expect_tls_required(router->port());
  expect_tls_required(good->port());

  // A TLS client without a certificate cannot register as a worker.
  ASSERT_OK_AND_ASSIGN(auto pretender, WireClient::Connect("127.0.0.1", router->port(), 10s, {},
                                                           std::nullopt, ca_only));
  ASSERT_OK_AND_ASSIGN(const std::string reason,
                       RegisterRefusedFor(*pretender, "pretender", "127.0.0.1:1"));
  EXPECT_NE(reason.find("certificate"), std::string::npos) << reason;
  ExpectWorkersAlive(*router, 1);
  EXPECT_EQ(RunOne(*client, 2, Tokens(20, 2), 4).reason, FinishReason::LENGTH);
}

// With a revocation list (--tls-crl) rewritten while the router runs (re-read within a second): a
// worker that joined before its certificate was revoked is dropped, and it and any other holder
// of that certificate cannot join again; a worker with a valid certificate still joins.
TEST(RouterResilienceTest, WithACrlARevokedWorkerCannotJoin) {
  using ::chunkserve::testing::NodeTlsFiles;
  using ::chunkserve::testing::RevokedTlsFiles;
  using ::chunkserve::testing::TlsFixture;
  using ::chunkserve::testing::TlsFlags;
  using ::chunkserve::testing::WithCrl;
  if (::chunkserve::testing::TestTlsMode()) GTEST_SKIP() << "sets up its own TLS";
  const ::chunkserve::testing::TempDir dir;
  const std::filesystem::path crl = dir.path() / "crl.pem";
  auto install = [&](const std::string& fixture) {
    std::filesystem::copy_file(TlsFixture(fixture), dir.path() / "next.pem");
    std::filesystem::rename(dir.path() / "next.pem", crl);
  };
  install("crl-none.pem");
  ASSERT_OK_AND_ASSIGN(auto router,
                       RouterProcess::Start(TlsFlags(WithCrl(NodeTlsFiles(), crl.string()))));
  ASSERT_OK_AND_ASSIGN(auto early, StartWorker(router->address(), "early",
                                               TlsFlags(WithCrl(RevokedTlsFiles(), crl.string()))));
  ExpectWorkersAlive(*router, 1);
  install("crl.pem");
  ExpectWorkersAlive(*router, 0);  // its open links close at their next frame

  // The router refuses the revoked certificate once it has re-read the file: a client presenting
  // it is cut off at its first read (until then the router answers it).
  ASSERT_OK_AND_ASSIGN(auto revoked,
                       wire::TlsContext::Create(wire::TlsContext::Side::kClient, RevokedTlsFiles()));
  bool refused = false;
  const auto give_up = std::chrono::steady_clock::now() + 30s;
  while (!refused && std::chrono::steady_clock::now() < give_up) {
    auto c = WireClient::Connect("127.0.0.1", router->port(), 10s, {}, std::nullopt, revoked);
    if (c.ok()) {
      ASSERT_OK(SendGenerate(**c, 1, Tokens(20, 1), 4));
      refused = !(*c)->Receive(10s).ok();
    } else {
      refused = true;
    }
    if (!refused) std::this_thread::sleep_for(100ms);
  }
  ASSERT_TRUE(refused) << "the router never re-read its revocation list";

  ASSERT_OK_AND_ASSIGN(auto late, StartWorker(router->address(), "late",
                                              TlsFlags(WithCrl(RevokedTlsFiles(), crl.string()))));
  ASSERT_OK_AND_ASSIGN(auto good, StartWorker(router->address(), "good",
                                              TlsFlags(WithCrl(NodeTlsFiles(), crl.string()))));
  ExpectWorkersAlive(*router, 1);
  std::this_thread::sleep_for(2s);  // the revoked worker keeps retrying, and keeps failing
  ExpectWorkersAlive(*router, 1);
  ASSERT_OK_AND_ASSIGN(double registered,
                       Metric(router->http_port(), "chunkserve_router_workers_registered_total"));
  EXPECT_EQ(registered, 2);  // early, before the revocation, and good
}

}  // namespace
}  // namespace chunkserve::router
