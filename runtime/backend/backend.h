// Backend: runs one model forward step over a mixed batch, and owns the KV arena.
//
// The engine plans on the host (which tokens run, where their K/V go, which chunks each query
// attends to) and hands the backend one StepBatch per step. A step's tokens are concatenated:
//
//   rows [0, num_decode)                  one decode token per sequence, in the TPP plan's order
//   rows [num_decode, num_tokens)         prefill segments, each a run of one sequence's tokens
//
// Every token's K/V are written to (kv_slot[i], kv_offset[i]) in every layer before attention
// runs, so a query attends to its own key. Decode rows attend through the TPP plan; a prefill
// segment's tokens attend to the sequence's whole chunk path (cached prefix, earlier segments and
// this one) with a causal mask by position. KV copies (copy-on-write and partial-prefix reuse
// from the prefix tree) run before anything else.
//
// Thread safety: none; used from the engine's step thread only.
#ifndef CHUNKSERVE_RUNTIME_BACKEND_BACKEND_H_
#define CHUNKSERVE_RUNTIME_BACKEND_BACKEND_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "kernels/attention_params.h"
#include "runtime/base/ids.h"
#include "runtime/base/status.h"

namespace chunkserve::backend {

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
  std::span<const TokenId> tokens;      // [num_tokens]
  std::span<const int32_t> positions;   // [num_tokens] absolute positions
  std::span<const int32_t> kv_slot;     // [num_tokens]
  std::span<const int32_t> kv_offset;   // [num_tokens]
  int32_t num_decode = 0;
  kernels::TppPlanView decode_plan;     // rows == the decode rows, num_seqs == num_decode
  std::span<const PrefillSegment> prefill;
  std::span<const int32_t> logit_rows;  // rows whose logits the engine samples from
  std::span<const KvCopyOp> kv_copies;
};

struct KvArenaShape {
  int32_t num_layers = 0;
  int32_t num_slots = 0;
  int32_t num_kv_heads = 0;
  int32_t chunk_size = 0;
  int32_t head_dim = 0;
  kernels::DType dtype = kernels::DType::kF32;

  // K and V of one slot across all layers.
  uint64_t slot_bytes() const {
    return 2ull * num_layers * num_kv_heads * chunk_size * head_dim * kernels::DTypeSize(dtype);
  }
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual std::string name() const = 0;
  virtual const KvArenaShape& kv_shape() const = 0;
  virtual int32_t vocab_size() const = 0;

  // Runs the step; writes logits for each of batch.logit_rows, in that order, to `logits`
  // ([logit_rows.size(), vocab_size], fp32). InvalidArgument on a malformed batch; Internal or
  // Unavailable when the device fails.
  virtual Status Forward(const StepBatch& batch, std::span<float> logits) = 0;
};

// The structural checks every backend runs before a step (both backends call it, so they refuse
// exactly the same batches): array sizes agree, decode rows match the plan, token ids are below
// `vocab_size`, positions and slots lie in the arena, prefill segments tile the rows after the
// decode rows, logit rows exist and `logits_size` holds them, KV copies stay in the arena (source
// and destination distinct, at most one chunk). InvalidArgument naming the first problem.
Status ValidateStepBatch(const StepBatch& batch, const KvArenaShape& shape, int32_t vocab_size,
                         size_t logits_size);

}  // namespace chunkserve::backend

#endif  // CHUNKSERVE_RUNTIME_BACKEND_BACKEND_H_
