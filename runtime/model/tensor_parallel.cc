#include "runtime/model/tensor_parallel.h"

#include <string>

namespace chunkserve::model {
namespace {

// "1, 2, 4" for the divisors of every value: the tensor-parallel sizes that would work.
std::string WorkingSizes(const ModelConfig& c) {
  std::string out;
  for (int32_t t = 1; t <= c.num_kv_heads; ++t) {
    if (c.num_qo_heads % t == 0 && c.num_kv_heads % t == 0 && c.intermediate_size % t == 0) {
      if (!out.empty()) out += ", ";
      out += std::to_string(t);
    }
  }
  return out;
}

ShardRange Split(int64_t total, int32_t rank, int32_t size) {
  return {total / size * rank, total / size};
}

}  // namespace

Status ValidateTensorParallel(const ModelConfig& c, int32_t size) {
  if (size < 1) {
    return Status::InvalidArgument("tensor-parallel size must be >= 1, got " +
                                   std::to_string(size));
  }
  auto check = [&](const char* field, int32_t value) -> Status {
    if (value % size == 0) return Status::Ok();
    return Status::InvalidArgument("tensor-parallel size " + std::to_string(size) +
                                   " does not divide " + field + " = " + std::to_string(value) +
                                   " (each rank holds an equal share); sizes that divide every " +
                                   "split dimension of this model: " + WorkingSizes(c));
  };
  CHUNKSERVE_RETURN_IF_ERROR(check("num_attention_heads", c.num_qo_heads));
  CHUNKSERVE_RETURN_IF_ERROR(check("num_key_value_heads", c.num_kv_heads));
  return check("intermediate_size", c.intermediate_size);
}

Result<TensorParallelShard> ShardForRank(const ModelConfig& c, int32_t rank, int32_t size) {
  CHUNKSERVE_RETURN_IF_ERROR(ValidateTensorParallel(c, size));
  if (rank < 0 || rank >= size) {
    return Status::InvalidArgument("tensor-parallel rank " + std::to_string(rank) +
                                   " outside [0, " + std::to_string(size) + ")");
  }
  TensorParallelShard s;
  s.rank = rank;
  s.size = size;
  s.qo_heads = Split(c.num_qo_heads, rank, size);
  s.kv_heads = Split(c.num_kv_heads, rank, size);
  s.q_rows = {s.qo_heads.begin * c.head_dim, s.qo_heads.count * c.head_dim};
  s.kv_rows = {s.kv_heads.begin * c.head_dim, s.kv_heads.count * c.head_dim};
  s.intermediate = Split(c.intermediate_size, rank, size);
  return s;
}

}  // namespace chunkserve::model
