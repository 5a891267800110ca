// Connection over real sockets on 127.0.0.1:0: echo, malformed frames close only that
// connection, deadlines, bounded outgoing queue.
#include "runtime/wire/connection.h"

#include <capnp/message.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "runtime/wire/client.h"
#include "tests/testing/status_matchers.h"

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
            b.initRoot<schema::Envelope>().initToken().setRequestId(
                m.root().getCancel().getRequestId());
            (void)self->Send(b);
          },
          [this](const Status& reason) {
            if (!reason.ok()) errors.fetch_add(1);
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
