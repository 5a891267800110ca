// Backend: the operations of a model forward pass on one device, and nothing else: buffers,
// weight uploads, the KV arena, GEMMs and the kernels (kernels/cpu, kernels/cuda). The model
// definition (runtime/forward/llama.h) strings them into layers, once, for every backend; no
// backend contains a layer loop.
//
// Tensors. A Tensor is a buffer the backend owns: host memory on the CPU, device memory on CUDA.
// Two element types meet in a forward pass: the residual stream and the logits are fp32 on every
// backend; weights and the activations that feed GEMMs and attention (q, k, v, attention output,
// MLP) are in compute_dtype() (fp32 on the CPU; fp16 or bf16 on CUDA, the KV dtype). Shapes are
// row-major, as in kernels/*/model_ops.h; `T` below is the number of a step's tokens.
//
// Ordering. Operations run in call order (on CUDA: enqueued on the backend's one stream; pointers
// a call receives must stay valid until Finish). Errors are Status: InvalidArgument for a shape
// or argument the kernels refuse, ResourceExhausted when memory runs out, Unavailable when the
// device is gone, Internal for anything else; nothing aborts. After an error the step is lost
// but the backend stays usable.
//
// Thread safety: none; one thread drives a backend (the engine's step thread).
#ifndef CHUNKSERVE_RUNTIME_BACKEND_BACKEND_H_
#define CHUNKSERVE_RUNTIME_BACKEND_BACKEND_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kernels/attention_params.h"
#include "runtime/base/ids.h"
#include "runtime/base/logprobs.h"
#include "runtime/base/status.h"
#include "runtime/model/dtype.h"
#include "runtime/parallel/communicator.h"

namespace chunkserve::backend {

struct KvArenaShape {
  int32_t num_layers = 0;
  int32_t num_slots = 0;
  int32_t num_kv_heads = 0;  // this rank's KV heads
  int32_t chunk_size = 0;
  int32_t head_dim = 0;
  kernels::DType dtype = kernels::DType::kF32;

  // K and V of one slot across all layers.
  uint64_t slot_bytes() const {
    return 2ull * num_layers * num_kv_heads * chunk_size * head_dim * kernels::DTypeSize(dtype);
  }
};

struct Tensor {
  void* data = nullptr;
  kernels::DType dtype = kernels::DType::kF32;
  int64_t numel = 0;
  // A Linear weight in the backend's own layout (UploadLinearWeight; the CPU's packed panels of
  // kernels/cpu/gemm.h): only Linear and Embed read it, and From() does not apply.
  bool packed = false;

  // The same buffer from element `offset` on (a row range of a [rows, cols] tensor).
  Tensor From(int64_t offset) const {
    return {static_cast<unsigned char*>(data) + offset * static_cast<int64_t>(DTypeSize(dtype)),
            dtype, numel - offset};
  }
};

// A step's prefill attention lists (kernels' PrefillAttentionParams): `host` as built, `staged`
// where the backend's kernels read them (the same pointers on the CPU).
struct PrefillLists {
  int32_t num_seqs = 0;
  int32_t max_q_per_seq = 0;  // most query tokens of one sequence
  struct Arrays {
    const int32_t* q_indptr = nullptr;      // [num_seqs + 1]
    const int32_t* q_pos = nullptr;         // [q_indptr[num_seqs]]
    const int32_t* chunk_indptr = nullptr;  // [num_seqs + 1]
    const int32_t* chunk_slot = nullptr;    // [chunk_indptr[num_seqs]]
    const int32_t* chunk_len = nullptr;
  } host, staged;
};

// How to pick one logit row's token: kernels/cpu/sampling.h's rule and the row's draw.
struct SampleRow {
  float temperature = 0.0f;
  int32_t top_k = 0;
  float top_p = 1.0f;
  double uniform = 0.0;   // in [0, 1); ignored when greedy
  int32_t logprobs = -1;  // -1: none; k in [0, kMaxTopLogprobs]: the token's and the k best
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual std::string name() const = 0;  // "cpu", "cuda"
  virtual kernels::DType compute_dtype() const = 0;

  // --- Memory -----------------------------------------------------------------------------
  // Makes *t hold at least `numel` elements of `dtype` (a reallocation loses the contents).
  virtual Status Reserve(Tensor* t, kernels::DType dtype, int64_t numel) = 0;
  virtual void Release(Tensor* t) = 0;
  // A weight: `numel` elements of host memory `src` (checkpoint dtype `src_dtype`), converted to
  // compute_dtype(). Kept until the backend is destroyed.
  virtual Result<Tensor> UploadWeights(const void* src, model::DType src_dtype, int64_t numel) = 0;
  // A Linear's weight W [out, in] (row-major host memory, checkpoint dtype `src_dtype`), stored
  // the way this backend's Linear reads it fastest, possibly in its checkpoint dtype (the CPU keeps
  // fp16 / bf16 weights half-size, packed in panels); Embed takes it too, for an embedding table
  // that is also the LM head. Default: UploadWeights.
  virtual Result<Tensor> UploadLinearWeight(const void* src, model::DType src_dtype, int64_t out,
                                            int64_t in) {
    return UploadWeights(src, src_dtype, out * in);
  }
  virtual Result<Tensor> UploadFloats(std::span<const float> values) = 0;  // fp32 constants
  // Bytes held by the uploads above (weights and constants) so far; 0 when the backend does not
  // count them.
  virtual uint64_t weight_bytes() const { return 0; }
  // Copies a step's index arrays where the kernels read them; one pointer per section, valid
  // until the next StageIndices.
  virtual Result<std::vector<const int32_t*>> StageIndices(
      std::span<const std::span<const int32_t>> sections) = 0;
  // Allocates the KV arena: K and V each [num_layers][num_slots][num_kv_heads][chunk][head_dim],
  // zeroed. Once, before any KV operation; InvalidArgument for a shape the kernels refuse.
  virtual Status AllocateKvArena(const KvArenaShape& shape) = 0;

