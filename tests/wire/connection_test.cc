// Connection over real sockets on 127.0.0.1:0: echo, malformed frames close only that
// connection, deadlines, bounded outgoing queue, keepalive, the frame deadline, the process-wide
// byte budget, challenge-response authentication, and TLS (test certificates in
// tests/testing/tls).
#include "runtime/wire/connection.h"

#include <capnp/message.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <vector>
#include <chrono>
#include <optional>
#include <thread>

#include "runtime/wire/client.h"
#include "runtime/wire/framing.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/tls_fixtures.h"

namespace chunkserve::wire {
namespace {

using namespace std::chrono_literals;
using ::chunkserve::testing::StatusIs;

// An echo server: answers every Cancel with a Token carrying the same request id.
class EchoServer {
 public:
  explicit EchoServer(ConnectionOptions options) : acceptor_(io_), options_(options) {
    asio::ip::tcp::endpoint ep(asio::ip::make_address("127.0.0.1"), 0);
    acceptor_.open(ep.protocol());
    acceptor_.bind(ep);
    acceptor_.listen();
    port_ = acceptor_.local_endpoint().port();
    Accept();
    thread_ = std::thread([this] { io_.run(); });
  }
  ~EchoServer() {
    io_.stop();
    thread_.join();
  }
  uint16_t port() const { return port_; }
  std::atomic<int> closed{0};
  std::atomic<int> errors{0};
  std::vector<Status> reasons() {
    std::lock_guard<std::mutex> lock(mu_);
    return reasons_;
  }
  // Waits up to `limit` for `n` closes.
  bool WaitClosed(int n, std::chrono::milliseconds limit) {
    const auto give_up = std::chrono::steady_clock::now() + limit;
    while (closed.load() < n && std::chrono::steady_clock::now() < give_up) {
      std::this_thread::sleep_for(5ms);
    }
    return closed.load() >= n;
  }

