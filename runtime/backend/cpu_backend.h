// CpuBackend: the Backend operations (backend.h) on the CPU.
//
// Everything is host memory and activations are fp32 (compute_dtype() is kF32). Linear weights
// (UploadLinearWeight: the projections, the embedding table / LM head) are packed once into
// kernels/cpu/gemm.h's panels and kept in their checkpoint dtype, fp32, fp16 or bf16: half-size
// weights are widened in registers inside the GEMM, so they halve the bytes a decode step reads
// and the resident memory, never stored as an fp32 copy. Other weights (norms, biases) are fp32.
// The projections run over all of a step's tokens, split by output panels over the kernels'
// thread pool (one pool serves GEMMs and attention: two pools spinning against each other on the
// same cores cost more in system time than the GEMMs themselves); a plain fp32 weight from
// UploadWeights still runs on OpenBLAS's SGEMM; attention runs on the kernels/cpu TPP decode and prefill
// kernels, K/V writes on KvAppend, sampling on kernels/cpu/sampling.h. The KV arena is one
// allocation per K and V in the configured dtype (fp32, fp16 or bf16). Operations run
// synchronously, so Finish has nothing to wait for.
//
// Thread safety: none (Backend's contract).
#ifndef CHUNKSERVE_RUNTIME_BACKEND_CPU_BACKEND_H_
#define CHUNKSERVE_RUNTIME_BACKEND_CPU_BACKEND_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "kernels/cpu/common.h"
#include "kernels/cpu/sampling.h"
#include "kernels/cpu/thread_pool.h"
#include "runtime/backend/backend.h"

namespace chunkserve::backend {

struct CpuBackendOptions {
  int32_t num_threads = 0;  // 0: hardware concurrency
};

class CpuBackend final : public Backend {
 public:
  static Result<std::unique_ptr<CpuBackend>> Create(const CpuBackendOptions& options);
  ~CpuBackend() override;

  std::string name() const override { return "cpu"; }
  kernels::DType compute_dtype() const override { return kernels::DType::kF32; }

  Status Reserve(Tensor* t, kernels::DType dtype, int64_t numel) override;
  void Release(Tensor* t) override;
  Result<Tensor> UploadWeights(const void* src, model::DType src_dtype, int64_t numel) override;
  Result<Tensor> UploadLinearWeight(const void* src, model::DType src_dtype, int64_t out,
                                    int64_t in) override;
  Result<Tensor> UploadFloats(std::span<const float> values) override;
  uint64_t weight_bytes() const override { return weight_bytes_; }
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
  Status Finish() override { return Status::Ok(); }

 private:
  CpuBackend() = default;
  Result<Tensor> Allocate(kernels::DType dtype, int64_t numel);
  // fn(begin, end) over row ranges of [0, rows): on the pool's threads when each part gets
  // enough elements, else on the caller. The first failure's status (nothing else is undone).
  template <typename Fn>
  kernels::cpu::KernelStatus OverRows(int64_t rows, int64_t row_elems, Fn fn);
  void* LayerK(int32_t layer) const;
  void* LayerV(int32_t layer) const;

  std::unique_ptr<kernels::cpu::ThreadPool> pool_;
  std::unordered_map<void*, size_t> owned_;  // every live allocation and its size

  KvArenaShape shape_;
  unsigned char* k_arena_ = nullptr;
  unsigned char* v_arena_ = nullptr;
  size_t layer_arena_bytes_ = 0;  // bytes of one layer's K (or V)
  size_t arena_bytes_ = 0;        // bytes of all layers' K (or V)

  kernels::TppPlanView plan_;
  std::vector<unsigned char> workspace_;
  kernels::cpu::SamplingScratch sampling_;
  uint64_t weight_bytes_ = 0;  // what the Upload* calls allocated
};

}  // namespace chunkserve::backend

#endif  // CHUNKSERVE_RUNTIME_BACKEND_CPU_BACKEND_H_
