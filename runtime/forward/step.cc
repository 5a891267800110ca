#include "runtime/forward/step.h"

#include <string>

namespace chunkserve::forward {

Status ValidateStepBatch(const StepBatch& b, const backend::KvArenaShape& shape,
                         int32_t vocab_size) {
  const size_t n = b.tokens.size();
  if (b.positions.size() != n || b.kv_slot.size() != n || b.kv_offset.size() != n) {
    return Status::InvalidArgument("step batch arrays disagree on the token count");
  }
  if (b.num_decode < 0 || static_cast<size_t>(b.num_decode) > n ||
      (b.num_decode > 0 && b.decode_plan.num_seqs != b.num_decode)) {
    return Status::InvalidArgument("decode rows and decode plan disagree");
  }
  for (size_t i = 0; i < n; ++i) {
    if (b.tokens[i] < 0 || b.tokens[i] >= vocab_size) {
      return Status::InvalidArgument("token id " + std::to_string(b.tokens[i]) +
                                     " outside the vocabulary");
    }
    if (b.positions[i] < 0 || b.kv_slot[i] < 0 || b.kv_slot[i] >= shape.num_slots ||
        b.kv_offset[i] < 0 || b.kv_offset[i] >= shape.chunk_size) {
      return Status::InvalidArgument("token " + std::to_string(i) + " has a bad position or slot");
    }
  }
  int32_t next = b.num_decode;
  for (const PrefillSegment& s : b.prefill) {
    if (s.token_begin != next || s.num_tokens < 1 || s.chunk_slots.size() != s.chunk_lens.size() ||
        s.chunk_slots.empty()) {
      return Status::InvalidArgument("prefill segments must tile the rows after the decode rows");
    }
    next += s.num_tokens;
  }
  if (static_cast<size_t>(next) != n) {
    return Status::InvalidArgument("prefill segments do not cover every non-decode row");
  }
  for (int32_t r : b.logit_rows) {
    if (r < 0 || static_cast<size_t>(r) >= n) return Status::InvalidArgument("bad logit row");
  }
  for (const KvCopyOp& c : b.kv_copies) {
    if (c.src_slot < 0 || c.src_slot >= shape.num_slots || c.dst_slot < 0 ||
        c.dst_slot >= shape.num_slots || c.src_slot == c.dst_slot || c.num_tokens < 0 ||
        c.num_tokens > shape.chunk_size) {
      return Status::InvalidArgument("bad KV copy");
    }
  }
  return Status::Ok();
}

}  // namespace chunkserve::forward
