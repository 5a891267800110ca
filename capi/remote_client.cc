#include "capi/remote_client.h"

#include <capnp/message.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include "runtime/wire/asio.h"
#include <exception>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "runtime/base/finish_reason.h"
#include "runtime/wire/auth.h"
#include "runtime/wire/client_protocol.h"
#include "runtime/wire/connection.h"
#include "runtime/wire/framing.h"
#include "runtime/wire/messages.h"

namespace chunkserve::capi {

using wire::schema::Envelope;

// State shared by the client, its network thread and (weakly) its streams. Every stream push
// happens on the network thread, so a stream's tokens and its terminal event keep their order
// and the counts in the terminal event are exact.
class ClientCore {
 public:
  explicit ClientCore(RemoteClientOptions o)
      : options(std::move(o)),
        peer(options.host + ":" + std::to_string(options.port)),
        keepalive(io),
        reconnect_timer(io) {}

  // A request in flight: its stream and what its terminal event needs to report.
  struct Live {
    std::shared_ptr<sched::RequestStream> stream;
    int32_t prompt_tokens = 0;
    int32_t generated = 0;  // network thread only
  };

  asio::io_context io;  // first member: outlives everything bound to it
  const RemoteClientOptions options;
  const std::string peer;        // "host:port", for messages
  asio::steady_timer keepalive;  // network thread only (and before it starts)
  asio::steady_timer reconnect_timer;         // network thread only
  std::chrono::milliseconds backoff{0};       // network thread only
  std::string auth_key;                       // proven when the server challenges
  std::shared_ptr<wire::TlsContext> tls;      // null: plain TCP
  std::unique_ptr<wire::CrlWatcher> crl_watcher;  // with tls_crl_file: reloads `tls`
  // Requests with a deadline: a timer that ends the request locally a grace period after it.
  std::unordered_map<uint64_t, std::shared_ptr<asio::steady_timer>> deadline_timers;

  // Requests cancelled by the client, each with a timer that ends it locally if the server does
  // not answer the Cancel in time (network thread only).
  std::unordered_map<uint64_t, std::shared_ptr<asio::steady_timer>> cancel_timers;

