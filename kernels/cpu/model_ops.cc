#include "kernels/cpu/model_ops.h"

#include <cmath>

namespace chunkserve::kernels::cpu {

KernelStatus RmsNorm(const float* x, const float* weight, float* y, int64_t rows, int32_t dim,
                     float eps) {
  if (x == nullptr || weight == nullptr || y == nullptr || rows < 0 || dim <= 0 || !(eps >= 0)) {
    return KernelStatus::kInvalidArgument;
  }
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    float* yr = y + r * dim;
    double sum = 0.0;
    for (int32_t i = 0; i < dim; ++i) sum += static_cast<double>(xr[i]) * xr[i];
    const float scale = static_cast<float>(1.0 / std::sqrt(sum / dim + eps));
    for (int32_t i = 0; i < dim; ++i) yr[i] = xr[i] * scale * weight[i];
  }
  return KernelStatus::kOk;
}

KernelStatus ApplyRope(float* x, const int32_t* positions, int64_t rows, int32_t num_heads,
                       int32_t head_dim, const float* inv_freq) {
  if (x == nullptr || positions == nullptr || inv_freq == nullptr || rows < 0 || num_heads <= 0 ||
      head_dim <= 0 || head_dim % 2 != 0 || head_dim > kMaxHeadDim) {
    return KernelStatus::kInvalidArgument;
  }
  const int32_t half = head_dim / 2;
  float cos_v[kMaxHeadDim / 2];
  float sin_v[kMaxHeadDim / 2];
  for (int64_t r = 0; r < rows; ++r) {
    if (positions[r] < 0) return KernelStatus::kInvalidArgument;
    for (int32_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(positions[r]) * inv_freq[i];
      cos_v[i] = static_cast<float>(std::cos(angle));
      sin_v[i] = static_cast<float>(std::sin(angle));
    }
    for (int32_t h = 0; h < num_heads; ++h) {
      float* v = x + (r * num_heads + h) * head_dim;
      for (int32_t i = 0; i < half; ++i) {
        const float a = v[i], b = v[i + half];
        v[i] = a * cos_v[i] - b * sin_v[i];
        v[i + half] = b * cos_v[i] + a * sin_v[i];
      }
    }
  }
  return KernelStatus::kOk;
}

KernelStatus SiluMul(const float* gate, const float* up, float* out, int64_t n) {
  if (gate == nullptr || up == nullptr || out == nullptr || n < 0) {
    return KernelStatus::kInvalidArgument;
  }
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
  return KernelStatus::kOk;
}

}  // namespace chunkserve::kernels::cpu
