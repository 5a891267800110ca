// ReferenceCheck: are the tokens an engine generated for a request the tokens the independent
// double-precision reference model (tests/testing/reference_model.h) generates for it, greedy or
// sampled with the request's seed?
//
// Teacher forcing. The reference runs once over prompt + the engine's tokens; its logits at the
// position before generated token i are what the engine should have decided token i from. If
// every engine token is the reference's choice at its position, by induction the engine's output
// IS the reference's own continuation, token for token (ReferenceModel::Greedy for greedy
// requests), and one forward pass per request checks it.
//
// Float32 engine vs double reference. The engine's logits differ from the reference's by float32
// rounding (~1e-5 on these O(1) logits, tests/forward). Where that can decide (two logits within
// 2 * kLogitError for greedy; a sampling boundary within that perturbation for sampled), the
// engine's different choice is counted as a near tie and the check goes on (teacher forcing keeps
// the later positions meaningful). Anything else fails, naming request, position, both tokens and
// the margin. Near ties are rare (a few per thousand tokens at most); Finish() fails when there
// are more, so a bug cannot hide behind them.
//
// Sampled requests. The reference side draws from its own splitmix64 stream seeded with the
// request's seed, one uniform per generated token in token order, and applies the rule of
// kernels/cpu/sampling.h restated independently (in double): candidates by logit descending (ties:
// lower id), the first top_k, softmax of logit / temperature, the shortest prefix whose mass
// reaches top_p, the first token whose running mass exceeds u * kept mass. Exact equality relies
// on that draw order: the engine's Sampler (runtime/sched/sampler.h) consumes exactly one draw per
// non-greedy token of a request, whatever the batch, the steps or preemptions.
#ifndef CHUNKSERVE_TESTS_ENGINE_REFERENCE_CHECK_H_
#define CHUNKSERVE_TESTS_ENGINE_REFERENCE_CHECK_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "runtime/base/ids.h"
#include "runtime/sched/request.h"
#include "tests/testing/reference_model.h"

namespace chunkserve::testing {

// Bound assumed on |engine logit - reference logit|: 50x the float32 error measured in
// tests/forward, far below the gaps a wrong K/V, position or sampling rule produces.
inline constexpr double kLogitError = 5e-4;

// splitmix64, as published (Steele, Lea, Flood 2014), mapped to [0, 1) with 53 bits.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  double Uniform();

 private:
  uint64_t state_;
};

// The token the sampling rule picks from `logits` with draw `u` (greedy: argmax, lowest id).
TokenId ReferenceSample(std::span<const double> logits, const sched::SamplingParams& params,
                        double u);

// Whether some perturbation of `logits` by at most kLogitError each could make the rule pick
// `token` with draw `u` (a conservative bound: true whenever it could).
bool CouldPickUnderRounding(std::span<const double> logits, const sched::SamplingParams& params,
                            double u, TokenId token);

class ReferenceCheck {
 public:
  explicit ReferenceCheck(const ReferenceModel& reference) : reference_(reference) {}

  // Checks `tokens` (what the engine generated for `request`) position by position; failures
  // (gtest non-fatal) name `what`.
  void Expect(const sched::RequestOptions& request, std::span<const TokenId> tokens,
              const std::string& what);

  // Fails when near ties were too many to be float32 rounding. Call once at the end.
  void Finish() const;

  int tokens_checked() const { return tokens_checked_; }
  int near_ties() const { return near_ties_; }
  // Sampled positions where the reference's sampled token is not its argmax: a sampled test whose
  // draws never left the argmax would not have tested sampling.
  int sampled_off_argmax() const { return sampled_off_argmax_; }

 private:
  const ReferenceModel& reference_;
  int tokens_checked_ = 0;
  int near_ties_ = 0;
  int sampled_off_argmax_ = 0;
};

}  // namespace chunkserve::testing

#endif  // CHUNKSERVE_TESTS_ENGINE_REFERENCE_CHECK_H_