  std::mutex mu;
  std::shared_ptr<wire::Connection> connection;  // null once the connection ended
  std::unordered_map<uint64_t, Live> live;       // guarded by mu
  uint64_t next_id = 1;                          // guarded by mu
  std::string down_reason;                       // guarded by mu; why connection is null
  StatusCode down_code = StatusCode::kUnavailable;  // guarded by mu; Submit's answer while down
  std::string server_error;                      // guarded by mu; last connection-level Error
  StatusCode server_error_code = StatusCode::kOk;  // guarded by mu
  bool closing = false;                          // guarded by mu; destroyed: no reconnect
};

namespace {

std::vector<uint8_t> Encode(capnp::MallocMessageBuilder& builder) {
  Result<std::vector<uint8_t>> bytes = wire::EncodeFrame(builder);
  return bytes.ok() ? std::move(bytes).value() : std::vector<uint8_t>{};
}

std::vector<uint8_t> HealthFrame() {
  capnp::MallocMessageBuilder builder;
  builder.initRoot<Envelope>().initHealthRequest();
  return Encode(builder);
}

// Removes and returns every live request and marks the core down (network thread, or after it
// stopped). Returns the connection that was up, if any.
std::shared_ptr<wire::Connection> MarkDown(ClientCore& c, const std::string& reason,
                                           std::unordered_map<uint64_t, ClientCore::Live>* live,
                                           StatusCode code = StatusCode::kUnavailable) {
  std::lock_guard<std::mutex> lock(c.mu);
  if (c.down_reason.empty()) c.down_reason = reason;
  c.down_code = code;
  live->swap(c.live);
  return std::move(c.connection);
}

// What Submit answers while there is no connection. Called with c.mu held.
Status NotConnected(const ClientCore& c) {
  return Status(c.down_code, "not connected: " + c.down_reason);
}

void EndAll(std::unordered_map<uint64_t, ClientCore::Live>& live, const Status& status) {
  for (auto& [id, l] : live) {
    sched::FinishInfo info;
    // Lost with the connection: retryable, unless the server refused the client's credentials.
    info.reason = status.code() == StatusCode::kUnauthenticated ? FinishReason::kError
                                                                 : FinishReason::kUnavailable;
    info.error = status;
    info.prompt_tokens = l.prompt_tokens;
    info.generated_tokens = l.generated;
    l.stream->PushFinish(info);
  }
}

void CancelTimer(asio::steady_timer& timer) {
  try {
    timer.cancel();
  } catch (...) {
    // Cancelling a timer fails only on a broken loop; the loop is shutting down anyway.
  }
}

// Stops every timer (network thread), so that the loop runs out of work once the connection is
// closed.
void CancelTimers(ClientCore& c) {
  CancelTimer(c.keepalive);
  for (auto& [id, timer] : c.cancel_timers) CancelTimer(*timer);
  c.cancel_timers.clear();
  for (auto& [id, timer] : c.deadline_timers) CancelTimer(*timer);
  c.deadline_timers.clear();
}

void ScheduleReconnect(ClientCore& c);

// Ends live request `id` here, without the server (which may then be told to stop); nothing
// when it already ended.
void EndLocally(ClientCore& c, uint64_t id, FinishReason reason, const Status& error,
                bool tell_server) {
  ClientCore::Live l;
  {
    std::lock_guard<std::mutex> lock(c.mu);
    auto it = c.live.find(id);
    if (it == c.live.end()) return;
    l = std::move(it->second);
    c.live.erase(it);
    if (tell_server && c.connection != nullptr) (void)c.connection->SendBytes(wire::EncodeCancel(id));
  }
  sched::FinishInfo info;
  info.reason = reason;
  info.error = error;
  info.prompt_tokens = l.prompt_tokens;
  info.generated_tokens = l.generated;
  l.stream->PushFinish(info);
}

// A request's deadline passed a grace period ago and the server has not ended it: end it here
// (kDeadline) and tell the server to stop (network thread).
constexpr auto kDeadlineGrace = std::chrono::seconds(1);
void ArmDeadline(ClientCore& c, uint64_t id, std::chrono::milliseconds deadline) {
  {
    std::lock_guard<std::mutex> lock(c.mu);
    if (c.live.count(id) == 0) return;
  }
  auto timer = std::make_shared<asio::steady_timer>(c.io, deadline + kDeadlineGrace);
  c.deadline_timers[id] = timer;
  timer->async_wait([&c, id, timer](const asio::error_code& ec) {
    if (ec) return;
    c.deadline_timers.erase(id);
    EndLocally(c, id, FinishReason::kDeadline,
               Status::DeadlineExceeded(c.peer + " did not end the request by its deadline"),
               /*tell_server=*/true);
  });
}

void DisarmDeadline(ClientCore& c, uint64_t id) {
  auto it = c.deadline_timers.find(id);
  if (it == c.deadline_timers.end()) return;
  CancelTimer(*it->second);
  c.deadline_timers.erase(it);
}

// How long a cancelled request waits for the server's Finish before it is ended here: a server
// that is connected but no longer answers must not leave a cancelled stream (and a binding's
// Close waiting on it) hanging.
constexpr auto kCancelGrace = std::chrono::seconds(5);

// Network thread. Arms the grace timer of a cancelled request (once per request).
void ArmCancelGrace(ClientCore& c, uint64_t id) {
  {
    std::lock_guard<std::mutex> lock(c.mu);
    if (c.live.count(id) == 0 || c.connection == nullptr) return;
  }
  if (c.cancel_timers.count(id) != 0) return;
  auto timer = std::make_shared<asio::steady_timer>(c.io, kCancelGrace);
  c.cancel_timers[id] = timer;
  // The handler holds the timer, so erasing it from the map while the handler runs is safe.
  timer->async_wait([&c, id, timer](const asio::error_code& ec) {
    if (ec) return;  // answered in time, or shutting down
    c.cancel_timers.erase(id);
    EndLocally(c, id, FinishReason::kCancelled, Status::Ok(), /*tell_server=*/false);
  });
}

// Any thread: sends a Cancel for a live request and arms its grace timer. Called with c.mu held.
void SendCancelLocked(ClientCore& c, uint64_t id) {
  if (c.connection == nullptr) return;
  (void)c.connection->SendBytes(wire::EncodeCancel(id));
  asio::post(c.io, [&c, id] { ArmCancelGrace(c, id); });
}

// Network thread: the request ended; its grace timer, if any, is no longer needed.
void DisarmCancelGrace(ClientCore& c, uint64_t id) {
  auto it = c.cancel_timers.find(id);
  if (it == c.cancel_timers.end()) return;
  CancelTimer(*it->second);
  c.cancel_timers.erase(it);
}

void OnClose(ClientCore& c, const Status& reason) {
  std::string why =
      reason.ok() ? std::string("the server closed the connection") : std::string(reason.message());
  // Refused for its credentials (by the server, or here: no key to answer a challenge), the
  // client says so: retrying the same request cannot help until the key is fixed.
  bool unauthenticated = reason.code() == StatusCode::kUnauthenticated;
  {
    std::lock_guard<std::mutex> lock(c.mu);
    if (!c.server_error.empty()) why += " (server said: " + c.server_error + ")";
    unauthenticated |= c.server_error_code == StatusCode::kUnauthenticated;
  }
  const std::string message = "connection to " + c.peer + " lost: " + why;
  std::unordered_map<uint64_t, ClientCore::Live> live;
  MarkDown(c, message, &live,
           unauthenticated ? StatusCode::kUnauthenticated : StatusCode::kUnavailable);
  CancelTimers(c);
  EndAll(live, unauthenticated ? Status::Unauthenticated(message) : Status::Unavailable(message));
  bool closing;
  {
    std::lock_guard<std::mutex> lock(c.mu);
    closing = c.closing;
    if (!closing && c.options.reconnect) c.down_reason = message + "; reconnecting";
  }
  if (!closing && c.options.reconnect) ScheduleReconnect(c);
}

void OnMessage(ClientCore& c, wire::DecodedMessage& message) {
  c.backoff = std::chrono::milliseconds(0);  // the server answers: a later loss starts over
  Envelope::Reader root = message.root();
  switch (root.which()) {
    case Envelope::TOKEN: {
      Result<wire::TokenMessage> t = wire::DecodeToken(root.getToken());
      if (!t.ok()) return;  // not a token id of any model: nothing to deliver
      std::shared_ptr<sched::RequestStream> stream;
      {
        std::lock_guard<std::mutex> lock(c.mu);
        auto it = c.live.find(t->request_id);
        if (it == c.live.end()) return;  // forgotten (stream destroyed) or unknown
        ++it->second.generated;
        stream = it->second.stream;
      }
      stream->PushToken(t->token, t->index, std::move(t->logprobs));
      return;
    }
    case Envelope::FINISH: {
      const wire::FinishMessage f = wire::DecodeFinish(root.getFinish());
      ClientCore::Live l;
      {
        std::lock_guard<std::mutex> lock(c.mu);
        auto it = c.live.find(f.request_id);
        if (it == c.live.end()) return;
        l = std::move(it->second);
        c.live.erase(it);
      }
      DisarmCancelGrace(c, f.request_id);
      DisarmDeadline(c, f.request_id);
      sched::FinishInfo info;
      info.reason = f.reason;
      info.prompt_tokens = f.prompt_tokens;
      info.cached_tokens = f.cached_tokens;
      info.generated_tokens = f.generated_tokens;
      if (info.reason == FinishReason::kError || info.reason == FinishReason::kUnavailable) {
        StatusCode code = f.error.code();
        if (code == StatusCode::kOk) {
          code = info.reason == FinishReason::kError ? StatusCode::kInternal
                                                     : StatusCode::kUnavailable;
        }
        const std::string text(f.error.message());
        info.error = Status(code, c.peer + ": " + (text.empty() ? "request failed" : text));
      }
      l.stream->PushFinish(info);
      return;
    }
    case Envelope::ERROR: {
      auto e = root.getError();
      const StatusCode code = wire::FromWireErrorCode(e.getCode());
      const std::string text = e.getMessage().cStr();
      if (e.getRequestId() == 0) {
        // A connection-level error. Unimplemented answers a message the server does not serve
        // (a router may not answer the keepalive's HealthRequest): harmless. Anything else
        // precedes the server closing the connection; keep it for the streams' message.
        if (code != StatusCode::kUnimplemented) {
          std::lock_guard<std::mutex> lock(c.mu);
          c.server_error = text;
          c.server_error_code = code;
        }
        return;
      }
      ClientCore::Live l;
      {
        std::lock_guard<std::mutex> lock(c.mu);
        auto it = c.live.find(e.getRequestId());
        if (it == c.live.end()) return;
        l = std::move(it->second);
        c.live.erase(it);
      }
      DisarmCancelGrace(c, e.getRequestId());
      DisarmDeadline(c, e.getRequestId());
      sched::FinishInfo info;
      info.reason =
          code == StatusCode::kUnavailable ? FinishReason::kUnavailable : FinishReason::kError;
      info.error = Status(code == StatusCode::kOk ? StatusCode::kInternal : code,
                          c.peer + " rejected the request: " + text);
      info.prompt_tokens = l.prompt_tokens;
      info.generated_tokens = l.generated;
      l.stream->PushFinish(info);
      return;
    }
    default:
      return;  // Health (the keepalive's answer), Stats, and members newer than this client
  }
}

void ArmKeepalive(ClientCore& c) {
  if (c.options.keepalive_interval.count() <= 0) return;
  c.keepalive.expires_after(c.options.keepalive_interval);
  c.keepalive.async_wait([&c](const asio::error_code& ec) {
    if (ec) return;
    std::shared_ptr<wire::Connection> connection;
    {
      std::lock_guard<std::mutex> lock(c.mu);
      connection = c.connection;
    }
    if (connection == nullptr) return;
    (void)connection->SendBytes(HealthFrame());
    ArmKeepalive(c);
  });
}

// TCP keepalive, so that a peer that vanishes without closing (host down, network cut) is
// detected within about 20 s even while no request runs. Best effort.
void EnableTcpKeepalive(asio::ip::tcp::socket& socket) {
  const int fd = socket.native_handle();
  int on = 1, idle = 10, interval = 5, count = 2;
  (void)::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on));
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval));
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof(count));
}

