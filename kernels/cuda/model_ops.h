// CUDA model operations of a Llama-family forward pass: RMSNorm, RoPE, SiLU-and-multiply,
// embedding gather, and the KV arena writes (append new tokens, copy-on-write of a slot prefix).
//
// Tensors are fp16 or bf16 (`dtype`) in device memory, except where a function takes an fp32
// residual stream (RmsNorm's input, EmbeddingGather's output); every sum and transcendental is fp32
// (RoPE angles: the position times the inverse frequency is formed in fp64 and reduced modulo 2 pi
// before the fp32 sin/cos, so that positions in the 100k range keep their precision). Semantics
// match kernels/cpu/model_ops.h and kernels/cpu/kv_append.h; results differ from the CPU only by
// the rounding of the 16-bit outputs.
//
// Errors: shape checks (kernels/cuda/shapes.h) and null pointers give cudaErrorInvalidValue
// before any launch; otherwise the launch's cudaGetLastError(). Device index arrays (token ids,
// slots, offsets) are range-checked by the kernels: an out-of-range id gathers a zero row, an
// out-of-range (slot, offset) is skipped.
#ifndef CHUNKSERVE_KERNELS_CUDA_MODEL_OPS_H_
#define CHUNKSERVE_KERNELS_CUDA_MODEL_OPS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/attention_params.h"

namespace chunkserve::kernels::cuda {

// y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight; x, y [rows, dim], weight [dim]. weight and y
// are `dtype` (fp16 / bf16); x is `dtype` too (y may then alias x) or fp32 (the residual stream).
cudaError_t RmsNorm(DType x_dtype, DType dtype, const void* x, const void* weight, void* y,
                    int64_t rows, int32_t dim, float eps, cudaStream_t stream);

// In place on x [rows, num_heads, head_dim]; row r is at position positions[r]; Hugging Face's
// rotate_half pairing (i, i + head_dim / 2) rotated by positions[r] * inv_freq[i] (inv_freq is
// fp32 [head_dim / 2], device memory).
cudaError_t ApplyRope(DType dtype, void* x, const int32_t* positions, int64_t rows,
                      int32_t num_heads, int32_t head_dim, const float* inv_freq,
                      cudaStream_t stream);

// out[i] = silu(gate[i]) * up[i]; out may alias gate or up.
cudaError_t SiluMul(DType dtype, const void* gate, const void* up, void* out, int64_t n,
                    cudaStream_t stream);

// out[i] = table[ids[i]] ([vocab, dim] rows); ids outside [0, vocab) give zero rows. The table
// is fp16, bf16 or fp32; out has the table's dtype or fp32 (16-bit rows widened: the embedding
// into the fp32 residual stream, or rows of the residual gathered for the LM head).
cudaError_t EmbeddingGather(DType table_dtype, DType out_dtype, const void* table, int32_t vocab,
                            int32_t dim, const int32_t* ids, int64_t n, void* out,
                            cudaStream_t stream);

// One layer of the arena, writable (device pointers), as kernels/cpu/kv_append.h's KvArenaLayer.
struct KvArenaLayerDevice {
  void* k = nullptr;  // [num_slots, num_kv_heads, chunk_size, head_dim]
  void* v = nullptr;
  DType dtype = DType::kF16;
  int32_t num_slots = 0;
  int32_t num_kv_heads = 0;
  int32_t chunk_size = 0;
  int32_t head_dim = 0;
};

// New tokens' K/V ([num_tokens, num_kv_heads, head_dim], same dtype as the arena) to
// (slot[i], offset[i]) of every KV head. Pointers 16-byte aligned.
cudaError_t KvAppend(const KvArenaLayerDevice& kv, const void* k_new, const void* v_new,
                     const int32_t* slot, const int32_t* offset, int32_t num_tokens,
                     cudaStream_t stream);

// Copies token positions [0, num_tokens) of every KV head from src_slot to dst_slot (host ints).
cudaError_t KvCopy(const KvArenaLayerDevice& kv, int32_t src_slot, int32_t dst_slot,
                   int32_t num_tokens, cudaStream_t stream);

}  // namespace chunkserve::kernels::cuda

#endif  // CHUNKSERVE_KERNELS_CUDA_MODEL_OPS_H_
