#include "kernels/cpu/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace chunkserve::kernels::cpu {

int32_t ArgmaxToken(std::span<const float> logits) {
  int32_t best = 0;
  float best_v = -std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < logits.size(); ++i) {
    // `>` keeps the lowest id on ties; NaN never compares greater, so it never wins.
    if (logits[i] > best_v) {
      best_v = logits[i];
      best = static_cast<int32_t>(i);
    }
  }
  return best;
}

int32_t SampleToken(std::span<const float> logits, const SamplingRule& rule, double u,
                    SamplingScratch* scratch) {
  if (IsGreedy(rule)) return ArgmaxToken(logits);
  const float inv_t = 1.0f / rule.temperature;
  auto& cand = scratch->candidates;
  cand.clear();
  for (size_t i = 0; i < logits.size(); ++i) {
    if (std::isfinite(logits[i])) cand.emplace_back(logits[i] * inv_t, static_cast<int32_t>(i));
  }
  if (cand.empty()) return 0;
  // Descending by logit, ties to the lower id, so the candidate order is deterministic.
  auto higher = [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  size_t n = cand.size();
  if (rule.top_k > 0 && static_cast<size_t>(rule.top_k) < n) {
    std::nth_element(cand.begin(), cand.begin() + rule.top_k, cand.end(), higher);
    n = static_cast<size_t>(rule.top_k);
  }
  std::sort(cand.begin(), cand.begin() + static_cast<std::ptrdiff_t>(n), higher);

  // Softmax over the kept candidates, in double: the max-subtraction keeps exp() in range.
  const double max_logit = cand[0].first;
  double total = 0.0;
  std::vector<double>& probs = scratch->probs;
  probs.resize(n);
  for (size_t i = 0; i < n; ++i) {
    probs[i] = std::exp(static_cast<double>(cand[i].first) - max_logit);
    total += probs[i];
  }
  // top-p: keep the smallest prefix whose mass reaches top_p (at least one token).
  size_t kept = n;
  if (rule.top_p < 1.0f) {
    double mass = 0.0;
    for (size_t i = 0; i < n; ++i) {
      mass += probs[i] / total;
      if (mass >= rule.top_p) {
        kept = i + 1;
        break;
      }
    }
  }
  double kept_total = 0.0;
  for (size_t i = 0; i < kept; ++i) kept_total += probs[i];
  const double target = u * kept_total;
  double acc = 0.0;
  for (size_t i = 0; i < kept; ++i) {
    acc += probs[i];
    if (target < acc) return cand[i].second;
  }
  return cand[kept - 1].second;  // rounding left target == kept_total
}

}  // namespace chunkserve::kernels::cpu