// Starts serving a connected socket (network thread, or before it runs).
void StartConnection(ClientCore& c, asio::ip::tcp::socket socket) {
  EnableTcpKeepalive(socket);
  // The connection's own deadlines stay off: a client may wait arbitrarily long for tokens.
  wire::ConnectionOptions options;
  options.tls = c.tls;
  options.tls_host = c.options.host;
  if (!c.auth_key.empty()) {
    options.client_auth = wire::ClientAuth{c.auth_key, wire::schema::AuthRole::CLIENT};
  }
  auto connection = wire::Connection::Create(std::move(socket), options);
  {
    std::lock_guard<std::mutex> lock(c.mu);
    c.connection = connection;
    c.down_reason.clear();
    c.down_code = StatusCode::kUnavailable;
    c.server_error.clear();
    c.server_error_code = StatusCode::kOk;
  }
  ClientCore* raw = &c;  // handlers run on the network thread, which the core outlives
  connection->Start([raw](wire::DecodedMessage& m) { OnMessage(*raw, m); },
                    [raw](const Status& reason) { OnClose(*raw, reason); });
  // A first frame right away: servers close connections whose first frame is late (the worker's
  // handshake deadline), and a client may connect long before it submits.
  (void)connection->SendBytes(HealthFrame());
  ArmKeepalive(c);
}

