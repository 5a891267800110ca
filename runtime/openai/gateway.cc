#include "runtime/openai/gateway.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <ctime>
#include <deque>
#include <random>
#include <unordered_map>
#include <unordered_set>

#include "runtime/base/logging.h"
#include "runtime/openai/protocol.h"
#include "runtime/tokenizer/tokenizer.h"
#include "runtime/wire/client_protocol.h"
#include "runtime/wire/connection.h"
#include "runtime/wire/messages.h"

namespace chunkserve::openai {
namespace {

using wire::schema::Envelope;

const char* ErrorType(int http_status) {
  switch (http_status) {
    case 400: return "invalid_request_error";
    case 401: return "authentication_error";
    case 404: return "not_found_error";
    case 429: return "rate_limit_error";
    default: return http_status >= 500 ? "server_error" : "invalid_request_error";
  }
}

http::Reply ErrorReply(int status, std::string_view message, std::string_view code = "") {
  http::Reply r{status, "application/json", http::ErrorBody(message, ErrorType(status), code), {}};
  if (status == 401) r.headers.emplace_back("WWW-Authenticate", "Bearer");
  if (status == 429 || status == 503) r.headers.emplace_back("Retry-After", "1");
  return r;
}

// One choice of a call: its own upstream request, detokenizer and text.
struct Sample {
  uint64_t id = 0;  // upstream request id
  int32_t index = 0;
  std::unique_ptr<tokenizer::StreamDecoder> decoder;
  std::string text;      // all generated text so far (before any stop-string cut)
  size_t emitted = 0;    // bytes of `text` already streamed
  bool sent_delta = false;  // chat: the first delta carries the role
  bool done = false;
  std::string finish_reason;
  int32_t completion_tokens = 0;
  int32_t cached_tokens = -1;  // from its Finish; -1: none came (cut by a stop string)
  // Logprobs of the tokens not yet reported, with the byte offset in `text` where each token's
  // text starts: a chunk reports those that start in the text it carries.
  std::deque<std::pair<size_t, LogprobEntry>> pending_logprobs;
  size_t offset_bytes = 0;   // a byte offset in `text` and its count of code points, so that
  int32_t offset_chars = 0;  // text offsets are counted once, front to back
  std::vector<LogprobEntry> logprobs;  // a non-streamed answer's, at the end
};

// One request through the gateway, from its HTTP request to its last byte: n choices (samples),
// each its own upstream request. The engine's prefix tree shares their prompt's KV chunks, so the
// prompt is computed once however many choices there are.
struct Call {
  GenerationRequest request;
  std::shared_ptr<http::Responder> responder;
  std::unordered_set<TokenId> stop_ids;
  Completion completion;  // id, created, model, usage; the choices at the end
  std::vector<Sample> samples;
  size_t max_stop = 0;   // longest stop string
  bool stream_started = false;
  bool done = false;
};

class GatewayImpl final : public Gateway, public std::enable_shared_from_this<GatewayImpl> {
 public:
  GatewayImpl(asio::io_context& io, GatewayOptions options)
      : io_(io), options_(std::move(options)), rng_(std::random_device{}()) {}

  bool Handle(http::Request& request, const std::shared_ptr<http::Responder>& responder) override {
    if (request.path.rfind("/v1/", 0) != 0) return false;
    if (!Authorized(request)) {
      ++stats_.errors;
      responder->Reply(ErrorReply(401, "a valid API key is required (Authorization: Bearer ...)",
                                  "invalid_api_key"));
      return true;
    }
    const bool get = request.method == "GET" || request.method == "HEAD";
    if (request.path == "/v1/models") {
      if (!get) return MethodNotAllowed(*responder), true;
      responder->Reply({200, "application/json",
                        RenderModels(options_.model.name, started_, options_.model.context_length),
                        {}});
      return true;
    }
    Endpoint endpoint;
    if (request.path == "/v1/completions") {
      endpoint = Endpoint::kCompletions;
    } else if (request.path == "/v1/chat/completions") {
      endpoint = Endpoint::kChat;
    } else {
      ++stats_.errors;
      responder->Reply(ErrorReply(404, "no such endpoint: " + request.path, "not_found"));
      return true;
    }
    if (request.method != "POST") return MethodNotAllowed(*responder), true;
    Start(endpoint, request, responder);
    return true;
  }

