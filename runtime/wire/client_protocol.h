// The client protocol's request messages (Generate, Token, Finish, Cancel) as plain values, and the
// one place they are encoded and decoded. Every sender and receiver uses these: the worker, the
// router (both towards clients and towards workers), the C ABI's remote client and the load
// generator.
//
// Decoding validates what any receiver must check, whatever serves the request: a Generate needs
// a non-empty prompt, token ids that fit TokenId (int32), maxNewTokens >= 1 and logprobs in
// [-1, kMaxTopLogprobs]; a Token's logprobs, at most kMaxTopLogprobs alternatives with ids that
// fit TokenId. Sampling values,
// token ids against the model's vocabulary and lengths against its context are the engine's to
// check (sched::ValidateRequest), where the request is served. Errors are InvalidArgument naming the field. A
// Finish with a reason or error code this build does not know decodes as an error / internal.
//
// Thread safety: plain functions of their arguments.
#ifndef CHUNKSERVE_RUNTIME_WIRE_CLIENT_PROTOCOL_H_
#define CHUNKSERVE_RUNTIME_WIRE_CLIENT_PROTOCOL_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runtime/base/finish_reason.h"
#include "runtime/base/ids.h"
#include "runtime/base/logprobs.h"
#include "runtime/base/status.h"
#include "runtime/wire/chunkserve.capnp.h"

namespace chunkserve::wire {

struct SamplingMessage {
  float temperature = 0;  // 0: greedy
  int32_t top_k = 0;      // 0: no limit
  float top_p = 1;        // 1: no limit
  uint64_t seed = 0;
};

struct GenerateMessage {
  uint64_t request_id = 0;
  std::vector<TokenId> prompt;
  std::optional<SamplingMessage> sampling;  // absent: greedy
  int32_t max_new_tokens = 16;
  std::vector<TokenId> stop_tokens;
  uint32_t deadline_ms = 0;  // relative, from receipt; 0: none
  int32_t priority = 0;
  int32_t logprobs = -1;  // -1: none; else [0, kMaxTopLogprobs] alternatives per token
};

struct TokenMessage {
  uint64_t request_id = 0;
  TokenId token = 0;
  int32_t index = 0;  // 0-based position among the generated tokens
  std::optional<TokenLogprobs> logprobs;  // when the Generate asked for them
};

struct FinishMessage {
  uint64_t request_id = 0;
  FinishReason reason = FinishReason::kLength;
  Status error;  // OK unless reason is error / unavailable (or another failure)
  int32_t prompt_tokens = 0;
  int32_t cached_tokens = 0;
  int32_t generated_tokens = 0;
};

std::vector<uint8_t> EncodeGenerate(const GenerateMessage& m);
Result<GenerateMessage> DecodeGenerate(schema::Generate::Reader g);

std::vector<uint8_t> EncodeToken(const TokenMessage& m);
Result<TokenMessage> DecodeToken(schema::Token::Reader t);

std::vector<uint8_t> EncodeFinish(const FinishMessage& m);
FinishMessage DecodeFinish(schema::Finish::Reader f);

std::vector<uint8_t> EncodeCancel(uint64_t request_id);

}  // namespace chunkserve::wire

#endif  // CHUNKSERVE_RUNTIME_WIRE_CLIENT_PROTOCOL_H_