 private:
  void Accept() {
    acceptor_.async_accept([this](const asio::error_code& ec, asio::ip::tcp::socket s) {
      if (ec) return;
      auto c = Connection::Create(std::move(s), options_);
      std::weak_ptr<Connection> weak = c;
      c->Start(
          [weak](DecodedMessage& m) {
            auto self = weak.lock();
            if (!self || m.root().which() != schema::Envelope::CANCEL) return;
            capnp::MallocMessageBuilder b;
            auto t = b.initRoot<schema::Envelope>().initToken();
            t.setRequestId(m.root().getCancel().getRequestId());
            // The proven role + 1 in the index (0: not authenticated).
            const auto role = self->peer_role();
            t.setIndex(role ? static_cast<int32_t>(*role) + 1 : 0);
            // 1 in the token when the peer presented a certificate the cluster CA verified.
            t.setToken(self->peer_certified() ? 1 : 0);
            (void)self->Send(b);
          },
          [this](const Status& reason) {
            if (!reason.ok()) errors.fetch_add(1);
            {
              std::lock_guard<std::mutex> lock(mu_);
              reasons_.push_back(reason);
            }
            closed.fetch_add(1);
          });
      Accept();
    });
  }
  asio::io_context io_;
  asio::ip::tcp::acceptor acceptor_;
  ConnectionOptions options_;
  uint16_t port_ = 0;
  std::thread thread_;
  std::mutex mu_;
  std::vector<Status> reasons_;
};

Status SendCancel(WireClient& c, uint64_t id) {
  capnp::MallocMessageBuilder b;
  b.initRoot<schema::Envelope>().initCancel().setRequestId(id);
  return c.Send(b);
}

TEST(ConnectionTest, EchoRoundTrips) {
  EchoServer server({});
  ASSERT_OK_AND_ASSIGN(auto client, WireClient::Connect("127.0.0.1", server.port(), 5s));
  for (uint64_t i = 1; i <= 50; ++i) ASSERT_OK(SendCancel(*client, i));
  for (uint64_t i = 1; i <= 50; ++i) {
    ASSERT_OK_AND_ASSIGN(DecodedMessage m, client->Receive(5s));
    ASSERT_EQ(m.root().which(), schema::Envelope::TOKEN);
    EXPECT_EQ(m.root().getToken().getRequestId(), i);
  }
}

TEST(ConnectionTest, MalformedFrameClosesOnlyThatConnection) {
  EchoServer server({});
  ASSERT_OK_AND_ASSIGN(auto good, WireClient::Connect("127.0.0.1", server.port(), 5s));
  ASSERT_OK_AND_ASSIGN(auto bad, WireClient::Connect("127.0.0.1", server.port(), 5s));
  ASSERT_OK(bad->SendRaw({0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0}));
  // The bad client gets a connection-level Error, then the close.
  ASSERT_OK_AND_ASSIGN(DecodedMessage m, bad->Receive(5s));
  ASSERT_EQ(m.root().which(), schema::Envelope::ERROR);
  EXPECT_EQ(m.root().getError().getRequestId(), 0u);
  EXPECT_THAT(bad->Receive(5s).status(), StatusIs(StatusCode::kUnavailable));
  ASSERT_OK(SendCancel(*good, 9));
  ASSERT_OK_AND_ASSIGN(DecodedMessage echo, good->Receive(5s));
  EXPECT_EQ(echo.root().getToken().getRequestId(), 9u);
}

TEST(ConnectionTest, OversizedFrameClosesConnection) {
  ConnectionOptions o;
  o.limits.max_message_bytes = 4096;
  EchoServer server(o);
  ASSERT_OK_AND_ASSIGN(auto bad, WireClient::Connect("127.0.0.1", server.port(), 5s));
  ASSERT_OK(bad->SendRaw({0, 0, 0, 0, 0, 0, 0, 1}));  // 1 segment of 2^24 words
  ASSERT_OK_AND_ASSIGN(DecodedMessage m, bad->Receive(5s));
  EXPECT_EQ(m.root().getError().getCode(), schema::ErrorCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(bad->Receive(5s).status(), StatusIs(StatusCode::kUnavailable));
}

TEST(ConnectionTest, HandshakeDeadlineClosesSilentPeer) {
  ConnectionOptions o;
  o.handshake_timeout = 100ms;
  EchoServer server(o);
  ASSERT_OK_AND_ASSIGN(auto silent, WireClient::Connect("127.0.0.1", server.port(), 5s));
  EXPECT_THAT(silent->Receive(10s).status(), StatusIs(StatusCode::kUnavailable));
  const auto give_up = std::chrono::steady_clock::now() + 10s;
  while (server.errors.load() == 0 && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(5ms);
  }
  EXPECT_EQ(server.errors.load(), 1);
}

TEST(ConnectionTest, OutgoingQueueIsBounded) {
  asio::io_context io;
  asio::ip::tcp::acceptor acceptor(io, {asio::ip::make_address("127.0.0.1"), 0});
  ASSERT_OK_AND_ASSIGN(auto peer,
                       WireClient::Connect("127.0.0.1", acceptor.local_endpoint().port(), 5s));
  asio::ip::tcp::socket socket = acceptor.accept();
  ConnectionOptions o;
  o.max_outgoing_bytes = 64 << 10;
  auto c = Connection::Create(std::move(socket), o);
  c->Start(nullptr, nullptr);
  // The loop is not run: nothing is written, so the queue must refuse past its bound.
  std::vector<uint8_t> frame(1024, 0);
  int accepted = 0;
  Status s;
  while ((s = c->SendBytes(frame)).ok()) ++accepted;
  EXPECT_THAT(s, StatusIs(StatusCode::kResourceExhausted));
  EXPECT_EQ(accepted, 64);
  c->Close(Status::Ok());
  io.run_for(1s);
  EXPECT_TRUE(c->closed());
}

}  // namespace
}  // namespace chunkserve::wire

namespace chunkserve::wire {
namespace {

// Half of a frame: a segment table announcing `words` words, and no body.
std::vector<uint8_t> PartialFrame(uint32_t words, size_t body_bytes) {
  std::vector<uint8_t> bytes(8 + body_bytes, 0x5a);
  for (int i = 0; i < 4; ++i) {
    bytes[i] = 0;  // one segment
    bytes[4 + i] = static_cast<uint8_t>(words >> (8 * i));
  }
  return bytes;
}

TEST(ConnectionTest, KeepaliveKeepsAnIdleLinkOpenAndADeadPeerIsNotKept) {
  // The server closes a link that is silent for 600 ms; a peer that pings every 100 ms while
  // idle stays open for 2 s, one that does not is closed.
  ConnectionOptions server_options;
  server_options.idle_timeout = 600ms;
  EchoServer server(server_options);

  asio::io_context io;
  auto connect = [&] {
    asio::ip::tcp::socket s(io);
    s.connect({asio::ip::make_address("127.0.0.1"), server.port()});
    return s;
  };
  ConnectionOptions pinging;
  pinging.keepalive_interval = 100ms;
  pinging.ping_first = true;
  auto alive = Connection::Create(connect(), pinging);
  std::atomic<bool> alive_closed{false};
  alive->Start([](DecodedMessage&) {}, [&](const Status&) { alive_closed = true; });
  ASSERT_OK_AND_ASSIGN(auto silent, WireClient::Connect("127.0.0.1", server.port(), 5s));
  std::thread loop([&] { io.run_for(2000ms); });
  loop.join();
  EXPECT_FALSE(alive_closed.load());
  EXPECT_FALSE(alive->closed());
  EXPECT_EQ(server.closed.load(), 1);  // only the silent one
  ASSERT_FALSE(server.reasons().empty());
  EXPECT_THAT(server.reasons()[0], StatusIs(StatusCode::kDeadlineExceeded));
  alive->Close(Status::Ok());
  io.restart();
  io.run_for(100ms);
}

// A server streams a Token every 20 ms for 1.5 s to a peer that sends one frame and then only
// reads (a client streaming a long answer); the server's idle deadline is 300 ms. Returns how
// the server's side closed (OK: still open at the end).
Status StreamToAReader(bool idle_counts_sends) {
  asio::io_context io;
  asio::ip::tcp::acceptor acceptor(io, {asio::ip::make_address("127.0.0.1"), 0});
  auto reader = WireClient::Connect("127.0.0.1", acceptor.local_endpoint().port(), 5s);
  if (!reader.ok()) return reader.status();
  CHUNKSERVE_RETURN_IF_ERROR(SendCancel(**reader, 1));
  asio::ip::tcp::socket socket = acceptor.accept();
  ConnectionOptions o;
  o.idle_timeout = 300ms;
  o.idle_counts_sends = idle_counts_sends;
  auto server = Connection::Create(std::move(socket), o);
  std::optional<Status> closed;
  server->Start([](DecodedMessage&) {}, [&](const Status& why) { closed = why; });
  asio::steady_timer tick(io);
  std::function<void()> stream = [&] {
    capnp::MallocMessageBuilder b;
    b.initRoot<schema::Envelope>().initToken().setRequestId(1);
    (void)server->Send(b);
    tick.expires_after(20ms);
    tick.async_wait([&](const asio::error_code& ec) {
      if (!ec) stream();
    });
  };
  stream();
  std::thread loop([&] { io.run_for(1500ms); });
  const auto end = std::chrono::steady_clock::now() + 1500ms;
  while (std::chrono::steady_clock::now() < end && (*reader)->Receive(100ms).ok()) {
  }
  loop.join();
  const Status result = closed.value_or(Status::Ok());
  tick.cancel();
  server->Close(Status::Ok());
  io.restart();
  io.run_for(50ms);
  return result;
}

TEST(ConnectionTest, APeerThatIsStreamedToIsNotIdle) {
  EXPECT_OK(StreamToAReader(/*idle_counts_sends=*/true));
  EXPECT_THAT(StreamToAReader(/*idle_counts_sends=*/false),
              StatusIs(StatusCode::kDeadlineExceeded, ::testing::HasSubstr("idle deadline")));
}

TEST(ConnectionTest, PingFirstMeetsThePeersHandshakeDeadline) {
  // A link with nothing to say yet (a router's data link) pings at Start, so the peer's handshake
  // deadline is met. No fixed wait decides it: a silent peer connects right after the pinging
  // one, and the server, which arms each handshake deadline when it accepts (in connection
  // order) and fires equal deadlines in the order they were armed, has run the pinging link's
  // deadline by the time it closes the silent one. The deadline is generous (1 s) so that a
  // loaded machine cannot delay the ping past it.
  ConnectionOptions server_options;
  server_options.handshake_timeout = 1000ms;
  EchoServer server(server_options);
  asio::io_context io;
  asio::ip::tcp::socket s(io);
  s.connect({asio::ip::make_address("127.0.0.1"), server.port()});
  ConnectionOptions o;
  o.ping_first = true;  // and no keepalive interval: this ping is the only one
  auto c = Connection::Create(std::move(s), o);
  c->Start([](DecodedMessage&) {}, [](const Status&) {});
  std::thread loop([&io] { io.run(); });  // until the connection closes
  ASSERT_OK_AND_ASSIGN(auto silent, WireClient::Connect("127.0.0.1", server.port(), 5s));
  EXPECT_THAT(silent->Receive(30s).status(), StatusIs(StatusCode::kUnavailable));
  EXPECT_TRUE(server.WaitClosed(1, 30s));
  EXPECT_EQ(server.closed.load(), 1) << "the pinging link missed the handshake deadline too";
  ASSERT_FALSE(server.reasons().empty());
  EXPECT_THAT(server.reasons()[0],
              StatusIs(StatusCode::kDeadlineExceeded, ::testing::HasSubstr("handshake")));
  EXPECT_FALSE(c->closed());
  asio::post(io, [c] { c->Close(Status::Ok()); });
  loop.join();
}

TEST(ConnectionTest, AStartedFrameMustCompleteInTime) {
  ConnectionOptions o;
  o.frame_timeout = 200ms;
  EchoServer server(o);
  ASSERT_OK_AND_ASSIGN(auto slow, WireClient::Connect("127.0.0.1", server.port(), 5s));
  ASSERT_OK(SendCancel(*slow, 1));  // one good frame first (the old slowloris)
  ASSERT_OK_AND_ASSIGN(DecodedMessage echo, slow->Receive(5s));
  EXPECT_EQ(echo.root().getToken().getRequestId(), 1u);
  const auto start = std::chrono::steady_clock::now();
  ASSERT_OK(slow->SendRaw(PartialFrame(1000, 100)));
  ASSERT_OK_AND_ASSIGN(DecodedMessage m, slow->Receive(5s));
  EXPECT_EQ(m.root().getError().getCode(), schema::ErrorCode::DEADLINE_EXCEEDED);
  EXPECT_THAT(slow->Receive(5s).status(), StatusIs(StatusCode::kUnavailable));
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_GE(took, 180ms);
  EXPECT_LT(took, 3s);
}

TEST(ConnectionTest, PartialFramesAcrossConnectionsStayWithinTheBudget) {
  // 20 peers each start a 1 MB frame and send 100 KB of it; a partial frame is charged in whole
  // decoder blocks, so with a 1 MB budget `fit` of them fit (9), the rest are refused at once;
  // the budget never passes its limit and is free again after.
  constexpr size_t kSent = 8 + (100 << 10);  // segment table + body
  constexpr size_t kCharge =
      (kSent + FrameDecoder::kBlockBytes - 1) / FrameDecoder::kBlockBytes * FrameDecoder::kBlockBytes;
  constexpr size_t kLimit = 1u << 20;
  constexpr uint64_t kFit = kLimit / kCharge;
  static_assert(kFit >= 5 && kFit < 20);
  auto budget = std::make_shared<ByteBudget>(kLimit);
  ConnectionOptions o;
  o.budget = budget;
  o.frame_timeout = 10s;
  EchoServer server(o);
  std::vector<std::unique_ptr<WireClient>> peers;
  for (int i = 0; i < 20; ++i) {
    ASSERT_OK_AND_ASSIGN(auto c, WireClient::Connect("127.0.0.1", server.port(), 5s));
    // A peer past the budget is refused (Error, then close) as soon as its first bytes arrive,
    // possibly while the rest are still being written: a failed send here is that refusal.
    (void)c->SendRaw(PartialFrame((1u << 20) / 8, 100 << 10));
    peers.push_back(std::move(c));
  }
  // Every peer settles as accepted (its whole 100 KB held) or refused. The wait is for that final
  // state, not for a byte sum that a peer still arriving (charged, about to be refused) can reach
  // early: that counted one refusal too few.
  const auto give_up = std::chrono::steady_clock::now() + 10s;
  while (!(budget->used() == kFit * kCharge && budget->refusals() == 20 - kFit) &&
         std::chrono::steady_clock::now() < give_up) {
    EXPECT_LE(budget->used(), budget->limit());
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_LE(budget->used(), budget->limit());
  EXPECT_EQ(budget->used(), kFit * kCharge);
  const uint64_t refusals = budget->refusals();
  EXPECT_EQ(refusals, 20 - kFit);
  // The server has closed every refused peer (so what they will see is already on its way);
  // each sees the Error, or only the close when the reset overtook it. The others hear nothing.
  ASSERT_TRUE(server.WaitClosed(static_cast<int>(refusals), 10s));
  uint64_t ended = 0;
  for (auto& c : peers) {
    Result<DecodedMessage> m = c->Receive(200ms);
    if (m.ok() && m.value().root().which() == schema::Envelope::ERROR) {
      EXPECT_EQ(m.value().root().getError().getCode(), schema::ErrorCode::RESOURCE_EXHAUSTED);
      ++ended;
    } else if (!m.ok() && m.status().code() == StatusCode::kUnavailable) {
      ++ended;
    }
  }
  EXPECT_EQ(ended, refusals);
  peers.clear();
  ASSERT_TRUE(server.WaitClosed(20, 10s));
  EXPECT_EQ(budget->used(), 0u);
}

TEST(ConnectionTest, ChallengeResponseAuthentication) {
  auto keys = std::make_shared<AuthKeys>();
  keys->cluster_secret = "cluster-secret-0123456789abcdef";
  keys->client_token = "client-token-0123456789abcdef";
  ConnectionOptions o;
  o.server_auth = keys;
  EchoServer server(o);
  auto echo_role = [&](WireClient& c) -> Result<int32_t> {
    CHUNKSERVE_RETURN_IF_ERROR(SendCancel(c, 7));
    CHUNKSERVE_ASSIGN_OR_RETURN(DecodedMessage m, c.Receive(5s));
    if (m.root().which() == schema::Envelope::ERROR) {
      return Status(static_cast<StatusCode>(m.root().getError().getCode()),
                    m.root().getError().getMessage().cStr());
    }
    return m.root().getToken().getIndex();
  };
  // A worker proves the cluster secret; a client proves the client token or the cluster secret.
  ASSERT_OK_AND_ASSIGN(auto worker, WireClient::Connect("127.0.0.1", server.port(), 5s, {},
                                                        ClientAuth{keys->cluster_secret,
                                                                   schema::AuthRole::WORKER}));
  EXPECT_EQ(echo_role(*worker).value(), 1 + static_cast<int32_t>(schema::AuthRole::WORKER));
  ASSERT_OK_AND_ASSIGN(auto client, WireClient::Connect("127.0.0.1", server.port(), 5s, {},
                                                        ClientAuth{keys->client_token,
                                                                   schema::AuthRole::CLIENT}));
  EXPECT_EQ(echo_role(*client).value(), 1 + static_cast<int32_t>(schema::AuthRole::CLIENT));
  // The client token is not the cluster secret: it cannot prove a worker.
  ASSERT_OK_AND_ASSIGN(auto fake, WireClient::Connect("127.0.0.1", server.port(), 5s, {},
                                                      ClientAuth{keys->client_token,
                                                                 schema::AuthRole::WORKER}));
  EXPECT_THAT(echo_role(*fake).status(), StatusIs(StatusCode::kUnauthenticated));
  EXPECT_THAT(fake->Receive(5s).status(), StatusIs(StatusCode::kUnavailable));
  // No secret at all: the first frame is refused.
  ASSERT_OK_AND_ASSIGN(auto anonymous, WireClient::Connect("127.0.0.1", server.port(), 5s));
  EXPECT_THAT(echo_role(*anonymous).status(), StatusIs(StatusCode::kUnauthenticated));
  // A peer with a secret against a server that requires none: a clear error at the server's
  // first answer, not at the deadline.
  EchoServer open({});
  EXPECT_THAT(WireClient::Connect("127.0.0.1", open.port(), 30s, {},
                                  ClientAuth{keys->cluster_secret, schema::AuthRole::WORKER})
                  .status(),
              StatusIs(StatusCode::kUnauthenticated,
                       ::testing::HasSubstr("answered without an authentication challenge")));
}

// Runs an authenticating Connection (as a worker's router link or a gateway's upstream link is)
// against 127.0.0.1:port until it closes; returns why.
Status AuthenticatingLinkClosesWith(uint16_t port) {
  asio::io_context io;
  asio::ip::tcp::socket s(io);
  s.connect({asio::ip::make_address("127.0.0.1"), port});
  ConnectionOptions o;
  o.client_auth = ClientAuth{"cluster-secret-0123456789abcdef", schema::AuthRole::WORKER};
  o.handshake_timeout = 30s;
  auto c = Connection::Create(std::move(s), o);
  std::optional<Status> reason;
  c->Start([](DecodedMessage&) {}, [&](const Status& why) { reason = why; });
  const auto give_up = std::chrono::steady_clock::now() + 60s;
  while (!reason.has_value() && std::chrono::steady_clock::now() < give_up) io.run_for(20ms);
  return reason.value_or(Status::Internal("still open after 60 s"));
}

TEST(ConnectionTest, AnAuthenticatingLinkToAServerWithoutAuthenticationEndsAtItsFirstAnswer) {
  EchoServer open({});
  EXPECT_THAT(AuthenticatingLinkClosesWith(open.port()),
              StatusIs(StatusCode::kUnauthenticated,
                       ::testing::HasSubstr("answered without an authentication challenge")));
}

TEST(ConnectionTest, AnAuthenticatingConnectionHoldsItsFramesUntilChallenged) {
  auto keys = std::make_shared<AuthKeys>();
  keys->cluster_secret = "cluster-secret-0123456789abcdef";
  ConnectionOptions server_options;
  server_options.server_auth = keys;
  EchoServer server(server_options);
  asio::io_context io;
  asio::ip::tcp::socket s(io);
  s.connect({asio::ip::make_address("127.0.0.1"), server.port()});
  ConnectionOptions o;
  o.client_auth = ClientAuth{keys->cluster_secret, schema::AuthRole::ROUTER};
  auto c = Connection::Create(std::move(s), o);
  std::vector<int32_t> roles;
  c->Start([&](DecodedMessage& m) { roles.push_back(m.root().getToken().getIndex()); },
           [](const Status&) {});
  // Sent before the challenge arrived: held, then delivered after the proof.
  for (uint64_t i = 1; i <= 3; ++i) {
    capnp::MallocMessageBuilder b;
    b.initRoot<schema::Envelope>().initCancel().setRequestId(i);
    ASSERT_OK(c->Send(b));
  }
  const auto give_up = std::chrono::steady_clock::now() + 5s;
  while (roles.size() < 3 && std::chrono::steady_clock::now() < give_up) io.run_for(20ms);
  ASSERT_EQ(roles.size(), 3u);
  for (int32_t r : roles) EXPECT_EQ(r, 1 + static_cast<int32_t>(schema::AuthRole::ROUTER));
  EXPECT_EQ(server.errors.load(), 0);
  c->Close(Status::Ok());
  io.run_for(50ms);
}


namespace tls_cases {

std::shared_ptr<TlsContext> Context(TlsContext::Side side, const TlsFiles& files) {
  auto context = TlsContext::Create(side, files);
  EXPECT_OK(context.status());
  return context.ok() ? *context : nullptr;
}

ConnectionOptions TlsServer(const TlsFiles& files) {
  ConnectionOptions o;
  o.tls = Context(TlsContext::Side::kServer, files);
  return o;
}

// Sends Cancel(id) and returns the echoed Token's `token` field (1: the server saw a certified
// peer), or the error the server answered with.
Result<uint32_t> EchoCertified(WireClient& c, uint64_t id) {
  CHUNKSERVE_RETURN_IF_ERROR(SendCancel(c, id));
  CHUNKSERVE_ASSIGN_OR_RETURN(DecodedMessage m, c.Receive(5s));
  if (m.root().which() == schema::Envelope::ERROR) {
    return Status(static_cast<StatusCode>(m.root().getError().getCode()),
                  m.root().getError().getMessage().cStr());
  }
  if (m.root().getToken().getRequestId() != id) return Status::Internal("wrong echo");
  return m.root().getToken().getToken();
}

TEST(ConnectionTlsTest, RoundTripsAndKnowsWhichPeersHoldAClusterCertificate) {
  EchoServer server(TlsServer(testing::NodeTlsFiles()));
  // A client with only the CA: served, not certified.
  ASSERT_OK_AND_ASSIGN(auto client,
                       WireClient::Connect("127.0.0.1", server.port(), 5s, {}, {},
                                           Context(TlsContext::Side::kClient,
                                                   testing::ClientTlsFiles())));
  EXPECT_TRUE(client->peer_certified());  // the server's certificate verified
  for (uint64_t i = 1; i <= 20; ++i) EXPECT_EQ(EchoCertified(*client, i).value(), 0u);
  // A member (router or worker) presenting its certificate: certified, and it verified the server.
  ASSERT_OK_AND_ASSIGN(auto member,
                       WireClient::Connect("127.0.0.1", server.port(), 5s, {}, {},
                                           Context(TlsContext::Side::kClient,
                                                   testing::NodeTlsFiles())));
  EXPECT_TRUE(member->peer_certified());
  for (uint64_t i = 1; i <= 20; ++i) EXPECT_EQ(EchoCertified(*member, i).value(), 1u);
  // A large frame crosses many TLS records intact.
  capnp::MallocMessageBuilder b;
  auto e = b.initRoot<schema::Envelope>().initError();
  e.setRequestId(0);
  e.setMessage(std::string(300000, 'x'));
  ASSERT_OK(member->Send(b));  // the echo server ignores it; the link stays up
  EXPECT_EQ(EchoCertified(*member, 99).value(), 1u);
}

TEST(ConnectionTlsTest, APlaintextPeerIsToldThatTlsIsRequired) {
  EchoServer server(TlsServer(testing::NodeTlsFiles()));
  ASSERT_OK_AND_ASSIGN(auto plain, WireClient::Connect("127.0.0.1", server.port(), 5s));
  EXPECT_THAT(EchoCertified(*plain, 1).status(),
              StatusIs(StatusCode::kUnauthenticated, ::testing::HasSubstr("TLS")));
  EXPECT_THAT(plain->Receive(5s).status(), StatusIs(StatusCode::kUnavailable));
  ASSERT_TRUE(server.WaitClosed(1, 5s));
  EXPECT_THAT(server.reasons()[0], StatusIs(StatusCode::kUnauthenticated));
}

// A plaintext peer that holds a secret waits for a Challenge before it sends anything; a TLS
// server waits for a TLS handshake. The peer's opening Ping breaks the silence: the server's
// plaintext Error says TLS is required (it used to be "no authentication challenge" after 10 s).
TEST(ConnectionTlsTest, AnAuthenticatingPlaintextPeerIsToldThatTlsIsRequired) {
  EchoServer server(TlsServer(testing::NodeTlsFiles()));
  EXPECT_THAT(WireClient::Connect("127.0.0.1", server.port(), 30s, {},
                                  ClientAuth{"client-token-0123456789abcdef",
                                             schema::AuthRole::CLIENT})
                  .status(),
              StatusIs(StatusCode::kUnauthenticated, ::testing::HasSubstr("requires TLS")));
  EXPECT_THAT(AuthenticatingLinkClosesWith(server.port()),
              StatusIs(StatusCode::kUnauthenticated, ::testing::HasSubstr("requires TLS")));
}

TEST(ConnectionTlsTest, ACertificateFromAnotherAuthorityIsRefusedBothWays) {
  // A server whose certificate the cluster CA did not sign: the client refuses it.
  EchoServer rogue_server(TlsServer(testing::RogueTlsFiles()));
  EXPECT_THAT(WireClient::Connect("127.0.0.1", rogue_server.port(), 5s, {}, {},
                                  Context(TlsContext::Side::kClient, testing::ClientTlsFiles()))
                  .status(),
              StatusIs(StatusCode::kUnauthenticated));
  // A client presenting such a certificate: the server refuses it (during the handshake, or at
  // the client's first read under TLS 1.3); it is never served.
  EchoServer server(TlsServer(testing::NodeTlsFiles()));
  auto rogue = WireClient::Connect("127.0.0.1", server.port(), 5s, {}, {},
                                   Context(TlsContext::Side::kClient, testing::RogueTlsFiles()));
  if (rogue.ok()) {
    EXPECT_FALSE(EchoCertified(**rogue, 1).ok());
  }
  ASSERT_TRUE(server.WaitClosed(1, 5s));
  EXPECT_THAT(server.reasons()[0], StatusIs(StatusCode::kUnauthenticated));
}

TEST(ConnectionTlsTest, ATlsClientAgainstAPlaintextServerFailsQuickly) {
  EchoServer plain({});
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THAT(WireClient::Connect("127.0.0.1", plain.port(), 5s, {}, {},
                                  Context(TlsContext::Side::kClient, testing::ClientTlsFiles()))
                  .status(),
              StatusIs(StatusCode::kUnauthenticated));
  EXPECT_LT(std::chrono::steady_clock::now() - start, 4s);
}

TEST(ConnectionTlsTest, ContextsRefuseUnusableFiles) {
  EXPECT_THAT(TlsContext::Create(TlsContext::Side::kServer, testing::ClientTlsFiles()).status(),
              StatusIs(StatusCode::kInvalidArgument));
  TlsFiles missing = testing::NodeTlsFiles();
  missing.ca_file = testing::TlsFixture("no-such-ca.pem");
  EXPECT_THAT(TlsContext::Create(TlsContext::Side::kClient, missing).status(),
              StatusIs(StatusCode::kInvalidArgument, ::testing::HasSubstr("no-such-ca.pem")));
  TlsFiles mismatched = testing::NodeTlsFiles();
  mismatched.key_file = testing::TlsFixture("rogue.key");
  EXPECT_THAT(TlsContext::Create(TlsContext::Side::kServer, mismatched).status(),
              StatusIs(StatusCode::kInvalidArgument));
  TlsFiles cert_only = testing::NodeTlsFiles();
  cert_only.key_file.clear();
  EXPECT_THAT(TlsContext::Create(TlsContext::Side::kClient, cert_only).status(),
              StatusIs(StatusCode::kInvalidArgument));
}

// Connects with `client_files` and runs one echo; OK when the link was served.
Status EchoOnce(uint16_t port, const TlsFiles& client_files) {
  CHUNKSERVE_ASSIGN_OR_RETURN(
      auto c, WireClient::Connect("127.0.0.1", port, 5s, {}, {},
                                  Context(TlsContext::Side::kClient, client_files)));
  return EchoCertified(*c, 1).status();  // a refused client fails here under TLS 1.3
}

TEST(ConnectionTlsTest, ARevokedCertificateIsRefusedBothWays) {
  using testing::WithCrl;
  // Without a list the revoked certificate is a valid member's: what refuses it below is the CRL.
  EchoServer open(TlsServer(testing::NodeTlsFiles()));
  EXPECT_OK(EchoOnce(open.port(), testing::RevokedTlsFiles()));
  // A server with the list refuses a client presenting the revoked certificate, serves others.
  EchoServer server(TlsServer(WithCrl(testing::NodeTlsFiles(), "crl.pem")));
  EXPECT_OK(EchoOnce(server.port(), testing::NodeTlsFiles()));
  EXPECT_OK(EchoOnce(server.port(), testing::ClientTlsFiles()));
  EXPECT_FALSE(EchoOnce(server.port(), testing::RevokedTlsFiles()).ok());
  ASSERT_TRUE(server.WaitClosed(3, 5s));
  int32_t refused = 0;
  for (const Status& reason : server.reasons()) {
    if (reason.code() == StatusCode::kUnauthenticated) ++refused;
  }
  EXPECT_EQ(refused, 1);
  // A client with the list refuses a server presenting the revoked certificate.
  EchoServer revoked_server(TlsServer(testing::RevokedTlsFiles()));
  EXPECT_OK(EchoOnce(revoked_server.port(), testing::ClientTlsFiles()));
  EXPECT_THAT(WireClient::Connect(
                  "127.0.0.1", revoked_server.port(), 5s, {}, {},
                  Context(TlsContext::Side::kClient, WithCrl(testing::ClientTlsFiles(), "crl.pem")))
                  .status(),
              StatusIs(StatusCode::kUnauthenticated));
  EXPECT_OK(EchoOnce(open.port(), WithCrl(testing::ClientTlsFiles(), "crl.pem")));
}

// The list is re-read when its file changes: a revocation takes effect without a restart, for new
// links and for links already open (at their next frame), an unreadable rewrite keeps the lists
// loaded, and a newer list can lift a revocation.
TEST(ConnectionTlsTest, ARewrittenCrlTakesEffectForNewLinks) {
  const testing::TempDir dir;
  const std::string crl = (dir.path() / "crl.pem").string();
  auto install = [&](const std::string& from) {
    const std::string tmp = crl + ".new";
    std::filesystem::copy_file(from, tmp, std::filesystem::copy_options::overwrite_existing);
    std::filesystem::rename(tmp, crl);  // as a deployment would: whole, at once
  };
  install(testing::TlsFixture("crl-none.pem"));
  std::shared_ptr<TlsContext> context =
      Context(TlsContext::Side::kServer, testing::WithCrl(testing::NodeTlsFiles(), crl));
  ASSERT_NE(context, nullptr);
  EXPECT_EQ(context->revoked_count(), 0u);
  ConnectionOptions o;
  o.tls = context;
  EchoServer server(o);
  CrlWatcher watcher(crl, {context}, 20ms);
  auto wait_for_count = [&](size_t want) {
    const auto give_up = std::chrono::steady_clock::now() + 10s;
    while (context->revoked_count() != want && std::chrono::steady_clock::now() < give_up) {
      std::this_thread::sleep_for(5ms);
    }
    return context->revoked_count() == want;
  };

  ASSERT_OK_AND_ASSIGN(auto before, WireClient::Connect("127.0.0.1", server.port(), 5s, {}, {},
                                                        Context(TlsContext::Side::kClient,
                                                                testing::RevokedTlsFiles())));
  EXPECT_EQ(EchoCertified(*before, 1).value(), 1u);

  install(testing::TlsFixture("crl.pem"));
  ASSERT_TRUE(wait_for_count(1));
  EXPECT_FALSE(EchoOnce(server.port(), testing::RevokedTlsFiles()).ok());
  EXPECT_OK(EchoOnce(server.port(), testing::NodeTlsFiles()));
  // The link opened before the reload is closed at its next frame, with the reason.
  EXPECT_FALSE(EchoCertified(*before, 2).ok());
  const auto closed_by = std::chrono::steady_clock::now() + 5s;
  bool said_revoked = false;
  while (!said_revoked && std::chrono::steady_clock::now() < closed_by) {
    for (const Status& reason : server.reasons()) {
      said_revoked = said_revoked || (reason.code() == StatusCode::kUnauthenticated &&
                                      reason.message().find("revoked") != std::string::npos);
    }
    if (!said_revoked) std::this_thread::sleep_for(5ms);
  }
  EXPECT_TRUE(said_revoked);

  // Garbage, then the wrong CA's list: refused, the loaded list stays.
  {
    std::ofstream(crl + ".new") << "not a revocation list\n";
    std::filesystem::rename(crl + ".new", crl);
  }
  std::this_thread::sleep_for(200ms);  // ten watcher periods
  EXPECT_THAT(context->ReloadCrl(), StatusIs(StatusCode::kInvalidArgument));
  install(testing::TlsFixture("other-crl.pem"));
  std::this_thread::sleep_for(200ms);
  EXPECT_EQ(context->revoked_count(), 1u);
  EXPECT_FALSE(EchoOnce(server.port(), testing::RevokedTlsFiles()).ok());

  // A list without the revocation (here an older one: the file is what counts) lifts it.
  install(testing::TlsFixture("crl-none.pem"));
  ASSERT_TRUE(wait_for_count(0));
  EXPECT_OK(EchoOnce(server.port(), testing::RevokedTlsFiles()));
}

// One thread serves every watcher of a process: fifty contexts watching their files start at most
// one thread, each still reloads its own file, and the thread ends with the last watcher (the next
// watcher starts a new one).
TEST(ConnectionTlsTest, ManyCrlWatchersShareOneThread) {
  const testing::TempDir dir;
  constexpr int kWatchers = 50;
  std::vector<std::string> files;
  std::vector<std::shared_ptr<TlsContext>> contexts;
  for (int i = 0; i < kWatchers; ++i) {
    files.push_back((dir.path() / ("crl-" + std::to_string(i) + ".pem")).string());
    std::filesystem::copy_file(testing::TlsFixture("crl-none.pem"), files.back());
    contexts.push_back(
        Context(TlsContext::Side::kServer, testing::WithCrl(testing::NodeTlsFiles(), files.back())));
    ASSERT_NE(contexts.back(), nullptr);
  }
  const size_t threads_before = CrlWatcherThreadsStarted();
  {
    std::vector<std::unique_ptr<CrlWatcher>> watchers;
    for (int i = 0; i < kWatchers; ++i) {
      watchers.push_back(std::make_unique<CrlWatcher>(
          files[static_cast<size_t>(i)],
          std::vector<std::shared_ptr<TlsContext>>{contexts[static_cast<size_t>(i)]}, 20ms));
    }
    EXPECT_LE(CrlWatcherThreadsStarted(), threads_before + 1);
    // Every other file now revokes: those contexts, and only those, pick it up.
    for (int i = 0; i < kWatchers; i += 2) {
      const std::string next = files[static_cast<size_t>(i)] + ".new";
      std::filesystem::copy_file(testing::TlsFixture("crl.pem"), next);
      std::filesystem::rename(next, files[static_cast<size_t>(i)]);
    }
    const auto give_up = std::chrono::steady_clock::now() + 10s;
    auto all_reloaded = [&] {
      for (int i = 0; i < kWatchers; i += 2) {
        if (contexts[static_cast<size_t>(i)]->revoked_count() != 1) return false;
      }
      return true;
    };
    while (!all_reloaded() && std::chrono::steady_clock::now() < give_up) {
      std::this_thread::sleep_for(5ms);
    }
    EXPECT_TRUE(all_reloaded());
    for (int i = 1; i < kWatchers; i += 2) {
      EXPECT_EQ(contexts[static_cast<size_t>(i)]->revoked_count(), 0u) << i;
    }
    EXPECT_LE(CrlWatcherThreadsStarted(), threads_before + 1);
  }
  // All gone: a new watcher needs (and gets) a thread again, and it works.
  const size_t threads_after = CrlWatcherThreadsStarted();
  CrlWatcher again(files[1], {contexts[1]}, 20ms);
  const std::string next = files[1] + ".new";
  std::filesystem::copy_file(testing::TlsFixture("crl.pem"), next);
  std::filesystem::rename(next, files[1]);
  const auto give_up = std::chrono::steady_clock::now() + 10s;
  while (contexts[1]->revoked_count() != 1 && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(5ms);
  }
  EXPECT_EQ(contexts[1]->revoked_count(), 1u);
  EXPECT_EQ(CrlWatcherThreadsStarted(), threads_after + 1);
}

TEST(ConnectionTlsTest, UnusableRevocationListsAreRefusedAtStart) {
  using testing::WithCrl;
  const auto create = [](const TlsFiles& f) {
    return TlsContext::Create(TlsContext::Side::kServer, f).status();
  };
  EXPECT_OK(create(WithCrl(testing::NodeTlsFiles(), "crl.pem")));
  EXPECT_THAT(create(WithCrl(testing::NodeTlsFiles(), "no-such-crl.pem")),
              StatusIs(StatusCode::kInvalidArgument, ::testing::HasSubstr("no-such-crl.pem")));
  EXPECT_THAT(create(WithCrl(testing::NodeTlsFiles(), "other-crl.pem")),
              StatusIs(StatusCode::kInvalidArgument, ::testing::HasSubstr("not signed")));
  EXPECT_THAT(create(WithCrl(testing::NodeTlsFiles(), "crl-expired.pem")),
              StatusIs(StatusCode::kInvalidArgument, ::testing::HasSubstr("next update")));
  EXPECT_THAT(create(WithCrl(testing::NodeTlsFiles(), "ca.pem")),
              StatusIs(StatusCode::kInvalidArgument, ::testing::HasSubstr("no revocation list")));
  EXPECT_THAT(create(WithCrl(testing::NodeTlsFiles(), "node.key")),
              StatusIs(StatusCode::kInvalidArgument, ::testing::HasSubstr("node.key")));
  // A FIFO, a device or a directory is refused before it is opened (opening a FIFO nobody
  // writes to never returns).
  const testing::TempDir dir;
  const std::string fifo = (dir.path() / "crl.pem").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  for (const std::string& path : {fifo, std::string("/dev/null"), dir.path().string()}) {
    EXPECT_THAT(create(WithCrl(testing::NodeTlsFiles(), path)),
                StatusIs(StatusCode::kInvalidArgument, ::testing::HasSubstr("regular file")))
        << path;
  }
  // Only with TLS on.
  TlsFiles crl_only;
  crl_only.crl_file = testing::TlsFixture("crl.pem");
  EXPECT_THAT(MakeTlsContexts(crl_only).status(),
              StatusIs(StatusCode::kInvalidArgument, ::testing::HasSubstr("CRL")));
}

}  // namespace tls_cases
}  // namespace
}  // namespace chunkserve::wire
