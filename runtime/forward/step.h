// StepBatch: one engine step as the model definition runs it (a mixed batch of decode and
// prefill tokens), and the checks every step passes before any backend operation runs.
//
// A step's tokens are concatenated:
//
//   rows [0, num_decode)                  one decode token per sequence, in the TPP plan's order
//   rows [num_decode, num_tokens)         prefill segments, each a run of one sequence's tokens
//
// Every token's K/V are written to (kv_slot[i], kv_offset[i]) in every layer before attention
// runs, so a query attends to its own key. Decode rows attend through the TPP plan; a prefill
// segment's tokens attend to the sequence's whole chunk path (cached prefix, earlier segments and
// this one) with a causal mask by position. KV copies (copy-on-write and partial-prefix reuse
// from the prefix tree) run before anything else.
#ifndef CHUNKSERVE_RUNTIME_FORWARD_STEP_H_
#define CHUNKSERVE_RUNTIME_FORWARD_STEP_H_

#include <cstdint>
#include <span>

#include "kernels/attention_params.h"
#include "runtime/backend/backend.h"
#include "runtime/base/ids.h"
#include "runtime/base/status.h"

namespace chunkserve::forward {

// Copy positions [0, num_tokens) of every layer's K and V from slot src to slot dst.
struct KvCopyOp {
  int32_t src_slot = 0;
  int32_t dst_slot = 0;
  int32_t num_tokens = 0;
};

struct PrefillSegment {
  int32_t token_begin = 0;  // first row of the segment in the step's token arrays
  int32_t num_tokens = 0;
  // The sequence's chunk path after this step's appends, in order: chunk k covers positions
  // [k * chunk_size, k * chunk_size + chunk_len[k]).
  std::span<const int32_t> chunk_slots;
  std::span<const int32_t> chunk_lens;
};

struct StepBatch {
  std::span<const TokenId> tokens;     // [num_tokens]
  std::span<const int32_t> positions;  // [num_tokens] absolute positions
  std::span<const int32_t> kv_slot;    // [num_tokens]
  std::span<const int32_t> kv_offset;  // [num_tokens]
  int32_t num_decode = 0;
  kernels::TppPlanView decode_plan;  // rows == the decode rows, num_seqs == num_decode
  std::span<const PrefillSegment> prefill;
  std::span<const int32_t> logit_rows;  // rows whose logits (or tokens) the engine wants
  std::span<const KvCopyOp> kv_copies;
};

// The structural checks of a step (every rank and backend refuses exactly the same batches):
// array sizes agree, decode rows match the plan, token ids are below `vocab_size`, positions and
// slots lie in the arena, prefill segments tile the rows after the decode rows, logit rows exist,
// KV copies stay in the arena (source and destination distinct, at most one chunk).
// InvalidArgument naming the first problem.
Status ValidateStepBatch(const StepBatch& batch, const backend::KvArenaShape& shape,
                         int32_t vocab_size);

}  // namespace chunkserve::forward

#endif  // CHUNKSERVE_RUNTIME_FORWARD_STEP_H_
