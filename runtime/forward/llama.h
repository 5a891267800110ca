// LlamaModel: the one model definition. The Llama-family forward pass (Llama 2 and 3, Mistral,
// Qwen2, SmolLM2: model/model_config.h's architectures) written once, as a sequence of Backend
// operations (backend/backend.h), for every backend and every tensor-parallel rank.
//
// One step (StepBatch, step.h), for this rank's shard:
//
//   KV copies (copy-on-write) for every layer
//   x = embed(tokens)                                       fp32 residual stream [T, hidden]
//   per layer:
//     h = rmsnorm(x) * input_norm                           compute dtype
//     q, k, v = h Wq^T + bq, h Wk^T + bk, h Wv^T + bv       this rank's heads (biases: Qwen2, or
//                                                           Llama's attention_bias)
//     rope(q), rope(k)                                      Llama 3 scaling from the config
//     KV append (every token's K/V to its slot and offset)
//     attn = TPP decode (decode rows) | causal prefill over chunk paths (prefill rows)
//     x += attn Wo^T + bo                                   all-reduce across ranks (below)
//     h = rmsnorm(x) * post_attention_norm
//     x += (silu(h Wg^T) * h Wu^T) Wd^T                     this rank's MLP columns; all-reduce
//   rows = x[logit_rows]; logits = (rmsnorm(rows) * final_norm) Wlm^T   rank 0; Wlm tied or not
//
// Tensor parallelism (Megatron-style, model/tensor_parallel.h): each rank holds its query and KV
// heads (q/k/v rows, o columns) and its MLP columns (gate/up rows, down columns), and a KV arena
// of its KV heads. The residual stream is the all-reduce buffer: rank 0 adds its partial o / down
// output to x (with the o bias), the other ranks overwrite x with theirs, and one all-reduce of
// x through the communicator gives every rank the same, complete hidden states. Two all-reduces
// per layer; nothing else crosses ranks. Only rank 0 holds the LM head and is given logit rows.
// A communicator of one rank runs the same path (its all-reduce is the identity).
//
// Precision: the residual stream, every accumulation and the logits are fp32; weights and the
// activations feeding GEMMs and attention are in the backend's compute dtype (fp32 on the CPU,
// fp16 / bf16 on CUDA); K/V are stored in the KV dtype.
//
// Thread safety: none (StepRunner's contract).
#ifndef CHUNKSERVE_RUNTIME_FORWARD_LLAMA_H_
#define CHUNKSERVE_RUNTIME_FORWARD_LLAMA_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "runtime/backend/backend.h"
#include "runtime/forward/step_runner.h"
#include "runtime/model/model.h"
#include "runtime/parallel/communicator.h"

namespace chunkserve::forward {

struct TensorParallel {
  int32_t rank = 0;
  int32_t size = 1;
  // Borrowed; must outlive the model. Required when size > 1; with size 1 it is optional (the
  // all-reduces then run on it, as identities).
  parallel::Communicator* comm = nullptr;
  std::chrono::milliseconds op_timeout{30000};  // deadline of each all-reduce
};

struct LlamaOptions {
  int32_t num_slots = 0;    // KV slots (>= 1)
  int32_t chunk_size = 64;  // the backend's range (CPU 16..256; CUDA multiples of 16 to 128)
  kernels::DType kv_dtype = kernels::DType::kF32;
  TensorParallel tp;
};

class LlamaModel final : public StepRunner {
 public:
  // Takes `backend`, uploads this rank's shard of `model`'s weights (`model` may go once Create
  // returns) and allocates the KV arena. InvalidArgument for options or a tensor-parallel size
  // the model does not split into; the backend's errors otherwise.
  static Result<std::unique_ptr<LlamaModel>> Create(const model::LoadedModel& model,
                                                    std::unique_ptr<backend::Backend> backend,
                                                    const LlamaOptions& options);
  ~LlamaModel() override;

  std::string name() const override { return backend_->name(); }
  const backend::KvArenaShape& kv_shape() const override { return shape_; }
  int32_t vocab_size() const override { return config_.vocab_size; }
  uint64_t weight_bytes() const override { return backend_->weight_bytes(); }
  Status Forward(const StepBatch& batch, std::span<float> logits) override;
  Status ForwardSample(const StepBatch& batch, std::span<const backend::SampleRow> rows,
                       std::span<TokenId> tokens, std::span<TokenLogprobs> logprobs) override;

  backend::Backend& backend() { return *backend_; }

 private:
  struct Layer {
    backend::Tensor input_norm, q_proj, k_proj, v_proj, o_proj, q_bias, k_bias, v_bias, o_bias;
    backend::Tensor post_norm, gate_proj, up_proj, down_proj;
  };

  LlamaModel(const model::ModelConfig& config, std::unique_ptr<backend::Backend> backend,
             const LlamaOptions& options);
  Status UploadShard(const model::LoadedModel& model);
  // Runs the step up to the logits of batch.logit_rows (in logits_, on the backend).
  Status Run(const StepBatch& batch);
  Status RunLayer(int32_t layer, const StepBatch& batch, int32_t num_tokens);
  // x += in W^T (+ bias), summed across the tensor-parallel group.
  Status AddToResidual(const backend::Tensor& in, const backend::Tensor& w,
                       const backend::Tensor* bias, int32_t num_tokens, int32_t in_dim);

  const model::ModelConfig config_;
  const LlamaOptions options_;
  std::unique_ptr<backend::Backend> backend_;
  backend::KvArenaShape shape_;
  // This rank's shares (the whole model when tp.size == 1).
  int32_t local_qo_heads_ = 0, local_kv_heads_ = 0, local_intermediate_ = 0;

  backend::Tensor embed_, final_norm_, lm_head_, inv_freq_;
  bool tied_ = false;  // lm_head_ is embed_
  std::vector<Layer> layers_;

  // Per-step buffers, grown on demand, and the step's host-side index lists.
  backend::Tensor x_, h_, q_, k_, v_, attn_, gate_, up_, rows_, rows_norm_, logits_;
  std::vector<int32_t> q_indptr_, q_pos_, chunk_indptr_, chunk_slot_, chunk_len_;
  const int32_t* d_tokens_ = nullptr;
  const int32_t* d_pos_ = nullptr;
  const int32_t* d_slot_ = nullptr;
  const int32_t* d_offset_ = nullptr;
  const int32_t* d_logit_rows_ = nullptr;
  backend::PrefillLists prefill_;
};

// Which backend CreateLlamaModel builds.
enum class BackendKind : int32_t { kCpu = 0, kCuda = 1 };

struct RunnerOptions {
  BackendKind backend = BackendKind::kCpu;
  int32_t cuda_device = 0;  // kCuda: device ordinal
  int32_t num_threads = 0;  // kCpu: threads (0 = hardware concurrency)
  int32_t num_slots = 0;
  int32_t chunk_size = 64;
  // kCpu: f32, f16 or bf16. kCuda: f16 or bf16, which is also its weights' and activations'
  // dtype.
  kernels::DType kv_dtype = kernels::DType::kF32;
};

// Builds the backend `options.backend` names and LlamaModel on it. kCuda in a build without CUDA
// is Unimplemented; on a machine without a device, Unavailable.
Result<std::unique_ptr<LlamaModel>> CreateLlamaModel(const model::LoadedModel& model,
                                                     const RunnerOptions& options,
                                                     const TensorParallel& tp = {});

}  // namespace chunkserve::forward

#endif  // CHUNKSERVE_RUNTIME_FORWARD_LLAMA_H_
