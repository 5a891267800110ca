// CudaBackend: the CUDA implementation of Backend (DESIGN.md section 5), built only when the
// project is configured with CUDA (CHUNKSERVE_HAVE_CUDA_BACKEND is then defined for users of
// chunkserve::backend). It mirrors CpuBackend step for step, on one device and one stream:
//
//   KV copies (copy-on-write) -> embedding gather -> per layer: RMSNorm, q/k/v GEMMs (+ biases),
//   RoPE, KV append, attention (decode rows: TPP decode over the step's plan, uploaded through
//   DevicePlan only when it changes; prefill segments: the prefill kernel over each sequence's
//   chunk path), o GEMM accumulated into the residual, RMSNorm, gate/up GEMMs, SiLU-and-mul, down
//   GEMM accumulated into the residual -> for logit_rows only: final RMSNorm and the LM head
//   (fp32 out) -> logits copied to the host.
//
// Storage: weights, activations and the KV arena are all in the compute dtype, fp16 or bf16
// (CudaBackendOptions::kv_dtype; the attention kernels take queries and K/V in one 16-bit dtype).
// Checkpoints in another dtype (fp32 included) are converted on the host once at creation. The
// residual stream is 16-bit too (the CPU backend keeps it in fp32), so logits differ from the CPU
// backend's by fp16 / bf16 rounding; every GEMM and kernel accumulates in fp32. The KV arena is
// KvArenaShape's: K and V each [num_layers][num_slots][num_kv_heads][chunk_size][head_dim].
//
// Errors: every CUDA / cuBLAS error becomes a Status naming the operation and the CUDA error
// (Unavailable for a missing or unusable device, ResourceExhausted for out-of-memory, Internal
// otherwise); nothing aborts. Create checks shapes on the host first (head_dim 64 or 128, chunk
// size a multiple of 16 in [16, 128], f16/bf16 KV), then the device.
//
// NOTE: written and compiled without a GPU; see runtime/README.md for what has been verified.
//
// Thread safety: none (Backend's contract). Forward may run on another thread than Create: it
// selects the backend's device on the calling thread first.
#ifndef CHUNKSERVE_RUNTIME_BACKEND_CUDA_BACKEND_H_
#define CHUNKSERVE_RUNTIME_BACKEND_CUDA_BACKEND_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "runtime/backend/backend.h"
#include "runtime/model/model.h"

namespace chunkserve::backend {

struct CudaBackendOptions {
  int32_t device = 0;                              // CUDA device ordinal
  int32_t num_slots = 0;                           // KV slots (>= 1)
  int32_t chunk_size = 64;                         // 16..128, a multiple of 16
  kernels::DType kv_dtype = kernels::DType::kF16;  // kF16 or kBF16: KV, weights, activations
};

class CudaBackend final : public Backend {
 public:
  // Borrows `model` only during the call (weights are copied to the device). InvalidArgument /
  // Unimplemented for options or a model shape the kernels do not support, Unavailable when
  // there is no usable CUDA device, ResourceExhausted when device memory runs out.
  static Result<std::unique_ptr<CudaBackend>> Create(const model::LoadedModel& model,
                                                     const CudaBackendOptions& options);
  ~CudaBackend() override;

  std::string name() const override { return "cuda"; }
  const KvArenaShape& kv_shape() const override { return shape_; }
  int32_t vocab_size() const override;
  Status Forward(const StepBatch& batch, std::span<float> logits) override;

  // Host-to-device bytes the last Forward's decode-plan upload copied (0: plan unchanged).
  uint64_t last_plan_upload_bytes() const;

 private:
  struct Impl;  // device state; kept out of this header so it needs no CUDA headers
  explicit CudaBackend(std::unique_ptr<Impl> impl, const KvArenaShape& shape);

  std::unique_ptr<Impl> impl_;
  KvArenaShape shape_;
};

}  // namespace chunkserve::backend

#endif  // CHUNKSERVE_RUNTIME_BACKEND_CUDA_BACKEND_H_