// Network thread: connects again after `backoff`, resolving the host each time (a restarted
// router may come back at another address).
void ScheduleReconnect(ClientCore& c) {
  c.backoff = c.backoff.count() == 0 ? c.options.reconnect_min
                                     : std::min(c.backoff * 2, c.options.reconnect_max);
  c.reconnect_timer.expires_after(c.backoff);
  c.reconnect_timer.async_wait([&c](const asio::error_code& ec) {
    if (ec) return;
    {
      std::lock_guard<std::mutex> lock(c.mu);
      if (c.closing) return;
    }
    auto resolver = std::make_shared<asio::ip::tcp::resolver>(c.io);
    resolver->async_resolve(
        c.options.host, std::to_string(c.options.port), asio::ip::resolver_base::numeric_service,
        [&c, resolver](const asio::error_code& e, asio::ip::tcp::resolver::results_type results) {
          if (e) {
            ScheduleReconnect(c);
            return;
          }
          auto socket = std::make_shared<asio::ip::tcp::socket>(c.io);
          auto timer = std::make_shared<asio::steady_timer>(c.io, c.options.connect_timeout);
          timer->async_wait([socket](const asio::error_code& te) {
            if (!te) {
              asio::error_code ignored;
              socket->close(ignored);  // the connect handler runs with operation_aborted
            }
          });
          asio::async_connect(*socket, results,
                              [&c, socket, timer](const asio::error_code& ce, const auto&) {
                                CancelTimer(*timer);
                                bool closing;
                                {
                                  std::lock_guard<std::mutex> lock(c.mu);
                                  closing = c.closing;
                                }
                                if (closing) return;
                                if (ce) {
                                  ScheduleReconnect(c);
                                  return;
                                }
                                // The backoff resets on the first frame received, not here:
                                // a server that accepts and closes at once is not hammered.
                                StartConnection(c, std::move(*socket));
                              });
        });
  });
}

