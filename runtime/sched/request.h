// What a client asks the engine for, and what it gets back.
//
// A request is a prompt of token ids plus sampling and stopping rules. The engine answers with a
// stream of generated tokens and exactly one terminal event (FinishInfo).
#ifndef CHUNKSERVE_RUNTIME_SCHED_REQUEST_H_
#define CHUNKSERVE_RUNTIME_SCHED_REQUEST_H_

#include <chrono>
#include <cstdint>
#include <optional>
#include <vector>

#include "runtime/base/finish_reason.h"
#include "runtime/base/ids.h"
#include "runtime/base/logprobs.h"
#include "runtime/base/status.h"

namespace chunkserve::sched {

using Clock = std::chrono::steady_clock;

// Sampling rules. temperature == 0 is greedy (argmax, ties to the lowest id); otherwise logits
// are divided by temperature, restricted to the top_k most likely tokens (0: no limit), then to
// the smallest set whose probability reaches top_p (1: no limit), and sampled with a generator
// seeded by `seed`, so equal requests with equal seeds generate equal tokens.
struct SamplingParams {
  float temperature = 0.0f;  // >= 0
  int32_t top_k = 0;         // >= 0
  float top_p = 1.0f;        // in (0, 1]
  uint64_t seed = 0;
};

struct RequestOptions {
  std::vector<TokenId> prompt;          // non-empty, every id in [0, vocab)
  SamplingParams sampling;
  int32_t max_new_tokens = 16;          // >= 1
  std::vector<TokenId> stop_tokens;     // generating one of these ends the request (kStopToken)
  std::optional<Clock::time_point> deadline;  // past it the request ends with kDeadline
  int32_t priority = 0;                 // higher runs first and is preempted last
  // -1: none; k in [0, kMaxTopLogprobs]: every generated token comes with its log-probability
  // and the k most likely tokens at its position (runtime/base/logprobs.h).
  int32_t logprobs = -1;
};

// Validates a request against the model: returns InvalidArgument naming the first problem.
Status ValidateRequest(const RequestOptions& request, int32_t vocab_size, int32_t max_context);

// The terminal event of a request.
struct FinishInfo {
  FinishReason reason = FinishReason::kError;
  Status error{};                 // non-OK only with kError / kUnavailable
  int32_t prompt_tokens = 0;      // tokens in the prompt
  int32_t cached_tokens = 0;      // prompt tokens whose KV came from the prefix cache
  int32_t generated_tokens = 0;   // tokens streamed to the client
  // Seconds from submission to the request's first admission into the running batch (its queue
  // time; preemption does not add to it); negative when it was never admitted.
  double queue_seconds = -1;
};

}  // namespace chunkserve::sched

#endif  // CHUNKSERVE_RUNTIME_SCHED_REQUEST_H_
