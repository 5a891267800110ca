#include "runtime/wire/client.h"

#include <poll.h>

#include <algorithm>
#include <array>
#include <string>

namespace chunkserve::wire {

WireClient::WireClient(ReaderLimits limits) : socket_(io_), decoder_(limits) {}

WireClient::~WireClient() { Close(); }

Result<std::unique_ptr<WireClient>> WireClient::Connect(const std::string& host, uint16_t port,
                                                        std::chrono::milliseconds timeout,
                                                        ReaderLimits limits,
                                                        std::optional<ClientAuth> auth) {
  std::unique_ptr<WireClient> client(new WireClient(limits));
  asio::error_code ec;
  asio::ip::address address = asio::ip::make_address(host, ec);
  if (ec) return Status::InvalidArgument("bad host address: " + host);
  client->socket_.open(address.is_v4() ? asio::ip::tcp::v4() : asio::ip::tcp::v6(), ec);
  if (ec) return Status::Unavailable("socket: " + ec.message());
  client->socket_.non_blocking(true, ec);
  client->socket_.connect(asio::ip::tcp::endpoint(address, port), ec);
  if (ec == asio::error::would_block || ec == asio::error::in_progress) {
    pollfd pfd{client->socket_.native_handle(), POLLOUT, 0};
    const int r = ::poll(&pfd, 1, static_cast<int>(timeout.count()));
    if (r <= 0) return Status::DeadlineExceeded("connect timed out");
    int err = 0;
    socklen_t len = sizeof(err);
    ::getsockopt(pfd.fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) return Status::Unavailable("connect failed: " + std::to_string(err));
  } else if (ec) {
    return Status::Unavailable("connect failed: " + ec.message());
  }
  client->socket_.set_option(asio::ip::tcp::no_delay(true), ec);
  if (auth) {
    Result<DecodedMessage> first = client->ReceiveRaw(timeout);
    if (!first.ok()) {
      return first.status().code() == StatusCode::kDeadlineExceeded
                 ? Status::Unauthenticated("the server sent no authentication challenge: it does "
                                           "not require authentication")
                 : first.status();
    }
    schema::Envelope::Reader root = first.value().root();
    if (root.which() != schema::Envelope::CHALLENGE) {
      return Status::FailedPrecondition("expected the server's authentication challenge first");
    }
    const capnp::Data::Reader nonce = root.getChallenge().getNonce();
    const std::vector<uint8_t> proof =
        AuthProof(auth->key, std::span<const uint8_t>(nonce.begin(), nonce.size()), auth->role);
    capnp::MallocMessageBuilder builder;
    auto a = builder.initRoot<schema::Envelope>().initAuth();
    a.setRole(auth->role);
    a.setProof(kj::arrayPtr(proof.data(), proof.size()));
    CHUNKSERVE_RETURN_IF_ERROR(client->Send(builder));
  }
  return client;
}

Status WireClient::Send(capnp::MessageBuilder& message) {
  CHUNKSERVE_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, EncodeFrame(message));
  return SendRaw(bytes);
}

Status WireClient::SendRaw(const std::vector<uint8_t>& bytes) {
  size_t sent = 0;
  while (sent < bytes.size()) {
    asio::error_code ec;
    const size_t n = socket_.write_some(asio::buffer(bytes.data() + sent, bytes.size() - sent), ec);
    if (ec == asio::error::would_block) {
      pollfd pfd{socket_.native_handle(), POLLOUT, 0};
      if (::poll(&pfd, 1, 10000) <= 0) return Status::DeadlineExceeded("send timed out");
      continue;
    }
    if (ec) return Status::Unavailable("send failed: " + ec.message());
    sent += n;
  }
  return Status::Ok();
}

Result<DecodedMessage> WireClient::Receive(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    const auto left = std::max(std::chrono::milliseconds(0),
                               std::chrono::duration_cast<std::chrono::milliseconds>(
                                   deadline - std::chrono::steady_clock::now()));
    CHUNKSERVE_ASSIGN_OR_RETURN(DecodedMessage message, ReceiveRaw(left));
    schema::Envelope::Reader root = message.root();
    switch (root.which()) {
      case schema::Envelope::PING: {
        capnp::MallocMessageBuilder builder;
        builder.initRoot<schema::Envelope>().initPong().setNonce(root.getPing().getNonce());
        CHUNKSERVE_RETURN_IF_ERROR(Send(builder));
        continue;
      }
      case schema::Envelope::PONG:
        continue;
      case schema::Envelope::CHALLENGE:
        return Status::Unauthenticated(
            "the server requires authentication and this client has no secret");
      default:
        return message;
    }
  }
}

Result<DecodedMessage> WireClient::ReceiveRaw(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::array<uint8_t, 16384> buffer;
  while (true) {
    DecodedMessage message;
    if (decoder_.Next(&message)) return message;
    if (!decoder_.status().ok()) return decoder_.status();
    if (!socket_.is_open()) return Status::Unavailable("connection closed");
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return Status::DeadlineExceeded("receive timed out");
    pollfd pfd{socket_.native_handle(), POLLIN, 0};
    const int r = ::poll(&pfd, 1, static_cast<int>(left.count()));
    if (r == 0) return Status::DeadlineExceeded("receive timed out");
    if (r < 0) continue;
    asio::error_code ec;
    const size_t n = socket_.read_some(asio::buffer(buffer), ec);
    if (ec == asio::error::would_block) continue;
    if (ec) {
      Close();
      return Status::Unavailable("connection closed: " + ec.message());
    }
    Status s = decoder_.Feed(buffer.data(), n);
    if (decoder_.Next(&message)) return message;
    if (!s.ok()) return s;
  }
}

void WireClient::Close() {
  asio::error_code ignored;
  if (socket_.is_open()) {
    socket_.shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
  }
}

}  // namespace chunkserve::wire
