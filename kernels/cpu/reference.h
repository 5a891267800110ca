// The naive attention reference: the oracle every CPU (and CUDA) attention kernel is tested
// against, and the "naive" line of the attention benchmark.
//
// Deliberately independent of the fast kernels: contiguous K/V, plain loops, no SIMD code of ours,
// no online softmax. Each query row computes all its scores in fp64, subtracts the maximum,
// exponentiates with std::exp, normalizes and accumulates V in fp64. K/V are read through the
// portable conversions of kernels/cpu/dtype.h, so for fp16/bf16 KV it sees exactly the rounded
// values the fast kernels see.
#ifndef CHUNKSERVE_KERNELS_CPU_REFERENCE_H_
#define CHUNKSERVE_KERNELS_CPU_REFERENCE_H_

#include <cstdint>

#include "kernels/attention_params.h"
#include "kernels/cpu/common.h"
#include "kernels/cpu/thread_pool.h"

namespace chunkserve::kernels::cpu {

struct NaiveAttentionParams {
  const float* q = nullptr;  // [num_queries, num_qo_heads, head_dim]
  float* o = nullptr;        // [num_queries, num_qo_heads, head_dim]
  const void* k = nullptr;   // [num_kv_tokens, num_kv_heads, head_dim] in dtype, contiguous
  const void* v = nullptr;   // [num_kv_tokens, num_kv_heads, head_dim] in dtype, contiguous
  DType dtype = DType::kF32;
  int64_t num_kv_tokens = 0;
  // Query i attends to KV tokens [kv_begin[i], kv_end[i]) (decode: the sequence's whole context;
  // causal prefill: the sequence's tokens up to and including the query's position). An empty
  // range gives zeros.
  const int64_t* kv_begin = nullptr;  // [num_queries]
  const int64_t* kv_end = nullptr;    // [num_queries]
  int32_t num_queries = 0;
  int32_t num_qo_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  float sm_scale = 0.0f;
  ThreadPool* pool = nullptr;  // optional: spreads queries over threads; null runs on the caller
  int32_t num_threads = 0;
};

KernelStatus NaiveAttention(const NaiveAttentionParams& params);

}  // namespace chunkserve::kernels::cpu

#endif  // CHUNKSERVE_KERNELS_CPU_REFERENCE_H_
