// HttpServer over real sockets: a Beast client (and raw sockets for malformed input) against the
// server on its own event-loop thread.
#include "runtime/http/server.h"

#include <gtest/gtest.h>

#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <atomic>
#include <chrono>
#include <future>
#include <iterator>
#include <string>
#include <thread>

#include "runtime/wire/listen.h"
#include "tests/testing/random.h"

namespace chunkserve::http {
namespace {

namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using namespace std::chrono_literals;

// Polls `cond` until it holds or 10 s pass.
template <typename F>
bool Eventually(F cond) {
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (std::chrono::steady_clock::now() < deadline) {
    if (cond()) return true;
    std::this_thread::sleep_for(5ms);
  }
  return cond();
}

class HttpServerTest : public ::testing::Test {
 protected:
  void Start(ServerOptions options, Handler handler) {
    ASSERT_TRUE(wire::ListenTcp(acceptor_, "127.0.0.1", 0).ok());
    port_ = acceptor_.local_endpoint().port();
    server_ = HttpServer::Start(acceptor_, options, std::move(handler));
    thread_ = std::thread([this] { io_.run(); });
  }
  void TearDown() override {
    asio::post(io_, [this] {
      asio::error_code ignored;
      acceptor_.close(ignored);
      if (server_) server_->Stop();
    });
    work_.reset();
    io_.stop();
    if (thread_.joinable()) thread_.join();
  }

  // A connected client stream.
  beast::tcp_stream Connect() {
    asio::io_context* io = &client_io_;
    beast::tcp_stream s(*io);
    s.connect(asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), port_));
    return s;
  }

  bhttp::response<bhttp::string_body> Send(beast::tcp_stream& s, bhttp::verb verb,
                                           const std::string& target, std::string body = "") {
    bhttp::request<bhttp::string_body> req(verb, target, 11);
    req.set(bhttp::field::host, "127.0.0.1");
    req.body() = std::move(body);
    req.prepare_payload();
    bhttp::write(s, req);
    beast::flat_buffer buffer;
    bhttp::response<bhttp::string_body> res;
    bhttp::read(s, buffer, res);
    return res;
  }

  // Raw bytes in, everything the server sends until it closes out.
  std::string Raw(const std::string& bytes) {
    asio::ip::tcp::socket s(client_io_);
    s.connect(asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), port_));
    asio::write(s, asio::buffer(bytes));
    std::string out;
    asio::error_code ec;
    char buf[4096];
    while (true) {
      const size_t n = s.read_some(asio::buffer(buf), ec);
      if (ec) break;
      out.append(buf, n);
    }
    return out;
  }

  asio::io_context io_;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work_{
      asio::make_work_guard(io_)};
  asio::io_context client_io_;
  asio::ip::tcp::acceptor acceptor_{io_};
  uint16_t port_ = 0;
  std::shared_ptr<HttpServer> server_;
  std::thread thread_;
};

TEST_F(HttpServerTest, RepliesAndKeepsTheConnectionAlive) {
  Start({}, [](Request r, std::shared_ptr<Responder> w) {
    w->Reply({200, "text/plain", r.method + " " + r.path + " ?" + r.query + " " + r.body, {}});
  });
  auto s = Connect();
  auto a = Send(s, bhttp::verb::get, "/a?x=1");
  EXPECT_EQ(a.result_int(), 200);
  EXPECT_EQ(a.body(), "GET /a ?x=1 ");
  auto b = Send(s, bhttp::verb::post, "/b", "hello");  // same connection
  EXPECT_EQ(b.body(), "POST /b ? hello");
  EXPECT_EQ(server_->requests(), 2u);
}

