// The logprobs of one sampled row, computed on the host from its fp32 logits: what every backend
// returns for a row whose SampleRow asks for them (the CUDA backend copies such a row up first).
#ifndef CHUNKSERVE_RUNTIME_BACKEND_ROW_LOGPROBS_H_
#define CHUNKSERVE_RUNTIME_BACKEND_ROW_LOGPROBS_H_

#include <algorithm>
#include <array>
#include <cstdint>
#include <span>

#include "kernels/cpu/sampling.h"
#include "runtime/base/logprobs.h"

namespace chunkserve::backend {

inline void RowLogprobs(std::span<const float> row, TokenId token, int32_t k,
                        kernels::cpu::SamplingScratch* scratch, TokenLogprobs* out) {
  k = std::clamp(k, 0, kMaxTopLogprobs);
  std::array<int32_t, kMaxTopLogprobs> ids{};
  std::array<float, kMaxTopLogprobs> values{};
  int32_t n = 0;
  out->logprob = kernels::cpu::TokenLogprobs(row, token, k, ids.data(), values.data(), &n, scratch);
  out->top.resize(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) out->top[static_cast<size_t>(i)] = {ids[i], values[i]};
}

}  // namespace chunkserve::backend

#endif  // CHUNKSERVE_RUNTIME_BACKEND_ROW_LOGPROBS_H_
