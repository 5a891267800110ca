// Element-wise and per-row model operations of a Llama-family forward pass on the CPU:
// RMSNorm, rotary position embedding and SwiGLU's SiLU-and-multiply. fp32 in and out.
//
// These are a small share of a step's time next to the GEMMs and attention, so they are plain
// loops the compiler vectorizes; each validates its shapes and returns a KernelStatus.
#ifndef CHUNKSERVE_KERNELS_CPU_MODEL_OPS_H_
#define CHUNKSERVE_KERNELS_CPU_MODEL_OPS_H_

#include <cstdint>

#include "kernels/cpu/common.h"

namespace chunkserve::kernels::cpu {

// y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight, for r in [0, rows). y may alias x.
// x, y: [rows, dim]; weight: [dim]. The mean is accumulated in double: dim can be 8192 and the
// sum of squares must not lose the small components.
KernelStatus RmsNorm(const float* x, const float* weight, float* y, int64_t rows, int32_t dim,
                     float eps);

// Rotates x in place: x is [rows, num_heads, head_dim]; row r sits at position positions[r].
// Hugging Face's rotate_half convention: dimension i and i + head_dim / 2 form a pair rotated by
// angle positions[r] * inv_freq[i], i < head_dim / 2. head_dim must be even. Angles are computed
// in double so that large positions keep their precision.
KernelStatus ApplyRope(float* x, const int32_t* positions, int64_t rows, int32_t num_heads,
                       int32_t head_dim, const float* inv_freq);

// out[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + exp(-g)). out may alias gate or up.
KernelStatus SiluMul(const float* gate, const float* up, float* out, int64_t n);

}  // namespace chunkserve::kernels::cpu

#endif  // CHUNKSERVE_KERNELS_CPU_MODEL_OPS_H_