TEST_F(HttpServerTest, HeadGetsHeadersOnly) {
  Start({}, [](Request, std::shared_ptr<Responder> w) { w->Reply({200, "text/plain", "12345", {}}); });
  const std::string out = Raw("HEAD /x HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
  EXPECT_NE(out.find("Content-Length: 5"), std::string::npos) << out;
  EXPECT_EQ(out.find("12345"), std::string::npos) << out;
}

TEST_F(HttpServerTest, StreamsChunksInOrder) {
  Start({}, [this](Request, std::shared_ptr<Responder> w) {
    w->StartStream(200, "text/event-stream");
    // Later writes, from the loop, as a generation would make them.
    for (int i = 0; i < 5; ++i) {
      asio::post(io_, [w, i] { EXPECT_TRUE(w->Write("data: " + std::to_string(i) + "\n\n")); });
    }
    asio::post(io_, [w] { w->End(); });
  });
  auto s = Connect();
  auto res = Send(s, bhttp::verb::get, "/stream");
  EXPECT_EQ(res.result_int(), 200);
  EXPECT_TRUE(res.chunked());
  EXPECT_EQ(res[bhttp::field::content_type], "text/event-stream");
  EXPECT_EQ(res.body(), "data: 0\n\ndata: 1\n\ndata: 2\n\ndata: 3\n\ndata: 4\n\n");
  // The connection is still usable after a stream.
  auto again = Send(s, bhttp::verb::get, "/stream");
  EXPECT_EQ(again.body(), res.body());
}

TEST_F(HttpServerTest, MalformedRequestGets400AndAClose) {
  Start({}, [](Request, std::shared_ptr<Responder> w) { w->Reply({200, "text/plain", "x", {}}); });
  const std::string out = Raw("GARBAGE\x01\x02 / HTTP/9\r\n\r\n");
  EXPECT_EQ(out.rfind("HTTP/1.1 400", 0), 0u) << out;
  EXPECT_NE(out.find("\"error\""), std::string::npos) << out;
}

TEST_F(HttpServerTest, OversizedBodyAndHeadAreRefused) {
  ServerOptions o;
  o.max_body_bytes = 1000;
  o.max_header_bytes = 2000;
  Start(o, [](Request, std::shared_ptr<Responder> w) { w->Reply({200, "text/plain", "x", {}}); });
  const std::string big(5000, 'a');
  std::string out = Raw("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5000\r\n\r\n" + big);
  EXPECT_EQ(out.rfind("HTTP/1.1 413", 0), 0u) << out.substr(0, 100);
  out = Raw("GET / HTTP/1.1\r\nHost: a\r\nX-Big: " + big + "\r\n\r\n");
  EXPECT_EQ(out.rfind("HTTP/1.1 431", 0), 0u) << out.substr(0, 100);
}

TEST_F(HttpServerTest, ClientDisconnectRunsTheCloseCallback) {
  std::atomic<int> closed{0};
  std::atomic<bool> got{false};
  std::shared_ptr<Responder> held;
  Start({}, [&](Request, std::shared_ptr<Responder> w) {
    held = w;  // never answered: a long generation
    w->OnClose([&] { closed++; });
    got = true;
  });
  {
    asio::ip::tcp::socket s(client_io_);
    s.connect(asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), port_));
    asio::write(s, asio::buffer(std::string("GET / HTTP/1.1\r\nHost: a\r\n\r\n")));
    ASSERT_TRUE(Eventually([&] { return got.load(); }));
  }  // closed here
  EXPECT_TRUE(Eventually([&] { return closed.load() == 1; }));
  asio::post(io_, [&] { EXPECT_TRUE(held->closed()); EXPECT_FALSE(held->Write("late")); held.reset(); });
}

TEST_F(HttpServerTest, SlowReaderIsCutAtTheQueueBound) {
  ServerOptions o;
  o.max_queued_bytes = 64 << 10;
  std::atomic<int> closed{0};
  std::atomic<int> refused{0};
  Start(o, [&](Request, std::shared_ptr<Responder> w) {
    w->OnClose([&] { closed++; });
    w->StartStream(200, "text/event-stream");
    // Far more than the socket buffers and the bound hold; the client never reads.
    for (int i = 0; i < 4000; ++i) {
      if (!w->Write(std::string(4096, 'x'))) {
        refused++;
        break;
      }
    }
  });
  asio::ip::tcp::socket s(client_io_);
  s.connect(asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), port_));
  asio::write(s, asio::buffer(std::string("GET / HTTP/1.1\r\nHost: a\r\n\r\n")));
  EXPECT_TRUE(Eventually([&] { return closed.load() == 1 && refused.load() == 1; }));
}

TEST_F(HttpServerTest, ConnectionsBeyondTheCapGet503) {
  ServerOptions o;
  o.max_connections = 1;
  Start(o, [](Request, std::shared_ptr<Responder> w) { w->Reply({200, "text/plain", "x", {}}); });
  auto first = Connect();
  ASSERT_EQ(Send(first, bhttp::verb::get, "/").result_int(), 200);
  const std::string out = Raw("GET / HTTP/1.1\r\nHost: a\r\n\r\n");
  EXPECT_EQ(out.rfind("HTTP/1.1 503", 0), 0u) << out;
}

