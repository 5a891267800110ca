// Token sampling on the device, one thread block per row of fp32 logits [rows, vocab].
//
// The rules are runtime/sched/sampler.cc's, so that a request samples the same tokens on either
// backend given the same uniform draw:
//  - greedy (ArgmaxSample, and rows with temperature == 0 or top_k == 1): the largest logit, ties
//    to the lowest id; NaN never wins; when no logit is above -inf, token 0.
//  - otherwise (TopKTopPSample): candidates are the finite logits times 1 / temperature (fp32),
//    ordered by value descending then id ascending; top_k keeps the first top_k; probabilities
//    are exp(x - max) in fp64 over those; top_p keeps the shortest prefix whose normalized mass
//    reaches top_p; the token is the first whose running sum exceeds u * (kept mass), u being the
//    row's uniform draw in [0, 1) (the host Sampler's NextUniform()).
// The device sorts at most kMaxTopK (shapes.h, 1024) candidates: a row that would keep more
// (top_k <= 0 or > 1024 with more than 1024 finite logits) gets -1, and the caller samples that
// row on the host. fp64 exp on the device may differ from the host's in the last bit, which
// changes a token only when u lands within ~1e-16 of a boundary.
#ifndef CHUNKSERVE_KERNELS_CUDA_SAMPLING_H_
#define CHUNKSERVE_KERNELS_CUDA_SAMPLING_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace chunkserve::kernels::cuda {

cudaError_t ArgmaxSample(const float* logits, int32_t rows, int32_t vocab, int32_t* out,
                         cudaStream_t stream);

struct TopKTopPParams {
  const float* logits = nullptr;  // [rows, vocab]
  int32_t rows = 0;
  int32_t vocab = 0;
  // Per-row device arrays [rows].
  const float* temperature = nullptr;
  const int32_t* top_k = nullptr;  // <= 0: no top-k filter
  const float* top_p = nullptr;    // >= 1: no top-p filter
  const double* uniform = nullptr;
  int32_t* out = nullptr;  // token id, or -1 (see above)
};

cudaError_t TopKTopPSample(const TopKTopPParams& params, cudaStream_t stream);

}  // namespace chunkserve::kernels::cuda

#endif  // CHUNKSERVE_KERNELS_CUDA_SAMPLING_H_
