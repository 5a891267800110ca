#include "runtime/sched/request.h"

#include <cmath>
#include <string>

namespace chunkserve::sched {

Status ValidateRequest(const RequestOptions& r, int32_t vocab_size, int32_t max_context) {
  if (r.prompt.empty()) return Status::InvalidArgument("empty prompt");
  for (size_t i = 0; i < r.prompt.size(); ++i) {
    const TokenId t = r.prompt[i];
    if (t < 0 || t >= vocab_size) {
      return Status::InvalidArgument("prompt token " + std::to_string(i) + " has id " +
                                     std::to_string(t) + ", outside [0, " +
                                     std::to_string(vocab_size) + ")");
    }
  }
  for (TokenId t : r.stop_tokens) {
    if (t < 0 || t >= vocab_size) {
      return Status::InvalidArgument("stop token id " + std::to_string(t) + " outside [0, " +
                                     std::to_string(vocab_size) + ")");
    }
  }
  if (r.max_new_tokens < 1) {
    return Status::InvalidArgument("max_new_tokens must be >= 1, got " +
                                   std::to_string(r.max_new_tokens));
  }
  if (max_context > 0 && static_cast<int64_t>(r.prompt.size()) >= max_context) {
    return Status::InvalidArgument("prompt of " + std::to_string(r.prompt.size()) +
                                   " tokens leaves no room in the context of " +
                                   std::to_string(max_context));
  }
  // A prompt that fits but would overflow with max_new_tokens is accepted: it ends with kLength.
  const SamplingParams& s = r.sampling;
  if (!std::isfinite(s.temperature) || s.temperature < 0.0f) {
    return Status::InvalidArgument("temperature must be a finite value >= 0");
  }
  if (s.top_k < 0) return Status::InvalidArgument("top_k must be >= 0");
  if (!(s.top_p > 0.0f && s.top_p <= 1.0f)) {
    return Status::InvalidArgument("top_p must be in (0, 1]");
  }
  if (r.logprobs < -1 || r.logprobs > kMaxTopLogprobs) {
    return Status::InvalidArgument("logprobs must be -1 (none) or in [0, " +
                                   std::to_string(kMaxTopLogprobs) + "], got " +
                                   std::to_string(r.logprobs));
  }
  return Status::Ok();
}

}  // namespace chunkserve::sched