void RunLoop(ClientCore& c) {
  for (;;) {
    try {
      c.io.run();
      return;
    } catch (...) {
      // A handler threw (out of memory while delivering): keep serving the connection.
    }
  }
}

}  // namespace

namespace {

// Before the network thread starts: runs the loop on the caller's thread until the first
// connection's TLS handshake completed, failed or ran out of time (then it is closed).
Status AwaitHandshake(ClientCore& c, std::chrono::steady_clock::time_point deadline) {
  std::shared_ptr<wire::Connection> connection;
  {
    std::lock_guard<std::mutex> lock(c.mu);
    connection = c.connection;
  }
  {
    std::lock_guard<std::mutex> lock(c.mu);
    c.closing = true;  // a failed first handshake is Connect's error, not a reason to reconnect
  }
  while (connection != nullptr && !connection->established() && !connection->closed()) {
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline || c.io.stopped()) break;
    c.io.run_one_for(deadline - now);
  }
  c.io.restart();
  if (connection != nullptr && connection->established()) {
    std::lock_guard<std::mutex> lock(c.mu);
    c.closing = false;
    return Status::Ok();
  }
  CancelTimers(c);
  if (connection != nullptr && !connection->closed()) {
    connection->Close(Status::DeadlineExceeded("TLS handshake timed out"));
    c.io.poll();
    return Status::Unavailable("the TLS handshake with " + c.peer + " did not complete within " +
                               std::to_string(c.options.connect_timeout.count()) + " ms");
  }
  c.io.poll();
  std::lock_guard<std::mutex> lock(c.mu);
  if (c.down_code == StatusCode::kUnauthenticated) {
    return Status::Unauthenticated(c.down_reason);
  }
  return Status::Unavailable(c.down_reason.empty() ? "connection to " + c.peer + " lost"
                                                   : c.down_reason);
}

}  // namespace

Result<std::unique_ptr<RemoteClient>> RemoteClient::Connect(const RemoteClientOptions& options) {
  auto core = std::make_shared<ClientCore>(options);
  ClientCore& c = *core;
  const std::string& peer = c.peer;
  const auto connect_deadline = std::chrono::steady_clock::now() + options.connect_timeout;
  if (options.tls.enabled()) {
    CHUNKSERVE_ASSIGN_OR_RETURN(
        c.tls, wire::TlsContext::Create(wire::TlsContext::Side::kClient, options.tls));
    if (!options.tls.crl_file.empty()) {
      c.crl_watcher = std::make_unique<wire::CrlWatcher>(
          options.tls.crl_file, std::vector<std::shared_ptr<wire::TlsContext>>{c.tls});
    }
  }

  asio::error_code ec;
  asio::ip::tcp::resolver resolver(c.io);
  const auto endpoints = resolver.resolve(options.host, std::to_string(options.port),
                                          asio::ip::resolver_base::numeric_service, ec);
  if (ec) return Status::Unavailable("cannot resolve " + options.host + ": " + ec.message());

  // Connect with a deadline: run the loop on this thread until the connect completes or time
  // runs out, then close the socket to abort it.
  asio::ip::tcp::socket socket(c.io);
  asio::error_code connect_ec = asio::error::would_block;
  asio::async_connect(
      socket, endpoints,
      [&connect_ec](const asio::error_code& e, const asio::ip::tcp::endpoint&) { connect_ec = e; });
  c.io.run_for(options.connect_timeout);
  if (connect_ec == asio::error::would_block) {
    socket.close(ec);
    c.io.restart();
    c.io.run();  // completes the aborted connect, whose handler refers to this frame
    return Status::Unavailable("connecting to " + peer + " timed out after " +
                               std::to_string(options.connect_timeout.count()) + " ms");
  }
  c.io.restart();
  if (connect_ec) {
    return Status::Unavailable("cannot connect to " + peer + ": " + connect_ec.message());
  }
  c.auth_key = options.auth_key;
  if (c.auth_key.empty() && options.auth_from_env) {
    for (const char* env : {wire::kClientTokenEnv, wire::kClusterSecretEnv}) {
      Result<std::string> key = wire::LoadSecret("", env);
      if (key.ok() && !key.value().empty()) {
        c.auth_key = key.value();
        break;
      }
    }
  }
  StartConnection(c, std::move(socket));
  if (c.tls != nullptr) CHUNKSERVE_RETURN_IF_ERROR(AwaitHandshake(c, connect_deadline));

  std::unique_ptr<RemoteClient> client(new RemoteClient());
  client->core_ = core;
  client->thread_ = std::thread([core] { RunLoop(*core); });
  return client;
}

