#include "runtime/http/server.h"

#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

#include <atomic>
#include <deque>
#include <exception>
#include <optional>
#include <unordered_map>

#include "runtime/base/logging.h"
#include "runtime/wire/listen.h"

namespace chunkserve::http {
namespace {

namespace beast = boost::beast;
namespace bhttp = boost::beast::http;

class ServerImpl;

// One accepted connection. Requests on it are answered one at a time, in order.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(asio::ip::tcp::socket socket, std::shared_ptr<ServerImpl> server, uint64_t id);

  void Begin(bool refuse);
  void Close();

  // What the current request's Responder does (`seq` names the request it was made for; calls
  // for an earlier request on a keep-alive connection are ignored).
  void ReplyFor(uint64_t seq, Reply reply);
  void StartStreamFor(uint64_t seq, int status, std::string content_type);
  bool WriteFor(uint64_t seq, std::string data);
  void EndFor(uint64_t seq);
  void OnCloseFor(uint64_t seq, std::function<void()> callback);
  bool ClosedFor(uint64_t seq) const { return closed_ || seq != seq_ || answered_; }

 private:
  void ReadRequest();
  void OnRead(const asio::error_code& e);
  void Watch();
  void Fail(int status, std::string_view message);
  void Pump();
  void OnWritten(const asio::error_code& e);
  void Finished();

  beast::tcp_stream stream_;
  std::shared_ptr<ServerImpl> server_;
  const uint64_t id_;
  beast::flat_buffer buffer_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  uint64_t seq_ = 0;         // the request being answered
  bool handling_ = false;    // a request was read and is not fully answered
  bool answered_ = false;    // the current request's answer is complete (or was queued whole)
  bool streaming_ = false;
  bool keep_alive_ = false;
  bool head_ = false;
  unsigned version_ = 11;
  bool closed_ = false;
  bool writing_ = false;
  bool end_queued_ = false;
  std::deque<std::string> queue_;
  size_t queued_bytes_ = 0;
  std::function<void()> on_close_;
};

class Exchange final : public Responder {
 public:
  Exchange(std::shared_ptr<Session> session, uint64_t seq)
      : session_(std::move(session)), seq_(seq) {}
  void Reply(http::Reply reply) override { session_->ReplyFor(seq_, std::move(reply)); }
  void StartStream(int status, std::string content_type) override {
    session_->StartStreamFor(seq_, status, std::move(content_type));
  }
  bool Write(std::string data) override { return session_->WriteFor(seq_, std::move(data)); }
  void End() override { session_->EndFor(seq_); }
  void OnClose(std::function<void()> callback) override {
    session_->OnCloseFor(seq_, std::move(callback));
  }
  bool closed() const override { return session_->ClosedFor(seq_); }

 private:
  std::shared_ptr<Session> session_;
  const uint64_t seq_;
};

class ServerImpl final : public HttpServer, public std::enable_shared_from_this<ServerImpl> {
 public:
  ServerImpl(ServerOptions options, Handler handler)
      : options_(options), handler_(std::move(handler)) {}

  void Accept(asio::ip::tcp::acceptor& acceptor) {
    std::weak_ptr<ServerImpl> weak = shared_from_this();
    wire::AcceptLoop(acceptor, [weak](asio::ip::tcp::socket socket) {
      auto self = weak.lock();
      if (self == nullptr || self->stopped_) {
        asio::error_code ignored;
        socket.close(ignored);
        return;
      }
      const uint64_t id = self->next_id_++;
      auto session = std::make_shared<Session>(std::move(socket), self, id);
      const bool refuse = self->sessions_.size() >= self->options_.max_connections;
      self->sessions_[id] = session;
      self->open_.store(self->sessions_.size(), std::memory_order_relaxed);
      session->Begin(refuse);
    });
  }

  void Stop() override {
    stopped_ = true;
    auto sessions = std::move(sessions_);
    sessions_.clear();
    open_.store(0, std::memory_order_relaxed);
    for (auto& [id, weak] : sessions) {
      if (auto s = weak.lock()) s->Close();
    }
  }
  size_t connections() const override { return open_.load(std::memory_order_relaxed); }
  uint64_t requests() const override { return requests_.load(std::memory_order_relaxed); }

  void Remove(uint64_t id) {
    sessions_.erase(id);
    open_.store(sessions_.size(), std::memory_order_relaxed);
  }
  void Handle(Request request, std::shared_ptr<Responder> responder) {
    ++requests_;
    try {
      handler_(std::move(request), responder);
    } catch (const std::exception& e) {
      LOG(ERROR) << "HTTP handler threw: " << e.what();
      if (!responder->closed()) {
        responder->Reply({500, "application/json", ErrorBody("internal error", "server_error"), {}});
      }
    }
  }
  const ServerOptions& options() const { return options_; }

