// The small model shape most engine, model-definition and router tests use: 2 layers, hidden
// 64, 4 query and 2 KV heads of 16 (GQA), SwiGLU 128, vocabulary 256, context 1024. Small enough
// for a quick test, real enough for grouped-query attention, shared chunks and a second layer.
// Written to disk with model::WriteTinyModel (random weights from `seed`).
#ifndef CHUNKSERVE_TESTS_TESTING_TINY_MODELS_H_
#define CHUNKSERVE_TESTS_TESTING_TINY_MODELS_H_

#include <cstdint>

#include "runtime/model/tiny_model.h"

namespace chunkserve::testing {

inline model::TinyModelOptions SmallTestModel(uint64_t seed) {
  model::TinyModelOptions o;
  o.seed = seed;
  o.vocab_size = 256;
  o.hidden_size = 64;
  o.num_layers = 2;
  o.num_qo_heads = 4;
  o.num_kv_heads = 2;
  o.head_dim = 16;
  o.intermediate_size = 128;
  o.max_position_embeddings = 1024;
  return o;
}

}  // namespace chunkserve::testing

#endif  // CHUNKSERVE_TESTS_TESTING_TINY_MODELS_H_