TEST_F(HttpServerTest, SilentClientIsClosedAfterTheReadTimeout) {
  ServerOptions o;
  o.read_timeout = 200ms;
  Start(o, [](Request, std::shared_ptr<Responder> w) { w->Reply({200, "text/plain", "x", {}}); });
  asio::ip::tcp::socket s(client_io_);
  s.connect(asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), port_));
  asio::write(s, asio::buffer(std::string("GET / HTTP/1.1\r\n")));  // never finished
  char buf[16];
  asio::error_code ec;
  s.read_some(asio::buffer(buf), ec);  // returns when the server closes
  EXPECT_TRUE(ec == asio::error::eof || ec == asio::error::connection_reset) << ec.message();
  EXPECT_TRUE(Eventually([&] { return server_->connections() == 0; }));
}

// Malformed HTTP from a fuzzer's point of view: mutated requests over real sockets each get an
// answer or a close, and the server keeps serving. (Beast parses; this checks what we do with it.)
TEST_F(HttpServerTest, MutatedRequestsGetAnAnswerOrACloseAndTheServerLives) {
  ServerOptions o;
  o.read_timeout = 100ms;
  o.max_body_bytes = 4096;
  Start(o, [](Request r, std::shared_ptr<Responder> w) {
    if (r.path == "/stream") {
      w->StartStream(200, "text/event-stream");
      w->Write("data: x\n\n");
      w->End();
      return;
    }
    w->Reply({200, "application/json", r.body, {}});
  });
  const std::vector<std::string> seeds = {
      "GET /v1/models HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
      "POST /v1/completions HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\n"
      "Content-Length: 15\r\nConnection: close\r\n\r\n{\"prompt\": \"x\"}",
      "POST /stream HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n"
      "\r\n5\r\nhello\r\n0\r\n\r\n",
      "GET /a HTTP/1.0\r\n\r\n"};
  static const char* const kTokens[] = {"\r\n",
                                        "\r\n\r\n",
                                        ":",
                                        " ",
                                        "Content-Length: 99999999999",
                                        "Transfer-Encoding: chunked\r\n",
                                        "ffffffffffffffff\r\n",
                                        "HTTP/9.9",
                                        "\xff\xfe",
                                        "%00",
                                        "?",
                                        "#"};
  ::chunkserve::testing::Random rng(::chunkserve::testing::TestSeed());
  for (int i = 0; i < 80; ++i) {
    std::string s = seeds[static_cast<size_t>(rng.Int(0, static_cast<int64_t>(seeds.size()) - 1))];
    for (int e = static_cast<int>(rng.Int(1, 3)); e > 0 && !s.empty(); --e) {
      const size_t pos = static_cast<size_t>(rng.Int(0, static_cast<int64_t>(s.size()) - 1));
      switch (rng.Int(0, 3)) {
        case 0: s[pos] = static_cast<char>(s[pos] ^ (1 << rng.Int(0, 7))); break;
        case 1:
          s.insert(pos, kTokens[rng.Int(0, static_cast<int64_t>(std::size(kTokens)) - 1)]);
          break;
        case 2: s.erase(pos, static_cast<size_t>(rng.Int(1, 8))); break;
        default: s.resize(pos); break;
      }
    }
    const std::string out = Raw(s);  // returns once the server closed
    EXPECT_TRUE(out.empty() || out.rfind("HTTP/1.", 0) == 0) << out.substr(0, 80);
  }
  auto c = Connect();
  EXPECT_EQ(Send(c, bhttp::verb::get, "/alive").result_int(), 200);
  EXPECT_TRUE(Eventually([&] { return server_->connections() == 1; }));
}

TEST(ErrorBodyTest, HasOpenAIShape) {
  EXPECT_EQ(ErrorBody("bad", "invalid_request_error", "c", "temperature"),
            "{\"error\":{\"code\":\"c\",\"message\":\"bad\",\"param\":\"temperature\","
            "\"type\":\"invalid_request_error\"}}\n");
  EXPECT_EQ(ErrorBody("x", "server_error"),
            "{\"error\":{\"code\":null,\"message\":\"x\",\"param\":null,\"type\":\"server_error\"}}\n");
}

}  // namespace
}  // namespace chunkserve::http