 private:
  const ServerOptions options_;
  Handler handler_;
  std::unordered_map<uint64_t, std::weak_ptr<Session>> sessions_;
  uint64_t next_id_ = 1;
  std::atomic<size_t> open_{0};        // sessions_.size(), readable from any thread
  std::atomic<uint64_t> requests_{0};
  bool stopped_ = false;
};

Session::Session(asio::ip::tcp::socket socket, std::shared_ptr<ServerImpl> server, uint64_t id)
    : stream_(std::move(socket)), server_(std::move(server)), id_(id) {}

void Session::Begin(bool refuse) {
  if (refuse) {
    keep_alive_ = false;
    handling_ = true;
    ++seq_;
    ReplyFor(seq_, {503, "application/json",
                    ErrorBody("too many connections", "server_error", "overloaded"), {}});
    return;
  }
  ReadRequest();
}

void Session::ReadRequest() {
  parser_.emplace();
  parser_->header_limit(server_->options().max_header_bytes);
  parser_->body_limit(server_->options().max_body_bytes);
  stream_.expires_after(server_->options().read_timeout);
  bhttp::async_read(stream_, buffer_, *parser_,
                    [self = shared_from_this()](const asio::error_code& e, size_t) {
                      self->OnRead(e);
                    });
}

void Session::OnRead(const asio::error_code& e) {
  if (closed_) return;
  if (e == bhttp::error::body_limit) return Fail(413, "request body too large");
  if (e == bhttp::error::header_limit) return Fail(431, "request header too large");
  if (e) {
    // A malformed request gets an answer; a closed, reset or silent peer does not.
    const bool protocol = &e.category() == &bhttp::make_error_code(bhttp::error::bad_target).category();
    if (protocol && e != bhttp::error::end_of_stream && e != bhttp::error::partial_message) {
      return Fail(400, "malformed HTTP request: " + e.message());
    }
    return Close();
  }
  auto& req = parser_->get();
  keep_alive_ = req.keep_alive();
  version_ = req.version();
  head_ = req.method() == bhttp::verb::head;
  Request r;
  r.method = std::string(req.method_string());
  const std::string_view target = req.target();
  const size_t q = target.find('?');
  r.path = std::string(target.substr(0, q));
  if (q != std::string_view::npos) r.query = std::string(target.substr(q + 1));
  r.authorization = std::string(req[bhttp::field::authorization]);
  r.content_type = std::string(req[bhttp::field::content_type]);
  r.body = std::move(req.body());
  r.connection = id_;
  parser_.reset();
  ++seq_;
  handling_ = true;
  answered_ = false;
  streaming_ = false;
  stream_.expires_never();
  Watch();
  server_->Handle(std::move(r), std::make_shared<Exchange>(shared_from_this(), seq_));
}

// While a request is answered nothing reads the socket; a readable socket with no bytes is a peer
// that closed (or reset) it.
void Session::Watch() {
  stream_.socket().async_wait(
      asio::ip::tcp::socket::wait_read,
      [self = shared_from_this(), seq = seq_](const asio::error_code& e) {
        if (e || self->closed_ || self->seq_ != seq || !self->handling_) return;
        asio::error_code ec;
        const size_t available = self->stream_.socket().available(ec);
        if (ec || available == 0) self->Close();
        // Otherwise a pipelined request waits for its turn; nothing is watched until then.
      });
}

void Session::Fail(int status, std::string_view message) {
  keep_alive_ = false;
  handling_ = true;
  answered_ = false;
  streaming_ = false;
  ++seq_;
  ReplyFor(seq_, {status, "application/json",
                  ErrorBody(message, "invalid_request_error", "bad_request"), {}});
}

void Session::ReplyFor(uint64_t seq, Reply reply) {
  if (ClosedFor(seq) || streaming_) return;
  answered_ = true;
  auto fill = [&](auto& res) {
    res.set(bhttp::field::content_type, reply.content_type);
    for (const auto& [name, value] : reply.headers) res.set(name, value);
    res.keep_alive(keep_alive_);
  };
  writing_ = true;
  stream_.expires_after(server_->options().write_timeout);
  auto done = [self = shared_from_this()](const asio::error_code& e, size_t) {
    self->writing_ = false;
    if (e) return self->Close();
    self->Finished();
  };
  const auto status = static_cast<bhttp::status>(reply.status);
  if (head_) {
    auto res = std::make_shared<bhttp::response<bhttp::empty_body>>(status, version_);
    fill(*res);
    res->content_length(reply.body.size());
    bhttp::async_write(stream_, *res, [res, done](const asio::error_code& e, size_t n) {
      done(e, n);
    });
    return;
  }
  auto res = std::make_shared<bhttp::response<bhttp::string_body>>(status, version_);
  fill(*res);
  res->body() = std::move(reply.body);
  res->prepare_payload();
  bhttp::async_write(stream_, *res, [res, done](const asio::error_code& e, size_t n) {
    done(e, n);
  });
}

void Session::StartStreamFor(uint64_t seq, int status, std::string content_type) {
  if (ClosedFor(seq) || streaming_) return;
  streaming_ = true;
  auto res = std::make_shared<bhttp::response<bhttp::empty_body>>(
      static_cast<bhttp::status>(status), version_);
  res->set(bhttp::field::content_type, content_type);
  res->set(bhttp::field::cache_control, "no-cache");
  res->keep_alive(keep_alive_);
  res->chunked(true);
  auto serializer = std::make_shared<bhttp::response_serializer<bhttp::empty_body>>(*res);
  writing_ = true;
  stream_.expires_after(server_->options().write_timeout);
  bhttp::async_write_header(stream_, *serializer,
                            [self = shared_from_this(), res, serializer](const asio::error_code& e,
                                                                         size_t) {
                              self->OnWritten(e);
                            });
}

bool Session::WriteFor(uint64_t seq, std::string data) {
  if (ClosedFor(seq) || !streaming_ || end_queued_) return false;
  if (data.empty()) return true;  // an empty chunk would end the stream
  if (queued_bytes_ + data.size() > server_->options().max_queued_bytes) {
    LOG(WARNING) << "HTTP connection " << id_ << ": client too far behind ("
                 << queued_bytes_ << " bytes queued); closing it";
    Close();
    return false;
  }
  queued_bytes_ += data.size();
  queue_.push_back(std::move(data));
  Pump();
  return true;
}

void Session::EndFor(uint64_t seq) {
  if (ClosedFor(seq) || !streaming_ || end_queued_) return;
  end_queued_ = true;
  answered_ = true;
  Pump();
}

void Session::OnCloseFor(uint64_t seq, std::function<void()> callback) {
  if (ClosedFor(seq)) return;
  on_close_ = std::move(callback);
}

void Session::Pump() {
  if (writing_ || closed_) return;
  auto self = shared_from_this();
  if (!queue_.empty()) {
    auto data = std::make_shared<std::string>(std::move(queue_.front()));
    queue_.pop_front();
    queued_bytes_ -= data->size();
    writing_ = true;
    stream_.expires_after(server_->options().write_timeout);
    asio::async_write(stream_, bhttp::make_chunk(asio::buffer(*data)),
                      [self, data](const asio::error_code& e, size_t) { self->OnWritten(e); });
    return;
  }
  if (end_queued_) {
    end_queued_ = false;
    writing_ = true;
    stream_.expires_after(server_->options().write_timeout);
    asio::async_write(stream_, bhttp::make_chunk_last(), [self](const asio::error_code& e, size_t) {
      self->writing_ = false;
      if (e) return self->Close();
      self->Finished();
    });
  }
}

void Session::OnWritten(const asio::error_code& e) {
  writing_ = false;
  if (e) return Close();
  Pump();
}

void Session::Finished() {
  handling_ = false;
  streaming_ = false;
  on_close_ = nullptr;
  if (closed_) return;
  if (!keep_alive_) {
    asio::error_code ignored;
    stream_.socket().shutdown(asio::ip::tcp::socket::shutdown_send, ignored);
    return Close();
  }
  ReadRequest();
}

void Session::Close() {
  if (closed_) return;
  closed_ = true;
  asio::error_code ignored;
  stream_.socket().close(ignored);
  queue_.clear();
  queued_bytes_ = 0;
  server_->Remove(id_);
  if (handling_ && on_close_) {
    auto callback = std::move(on_close_);
    on_close_ = nullptr;
    callback();
  }
}

}  // namespace

std::shared_ptr<HttpServer> HttpServer::Start(asio::ip::tcp::acceptor& acceptor,
                                              ServerOptions options, Handler handler) {
  auto server = std::make_shared<ServerImpl>(options, std::move(handler));
  server->Accept(acceptor);
  return server;
}

std::string ErrorBody(std::string_view message, std::string_view type, std::string_view code,
                      std::string_view param) {
  using Json = nlohmann::json;
  Json error = {{"message", message}, {"type", type}};
  error["param"] = param.empty() ? Json(nullptr) : Json(param);
  error["code"] = code.empty() ? Json(nullptr) : Json(code);
  return Json{{"error", error}}.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n";
}

}  // namespace chunkserve::http