  void Stop() override {
    stopped_ = true;
    FailAll(Status::Unavailable("the server is shutting down"));
    if (upstream_ != nullptr) upstream_->Close(Status::Unavailable("gateway stopped"));
    upstream_.reset();
  }

  GatewayStats stats() const override {
    GatewayStats s = stats_;
    s.in_flight = InFlight();
    return s;
  }

 private:
  bool Authorized(const http::Request& request) const {
    if (options_.api_key.empty()) return true;
    // Constant time in the key's bytes, so timing does not tell how much of a guess was right.
    const std::string expected = "Bearer " + options_.api_key;
    if (request.authorization.size() != expected.size()) return false;
    unsigned char diff = 0;
    for (size_t i = 0; i < expected.size(); ++i) {
      diff |= static_cast<unsigned char>(request.authorization[i] ^ expected[i]);
    }
    return diff == 0;
  }

  void MethodNotAllowed(http::Responder& responder) {
    ++stats_.errors;
    responder.Reply(ErrorReply(405, "method not allowed", "method_not_allowed"));
  }

  void Reject(http::Responder& responder, int status, std::string_view message,
              std::string_view code = "") {
    ++stats_.errors;
    responder.Reply(ErrorReply(status, message, code));
  }

  // Parses, tokenizes and sends one request upstream.
  void Start(Endpoint endpoint, const http::Request& http_request,
             const std::shared_ptr<http::Responder>& responder) {
    if (stopped_) return Reject(*responder, 503, "the server is shutting down", "unavailable");
    std::string param;
    Result<GenerationRequest> parsed =
        ParseGenerationRequest(endpoint, http_request.body, &param);
    if (!parsed.ok()) {
      ++stats_.errors;
      http::Reply r = ErrorReply(400, parsed.status().message(), "invalid_request");
      r.body = http::ErrorBody(parsed.status().message(), "invalid_request_error",
                               "invalid_request", param);
      return responder->Reply(std::move(r));
    }
    GenerationRequest req = std::move(parsed).value();
    const tokenizer::ModelText& model = options_.model;
    if (!req.model.empty() && req.model != model.name) {
      return Reject(*responder, 404, "the model `" + req.model + "` does not exist; this server serves `" +
                                          model.name + "`", "model_not_found");
    }
    if (InFlight() + static_cast<size_t>(req.n) > options_.max_in_flight) {
      return Reject(*responder, 429, "too many requests in flight", "overloaded");
    }

    // Token ids of the prompt.
    std::vector<TokenId> prompt;
    if (endpoint == Endpoint::kChat) {
      if (model.chat_template == nullptr) {
        return Reject(*responder, 400, "this model has no chat template; use /v1/completions",
                      "no_chat_template");
      }
      std::vector<tokenizer::ChatMessage> messages;
      for (const ChatMessage& m : req.messages) messages.push_back({m.role, m.content});
      Result<std::string> text = model.chat_template->Render(messages, true);
      if (!text.ok()) return Reject(*responder, 400, text.status().message(), "invalid_request");
      Result<std::vector<int32_t>> ids = model.tokenizer->Encode(*text, false);
      if (!ids.ok()) return Reject(*responder, 400, ids.status().message(), "invalid_request");
      prompt.assign(ids->begin(), ids->end());
    } else if (req.prompt_text.has_value()) {
      Result<std::vector<int32_t>> ids = model.tokenizer->Encode(*req.prompt_text, true);
      if (!ids.ok()) return Reject(*responder, 400, ids.status().message(), "invalid_request");
      prompt.assign(ids->begin(), ids->end());
    } else {
      for (TokenId t : req.prompt_ids) {
        if (t >= model.tokenizer->vocab_size()) {
          return Reject(*responder, 400, "prompt token id " + std::to_string(t) +
                                             " is outside the vocabulary", "invalid_request");
        }
      }
      prompt = req.prompt_ids;
    }
    if (prompt.empty()) return Reject(*responder, 400, "the prompt is empty", "invalid_request");
    const int64_t context = model.context_length;
    const int64_t room = context - static_cast<int64_t>(prompt.size());
    if (room < 1) {
      return Reject(*responder, 400, "the prompt is " + std::to_string(prompt.size()) +
                                         " tokens; this model's context is " +
                                         std::to_string(context) + " tokens",
                    "context_length_exceeded");
    }
    if (req.max_tokens.has_value() && *req.max_tokens > room) {
      return Reject(*responder, 400, "the prompt (" + std::to_string(prompt.size()) +
                                         " tokens) plus max_tokens (" +
                                         std::to_string(*req.max_tokens) +
                                         ") exceeds this model's context of " +
                                         std::to_string(context) + " tokens",
                    "context_length_exceeded");
    }

    auto call = std::make_shared<Call>();
    call->responder = responder;
    call->completion.id = (endpoint == Endpoint::kChat ? "chatcmpl-" : "cmpl-") + RandomId();
    call->completion.created = static_cast<int64_t>(std::time(nullptr));
    call->completion.model = model.name;
    call->completion.usage.prompt_tokens = static_cast<int32_t>(prompt.size());
    call->completion.has_logprobs = req.logprobs >= 0;
    for (const std::string& s : req.stop) call->max_stop = std::max(call->max_stop, s.size());
    if (!req.ignore_eos) {
      for (TokenId t : model.eos_ids) call->stop_ids.insert(t);
    }
    for (TokenId t : req.stop_token_ids) call->stop_ids.insert(t);

    wire::GenerateMessage g;
    g.prompt = std::move(prompt);
    g.max_new_tokens = req.max_tokens.value_or(static_cast<int32_t>(room));
    // The request's sampling values, else the model's defaults, else OpenAI's.
    const tokenizer::GenerationDefaults& defaults = model.defaults;
    const float temperature = req.temperature.value_or(defaults.temperature.value_or(1.0f));
    g.stop_tokens.assign(call->stop_ids.begin(), call->stop_ids.end());
    std::sort(g.stop_tokens.begin(), g.stop_tokens.end());
    g.deadline_ms = static_cast<uint32_t>(
        std::min<int64_t>(options_.request_timeout.count(), UINT32_MAX));
    g.logprobs = req.logprobs;
    // Choice i of a request with a seed samples with seed + i: reproducible, and no two choices
    // draw the same numbers.
    std::vector<std::vector<uint8_t>> frames;
    for (int32_t i = 0; i < req.n; ++i) {
      Sample& sample = call->samples.emplace_back();
      sample.id = next_id_++;
      sample.index = i;
      sample.decoder = std::make_unique<tokenizer::StreamDecoder>(*model.tokenizer, true);
      g.request_id = sample.id;
      if (temperature > 0) {
        g.sampling = wire::SamplingMessage{
            temperature, req.top_k.value_or(defaults.top_k.value_or(0)),
            req.top_p.value_or(defaults.top_p.value_or(1.0f)),
            req.seed.has_value() ? *req.seed + static_cast<uint64_t>(i) : rng_()};
      }
      frames.push_back(wire::EncodeGenerate(g));
    }
    call->request = std::move(req);
    ++stats_.requests;
    stats_.prompt_tokens += g.prompt.size();

    std::weak_ptr<GatewayImpl> weak = shared_from_this();
    std::weak_ptr<Call> weak_call = call;
    responder->OnClose([weak, weak_call] {
      auto self = weak.lock();
      auto c = weak_call.lock();
      if (self != nullptr && c != nullptr) self->OnClientGone(*c);
    });
    // A link still in its TLS handshake or authentication holds what is sent until it is through.
    if (upstream_ != nullptr) {
      Send(call, std::move(frames));
    } else {
      waiting_.push_back({call, std::move(frames)});
      Connect();
    }
  }

