#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "kernels/cuda/sampling.h"
#include "kernels/cuda/shapes.h"

namespace chunkserve::kernels::cuda {
namespace {

constexpr int kThreads = 1024;  // = kMaxTopK: one candidate per thread in the sort

// The host rule: only values > -inf compete (NaN never compares greater); ties to the lower id;
// nothing above -inf gives token 0.
struct Best {
  float v;
  int32_t id;
};
__device__ __forceinline__ Best Better(Best a, Best b) {
  if (b.id < 0) return a;
  if (a.id < 0) return b;
  if (b.v > a.v || (b.v == a.v && b.id < a.id)) return b;
  return a;
}

__device__ int32_t BlockArgmax(const float* row, int32_t vocab) {
  Best best{0.0f, -1};
  for (int32_t i = threadIdx.x; i < vocab; i += kThreads) {
    const float v = row[i];
    if (v > -INFINITY) best = Better(best, Best{v, i});
  }
  for (int o = 16; o > 0; o >>= 1) {
    Best other{__shfl_xor_sync(0xffffffffu, best.v, o), __shfl_xor_sync(0xffffffffu, best.id, o)};
    best = Better(best, other);
  }
  __shared__ Best warp_best[kThreads / 32];
  __shared__ int32_t result;
  if ((threadIdx.x & 31) == 0) warp_best[threadIdx.x >> 5] = best;
  __syncthreads();
  if (threadIdx.x == 0) {
    Best b{0.0f, -1};
    for (int w = 0; w < kThreads / 32; ++w) b = Better(b, warp_best[w]);
    result = b.id < 0 ? 0 : b.id;
  }
  __syncthreads();
  return result;
}

__global__ void __launch_bounds__(kThreads)
    ArgmaxKernel(const float* logits, int32_t vocab, int32_t* out) {
  const int32_t id = BlockArgmax(logits + static_cast<int64_t>(blockIdx.x) * vocab, vocab);
  if (threadIdx.x == 0) out[blockIdx.x] = id;
}

// Order-preserving map of finite floats to uint32 (larger float -> larger key); -0 is +0.
__device__ __forceinline__ uint32_t KeyOf(float x) {
  if (x == 0.0f) x = 0.0f;
  const uint32_t b = __float_as_uint(x);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float FloatOfKey(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

__global__ void __launch_bounds__(kThreads) TopKTopPKernel(const TopKTopPParams p) {
  using Reduce = cub::BlockReduce<int, kThreads>;
  using Scan = cub::BlockScan<int, kThreads>;
  __shared__ union {
    typename Reduce::TempStorage reduce;
    typename Scan::TempStorage scan;
  } temp;
  __shared__ unsigned long long cand[kThreads];  // key << 32 | (0xffffffff - id): sorts desc
  __shared__ int shared_int;
  __shared__ int count_gt;

  const int32_t r = blockIdx.x;
  const float* row = p.logits + static_cast<int64_t>(r) * p.vocab;
  const float temperature = p.temperature[r];
  const int32_t top_k = p.top_k[r];
  if (temperature == 0.0f || top_k == 1) {
    const int32_t id = BlockArgmax(row, p.vocab);
    if (threadIdx.x == 0) p.out[r] = id;
    return;
  }
  const float inv_t = 1.0f / temperature;

  auto count_at_least = [&](uint32_t t) {  // finite candidates with key >= t
    int c = 0;
    for (int32_t i = threadIdx.x; i < p.vocab; i += kThreads) {
      const float v = row[i];
      if (isfinite(v) && KeyOf(v * inv_t) >= t) ++c;
    }
    const int total = Reduce(temp.reduce).Sum(c);
    if (threadIdx.x == 0) shared_int = total;
    __syncthreads();
    const int result = shared_int;
    __syncthreads();
    return result;
  };

  const int n = count_at_least(0);
  if (n == 0) {
    if (threadIdx.x == 0) p.out[r] = 0;
    return;
  }
  const int k = (top_k > 0 && top_k < n) ? top_k : n;
  if (k > kMaxTopK) {
    if (threadIdx.x == 0) p.out[r] = -1;
    return;
  }
  // The k-th candidate's key: the largest t with count(key >= t) >= k.
  uint32_t threshold = 0;
  if (k < n) {
    uint64_t lo = 0, hi = 0xffffffffull;
    while (lo < hi) {
      const uint64_t mid = lo + (hi - lo + 1) / 2;
      if (count_at_least(static_cast<uint32_t>(mid)) >= k) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    threshold = static_cast<uint32_t>(lo);
  }
  // Gather: every key > threshold, then keys == threshold in id order until k candidates.
  cand[threadIdx.x] = 0;
  if (threadIdx.x == 0) count_gt = 0;
  __syncthreads();
  for (int32_t i = threadIdx.x; i < p.vocab; i += kThreads) {
    const float v = row[i];
    if (isfinite(v)) {
      const uint32_t key = KeyOf(v * inv_t);
      if (key > threshold) {
        const int at = atomicAdd(&count_gt, 1);
        cand[at] =
            (static_cast<unsigned long long>(key) << 32) | (0xffffffffu - static_cast<uint32_t>(i));
      }
    }
  }
  __syncthreads();
  int taken = count_gt;
  for (int32_t base = 0; base < p.vocab && taken < k; base += kThreads) {
    const int32_t i = base + threadIdx.x;
    int flag = 0;
    uint32_t key = 0;
    if (i < p.vocab) {
      const float v = row[i];
      if (isfinite(v)) {
        key = KeyOf(v * inv_t);
        flag = key == threshold ? 1 : 0;
      }
    }
    int offset = 0, tile_total = 0;
    Scan(temp.scan).ExclusiveSum(flag, offset, tile_total);
    if (flag && taken + offset < k) {
      cand[taken + offset] =
          (static_cast<unsigned long long>(key) << 32) | (0xffffffffu - static_cast<uint32_t>(i));
    }
    taken += tile_total;  // the same value in every thread: the loop condition stays uniform
    __syncthreads();
  }
  // Bitonic sort, descending (padding zeros sort last: every finite key is > 0).
  for (int size = 2; size <= kThreads; size <<= 1) {
    for (int stride = size / 2; stride > 0; stride >>= 1) {
      const int i = threadIdx.x;
      const int j = i ^ stride;
      if (j > i) {
        const bool descending = (i & size) == 0;
        const unsigned long long a = cand[i], b = cand[j];
        if ((a < b) == descending) {
          cand[i] = b;
          cand[j] = a;
        }
      }
      __syncthreads();
    }
  }
  if (threadIdx.x != 0) return;
  // The host's arithmetic, in its order.
  const double max_logit = FloatOfKey(static_cast<uint32_t>(cand[0] >> 32));
  double total = 0.0;
  for (int i = 0; i < k; ++i) {
    total += exp(static_cast<double>(FloatOfKey(static_cast<uint32_t>(cand[i] >> 32))) - max_logit);
  }
  int kept = k;
  const float top_p = p.top_p[r];
  if (top_p < 1.0f) {
    double mass = 0.0;
    for (int i = 0; i < k; ++i) {
      mass +=
          exp(static_cast<double>(FloatOfKey(static_cast<uint32_t>(cand[i] >> 32))) - max_logit) /
          total;
      if (mass >= top_p) {
        kept = i + 1;
        break;
      }
    }
  }
  double kept_total = 0.0;
  for (int i = 0; i < kept; ++i) {
    kept_total +=
        exp(static_cast<double>(FloatOfKey(static_cast<uint32_t>(cand[i] >> 32))) - max_logit);
  }
  const double target = p.uniform[r] * kept_total;
  double acc = 0.0;
  int32_t token = static_cast<int32_t>(0xffffffffu - static_cast<uint32_t>(cand[kept - 1]));
  for (int i = 0; i < kept; ++i) {
    acc += exp(static_cast<double>(FloatOfKey(static_cast<uint32_t>(cand[i] >> 32))) - max_logit);
    if (target < acc) {
      token = static_cast<int32_t>(0xffffffffu - static_cast<uint32_t>(cand[i]));
      break;
    }
  }
  p.out[r] = token;
}

}  // namespace

cudaError_t ArgmaxSample(const float* logits, int32_t rows, int32_t vocab, int32_t* out,
                         cudaStream_t stream) {
  if (CheckSamplingShape(rows, vocab) != nullptr) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  if (logits == nullptr || out == nullptr) return cudaErrorInvalidValue;
  ArgmaxKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(logits, vocab, out);
  return cudaGetLastError();
}

cudaError_t TopKTopPSample(const TopKTopPParams& p, cudaStream_t stream) {
  if (CheckSamplingShape(p.rows, p.vocab) != nullptr) return cudaErrorInvalidValue;
  if (p.rows == 0) return cudaSuccess;
  if (p.logits == nullptr || p.temperature == nullptr || p.top_k == nullptr || p.top_p == nullptr ||
      p.uniform == nullptr || p.out == nullptr) {
    return cudaErrorInvalidValue;
  }
  TopKTopPKernel<<<static_cast<unsigned>(p.rows), kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace chunkserve::kernels::cuda
