// Token sampling from one row of fp32 logits on the CPU: the rule every chunkserve sampler follows
// (kernels/cuda/sampling.h implements the same rule on the device), given the row's uniform draw.
//
//  - greedy (temperature == 0 or top_k == 1): the largest logit, ties to the lowest id; NaN never
//    wins; when no logit is above -inf, token 0.
//  - otherwise: candidates are the finite logits times 1 / temperature (fp32), ordered by value
//    descending then id ascending; top_k > 0 keeps the first top_k; probabilities are
//    exp(x - max) in fp64 over those; top_p < 1 keeps the shortest prefix whose normalized mass
//    reaches top_p (at least one token); the token is the first whose running sum exceeds
//    u * (kept mass), u in [0, 1) being the row's uniform draw. No finite logit: token 0.
//
// The draw is an argument, not state: the caller owns the random stream (runtime/sched/sampler.h:
// one splitmix64 draw per sampled token), so CPU and CUDA backends pick the same tokens from the
// same logits and seed.
#ifndef CHUNKSERVE_KERNELS_CPU_SAMPLING_H_
#define CHUNKSERVE_KERNELS_CPU_SAMPLING_H_

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace chunkserve::kernels::cpu {

struct SamplingRule {
  float temperature = 0.0f;  // >= 0; 0 is greedy
  int32_t top_k = 0;         // <= 0: no top-k filter
  float top_p = 1.0f;        // >= 1: no top-p filter
};

inline bool IsGreedy(const SamplingRule& r) { return r.temperature == 0.0f || r.top_k == 1; }

// argmax with ties to the lowest id; NaN never wins; 0 when nothing is above -inf.
int32_t ArgmaxToken(std::span<const float> logits);

// Reusable candidate buffers, so that sampling a row allocates nothing in steady state.
struct SamplingScratch {
  std::vector<std::pair<float, int32_t>> candidates;
  std::vector<double> probs;
};

// The token `rule` picks from `logits` given the draw `u` in [0, 1) (ignored when greedy).
int32_t SampleToken(std::span<const float> logits, const SamplingRule& rule, double u,
                    SamplingScratch* scratch);

// Log-probabilities under the model's own distribution softmax(logits) — before temperature and
// the top-k / top-p filters, as OpenAI's API reports them — computed in fp64 over the finite
// logits (a non-finite logit has probability 0, log -inf). Returns log p(token) and writes the
// min(k, number of finite logits) most likely tokens, by logit descending then id ascending, to
// top_ids / top_logprobs (each with room for k) and their number to *top_count. No finite logit:
// -inf and no top tokens.
float TokenLogprobs(std::span<const float> logits, int32_t token, int32_t k, int32_t* top_ids,
                    float* top_logprobs, int32_t* top_count, SamplingScratch* scratch);

}  // namespace chunkserve::kernels::cpu

#endif  // CHUNKSERVE_KERNELS_CPU_SAMPLING_H_