  // Sends a call's requests upstream (one per choice).
  void Send(const std::shared_ptr<Call>& call, std::vector<std::vector<uint8_t>> frames) {
    for (Sample& sample : call->samples) routes_[sample.id] = {call, sample.index};
    for (auto& frame : frames) {
      if (call->done) return;
      Status s = upstream_->SendBytes(std::move(frame));
      if (!s.ok()) {
        End(*call, Status::ResourceExhausted("the server is overloaded: " +
                                             std::string(s.message())));
      }
    }
  }

  // --- the upstream link --------------------------------------------------------------------

  void Connect() {
    if (connecting_ || stopped_) return;
    connecting_ = true;
    auto socket = std::make_shared<asio::ip::tcp::socket>(io_);
    asio::error_code ec;
    const auto address = asio::ip::make_address(options_.upstream_host, ec);
    if (ec) {
      connecting_ = false;
      return FailWaiting(Status::Internal("gateway upstream host is not an address: " +
                                          options_.upstream_host));
    }
    std::weak_ptr<GatewayImpl> weak = shared_from_this();
    socket->async_connect(
        asio::ip::tcp::endpoint(address, options_.upstream_port),
        [weak, socket](const asio::error_code& e) {
          auto self = weak.lock();
          if (self == nullptr) return;
          self->connecting_ = false;
          if (e || self->stopped_) {
            return self->FailWaiting(Status::Unavailable("cannot reach the serving port: " +
                                                         e.message()));
          }
          self->OnConnected(std::move(*socket));
        });
  }

