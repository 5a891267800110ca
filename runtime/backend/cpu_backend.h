// CpuBackend: the complete CPU implementation of Backend (DESIGN.md section 5).
//
// Weights are widened to fp32 once at creation (whatever the checkpoint's dtype) and the
// projections run as OpenBLAS SGEMMs over all of a step's tokens; attention runs on the
// kernels/cpu TPP decode and prefill kernels, K/V writes on KvAppend. The KV arena is one
// allocation per K and V: [num_layers][num_slots][num_kv_heads][chunk_size][head_dim] in the
// configured dtype. Activation buffers grow to the largest step seen and are reused.
//
// Tensor parallelism (runtime/parallel, DESIGN.md section 6): with tp_size > 1 this backend is
// rank tp_rank of a group and holds only its slice (model/tensor_parallel.h): its query and KV
// heads (q/k/v rows, o columns), its MLP columns (gate/up rows, down columns), and the KV arena
// of its KV heads only. The partial outputs of the o and down projections are summed across the
// group with `all_reduce` before the residual add, so every rank holds the same hidden states.
// Embeddings and norms are replicated; the LM head is loaded and run on rank 0 only (followers
// are given no logit rows).
//
// Thread safety: none (Backend's contract).
#ifndef CHUNKSERVE_RUNTIME_BACKEND_CPU_BACKEND_H_
#define CHUNKSERVE_RUNTIME_BACKEND_CPU_BACKEND_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "kernels/cpu/thread_pool.h"
#include "runtime/backend/backend.h"
#include "runtime/model/model.h"

namespace chunkserve::backend {

struct CpuBackendOptions {
  int32_t num_threads = 0;  // 0: hardware concurrency
  int32_t num_slots = 0;    // KV slots (>= 1)
  int32_t chunk_size = 64;  // 16..256
  kernels::DType kv_dtype = kernels::DType::kF32;

  // Tensor parallelism; tp_size 1 is the whole model. all_reduce must sum a [tokens, hidden]
  // fp32 buffer in place across the group (same call order on every rank); required when
  // tp_size > 1. Its error ends the step with that status.
  int32_t tp_rank = 0;
  int32_t tp_size = 1;
  std::function<Status(std::span<float>)> all_reduce = nullptr;
};

class CpuBackend final : public Backend {
 public:
  // Borrows `model`, which must outlive the backend. InvalidArgument for bad options,
  // ResourceExhausted when the arena cannot be allocated.
  static Result<std::unique_ptr<CpuBackend>> Create(const model::LoadedModel& model,
                                                    const CpuBackendOptions& options);
  ~CpuBackend() override;

  std::string name() const override { return "cpu"; }
  const KvArenaShape& kv_shape() const override { return shape_; }
  int32_t vocab_size() const override { return config_.vocab_size; }
  Status Forward(const StepBatch& batch, std::span<float> logits) override;

 private:
  struct Layer {
    std::vector<float> input_norm, q_proj, k_proj, v_proj, o_proj, q_bias, k_bias, v_bias, o_bias;
    std::vector<float> post_norm, gate_proj, up_proj, down_proj;
  };

  CpuBackend(const model::ModelConfig& config, const CpuBackendOptions& options);
  Status RunLayer(int32_t layer, const StepBatch& batch, int32_t num_tokens);
  // x += in * w^T (+ bias), through the group's all-reduce when tensor-parallel.
  Status ProjectAndAdd(const float* in, const std::vector<float>& w,
                       const std::vector<float>& bias, int32_t num_tokens, int32_t in_dim);
  void* LayerK(int32_t layer) const;
  void* LayerV(int32_t layer) const;

  const model::ModelConfig config_;
  const CpuBackendOptions options_;
  KvArenaShape shape_;
  std::unique_ptr<kernels::cpu::ThreadPool> pool_;

  std::vector<float> embed_, final_norm_, lm_head_;
  std::vector<Layer> layers_;
  std::vector<float> inv_freq_;

  unsigned char* k_arena_ = nullptr;
  unsigned char* v_arena_ = nullptr;
  size_t layer_arena_bytes_ = 0;  // bytes of one layer's K (or V)

  // Per-step buffers, grown on demand.
  // This rank's shares (the whole model when tp_size == 1).
  int32_t local_qo_heads_ = 0, local_kv_heads_ = 0, local_intermediate_ = 0;

  std::vector<float> x_, h_, q_, k_, v_, attn_, gate_, up_, row_, reduce_;
  std::vector<unsigned char> workspace_;
  std::vector<int32_t> q_indptr_, q_pos_, chunk_indptr_, chunk_slot_, chunk_len_;
};

}  // namespace chunkserve::backend

#endif  // CHUNKSERVE_RUNTIME_BACKEND_CPU_BACKEND_H_
