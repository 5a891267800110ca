#include "runtime/wire/connection.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <atomic>
#include <string>
#include <utility>

#include "runtime/wire/messages.h"

namespace chunkserve::wire {
namespace {

using schema::Envelope;

std::atomic<uint64_t> next_connection_id{1};

// The handshake deadline of a connection that must authenticate when none is configured.
constexpr std::chrono::milliseconds kDefaultAuthTimeout{10000};

// How long a refusal over TLS waits for its Error frame to be written before closing anyway.
constexpr std::chrono::milliseconds kRefusalFlush{1000};

std::string Ms(std::chrono::milliseconds d) { return std::to_string(d.count()) + " ms"; }

std::unique_ptr<Transport> MakeTransport(asio::ip::tcp::socket socket,
                                         const ConnectionOptions& options) {
  if (options.tls == nullptr) return std::make_unique<Transport>(std::move(socket));
  return std::make_unique<Transport>(std::move(socket), options.tls, options.tls_host);
}

}  // namespace

std::shared_ptr<Connection> Connection::Create(asio::ip::tcp::socket socket,
                                               ConnectionOptions options) {
  return std::shared_ptr<Connection>(new Connection(std::move(socket), std::move(options)));
}

Connection::Connection(asio::ip::tcp::socket socket, ConnectionOptions options)
    : transport_(MakeTransport(std::move(socket), options)),
      timer_(transport_->executor()),
      frame_timer_(transport_->executor()),
      keepalive_timer_(transport_->executor()),
      options_(std::move(options)),
      id_(next_connection_id.fetch_add(1)),
      decoder_(options_.limits) {
  gated_ = options_.client_auth.has_value();
  asio::error_code ignored;
  transport_->socket().set_option(asio::ip::tcp::no_delay(true), ignored);
  if (options_.unacked_timeout.count() > 0) {
    const auto ms = static_cast<unsigned int>(options_.unacked_timeout.count());
    // Best effort: where the option does not exist the kernel's retransmission limit applies.
    (void)::setsockopt(transport_->socket().native_handle(), IPPROTO_TCP, TCP_USER_TIMEOUT, &ms,
                       sizeof(ms));
  }
}

Connection::~Connection() {
  if (options_.budget && reserved_ > 0) options_.budget->Release(reserved_);
}

void Connection::Start(MessageHandler on_message, CloseHandler on_close) {
  on_message_ = std::move(on_message);
  on_close_ = std::move(on_close);
  last_received_ = std::chrono::steady_clock::now();
  std::chrono::milliseconds first = options_.handshake_timeout;
  if (options_.server_auth && options_.server_auth->enabled()) {
    Result<std::vector<uint8_t>> nonce = NewAuthNonce();
    if (!nonce.ok()) {
      CloseOnLoop(nonce.status());
      return;
    }
    challenge_ = std::move(nonce).value();
    awaiting_auth_ = true;
    capnp::MallocMessageBuilder builder;
    builder.initRoot<Envelope>().initChallenge().setNonce(
        kj::arrayPtr(challenge_.data(), challenge_.size()));
    (void)Enqueue(EncodeOrEmpty(builder), true);
    if (first.count() <= 0) first = kDefaultAuthTimeout;
  }
  if (gated_ && first.count() <= 0) first = kDefaultAuthTimeout;
  if (transport_->tls() && first.count() <= 0) first = kDefaultAuthTimeout;
  // A connection that must authenticate speaks first too: a server that challenges sent its
  // Challenge before it read anything (the Pong comes after it), one that requires no
  // authentication answers with the Pong alone, and a TLS server answers a plaintext frame with
  // an Error saying TLS is required. So the first answer tells at once what waiting silently for
  // a Challenge would learn only at the deadline (HandleControl).
  if (options_.ping_first || gated_) {
    capnp::MallocMessageBuilder builder;
    builder.initRoot<Envelope>().initPing().setNonce(next_ping_++);
    (void)Enqueue(EncodeOrEmpty(builder), true);
  }
  ArmTimer(first.count() > 0 ? first : options_.idle_timeout);
  if (!transport_->tls()) {
    Begin();
    return;
  }
  // Frames queued meanwhile wait for the handshake: nothing may be written before it.
  writing_ = true;
  auto self = shared_from_this();
  transport_->AsyncHandshake([self](const asio::error_code& ec) {
    if (self->closed()) return;
    if (ec) {
      if (self->transport_->plaintext_peer()) {
        const Status refused = Status::Unauthenticated(
            "this server requires TLS: connect with TLS and the cluster's CA certificate");
        self->transport_->TryWriteRaw(asio::buffer(ErrorFrame(0, refused)));
        self->CloseOnLoop(refused);
        return;
      }
      self->CloseOnLoop(Status::Unauthenticated("TLS handshake failed: " + ec.message() +
                                                self->transport_->VerifyFailure()));
      return;
    }
    self->peer_certified_ = self->transport_->peer_certified();
    self->writing_ = false;
    self->Begin();
    self->DoWrite();
  });
}

void Connection::Begin() {
  established_.store(true, std::memory_order_release);
  ArmKeepalive();
  DoRead();
}

bool Connection::ending() const { return refusing_ || closed(); }

void Connection::ArmTimer(std::chrono::milliseconds timeout) {
  timer_.cancel();
  if (timeout.count() <= 0) return;
  timer_.expires_after(timeout);
  std::weak_ptr<Connection> weak = weak_from_this();
  bool gated;
  {
    std::lock_guard<std::mutex> lock(mu_);
    gated = gated_;
  }
  const bool idle = !awaiting_auth_ && !gated && got_first_message_;
  const char* what = awaiting_auth_        ? "authentication deadline passed"
                     : gated               ? "the server sent no authentication challenge"
                     : !got_first_message_ ? "handshake deadline passed"
                                           : "idle deadline passed";
  timer_.async_wait([weak, what, timeout, gated, idle](const asio::error_code& ec) {
    if (ec) return;  // cancelled or re-armed
    if (auto self = weak.lock()) {
      if (idle && self->options_.idle_counts_sends) {
        // A peer this side still streams to is not idle: the deadline runs from the last write.
        const auto since = std::chrono::steady_clock::now() - self->last_sent_;
        if (since < self->options_.idle_timeout) {
          self->ArmTimer(std::chrono::duration_cast<std::chrono::milliseconds>(
                             self->options_.idle_timeout - since) +
                         std::chrono::milliseconds(1));
          return;
        }
      }
      const std::string why =
          std::string(what) + " (" + Ms(idle ? self->options_.idle_timeout : timeout) + ")";
      self->CloseOnLoop(gated ? Status::Unauthenticated(
                                    why + ": it does not require authentication here, or it is "
                                          "not a chunkserve server")
                              : Status::DeadlineExceeded(why));
    }
  });
}

void Connection::ArmKeepalive() {
  const std::chrono::milliseconds interval = options_.keepalive_interval;
  if (interval.count() <= 0) return;
  keepalive_timer_.expires_after(interval);
  std::weak_ptr<Connection> weak = weak_from_this();
  keepalive_timer_.async_wait([weak, interval](const asio::error_code& ec) {
    if (ec) return;
    auto self = weak.lock();
    if (!self || self->closed()) return;
    if (std::chrono::steady_clock::now() - self->last_received_ >= interval) {
      capnp::MallocMessageBuilder builder;
      builder.initRoot<Envelope>().initPing().setNonce(self->next_ping_++);
      (void)self->Enqueue(EncodeOrEmpty(builder), true);
    }
    self->ArmKeepalive();
  });
}

// Keeps the budget reservation equal to the bytes of partial frames, and the frame deadline
// running while there are any. False when the connection was closed for it.
void Connection::AccountBuffered() {
  const size_t now = decoder_.buffered_bytes();
  if (options_.budget) {
    if (now > reserved_) {
      if (!options_.budget->TryReserve(now - reserved_)) {
        RefuseAndClose(Status::ResourceExhausted(
            "the process's budget of " + std::to_string(options_.budget->limit()) +
            " bytes for partly received frames is spent"));
        return;
      }
    } else if (now < reserved_) {
      options_.budget->Release(reserved_ - now);
    }
    reserved_ = now;
  }
  if (options_.frame_timeout.count() <= 0) return;
  if (now == 0) {
    if (frame_timer_armed_) frame_timer_.cancel();
    frame_timer_armed_ = false;
    return;
  }
  if (frame_timer_armed_) return;
  frame_timer_armed_ = true;
  frame_timer_.expires_after(options_.frame_timeout);
  std::weak_ptr<Connection> weak = weak_from_this();
  const std::chrono::milliseconds timeout = options_.frame_timeout;
  frame_timer_.async_wait([weak, timeout](const asio::error_code& ec) {
    if (ec) return;
    auto self = weak.lock();
    if (!self) return;
    self->frame_timer_armed_ = false;
    if (self->decoder_.buffered_bytes() > 0) {
      self->RefuseAndClose(Status::DeadlineExceeded(
          "a frame was started and not completed within " + Ms(timeout)));
    }
  });
}

void Connection::DoRead() {
  auto self = shared_from_this();
  transport_->AsyncReadSome(asio::buffer(read_buffer_), [self](const asio::error_code& ec, size_t n) {
    if (self->ending()) return;
    if (ec) {
      self->CloseOnLoop(ec == asio::error::eof
                            ? Status::Ok()
                            : Status::Unavailable("connection read failed: " + ec.message()));
      return;
    }
    if (Status revoked = self->transport_->RecheckPeer(); !revoked.ok()) {
      self->CloseOnLoop(revoked);  // the CRL was reloaded and lists this peer
      return;
    }
    Status status = self->decoder_.Feed(self->read_buffer_.data(), n);
    DecodedMessage message;
    bool any = false;
    while (!self->ending() && self->decoder_.Next(&message)) {
      any = true;
      self->got_first_message_ = true;
      self->last_received_ = std::chrono::steady_clock::now();
      if (self->HandleControl(message)) continue;
      if (self->awaiting_auth_) {
        self->RefuseAndClose(Status::Unauthenticated(
            "this server requires authentication: answer its challenge with the cluster secret "
            "or client token first"));
        return;
      }
      if (self->on_message_) self->on_message_(message);
    }
    if (self->ending()) return;
    if (!status.ok()) {
      self->RefuseAndClose(status);  // tell the peer why, best effort, then close
      return;
    }
    if (any && self->frame_timer_armed_) {
      // A frame completed: the deadline restarts for the next one.
      self->frame_timer_.cancel();
      self->frame_timer_armed_ = false;
    }
    self->AccountBuffered();
    if (self->ending()) return;
    bool gated;
    {
      std::lock_guard<std::mutex> lock(self->mu_);
      gated = self->gated_;
    }
    if (any && !self->awaiting_auth_ && !gated) self->ArmTimer(self->options_.idle_timeout);
    self->DoRead();
  });
}

bool Connection::Gated() const {
  std::lock_guard<std::mutex> lock(mu_);
  return gated_;
}

bool Connection::HandleControl(DecodedMessage& message) {
  Envelope::Reader root = message.root();
  switch (root.which()) {
    case Envelope::PING: {
      capnp::MallocMessageBuilder builder;
      builder.initRoot<Envelope>().initPong().setNonce(root.getPing().getNonce());
      (void)Enqueue(EncodeOrEmpty(builder), true);
      return true;
    }
    case Envelope::PONG:
      if (Gated()) {
        CloseOnLoop(Status::Unauthenticated(
            "the server answered without an authentication challenge: it does not require "
            "authentication here, or it is not the server meant (configure no secret for it)"));
      }
      return true;
    case Envelope::ERROR:
      // Before the Challenge, an Error for the connection is the server's refusal (TLS required,
      // no room): it ends the connection with that reason.
      if (Gated() && root.getError().getRequestId() == 0) {
        CloseOnLoop(Status(FromWireErrorCode(root.getError().getCode()),
                           std::string("the server refused the connection: ") +
                               root.getError().getMessage().cStr()));
        return true;
      }
      return false;
    case Envelope::CHALLENGE: {
      if (!options_.client_auth || options_.client_auth->key.empty()) {
        CloseOnLoop(Status::Unauthenticated(
            "the server requires authentication and no cluster secret or client token is "
            "configured here"));
        return true;
      }
      const capnp::Data::Reader nonce = root.getChallenge().getNonce();
      const std::vector<uint8_t> proof =
          AuthProof(options_.client_auth->key, std::span<const uint8_t>(nonce.begin(), nonce.size()),
                    options_.client_auth->role);
      capnp::MallocMessageBuilder builder;
      auto auth = builder.initRoot<Envelope>().initAuth();
      auth.setRole(options_.client_auth->role);
      auth.setProof(kj::arrayPtr(proof.data(), proof.size()));
      (void)Enqueue(EncodeOrEmpty(builder), true);
      // What the application queued meanwhile follows the proof.
      {
        std::lock_guard<std::mutex> lock(mu_);
        gated_ = false;
        while (!held_.empty()) {
          outgoing_.push_back(std::move(held_.front()));
          held_.pop_front();
        }
      }
      if (!writing_) DoWrite();
      ArmTimer(options_.idle_timeout);
      return true;
    }
    case Envelope::AUTH: {
      if (!awaiting_auth_) return true;  // not required here: a peer that has a secret anyway
      const auto auth = root.getAuth();
      const capnp::Data::Reader proof = auth.getProof();
      if (!VerifyAuthProof(*options_.server_auth, challenge_, auth.getRole(),
                           std::span<const uint8_t>(proof.begin(), proof.size()))) {
        RefuseAndClose(Status::Unauthenticated(
            "authentication failed: the proof does not match this server's secret for that role"));
        return true;
      }
      awaiting_auth_ = false;
      challenge_.clear();
      peer_role_ = auth.getRole();
      if (auth.getRole() != schema::AuthRole::CLIENT) {
        decoder_.set_max_message_bytes(options_.trusted_max_message_bytes);
      }
      ArmTimer(options_.idle_timeout);
      return true;
    }
    default:
      return false;
  }
}

void Connection::RefuseAndClose(const Status& status) {
  if (ending()) return;
  std::vector<uint8_t> bytes = ErrorFrame(0, status);
  if (!transport_->tls()) {
    // Written directly, without blocking the loop on a peer that does not read.
    if (!bytes.empty()) transport_->TryWriteRaw(asio::buffer(bytes));
    CloseOnLoop(status);
    return;
  }
  // TLS cannot write beside a pending write: queue the Error, stop reading, and close once it is
  // written or after kRefusalFlush, whichever comes first.
  refusing_ = true;
  refusal_ = status;
  if (bytes.empty() || !Enqueue(std::move(bytes), true).ok()) {
    CloseOnLoop(status);
    return;
  }
  timer_.cancel();
  timer_.expires_after(kRefusalFlush);
  std::weak_ptr<Connection> weak = weak_from_this();
  timer_.async_wait([weak](const asio::error_code& ec) {
    if (ec) return;
    if (auto self = weak.lock()) self->CloseOnLoop(self->refusal_);
  });
}

Status Connection::Send(capnp::MessageBuilder& message) {
  CHUNKSERVE_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, EncodeFrame(message));
  return SendBytes(std::move(bytes));
}