  void OnConnected(asio::ip::tcp::socket socket) {
    asio::error_code ignored;
    socket.set_option(asio::ip::tcp::no_delay(true), ignored);
    wire::ConnectionOptions o;
    o.keepalive_interval = std::chrono::seconds(5);  // the server closes idle clients
    o.client_auth = options_.upstream_auth;
    o.tls = options_.upstream_tls;
    o.tls_host = options_.upstream_tls_host;
    auto connection = wire::Connection::Create(std::move(socket), o);
    upstream_ = connection;
    std::weak_ptr<GatewayImpl> weak = shared_from_this();
    connection->Start(
        [weak](wire::DecodedMessage& m) {
          if (auto self = weak.lock()) self->OnUpstream(m);
        },
        [weak, raw = connection.get()](const Status& reason) {
          if (auto self = weak.lock()) self->OnUpstreamClosed(raw, reason);
        });
    // Frames queued before the TLS handshake or the authentication are held by the connection.
    auto waiting = std::move(waiting_);
    waiting_.clear();
    for (auto& [call, frames] : waiting) {
      if (!call->done) Send(call, std::move(frames));
    }
  }

  void OnUpstreamClosed(wire::Connection* which, const Status& reason) {
    if (upstream_.get() != which) return;
    upstream_.reset();
    FailAll(Status::Unavailable("the serving port closed the gateway's link" +
                                (reason.ok() ? std::string() : ": " + std::string(reason.message()))));
  }

  void OnUpstream(wire::DecodedMessage& message) {
    Envelope::Reader root = message.root();
    switch (root.which()) {
      case Envelope::TOKEN: {
        Result<wire::TokenMessage> t = wire::DecodeToken(root.getToken());
        if (!t.ok()) return;
        if (Route r = Find(t->request_id); r.call) OnToken(*r.call, r.call->samples[r.sample], *t);
        return;
      }
      case Envelope::FINISH: {
        const wire::FinishMessage f = wire::DecodeFinish(root.getFinish());
        if (Route r = Find(f.request_id); r.call) OnFinish(*r.call, r.call->samples[r.sample], f);
        return;
      }
      case Envelope::ERROR: {
        auto e = root.getError();
        const Status status(wire::FromWireErrorCode(e.getCode()), e.getMessage().cStr());
        if (e.getRequestId() == 0) {
          LOG(WARNING) << "gateway: the serving port says: " << status.ToString();
          return;
        }
        if (Route r = Find(e.getRequestId()); r.call) End(*r.call, status);
        return;
      }
      default:
        return;  // health answers and newer members
    }
  }

