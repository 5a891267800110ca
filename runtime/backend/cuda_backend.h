// CudaBackend: the Backend operations (backend.h) on one CUDA device and one stream, built only
// when the project is configured with CUDA, into chunkserve::cuda_backend (programs that link CUDA)
// and the plugin libchunkserve_cuda.so (loaded by libchunkserve.so; see cuda_plugin.h).
//
// compute_dtype() is fp16 or bf16 (CudaBackendOptions::dtype): weights, the GEMM and attention
// activations and the KV arena (the attention kernels take queries and K/V in one 16-bit dtype).
// The residual stream and logits are fp32: GEMMs write fp32 through cuBLAS (fp32 accumulation),
// RMSNorm reads fp32 and writes the compute dtype, so a forward pass rounds to 16 bits only where
// the tensor cores need it. Checkpoints in another dtype (fp32 included) are converted on the
// host once, at upload.
//
// Decode attention runs the kernels/cuda TPP kernels on a DevicePlan, uploaded only when the plan
// changes (SetDecodePlan once per step); prefill the prefill kernel over each sequence's chunk
// path; sampling the device sampler (greedy or top-k/top-p over at most 1024 candidates; a row
// that keeps more is sampled on the host from its logits row, by the same rule). A step's index
// arrays go up in one copy. Tensor-parallel all-reduces hand device memory to the communicator
// on this stream (NCCL: ncclAllReduce on it; no host staging).
//
// Errors: every CUDA / cuBLAS error becomes a Status naming the operation and the CUDA error
// (Unavailable for a missing or unusable device, ResourceExhausted for out-of-memory, Internal
// otherwise); nothing aborts. Kernel faults surface at the step's ReadLogits / Sample / Finish.
//
// Thread safety: none (Backend's contract). Operations may run on another thread than Create:
// each selects the backend's device on the calling thread first.
#ifndef CHUNKSERVE_RUNTIME_BACKEND_CUDA_BACKEND_H_
#define CHUNKSERVE_RUNTIME_BACKEND_CUDA_BACKEND_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "runtime/backend/backend.h"
#include "runtime/backend/cuda_plugin.h"

namespace chunkserve::backend {

struct CudaBackendOptions {
  int32_t device = 0;                           // CUDA device ordinal
  kernels::DType dtype = kernels::DType::kF16;  // kF16 or kBF16: weights, activations and KV
};

// The CudaBackendFactory of cuda_plugin.h: checks the arena shape (before any device is looked
// at), then creates the backend on spec.device.
Result<std::unique_ptr<Backend>> CreateCudaBackendFromSpec(const CudaBackendSpec& spec);

class CudaBackend final : public Backend {
 public:
  // InvalidArgument for a bad dtype or device ordinal; Unavailable when there is no usable CUDA
  // device (the message says so, and that the CPU backend needs none).
  static Result<std::unique_ptr<CudaBackend>> Create(const CudaBackendOptions& options);
  ~CudaBackend() override;

  // Whether the CUDA kernels take this arena (and model) shape, without a device: f16 / bf16,
  // chunk_size a multiple of 16 in [16, 128], head_dim 64 or 128. InvalidArgument or
  // Unimplemented naming what is wrong.
  static Status CheckKvArena(const KvArenaShape& shape);

  std::string name() const override { return "cuda"; }
  kernels::DType compute_dtype() const override;

  Status Reserve(Tensor* t, kernels::DType dtype, int64_t numel) override;
  void Release(Tensor* t) override;
  Result<Tensor> UploadWeights(const void* src, model::DType src_dtype, int64_t numel) override;
  Result<Tensor> UploadFloats(std::span<const float> values) override;
  Result<std::vector<const int32_t*>> StageIndices(
      std::span<const std::span<const int32_t>> sections) override;
  Status AllocateKvArena(const KvArenaShape& shape) override;

  Status KvCopy(int32_t layer, int32_t src_slot, int32_t dst_slot, int32_t num_tokens) override;
  Status Embed(const Tensor& table, int32_t vocab, int32_t dim, const int32_t* ids, int32_t n,
               Tensor* out) override;
  Status RmsNorm(const Tensor& x, const Tensor& weight, Tensor* y, int32_t rows, int32_t dim,
                 float eps) override;
  Status Linear(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor* y, int32_t rows,
                int32_t out, int32_t in, bool accumulate) override;
  Status Rope(Tensor* x, const int32_t* positions, int32_t rows, int32_t heads, int32_t head_dim,
              const Tensor& inv_freq) override;
  Status KvAppend(int32_t layer, const Tensor& k, const Tensor& v, const int32_t* slot,
                  const int32_t* offset, int32_t n) override;
  Status SetDecodePlan(const kernels::TppPlanView& plan, int32_t num_qo_heads) override;
  Status DecodeAttention(int32_t layer, const Tensor& q, Tensor* o, int32_t num_qo_heads) override;
  Status PrefillAttention(int32_t layer, const Tensor& q, Tensor* o, int32_t num_qo_heads,
                          const PrefillLists& lists) override;
  Status SiluMul(const Tensor& gate, const Tensor& up, Tensor* out, int64_t n) override;
  Status GatherRows(const Tensor& x, int32_t x_rows, const int32_t* rows, int32_t n, int32_t dim,
                    Tensor* out) override;
  Status AllReduceSum(parallel::Communicator* comm, Tensor* x, int64_t n,
                      parallel::Deadline deadline) override;

  Status ReadLogits(const Tensor& logits, int32_t rows, int32_t vocab,
                    std::span<float> out) override;
  Status Sample(const Tensor& logits, int32_t rows, int32_t vocab,
                std::span<const SampleRow> params, std::span<TokenId> out,
                std::span<TokenLogprobs> logprobs) override;
  Status Finish() override;

  // Host-to-device bytes the last SetDecodePlan copied (0: the plan was unchanged).
  uint64_t last_plan_upload_bytes() const;
  int32_t device() const;

 private:
  struct Impl;  // device state; kept out of this header so it needs no CUDA headers
  explicit CudaBackend(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace chunkserve::backend

#endif  // CHUNKSERVE_RUNTIME_BACKEND_CUDA_BACKEND_H_
