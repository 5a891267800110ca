// Log-probabilities of a generated token, as a request may ask for them (OpenAI's `logprobs`):
// the sampled token's log-probability and the most likely alternatives at its position, all
// under the model's own distribution softmax(logits), before temperature and top-k / top-p.
#ifndef CHUNKSERVE_RUNTIME_BASE_LOGPROBS_H_
#define CHUNKSERVE_RUNTIME_BASE_LOGPROBS_H_

#include <cstdint>
#include <vector>

#include "runtime/base/ids.h"

namespace chunkserve {

// The most alternatives a request may ask for (OpenAI's top_logprobs limit).
inline constexpr int32_t kMaxTopLogprobs = 20;

struct TopLogprob {
  TokenId token = 0;
  float logprob = 0;
  friend bool operator==(const TopLogprob&, const TopLogprob&) = default;
};

struct TokenLogprobs {
  float logprob = 0;            // of the generated token; -inf when it had probability 0
  std::vector<TopLogprob> top;  // most likely first (ties: lower id first); <= kMaxTopLogprobs
  friend bool operator==(const TokenLogprobs&, const TokenLogprobs&) = default;
};

}  // namespace chunkserve

#endif  // CHUNKSERVE_RUNTIME_BASE_LOGPROBS_H_
