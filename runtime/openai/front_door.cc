#include "runtime/openai/front_door.h"

#include <sstream>
#include <utility>

namespace chunkserve::openai {

GatewayOptions GatewayOptionsFor(tokenizer::ModelText model, const std::string& host,
                                 uint16_t port, const wire::ConnectionOptions& wire_side,
                                 std::shared_ptr<wire::TlsContext> tls, std::string api_key) {
  GatewayOptions o;
  o.model = std::move(model);
  // A wildcard listen address is reached on loopback.
  o.upstream_host = host == "0.0.0.0" ? "127.0.0.1" : host == "::" ? "::1" : host;
  o.upstream_port = port;
  if (wire_side.server_auth != nullptr && wire_side.server_auth->enabled()) {
    const wire::AuthKeys& keys = *wire_side.server_auth;
    o.upstream_auth = wire::ClientAuth{
        keys.client_token.empty() ? keys.cluster_secret : keys.client_token,
        wire::schema::AuthRole::CLIENT};
  }
  if (wire_side.tls != nullptr) {
    o.upstream_tls = std::move(tls);
    o.upstream_tls_host = o.upstream_host;
  }
  o.api_key = std::move(api_key);
  return o;
}

namespace {

std::string GatewayMetrics(const GatewayStats& s) {
  std::ostringstream out;
  auto counter = [&](const char* name, const char* help, uint64_t v) {
    out << "# HELP " << name << " " << help << "\n# TYPE " << name << " counter\n"
        << name << " " << v << "\n";
  };
  counter("chunkserve_http_generate_requests_total", "OpenAI API generation requests served.",
          s.requests);
  counter("chunkserve_http_errors_total", "OpenAI API requests answered with an error.", s.errors);
  counter("chunkserve_http_disconnects_total",
          "OpenAI API requests cancelled because the client went away.", s.disconnects);
  counter("chunkserve_http_prompt_tokens_total", "Prompt tokens of OpenAI API requests.",
          s.prompt_tokens);
  counter("chunkserve_http_completion_tokens_total", "Tokens generated for OpenAI API requests.",
          s.completion_tokens);
  out << "# HELP chunkserve_http_in_flight OpenAI API requests in flight upstream (one per "
         "choice).\n"
      << "# TYPE chunkserve_http_in_flight gauge\nchunkserve_http_in_flight " << s.in_flight
      << "\n";
  return out.str();
}

}  // namespace

http::Handler FrontDoorHandler(std::shared_ptr<Gateway> gateway, ProbeHandler probes) {
  return [gateway = std::move(gateway), probes = std::move(probes)](
             http::Request request, std::shared_ptr<http::Responder> responder) {
    if (request.path.rfind("/v1/", 0) == 0) {
      if (gateway != nullptr && gateway->Handle(request, responder)) return;
      responder->Reply({404, "application/json",
                        http::ErrorBody("this process serves no OpenAI API: it has no tokenizer "
                                        "for its model (see --tokenizer / --model)",
                                        "not_found_error", "not_found"),
                        {}});
      return;
    }
    if (request.method != "GET" && request.method != "HEAD") {
      responder->Reply({405, "text/plain", "method not allowed\n", {{"Allow", "GET, HEAD"}}});
      return;
    }
    http::Reply reply = probes(request.path);
    if (request.path == "/metrics" && reply.status == 200 && gateway != nullptr) {
      reply.body += GatewayMetrics(gateway->stats());
    }
    responder->Reply(std::move(reply));
  };
}

void FrontDoor::Start(asio::io_context& io, asio::ip::tcp::acceptor& acceptor,
                      const Options& options, ProbeHandler probes) {
  if (options.model_text != nullptr) {
    gateway_ = Gateway::Create(io, GatewayOptionsFor(*options.model_text, options.wire_host,
                                                     options.wire_port, options.wire_side,
                                                     options.tls_client, options.api_key));
  }
  http_ = http::HttpServer::Start(acceptor, {}, FrontDoorHandler(gateway_, std::move(probes)));
}

void FrontDoor::Stop() {
  if (gateway_ != nullptr) gateway_->Stop();
  if (http_ != nullptr) http_->Stop();
}

}  // namespace chunkserve::openai