RemoteClient::~RemoteClient() {
  ClientCore* c = core_.get();
  const auto shut_down = [c] {
    {
      std::lock_guard<std::mutex> lock(c->mu);
      c->closing = true;
    }
    CancelTimer(c->reconnect_timer);
    std::unordered_map<uint64_t, ClientCore::Live> live;
    std::shared_ptr<wire::Connection> connection = MarkDown(*c, "the client was destroyed", &live);
    CancelTimers(*c);
    // Closing ends the pending read and write, so the loop runs out of work and returns.
    if (connection != nullptr) connection->Close(Status::Cancelled("client destroyed"));
    EndAll(live, Status::Unavailable("the client of " + c->peer + " was destroyed"));
  };
  if (thread_.joinable() && std::this_thread::get_id() == thread_.get_id()) {
    // Destroyed from a stream callback against the header's advice: shut down from here and let
    // the loop (which holds the core) finish on its own.
    shut_down();
    thread_.detach();
    return;
  }
  try {
    asio::post(c->io, shut_down);
  } catch (...) {
  }
  if (thread_.joinable()) thread_.join();
  // The loop may have ended before the posted shutdown ran (the connection was already closed,
  // which ended every stream); whatever is left is ended here, with no thread to race.
  shut_down();
}

Result<std::shared_ptr<sched::RequestStream>> RemoteClient::Submit(const RemoteRequest& request) {
  ClientCore& c = *core_;
  const sched::RequestOptions& r = request.options;
  uint64_t id = 0;
  {
    std::lock_guard<std::mutex> lock(c.mu);
    if (c.connection == nullptr) return NotConnected(c);
    id = c.next_id++;
  }
  std::vector<uint8_t> frame = wire::EncodeGenerate(
      {.request_id = id,
       .prompt = r.prompt,
       .sampling = wire::SamplingMessage{r.sampling.temperature, r.sampling.top_k,
                                         r.sampling.top_p, r.sampling.seed},
       .max_new_tokens = r.max_new_tokens,
       .stop_tokens = r.stop_tokens,
       .deadline_ms = request.deadline_ms,
       .priority = r.priority,
       .logprobs = r.logprobs});
  if (frame.empty()) return Status::Internal("cannot encode the request");

  auto stream = std::make_shared<sched::RequestStream>(RequestId(id));
  std::lock_guard<std::mutex> lock(c.mu);
  if (c.connection == nullptr) return NotConnected(c);
  // Registered before the frame is queued, so that the first Token finds it.
  ClientCore::Live& l = c.live[id];
  l.stream = stream;
  l.prompt_tokens = static_cast<int32_t>(r.prompt.size());
  Status sent = c.connection->SendBytes(std::move(frame));
  if (!sent.ok()) {
    c.live.erase(id);
    return Status(sent.code(), "sending to " + c.peer + ": " + std::string(sent.message()));
  }
  if (request.deadline_ms > 0) {
    const auto deadline = std::chrono::milliseconds(request.deadline_ms);
    asio::post(c.io, [&c, id, deadline] { ArmDeadline(c, id, deadline); });
  }
  return stream;
}

Status RemoteClient::Cancel(uint64_t request_id) {
  ClientCore& c = *core_;
  std::lock_guard<std::mutex> lock(c.mu);
  if (c.live.count(request_id) == 0) {
    return Status::NotFound("no live request with id " + std::to_string(request_id) +
                            " on this client");
  }
  SendCancelLocked(c, request_id);
  return Status::Ok();
}

std::weak_ptr<ClientCore> RemoteClient::core() const { return core_; }

void CoreCancel(ClientCore& c, uint64_t request_id) {
  std::lock_guard<std::mutex> lock(c.mu);
  if (c.live.count(request_id) != 0) SendCancelLocked(c, request_id);
}

void CoreForget(ClientCore& c, uint64_t request_id) {
  std::lock_guard<std::mutex> lock(c.mu);
  if (c.live.erase(request_id) != 0 && c.connection != nullptr) {
    (void)c.connection->SendBytes(wire::EncodeCancel(request_id));
  }
}

}  // namespace chunkserve::capi
