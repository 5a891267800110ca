// ReferenceModel: a deliberately plain Llama forward pass for tests, independent of the engine's
// backend, kernels, KV cache and plan. Weights are read by name from the safetensors store and
// widened to double; every token's logits come from full causal attention over the whole
// sequence, recomputed from scratch (no cache), in double precision.
//
// Supports what the tiny models use: plain RoPE (no scaling), optional q/k/v biases, tied or
// untied embeddings, GQA.
#ifndef CHUNKSERVE_TESTS_TESTING_REFERENCE_MODEL_H_
#define CHUNKSERVE_TESTS_TESTING_REFERENCE_MODEL_H_

#include <span>
#include <string>
#include <vector>

#include "runtime/base/ids.h"
#include "runtime/model/model.h"

namespace chunkserve::testing {

class ReferenceModel {
 public:
  explicit ReferenceModel(const model::LoadedModel& model);

  // Logits [tokens.size()][vocab] for every position of `tokens`.
  std::vector<std::vector<double>> Logits(std::span<const TokenId> tokens) const;

  // Greedy continuation: n tokens, argmax with ties to the lowest id.
  std::vector<TokenId> Greedy(std::span<const TokenId> prompt, int n) const;

 private:
  std::vector<double> Tensor(const std::string& name) const;

  const model::LoadedModel& model_;
  model::ModelConfig c_;
  std::vector<double> embed_, lm_head_, final_norm_;
  struct Layer {
    std::vector<double> in_norm, wq, wk, wv, wo, bq, bk, bv, post_norm, gate, up, down;
  };
  std::vector<Layer> layers_;
};

}  // namespace chunkserve::testing

#endif  // CHUNKSERVE_TESTS_TESTING_REFERENCE_MODEL_H_
