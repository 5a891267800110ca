// Per-request sampling state: greedy, temperature, top-k, top-p, seeded per request.
//
// Sampler holds one request's generator state. The generator is splitmix64 (explicit, so the
// same seed yields the same tokens with every standard library); each non-greedy sampled token
// consumes exactly one draw (greedy tokens none), so a request's n-th token depends only on its
// seed and its logits. The rule that turns logits and a draw into a token is
// kernels/cpu/sampling.h's, which the CUDA sampler (kernels/cuda/sampling.h) implements too: the
// engine draws here, on the host, and the backend samples next to the logits.
//
// Thread safety: none; one Sampler per request, used by the engine's step thread.
#ifndef CHUNKSERVE_RUNTIME_SCHED_SAMPLER_H_
#define CHUNKSERVE_RUNTIME_SCHED_SAMPLER_H_

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "kernels/cpu/sampling.h"
#include "runtime/base/ids.h"
#include "runtime/sched/request.h"

namespace chunkserve::sched {

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params) : params_(params), state_(params.seed) {}

  // Picks the next token from `logits` ([vocab], fp32) on the host: Draw(), then the rule.
  // Non-finite logits are treated as -inf; when every logit is -inf the lowest id is returned.
  TokenId Sample(std::span<const float> logits);

  // The draw for the next token: 0 (and no draw consumed) when greedy, else NextUniform().
  double Draw() { return kernels::cpu::IsGreedy(rule()) ? 0.0 : NextUniform(); }

  // Uniform double in [0, 1) from the request's generator.
  double NextUniform();

  const SamplingParams& params() const { return params_; }
  kernels::cpu::SamplingRule rule() const {
    return {.temperature = params_.temperature, .top_k = params_.top_k, .top_p = params_.top_p};
  }

 private:
  SamplingParams params_;
  uint64_t state_;
  kernels::cpu::SamplingScratch scratch_;  // reused candidate buffers
};

// argmax with ties to the lowest id; the greedy rule everywhere (engine, tests, reference).
TokenId Argmax(std::span<const float> logits);

}  // namespace chunkserve::sched

#endif  // CHUNKSERVE_RUNTIME_SCHED_SAMPLER_H_