  // --- Operations -------------------------------------------------------------------------
  // Copies positions [0, num_tokens) of layer `layer`'s K and V from slot src to slot dst.
  virtual Status KvCopy(int32_t layer, int32_t src_slot, int32_t dst_slot, int32_t num_tokens) = 0;
  // out[i] = table[ids[i]] widened to fp32: table [vocab, dim] compute dtype (or an
  // UploadLinearWeight tensor), out [n, dim] fp32.
  virtual Status Embed(const Tensor& table, int32_t vocab, int32_t dim, const int32_t* ids,
                       int32_t n, Tensor* out) = 0;
  // y = rmsnorm(x) * weight: x [rows, dim] fp32, weight compute dtype, y [rows, dim] compute.
  virtual Status RmsNorm(const Tensor& x, const Tensor& weight, Tensor* y, int32_t rows,
                         int32_t dim, float eps) = 0;
  // y (+)= x W^T (+ bias): x [rows, in] compute, W [out, in] (compute dtype, or an
  // UploadLinearWeight tensor) and bias [out] compute, y [rows, out] fp32 or compute dtype (its
  // Tensor's dtype); `accumulate` adds to y (beta 1).
  virtual Status Linear(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor* y,
                        int32_t rows, int32_t out, int32_t in, bool accumulate) = 0;
  // Rotates x [rows, heads, head_dim] (compute dtype) in place; inv_freq fp32 [head_dim / 2].
  virtual Status Rope(Tensor* x, const int32_t* positions, int32_t rows, int32_t heads,
                      int32_t head_dim, const Tensor& inv_freq) = 0;
  // New tokens' K/V [n, kv_heads, head_dim] (compute dtype) to (slot[i], offset[i]) of `layer`.
  virtual Status KvAppend(int32_t layer, const Tensor& k, const Tensor& v, const int32_t* slot,
                          const int32_t* offset, int32_t n) = 0;
  // The step's TPP plan (host arrays, valid until the step's last DecodeAttention), once per step.
  virtual Status SetDecodePlan(const kernels::TppPlanView& plan, int32_t num_qo_heads) = 0;
  // o[0, rows) = TPP decode attention of q[0, rows) over `layer`, rows = the plan's sequences.
  virtual Status DecodeAttention(int32_t layer, const Tensor& q, Tensor* o,
                                 int32_t num_qo_heads) = 0;
  // Causal attention of the prefill rows (q, o start at the first prefill row) over their paths.
  virtual Status PrefillAttention(int32_t layer, const Tensor& q, Tensor* o, int32_t num_qo_heads,
                                  const PrefillLists& lists) = 0;
  // out[i] = silu(gate[i]) * up[i] (compute dtype); out may alias gate.
  virtual Status SiluMul(const Tensor& gate, const Tensor& up, Tensor* out, int64_t n) = 0;
  // out[i] = x[rows[i]]: x [*, dim] fp32, out [n, dim] fp32.
  virtual Status GatherRows(const Tensor& x, int32_t x_rows, const int32_t* rows, int32_t n,
                            int32_t dim, Tensor* out) = 0;
  // Sums x[0, n) (fp32) across `comm`'s group in place, after the work already queued; on CUDA
  // straight from device memory on the backend's stream.
  virtual Status AllReduceSum(parallel::Communicator* comm, Tensor* x, int64_t n,
                              parallel::Deadline deadline) = 0;

  // --- Results (each waits for the step) --------------------------------------------------
  // Copies logits [rows, vocab] fp32 to the host.
  virtual Status ReadLogits(const Tensor& logits, int32_t rows, int32_t vocab,
                            std::span<float> out) = 0;
  // Samples one token per row of logits [rows, vocab] next to them; only the ids come back, and
  // for each row whose params ask for logprobs, logprobs[row] (kernels/cpu/sampling.h's
  // TokenLogprobs); `logprobs` may be empty when no row asks.
  virtual Status Sample(const Tensor& logits, int32_t rows, int32_t vocab,
                        std::span<const SampleRow> params, std::span<TokenId> out,
                        std::span<TokenLogprobs> logprobs) = 0;
  // Waits for everything queued (a step without logits).
  virtual Status Finish() = 0;
};

}  // namespace chunkserve::backend

#endif  // CHUNKSERVE_RUNTIME_BACKEND_BACKEND_H_
