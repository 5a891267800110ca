// Gateway: the OpenAI-compatible HTTP API in front of a worker or a router.
//
//   GET  /v1/models              the served model
//   POST /v1/completions         text (or token ids) in, text out; stream: true for SSE
//   POST /v1/chat/completions    messages rendered with the model's chat template
//
// A request for n choices is n upstream requests with the same prompt (the engine's prefix tree
// computes it once), sampled with seeds seed + i; their texts, stream chunks (by index) and
// finish reasons are kept apart, their usage summed.
//
// The gateway is a wire client of its own process: it tokenizes, sends the token ids to the
// process's wire port (one multiplexed connection on loopback, authenticated as a client when the
// cluster has a secret) and detokenizes what comes back. So admission, deadlines, routing,
// migration and cancellation have one implementation, whether a request came as text over HTTP
// or as token ids over the wire, and the router routes text by its token ids like any request.
// A client that disconnects cancels its request upstream (its chunks are freed).
//
// Text out: a streaming detokenizer (never half a UTF-8 character), stop strings cut the text
// where they begin (and cancel the request), stop token ids and the model's EOS ids end it (not
// shown). Streams hold back text that could still become a stop string.
//
// Errors use OpenAI's JSON shape: 400 bad input, 401 missing or wrong API key, 404 unknown model
// or path, 429 overloaded (retryable), 503 unavailable (retryable), 504 deadline, 500 otherwise. A
// stream that fails after it started ends with an error event and [DONE].
//
// Thread safety: everything on the process's io_context thread.
#ifndef CHUNKSERVE_RUNTIME_OPENAI_GATEWAY_H_
#define CHUNKSERVE_RUNTIME_OPENAI_GATEWAY_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/base/ids.h"
#include "runtime/base/status.h"
#include "runtime/http/server.h"
#include "runtime/tokenizer/model_text.h"
#include "runtime/wire/asio.h"
#include "runtime/wire/auth.h"
#include "runtime/wire/tls.h"

namespace chunkserve::openai {

struct GatewayOptions {
  tokenizer::ModelText model;  // name, tokenizer, chat template, EOS ids, context length
  // The process's own wire port.
  std::string upstream_host = "127.0.0.1";
  uint16_t upstream_port = 0;
  std::optional<wire::ClientAuth> upstream_auth;  // when the wire port challenges clients
  std::shared_ptr<wire::TlsContext> upstream_tls;  // when the wire port requires TLS
  std::string upstream_tls_host;
  // Non-empty: requests must carry "Authorization: Bearer <api_key>" (else 401).
  std::string api_key;
  // The deadline each request gets upstream (504 when it passes).
  std::chrono::milliseconds request_timeout{600000};
  // Upstream requests in flight through this gateway (one per choice); a request whose choices
  // would pass it gets 429.
  size_t max_in_flight = 8192;
};

struct GatewayStats {
  uint64_t requests = 0;       // /v1 generation requests accepted for serving
  uint64_t errors = 0;         // answered with an error status or error event
  uint64_t disconnects = 0;    // cancelled because the client went away
  uint64_t in_flight = 0;      // upstream requests (one per choice) sent or waiting
  uint64_t prompt_tokens = 0;
  uint64_t completion_tokens = 0;
};

class Gateway {
 public:
  static std::shared_ptr<Gateway> Create(asio::io_context& io, GatewayOptions options);
  virtual ~Gateway() = default;
  // Answers /v1/... requests; false (untouched) for other paths.
  virtual bool Handle(http::Request& request, const std::shared_ptr<http::Responder>& responder) = 0;
  // Fails what is in flight (503) and closes the upstream link.
  virtual void Stop() = 0;
  virtual GatewayStats stats() const = 0;
};

// The HTTP status for a Status code (see above).
int HttpStatusFor(StatusCode code);

}  // namespace chunkserve::openai

#endif  // CHUNKSERVE_RUNTIME_OPENAI_GATEWAY_H_
