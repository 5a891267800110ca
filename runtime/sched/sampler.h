// Token sampling on the host: greedy, temperature, top-k, top-p, seeded per request.
//
// Sampler holds one request's generator state. The generator is splitmix64 (explicit, so the
// same seed yields the same tokens with every standard library); each sampled token consumes
// exactly one draw, so a request's n-th token depends only on its seed and its logits.
//
// Thread safety: none; one Sampler per request, used by the engine's step thread.
#ifndef CHUNKSERVE_RUNTIME_SCHED_SAMPLER_H_
#define CHUNKSERVE_RUNTIME_SCHED_SAMPLER_H_

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "runtime/base/ids.h"
#include "runtime/sched/request.h"

namespace chunkserve::sched {

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params) : params_(params), state_(params.seed) {}

  // Picks the next token from `logits` ([vocab], fp32). Non-finite logits are treated as -inf;
  // when every logit is -inf the lowest id is returned.
  TokenId Sample(std::span<const float> logits);

  // Uniform double in [0, 1) from the request's generator.
  double NextUniform();

  const SamplingParams& params() const { return params_; }

 private:
  SamplingParams params_;
  uint64_t state_;
  std::vector<std::pair<float, TokenId>> scratch_;  // reused candidate buffer
  std::vector<double> probs_;                        // reused probability buffer
};

// argmax with ties to the lowest id; the greedy rule everywhere (engine, tests, reference).
TokenId Argmax(std::span<const float> logits);

}  // namespace chunkserve::sched

#endif  // CHUNKSERVE_RUNTIME_SCHED_SAMPLER_H_