  // The call and choice an upstream request id belongs to (null call when none is open).
  struct Route {
    std::shared_ptr<Call> call;
    int32_t sample = 0;
  };
  Route Find(uint64_t id) {
    auto it = routes_.find(id);
    return it == routes_.end() ? Route{} : it->second;
  }

  // --- text out -----------------------------------------------------------------------------

  void OnToken(Call& call, Sample& sample, const wire::TokenMessage& t) {
    const TokenId token = t.token;
    ++sample.completion_tokens;
    if (call.stop_ids.count(token) != 0) return;  // the stop token ends it; it is not shown
    if (call.completion.has_logprobs && t.logprobs.has_value()) {
      Result<LogprobEntry> entry = MakeLogprobEntry(token, *t.logprobs);
      if (!entry.ok()) {
        return End(call, Status::Internal("logprobs: " + std::string(entry.status().message())));
      }
      sample.pending_logprobs.emplace_back(sample.text.size(), std::move(entry).value());
    }
    Result<std::string> piece = sample.decoder->Push(token);
    if (!piece.ok()) {
      return End(call, Status::Internal("detokenizing: " + std::string(piece.status().message())));
    }
    if (piece->empty()) return;
    sample.text += *piece;
    if (CheckStop(call, sample)) {
      Cancel(sample);
      return SampleDone(call, sample, "stop");
    }
    if (call.request.stream) Emit(call, sample, SafeEnd(call, sample));
  }

  void OnFinish(Call& call, Sample& sample, const wire::FinishMessage& f) {
    call.completion.usage.prompt_tokens = f.prompt_tokens;
    sample.cached_tokens = f.cached_tokens;
    sample.completion_tokens = f.generated_tokens;
    switch (f.reason) {
      case FinishReason::kStopToken:
      case FinishReason::kLength: {
        sample.text += sample.decoder->Flush();
        const bool cut = CheckStop(call, sample);
        return SampleDone(call, sample,
                          cut || f.reason == FinishReason::kStopToken ? "stop" : "length");
      }
      case FinishReason::kDeadline:
        return End(call, Status::DeadlineExceeded("the request's deadline passed"));
      case FinishReason::kCancelled:
        return End(call, Status::Cancelled("the request was cancelled"));
      case FinishReason::kUnavailable:
        return End(call, f.error.ok() ? Status::Unavailable("the serving side went away") : f.error);
      case FinishReason::kError:
      default:
        return End(call, f.error.ok() ? Status::Internal("the request failed") : f.error);
    }
  }

  // Cuts the sample's text at the first stop string (true when one was found).
  static bool CheckStop(const Call& call, Sample& sample) {
    if (call.request.stop.empty()) return false;
    const size_t from = sample.emitted > call.max_stop ? sample.emitted - call.max_stop : 0;
    size_t cut = std::string::npos;
    for (const std::string& s : call.request.stop) {
      const size_t at = sample.text.find(s, from);
      if (at != std::string::npos) cut = std::min(cut, at);
    }
    if (cut == std::string::npos) return false;
    sample.text.resize(std::max(cut, sample.emitted));
    return true;
  }

