// The messages rank 0 sends its tensor-parallel followers (runtime/README.md "parallel/"): each
// engine step's descriptor (the StepBatch: tokens, positions, KV slots and offsets, prefill
// segments with their chunk paths, KV copy ops and the TPP decode plan), the group's init
// message, and the control messages (heartbeat, shutdown). The prefix tree and the scheduler live on rank 0
// only; followers run exactly the plan they are sent.
//
// Encoding: a flat array of little-endian int32 (hosts of one group share endianness), counts
// first, then each array in a fixed order; logit rows are not sent (only rank 0 samples). A
// decode step of b sequences over p private and s shared chunks is about 4 * (5b + 3p + 6s + 20)
// bytes. Decoding checks every count against the bytes present (DataLoss otherwise) and the
// structural invariants the backends rely on for memory safety are re-checked by
// forward::ValidateStepBatch; plan contents are trusted, as they come from rank 0 of the same
// group.
#ifndef CHUNKSERVE_RUNTIME_PARALLEL_STEP_CODEC_H_
#define CHUNKSERVE_RUNTIME_PARALLEL_STEP_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/base/status.h"
#include "runtime/forward/step.h"

namespace chunkserve::parallel {

enum class TpMessageKind : uint32_t {
  kInit = 1,       // TpInit
  kStep = 2,       // a StepBatch
  kHeartbeat = 3,  // no payload; followed by a one-float all-reduce (liveness of every rank)
  kShutdown = 4,   // no payload; followers exit cleanly
};

// What every follower needs to build its shard, sent once after the rendezvous.
struct TpInit {
  std::string model_dir;  // same path on every rank (ranks share a machine or a file system)
  uint64_t model_fingerprint = 0;  // followers check they loaded the same model
  int32_t num_slots = 0;
  int32_t chunk_size = 0;
  int32_t kv_dtype = 0;     // kernels::DType
  int32_t num_threads = 0;  // per rank (CPU backend)
  int32_t op_timeout_ms = 0;
  int32_t heartbeat_ms = 0;
  int32_t backend = 0;  // forward::BackendKind; CUDA ranks use device `rank`
  int32_t weight_dtype = 0;  // kernels::DType the leader's weights have (a GGUF's dequantization)
};

std::vector<std::byte> EncodeTpInit(const TpInit& init);
Result<TpInit> DecodeTpInit(std::span<const std::byte> bytes);

std::vector<std::byte> EncodeStep(const forward::StepBatch& batch);

// A decoded step owns its arrays; batch() views them (valid while the DecodedStep lives and is
// not moved).
class DecodedStep {
 public:
  const forward::StepBatch& batch() const { return batch_; }

 private:
  friend Status DecodeStep(std::span<const std::byte> bytes, DecodedStep* out);
  std::vector<int32_t> tokens_, positions_, kv_slot_, kv_offset_, paths_;
  std::vector<forward::PrefillSegment> segments_;
  std::vector<forward::KvCopyOp> copies_;
  std::vector<int32_t> plan_;  // every plan array, concatenated
  forward::StepBatch batch_;
};

// Decodes into *out (reusing its capacity); DataLoss on malformed bytes.
Status DecodeStep(std::span<const std::byte> bytes, DecodedStep* out);

}  // namespace chunkserve::parallel

#endif  // CHUNKSERVE_RUNTIME_PARALLEL_STEP_CODEC_H_
