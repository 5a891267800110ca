#include "runtime/wire/client.h"

#include <algorithm>
#include <string>

#include "runtime/wire/messages.h"

namespace chunkserve::wire {
namespace {

// Bound on writing one frame (the peer does not read: the client gives up and closes).
constexpr std::chrono::milliseconds kSendTimeout{10000};

std::chrono::milliseconds Left(std::chrono::steady_clock::time_point deadline) {
  return std::max(std::chrono::milliseconds(0),
                  std::chrono::duration_cast<std::chrono::milliseconds>(
                      deadline - std::chrono::steady_clock::now()));
}

}  // namespace

WireClient::WireClient(ReaderLimits limits) : decoder_(limits) {}

WireClient::~WireClient() { Close(); }

bool WireClient::RunUntil(const bool* done, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!*done) {
    const std::chrono::milliseconds left = Left(deadline);
    if (left.count() == 0) break;
    io_.restart();
    io_.run_one_for(left);
  }
  if (*done) return true;
  // Cancel what is pending and let it complete, so that no handler outlives this call.
  asio::error_code ignored;
  transport_->socket().cancel(ignored);
  io_.restart();
  while (!*done) io_.run_one();
  return false;
}

Result<std::unique_ptr<WireClient>> WireClient::Connect(const std::string& host, uint16_t port,
                                                        std::chrono::milliseconds timeout,
                                                        ReaderLimits limits,
                                                        std::optional<ClientAuth> auth,
                                                        std::shared_ptr<TlsContext> tls) {
  std::unique_ptr<WireClient> client(new WireClient(limits));
  asio::error_code ec;
  asio::ip::address address = asio::ip::make_address(host, ec);
  if (ec) return Status::InvalidArgument("bad host address: " + host);
  const std::string peer = host + ":" + std::to_string(port);
  const auto deadline = std::chrono::steady_clock::now() + timeout;

  asio::ip::tcp::socket socket(client->io_);
  bool done = false;
  asio::error_code result;
  socket.async_connect(asio::ip::tcp::endpoint(address, port), [&](const asio::error_code& e) {
    result = e;
    done = true;
  });
  while (!done && Left(deadline).count() > 0) {
    client->io_.restart();
    client->io_.run_one_for(Left(deadline));
  }
  if (!done) {
    socket.close(ec);  // the connect completes with operation_aborted
    client->io_.restart();
    while (!done) client->io_.run_one();
    return Status::DeadlineExceeded("connecting to " + peer + " timed out");
  }
  if (result) return Status::Unavailable("connect to " + peer + " failed: " + result.message());
  socket.set_option(asio::ip::tcp::no_delay(true), ec);
  client->transport_ = tls ? std::make_unique<Transport>(std::move(socket), tls, host)
                           : std::make_unique<Transport>(std::move(socket));
  client->open_ = true;
  if (tls) {
    done = false;
    client->transport_->AsyncHandshake([&](const asio::error_code& e) {
      result = e;
      done = true;
    });
    if (!client->RunUntil(&done, Left(deadline))) {
      return Status::DeadlineExceeded("TLS handshake with " + peer + " timed out");
    }
    if (result) {
      return Status::Unauthenticated("TLS handshake with " + peer + " failed: " + result.message());
    }
  }
  if (auth) {
    // A Ping first, as Connection does (connection.h): the first answer says at once whether a
    // Challenge will come.
    capnp::MallocMessageBuilder ping;
    ping.initRoot<schema::Envelope>().initPing().setNonce(0);
    CHUNKSERVE_RETURN_IF_ERROR(client->Send(ping));
    Result<DecodedMessage> first = client->ReceiveRaw(Left(deadline));
    if (!first.ok()) {
      return first.status().code() == StatusCode::kDeadlineExceeded
                 ? Status::Unauthenticated("the server sent no authentication challenge: it does "
                                           "not require authentication")
                 : first.status();
    }
    schema::Envelope::Reader root = first.value().root();
    if (root.which() == schema::Envelope::PONG) {
      return Status::Unauthenticated(
          "the server answered without an authentication challenge: it does not require "
          "authentication (connect without a secret or token)");
    }
    if (root.which() == schema::Envelope::ERROR) {
      return Status(FromWireErrorCode(root.getError().getCode()),
                    std::string("the server refused the connection: ") +
                        root.getError().getMessage().cStr());
    }
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
  if (!open_) return Status::Unavailable("connection closed");
  bool done = false;
  asio::error_code result;
  transport_->AsyncWrite(asio::buffer(bytes), [&](const asio::error_code& e, size_t) {
    result = e;
    done = true;
  });
  if (!RunUntil(&done, kSendTimeout)) {
    Close();
    return Status::DeadlineExceeded("send timed out");
  }
  if (result) {
    Close();
    return Status::Unavailable("send failed: " + result.message());
  }
  return Status::Ok();
}

Result<DecodedMessage> WireClient::Receive(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    CHUNKSERVE_ASSIGN_OR_RETURN(DecodedMessage message, ReceiveRaw(Left(deadline)));
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
  while (true) {
    DecodedMessage message;
    if (decoder_.Next(&message)) return message;
    if (!decoder_.status().ok()) return decoder_.status();
    if (!open_) return Status::Unavailable("connection closed");
    if (Left(deadline).count() == 0) return Status::DeadlineExceeded("receive timed out");
    bool done = false;
    asio::error_code result;
    size_t n = 0;
    transport_->AsyncReadSome(asio::buffer(buffer_), [&](const asio::error_code& e, size_t got) {
      result = e;
      n = got;
      done = true;
    });
    if (!RunUntil(&done, Left(deadline))) return Status::DeadlineExceeded("receive timed out");
    if (result) {
      Close();
      return Status::Unavailable("connection closed: " + result.message());
    }
    Status s = decoder_.Feed(buffer_.data(), n);
    if (decoder_.Next(&message)) return message;
    if (!s.ok()) return s;
  }
}

void WireClient::Close() {
  if (!open_) return;
  open_ = false;
  transport_->Close();
}

}  // namespace chunkserve::wire
