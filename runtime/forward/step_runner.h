// StepRunner: what the engine runs a step on. One implementation computes (LlamaModel, the model
// definition over a Backend); the tensor-parallel leader (runtime/parallel/tp_runner.h) wraps one
// to drive a group of ranks.
//
//   runner->ForwardSample(batch, rows, tokens, logprobs);  // the engine's path: tokens (and
//                                  // logprobs where asked), sampled on the backend by the logits
//   runner->Forward(batch, logits);  // logits to the host (tests, references)
//
// Thread safety: none; used from the engine's step thread only.
#ifndef CHUNKSERVE_RUNTIME_FORWARD_STEP_RUNNER_H_
#define CHUNKSERVE_RUNTIME_FORWARD_STEP_RUNNER_H_

#include <cstdint>
#include <span>
#include <string>

#include "runtime/backend/backend.h"
#include "runtime/base/ids.h"
#include "runtime/base/status.h"
#include "runtime/forward/step.h"

namespace chunkserve::forward {

class StepRunner {
 public:
  virtual ~StepRunner() = default;

  virtual std::string name() const = 0;  // "cpu", "cuda", "cpu-tp2", ...
  virtual const backend::KvArenaShape& kv_shape() const = 0;
  virtual int32_t vocab_size() const = 0;
  // Bytes of weights this runner keeps resident (host or device; under tensor parallelism, the
  // leader rank's share). 0 when unknown.
  virtual uint64_t weight_bytes() const { return 0; }

  // Runs the step; writes logits for each of batch.logit_rows, in that order, to `logits`
  // ([logit_rows.size(), vocab_size], fp32). InvalidArgument on a malformed batch; Internal or
  // Unavailable when the device fails.
  virtual Status Forward(const StepBatch& batch, std::span<float> logits) = 0;

  // Runs the step and samples one token per logit row (rows[i] for batch.logit_rows[i]) on the
  // backend; only the token ids reach the host, and logprobs[i] for each row that asks for them
  // (`logprobs` may be empty when none does).
  virtual Status ForwardSample(const StepBatch& batch, std::span<const backend::SampleRow> rows,
                               std::span<TokenId> tokens, std::span<TokenLogprobs> logprobs) = 0;
};

}  // namespace chunkserve::forward

#endif  // CHUNKSERVE_RUNTIME_FORWARD_STEP_RUNNER_H_
