#include "kernels/cpu/reference.h"

#include <atomic>
#include <cmath>
#include <cstddef>
#include <limits>
#include <new>

#include "kernels/cpu/dtype.h"

namespace chunkserve::kernels::cpu {
namespace {

double LoadElement(DType dtype, const void* base, int64_t index) {
  switch (dtype) {
    case DType::kF16:
      return HalfToFloat(static_cast<const uint16_t*>(base)[index]);
    case DType::kBF16:
      return Bf16ToFloat(static_cast<const uint16_t*>(base)[index]);
    case DType::kF32:
      break;
  }
  return static_cast<const float*>(base)[index];
}

// One query row, one query head: scores, max, exp, weighted sum of V, normalize. `scores` has room
// for the row's KV range, `acc` for head_dim values.
void AttendRow(const NaiveAttentionParams& p, int32_t query, int32_t head, double* scores,
               double* acc) {
  const int32_t d = p.head_dim;
  const int32_t kv_head = head / (p.num_qo_heads / p.num_kv_heads);
  const float* q = p.q + (static_cast<int64_t>(query) * p.num_qo_heads + head) * d;
  float* o = p.o + (static_cast<int64_t>(query) * p.num_qo_heads + head) * d;
  const int64_t begin = p.kv_begin[query];
  const int64_t end = p.kv_end[query];
  for (int32_t i = 0; i < d; ++i) o[i] = 0.0f;
  if (end <= begin) return;

  double max_score = -std::numeric_limits<double>::infinity();
  for (int64_t t = begin; t < end; ++t) {
    const int64_t base = (t * p.num_kv_heads + kv_head) * d;
    double dot = 0.0;
    for (int32_t i = 0; i < d; ++i)
      dot += static_cast<double>(q[i]) * LoadElement(p.dtype, p.k, base + i);
    scores[t - begin] = dot * p.sm_scale;
    if (scores[t - begin] > max_score) max_score = scores[t - begin];
  }
  double sum = 0.0;
  for (int64_t t = begin; t < end; ++t) {
    scores[t - begin] = std::exp(scores[t - begin] - max_score);
    sum += scores[t - begin];
  }
  for (int32_t i = 0; i < d; ++i) acc[i] = 0.0;
  for (int64_t t = begin; t < end; ++t) {
    const int64_t base = (t * p.num_kv_heads + kv_head) * d;
    for (int32_t i = 0; i < d; ++i)
      acc[i] += scores[t - begin] * LoadElement(p.dtype, p.v, base + i);
  }
  for (int32_t i = 0; i < d; ++i) o[i] = static_cast<float>(acc[i] / sum);
}

struct Job {
  const NaiveAttentionParams* params;
  int64_t max_range;
  std::atomic<bool> out_of_memory{false};
};

// Tasks are query rows; each task allocates its own score buffer (this is the reference, not a hot
// path, and the fast kernels' no-allocation rule does not apply to it).
void RunRows(void* ctx, int64_t begin, int64_t end, int32_t /*thread_index*/) {
  Job& job = *static_cast<Job*>(ctx);
  const NaiveAttentionParams& p = *job.params;
  double* scores = new (std::nothrow) double[static_cast<size_t>(job.max_range + p.head_dim)];
  if (scores == nullptr) {
    job.out_of_memory.store(true);
    return;
  }
  for (int64_t query = begin; query < end; ++query) {
    for (int32_t h = 0; h < p.num_qo_heads; ++h) {
      AttendRow(p, static_cast<int32_t>(query), h, scores, scores + job.max_range);
    }
  }
  delete[] scores;
}

}  // namespace

KernelStatus NaiveAttention(const NaiveAttentionParams& p) {
  if (p.q == nullptr || p.o == nullptr || p.k == nullptr || p.v == nullptr ||
      p.kv_begin == nullptr || p.kv_end == nullptr || p.num_queries < 0 || p.num_qo_heads <= 0 ||
      p.num_kv_heads <= 0 || p.num_qo_heads % p.num_kv_heads != 0 || p.head_dim <= 0 ||
      p.num_kv_tokens < 0) {
    return KernelStatus::kInvalidArgument;
  }
  if (p.dtype != DType::kF32 && p.dtype != DType::kF16 && p.dtype != DType::kBF16) {
    return KernelStatus::kInvalidArgument;
  }
  int64_t max_range = 0;
  for (int32_t i = 0; i < p.num_queries; ++i) {
    if (p.kv_begin[i] < 0 || p.kv_end[i] > p.num_kv_tokens || p.kv_begin[i] > p.kv_end[i]) {
      return KernelStatus::kInvalidArgument;
    }
    if (p.kv_end[i] - p.kv_begin[i] > max_range) max_range = p.kv_end[i] - p.kv_begin[i];
  }
  Job job;
  job.params = &p;
  job.max_range = max_range;
  if (p.pool == nullptr) {
    RunRows(&job, 0, p.num_queries, 0);
  } else {
    p.pool->ParallelFor(p.num_queries, 1, p.num_threads, &RunRows, &job);
  }
  return job.out_of_memory.load() ? KernelStatus::kResourceExhausted : KernelStatus::kOk;
}

}  // namespace chunkserve::kernels::cpu
