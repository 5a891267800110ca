#include "runtime/wire/client_protocol.h"

#include <capnp/message.h>

#include <string>

#include "runtime/wire/messages.h"

namespace chunkserve::wire {
namespace {

using schema::Envelope;

// Copies a list of wire token ids, refusing ids that do not fit TokenId.
Status ReadTokens(capnp::List<uint32_t>::Reader in, const char* field, std::vector<TokenId>* out) {
  out->reserve(in.size());
  for (uint32_t t : in) {
    if (t > static_cast<uint32_t>(INT32_MAX)) {
      return Status::InvalidArgument(std::string(field) + ": token id " + std::to_string(t) +
                                     " out of range");
    }
    out->push_back(static_cast<TokenId>(t));
  }
  return Status::Ok();
}

void WriteTokens(const std::vector<TokenId>& in, capnp::List<uint32_t>::Builder out) {
  for (size_t i = 0; i < in.size(); ++i) {
    out.set(static_cast<unsigned>(i), static_cast<uint32_t>(in[i]));
  }
}

}  // namespace

std::vector<uint8_t> EncodeGenerate(const GenerateMessage& m) {
  capnp::MallocMessageBuilder builder;
  auto g = builder.initRoot<Envelope>().initGenerate();
  g.setRequestId(m.request_id);
  WriteTokens(m.prompt, g.initPrompt(static_cast<unsigned>(m.prompt.size())));
  if (m.sampling) {
    auto s = g.initSampling();
    s.setTemperature(m.sampling->temperature);
    s.setTopK(m.sampling->top_k);
    s.setTopP(m.sampling->top_p);
    s.setSeed(m.sampling->seed);
  }
  g.setMaxNewTokens(m.max_new_tokens);
  if (!m.stop_tokens.empty()) {
    WriteTokens(m.stop_tokens, g.initStopTokens(static_cast<unsigned>(m.stop_tokens.size())));
  }
  g.setDeadlineMs(m.deadline_ms);
  g.setPriority(m.priority);
  g.setLogprobs(m.logprobs);
  return EncodeOrEmpty(builder);
}

Result<GenerateMessage> DecodeGenerate(schema::Generate::Reader g) {
  GenerateMessage m;
  m.request_id = g.getRequestId();
  if (g.getPrompt().size() == 0) return Status::InvalidArgument("prompt: empty");
  CHUNKSERVE_RETURN_IF_ERROR(ReadTokens(g.getPrompt(), "prompt", &m.prompt));
  CHUNKSERVE_RETURN_IF_ERROR(ReadTokens(g.getStopTokens(), "stopTokens", &m.stop_tokens));
  if (g.hasSampling()) {
    auto s = g.getSampling();
    m.sampling = SamplingMessage{s.getTemperature(), s.getTopK(), s.getTopP(), s.getSeed()};
  }
  m.max_new_tokens = g.getMaxNewTokens();
  if (m.max_new_tokens < 1) return Status::InvalidArgument("maxNewTokens must be >= 1");
  m.deadline_ms = g.getDeadlineMs();
  m.priority = g.getPriority();
  m.logprobs = g.getLogprobs();
  if (m.logprobs < -1 || m.logprobs > kMaxTopLogprobs) {
    return Status::InvalidArgument("logprobs must be -1 or in [0, " +
                                   std::to_string(kMaxTopLogprobs) + "], got " +
                                   std::to_string(m.logprobs));
  }
  return m;
}

std::vector<uint8_t> EncodeToken(const TokenMessage& m) {
  capnp::MallocMessageBuilder builder;
  auto t = builder.initRoot<Envelope>().initToken();
  t.setRequestId(m.request_id);
  t.setToken(static_cast<uint32_t>(m.token));
  t.setIndex(m.index);
  if (m.logprobs) {
    auto l = t.initLogprobs();
    l.setLogprob(m.logprobs->logprob);
    auto top = l.initTop(static_cast<unsigned>(m.logprobs->top.size()));
    for (size_t i = 0; i < m.logprobs->top.size(); ++i) {
      top[static_cast<unsigned>(i)].setToken(static_cast<uint32_t>(m.logprobs->top[i].token));
      top[static_cast<unsigned>(i)].setLogprob(m.logprobs->top[i].logprob);
    }
  }
  return EncodeOrEmpty(builder);
}

Result<TokenMessage> DecodeToken(schema::Token::Reader t) {
  if (t.getToken() > static_cast<uint32_t>(INT32_MAX)) {
    return Status::InvalidArgument("token: id " + std::to_string(t.getToken()) + " out of range");
  }
  TokenMessage m{t.getRequestId(), static_cast<TokenId>(t.getToken()), t.getIndex(), {}};
  if (t.hasLogprobs()) {
    auto l = t.getLogprobs();
    if (l.getTop().size() > static_cast<unsigned>(kMaxTopLogprobs)) {
      return Status::InvalidArgument("token: " + std::to_string(l.getTop().size()) +
                                     " top logprobs, at most " + std::to_string(kMaxTopLogprobs));
    }
    TokenLogprobs& out = m.logprobs.emplace();
    out.logprob = l.getLogprob();
    for (auto c : l.getTop()) {
      if (c.getToken() > static_cast<uint32_t>(INT32_MAX)) {
        return Status::InvalidArgument("token: top logprob id " + std::to_string(c.getToken()) +
                                       " out of range");
      }
      out.top.push_back({static_cast<TokenId>(c.getToken()), c.getLogprob()});
    }
  }
  return m;
}

std::vector<uint8_t> EncodeFinish(const FinishMessage& m) {
  capnp::MallocMessageBuilder builder;
  auto f = builder.initRoot<Envelope>().initFinish();
  f.setRequestId(m.request_id);
  f.setReason(static_cast<schema::FinishReason>(m.reason));
  f.setErrorCode(ToWireErrorCode(m.error.code()));
  f.setErrorMessage(std::string(m.error.message()));
  f.setPromptTokens(m.prompt_tokens);
  f.setCachedTokens(m.cached_tokens);
  f.setGeneratedTokens(m.generated_tokens);
  return EncodeOrEmpty(builder);
}

FinishMessage DecodeFinish(schema::Finish::Reader f) {
  FinishMessage m;
  m.request_id = f.getRequestId();
  const auto reason = static_cast<int32_t>(f.getReason());
  m.reason = reason >= 0 && reason <= static_cast<int32_t>(FinishReason::kUnavailable)
                 ? static_cast<FinishReason>(reason)
                 : FinishReason::kError;
  if (f.getErrorCode() != schema::ErrorCode::OK) {
    m.error = Status(FromWireErrorCode(f.getErrorCode()), f.getErrorMessage().cStr());
  }
  m.prompt_tokens = f.getPromptTokens();
  m.cached_tokens = f.getCachedTokens();
  m.generated_tokens = f.getGeneratedTokens();
  return m;
}

std::vector<uint8_t> EncodeCancel(uint64_t request_id) {
  capnp::MallocMessageBuilder builder;
  builder.initRoot<Envelope>().initCancel().setRequestId(request_id);
  return EncodeOrEmpty(builder);
}

}  // namespace chunkserve::wire