  // How much of the sample's text can be streamed: all but a tail that could still grow into a
  // stop string.
  static size_t SafeEnd(const Call& call, const Sample& sample) {
    const std::string& text = sample.text;
    size_t hold = 0;
    for (const std::string& s : call.request.stop) {
      for (size_t k = std::min(s.size() - 1, text.size()); k > hold; --k) {
        if (text.compare(text.size() - k, k, s, 0, k) == 0) {
          hold = k;
          break;
        }
      }
    }
    size_t end = text.size() - hold;
    // Never split a UTF-8 character (a held-back tail may end inside one).
    while (end > sample.emitted && end < text.size() &&
           (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) {
      --end;
    }
    return std::max(end, sample.emitted);
  }

  void Emit(Call& call, Sample& sample, size_t end) {
    if (end <= sample.emitted) return;
    StartStream(call);
    const std::string_view piece(sample.text.data() + sample.emitted, end - sample.emitted);
    const std::vector<LogprobEntry> logprobs = TakeLogprobs(sample, end);
    call.responder->Write(RenderStreamDelta(call.request.endpoint, call.completion, sample.index,
                                            piece, !sample.sent_delta, logprobs));
    sample.sent_delta = true;
    sample.emitted = end;
  }

  // The token's and its alternatives' bytes; the text offset is filled in by TakeLogprobs.
  Result<LogprobEntry> MakeLogprobEntry(TokenId token, const TokenLogprobs& l) const {
    const tokenizer::Tokenizer& tok = *options_.model.tokenizer;
    LogprobEntry e;
    CHUNKSERVE_ASSIGN_OR_RETURN(e.bytes, tok.TokenBytes(token));
    e.logprob = l.logprob;
    for (const TopLogprob& c : l.top) {
      CHUNKSERVE_ASSIGN_OR_RETURN(std::string bytes, tok.TokenBytes(c.token));
      e.top.emplace_back(std::move(bytes), c.logprob);
    }
    return e;
  }

  // The pending logprobs of the tokens whose text starts before byte `end` of the text, with
  // their text offsets in code points.
  static std::vector<LogprobEntry> TakeLogprobs(Sample& sample, size_t end) {
    std::vector<LogprobEntry> out;
    while (!sample.pending_logprobs.empty() && sample.pending_logprobs.front().first < end) {
      auto& [at, entry] = sample.pending_logprobs.front();
      for (; sample.offset_bytes < at && sample.offset_bytes < sample.text.size();
           ++sample.offset_bytes) {
        // Counts lead bytes: every code point has exactly one byte that is not 10xxxxxx.
        if ((static_cast<unsigned char>(sample.text[sample.offset_bytes]) & 0xC0) != 0x80) {
          ++sample.offset_chars;
        }
      }
      entry.text_offset = sample.offset_chars;
      out.push_back(std::move(entry));
      sample.pending_logprobs.pop_front();
    }
    return out;
  }

  void StartStream(Call& call) {
    if (call.stream_started) return;
    call.stream_started = true;
    call.responder->StartStream(200, "text/event-stream");
  }

  // Forgets a sample's upstream request (a later message for it is ignored).
  void Release(const Sample& sample) { routes_.erase(sample.id); }

  // Upstream requests (one per choice) sent and not ended, or waiting for the link.
  size_t InFlight() const {
    size_t n = routes_.size();
    for (const auto& [call, frames] : waiting_) n += call->done ? 0 : call->samples.size();
    return n;
  }

  // One choice ended well: the rest of its text (streaming) and its finish reason; the call
  // completes with its last choice.
  void SampleDone(Call& call, Sample& sample, std::string finish_reason) {
    if (call.done || sample.done) return;
    sample.done = true;
    sample.finish_reason = std::move(finish_reason);
    Release(sample);
    const Endpoint e = call.request.endpoint;
    if (call.request.stream) {
      Emit(call, sample, sample.text.size());
      StartStream(call);
      if (!sample.sent_delta && e == Endpoint::kChat) {
        call.responder->Write(RenderStreamDelta(e, call.completion, sample.index, "", true));
        sample.sent_delta = true;
      }
      call.responder->Write(
          RenderStreamFinish(e, call.completion, sample.index, sample.finish_reason));
    } else {
      sample.logprobs = TakeLogprobs(sample, sample.text.size());
    }
    if (std::all_of(call.samples.begin(), call.samples.end(),
                    [](const Sample& s) { return s.done; })) {
      Complete(call);
    }
  }

  // A successful end, every choice done: the whole answer (or the end of the stream).
  void Complete(Call& call) {
    if (call.done) return;
    call.done = true;
    Usage& usage = call.completion.usage;
    usage.completion_tokens = 0;
    int32_t cached = -1;  // what every choice found cached (the least)
    for (const Sample& sample : call.samples) {
      usage.completion_tokens += sample.completion_tokens;
      if (sample.cached_tokens >= 0) {
        cached = cached < 0 ? sample.cached_tokens : std::min(cached, sample.cached_tokens);
      }
    }
    usage.cached_tokens = std::max(cached, 0);
    stats_.completion_tokens += static_cast<uint64_t>(usage.completion_tokens);
    const Endpoint e = call.request.endpoint;
    if (call.request.stream) {
      StartStream(call);
      if (call.request.include_usage) {
        call.responder->Write(RenderStreamUsage(e, call.completion));
      }
      call.responder->Write(std::string(kStreamDone));
      call.responder->End();
    } else {
      for (Sample& sample : call.samples) {
        call.completion.choices.push_back(
            {std::move(sample.text), sample.finish_reason, std::move(sample.logprobs)});
      }
      call.responder->Reply({200, "application/json", RenderCompletion(e, call.completion), {}});
    }
  }

  // A failed end: the choices still running are cancelled upstream.
  void End(Call& call, const Status& status) {
    if (call.done) return;
    call.done = true;
    ++stats_.errors;
    for (Sample& sample : call.samples) {
      if (!sample.done) Cancel(sample);
      Release(sample);
    }
    const int http_status = HttpStatusFor(status.code());
    const std::string code = std::string(StatusCodeName(status.code()));
    if (call.stream_started) {
      call.responder->Write(RenderStreamError(status.message(), ErrorType(http_status), code));
      call.responder->Write(std::string(kStreamDone));
      call.responder->End();
    } else {
      call.responder->Reply(ErrorReply(http_status, status.message(), code));
    }
  }

  void Cancel(const Sample& sample) {
    if (upstream_ != nullptr && routes_.count(sample.id) != 0) {
      (void)upstream_->SendBytes(wire::EncodeCancel(sample.id));
    }
  }

  void OnClientGone(Call& call) {
    if (call.done) return;
    call.done = true;
    bool sent = false;
    for (Sample& sample : call.samples) {
      sent |= routes_.count(sample.id) != 0;
      if (!sample.done) Cancel(sample);
      Release(sample);
    }
    if (sent) ++stats_.disconnects;  // else never sent: the link was not up yet
  }

  void FailWaiting(const Status& status) {
    auto waiting = std::move(waiting_);
    waiting_.clear();
    for (auto& [call, frames] : waiting) End(*call, status);
  }

  void FailAll(const Status& status) {
    FailWaiting(status);
    std::vector<std::shared_ptr<Call>> calls;
    for (auto& [id, route] : routes_) calls.push_back(route.call);
    for (auto& call : calls) End(*call, status);
  }

  std::string RandomId() {
    char buf[40];
    std::snprintf(buf, sizeof(buf), "%016" PRIx64 "%08" PRIx64, rng_(), next_id_);
    return buf;
  }

  asio::io_context& io_;
  const GatewayOptions options_;
  std::mt19937_64 rng_;
  const int64_t started_ = static_cast<int64_t>(std::time(nullptr));
  std::shared_ptr<wire::Connection> upstream_;
  bool connecting_ = false;
  bool stopped_ = false;
  uint64_t next_id_ = 1;
  std::unordered_map<uint64_t, Route> routes_;  // upstream request id -> its call and choice
  // Calls whose requests wait for the link to come up.
  std::deque<std::pair<std::shared_ptr<Call>, std::vector<std::vector<uint8_t>>>> waiting_;
  GatewayStats stats_;
};

}  // namespace

int HttpStatusFor(StatusCode code) {
  switch (code) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kOutOfRange:
    case StatusCode::kFailedPrecondition: return 400;
    case StatusCode::kUnauthenticated: return 401;
    case StatusCode::kNotFound: return 404;
    case StatusCode::kResourceExhausted: return 429;
    case StatusCode::kCancelled: return 499;
    case StatusCode::kUnavailable: return 503;
    case StatusCode::kDeadlineExceeded: return 504;
    default: return 500;
  }
}

std::shared_ptr<Gateway> Gateway::Create(asio::io_context& io, GatewayOptions options) {
  return std::make_shared<GatewayImpl>(io, std::move(options));
}

}  // namespace chunkserve::openai
