// Tensor-parallel sharding of a Llama-family model (runtime/README.md "parallel/"): which slice
// of each weight rank r of T holds. Megatron-style: attention is split by heads, the MLP by its
// intermediate columns, so each rank's attention and MLP run without communication and one
// all-reduce after each of the o and down projections sums the partial outputs.
//
//   tensor                 split             rank r holds (n = rows or columns, T ranks)
//   q_proj [q_dim, h]      rows, by q head   query heads [r * Hq / T, (r + 1) * Hq / T)
//   k_proj, v_proj         rows, by KV head  KV heads    [r * Hkv / T, (r + 1) * Hkv / T)
//   q/k/v biases           as their weights
//   o_proj [h, q_dim]      columns           the columns of its query heads
//   gate_proj, up_proj     rows              intermediate [r * I / T, (r + 1) * I / T)
//   down_proj [h, I]       columns           the same intermediate range
//   embeddings, norms      replicated        everything
//   o_proj bias            replicated        added once, after the all-reduce
//   lm_head                rank 0 only       the engine samples on rank 0
//
// Splitting query and KV heads by the same contiguous ranges keeps grouped-query attention
// local: query head j uses KV head j / (Hq / Hkv), and both land on the same rank when T divides
// Hkv. A rank's KV cache holds its KV heads only.
#ifndef CHUNKSERVE_RUNTIME_MODEL_TENSOR_PARALLEL_H_
#define CHUNKSERVE_RUNTIME_MODEL_TENSOR_PARALLEL_H_

#include <cstdint>

#include "runtime/base/status.h"
#include "runtime/model/model_config.h"

namespace chunkserve::model {

// [begin, begin + count) of a dimension split evenly over the group.
struct ShardRange {
  int64_t begin = 0;
  int64_t count = 0;
};

struct TensorParallelShard {
  int32_t rank = 0;
  int32_t size = 1;
  ShardRange qo_heads;      // query heads
  ShardRange kv_heads;      // KV heads
  ShardRange q_rows;        // q_proj rows == o_proj columns (qo_heads * head_dim)
  ShardRange kv_rows;       // k_proj / v_proj rows (kv_heads * head_dim)
  ShardRange intermediate;  // gate / up rows == down columns
};

// InvalidArgument unless 1 <= size and size divides num_attention_heads, num_key_value_heads and
// intermediate_size; the message names the config value and the sizes that would work.
Status ValidateTensorParallel(const ModelConfig& config, int32_t size);

// Rank `rank`'s slices; validates as above and 0 <= rank < size.
Result<TensorParallelShard> ShardForRank(const ModelConfig& config, int32_t rank, int32_t size);

}  // namespace chunkserve::model

#endif  // CHUNKSERVE_RUNTIME_MODEL_TENSOR_PARALLEL_H_