Status Connection::SendBytes(std::vector<uint8_t> frame) { return Enqueue(std::move(frame), false); }

Status Connection::Enqueue(std::vector<uint8_t> frame, bool bypass_gate) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return Status::Unavailable("connection closed");
    if (outgoing_bytes_ + frame.size() > options_.max_outgoing_bytes) {
      return Status::ResourceExhausted("connection outgoing queue is full");
    }
    outgoing_bytes_ += frame.size();
    if (gated_ && !bypass_gate) {
      held_.push_back(std::move(frame));
      return Status::Ok();
    }
    outgoing_.push_back(std::move(frame));
  }
  auto self = shared_from_this();
  asio::post(transport_->executor(), [self] {
    if (!self->writing_) self->DoWrite();
  });
  return Status::Ok();
}

void Connection::DoWrite() {
  std::vector<uint8_t>* front = nullptr;
  bool refused = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) {
      writing_ = false;
      return;
    }
    if (outgoing_.empty()) {
      writing_ = false;
      refused = refusing_;  // the refusal's Error is out: close now
    } else {
      front = &outgoing_.front();  // stable: only this loop pops
    }
  }
  if (front == nullptr) {
    if (refused) CloseOnLoop(refusal_);
    return;
  }
  writing_ = true;
  auto self = shared_from_this();
  transport_->AsyncWrite(asio::buffer(*front), [self](const asio::error_code& ec, size_t) {
    {
      std::lock_guard<std::mutex> lock(self->mu_);
      if (!self->outgoing_.empty()) {
        self->outgoing_bytes_ -= self->outgoing_.front().size();
        self->outgoing_.pop_front();
      }
    }
    if (ec) {
      self->writing_ = false;
      self->CloseOnLoop(Status::Unavailable("connection write failed: " + ec.message()));
      return;
    }
    if (Status revoked = self->transport_->RecheckPeer(); !revoked.ok()) {
      self->writing_ = false;
      self->CloseOnLoop(revoked);
      return;
    }
    self->last_sent_ = std::chrono::steady_clock::now();
    self->DoWrite();
  });
}

void Connection::Close(const Status& reason) {
  auto self = shared_from_this();
  asio::post(transport_->executor(), [self, reason] { self->CloseOnLoop(reason); });
}

void Connection::CloseOnLoop(const Status& reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;
    closed_ = true;
  }
  timer_.cancel();
  frame_timer_.cancel();
  keepalive_timer_.cancel();
  if (options_.budget && reserved_ > 0) options_.budget->Release(reserved_);
  reserved_ = 0;
  transport_->Close();
  CloseHandler on_close = std::move(on_close_);
  on_close_ = nullptr;
  on_message_ = nullptr;
  if (on_close) on_close(reason);
}

bool Connection::closed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return closed_;
}

size_t Connection::queued_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return outgoing_bytes_;
}

}  // namespace chunkserve::wire
