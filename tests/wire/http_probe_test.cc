#include "runtime/wire/http_probe.h"

#include <gtest/gtest.h>

#include <string>
#include <thread>

#include "runtime/wire/asio.h"

#include "tests/testing/status_matchers.h"

namespace chunkserve::wire {
namespace {

HttpReply Routes(const std::string& path) {
  if (path == "/livez") return {200, "text/plain", "ok\n"};
  if (path == "/readyz") return {503, "text/plain", "draining\n"};
  return {404, "text/plain", "not found\n"};
}

TEST(HttpProbeRenderTest, GetAnswersWithStatusHeadersAndBody) {
  const std::string r = RenderHttpResponse("GET /livez HTTP/1.1\r\nHost: x\r\n\r\n", Routes);
  EXPECT_EQ(r,
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 3\r\n"
            "Connection: close\r\n\r\nok\n");
}

TEST(HttpProbeRenderTest, HeadOmitsTheBodyButKeepsItsLength) {
  const std::string r = RenderHttpResponse("HEAD /readyz HTTP/1.1\r\n\r\n", Routes);
  EXPECT_EQ(r.rfind("HTTP/1.1 503 Service Unavailable\r\n", 0), 0u) << r;
  EXPECT_NE(r.find("Content-Length: 9\r\n"), std::string::npos) << r;
  EXPECT_EQ(r.substr(r.size() - 4), "\r\n\r\n");
}

TEST(HttpProbeRenderTest, QueryStringIsIgnored) {
  EXPECT_NE(RenderHttpResponse("GET /livez?x=1 HTTP/1.1\r\n\r\n", Routes).find(" 200 OK"),
            std::string::npos);
}

TEST(HttpProbeRenderTest, MalformedLinesAndOtherMethodsAreRefused) {
  for (const char* bad : {"", "\r\n\r\n", "GET\r\n\r\n", "GET /livez\r\n\r\n", " /x y\r\n\r\n"}) {
    EXPECT_EQ(RenderHttpResponse(bad, Routes).rfind("HTTP/1.1 400 Bad Request", 0), 0u) << bad;
  }
  EXPECT_EQ(RenderHttpResponse("POST /livez HTTP/1.1\r\n\r\n", Routes)
                .rfind("HTTP/1.1 405 Method Not Allowed", 0),
            0u);
  EXPECT_EQ(RenderHttpResponse("GET /nope HTTP/1.1\r\n\r\n", Routes).rfind("HTTP/1.1 404", 0), 0u);
}

TEST(HttpProbeListenTest, RejectsHostsThatAreNotAddresses) {
  asio::io_context io;
  asio::ip::tcp::acceptor acceptor(io);
  EXPECT_THAT(ListenTcp(acceptor, "not an address", 0),
              ::chunkserve::testing::StatusIs(StatusCode::kInvalidArgument));
}

// A real socket on 127.0.0.1: a probe gets its answer, an oversized head gets the connection
// closed, and the server keeps serving afterwards.
TEST(HttpProbeServeTest, ServesOverTcpAndSurvivesOversizedHeads) {
  asio::io_context io;
  asio::ip::tcp::acceptor acceptor(io);
  ASSERT_OK(ListenTcp(acceptor, "127.0.0.1", 0));
  const uint16_t port = acceptor.local_endpoint().port();
  ServeHttp(acceptor, Routes);
  std::thread loop([&io] { io.run(); });

  auto exchange = [port](const std::string& request) {
    asio::io_context cio;
    asio::ip::tcp::socket s(cio);
    s.connect({asio::ip::make_address("127.0.0.1"), port});
    asio::error_code ec;
    asio::write(s, asio::buffer(request), ec);
    std::string out;
    char buf[4096];
    for (;;) {
      const size_t n = s.read_some(asio::buffer(buf), ec);
      out.append(buf, n);
      if (ec) break;
    }
    return out;
  };
  EXPECT_NE(exchange("GET /livez HTTP/1.1\r\n\r\n").find("\r\n\r\nok\n"), std::string::npos);
  EXPECT_EQ(exchange("GET /" + std::string(20000, 'a')), "");  // over 8 KiB: closed, no answer
  EXPECT_NE(exchange("GET /readyz HTTP/1.1\r\n\r\n").find(" 503 "), std::string::npos);

  asio::post(io, [&acceptor] {
    asio::error_code ignored;
    acceptor.close(ignored);
  });
  loop.join();  // the loop runs out once the acceptor is closed and no exchange is pending
}

}  // namespace
}  // namespace chunkserve::wire
