#include "runtime/sched/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace chunkserve::sched {

TokenId Argmax(std::span<const float> logits) {
  TokenId best = 0;
  float best_v = -std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < logits.size(); ++i) {
    // `>` keeps the lowest id on ties; NaN never compares greater, so it never wins.
    if (logits[i] > best_v) {
      best_v = logits[i];
      best = static_cast<TokenId>(i);
    }
  }
  return best;
}

double Sampler::NextUniform() {
  // splitmix64: tiny, full-period, and identical on every platform.
  uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1.0p-53;
}

TokenId Sampler::Sample(std::span<const float> logits) {
  if (params_.temperature == 0.0f || params_.top_k == 1) return Argmax(logits);
  const double u = NextUniform();  // drawn first: one draw per token whatever the filters keep

  const float inv_t = 1.0f / params_.temperature;
  scratch_.clear();
  for (size_t i = 0; i < logits.size(); ++i) {
    if (std::isfinite(logits[i])) scratch_.emplace_back(logits[i] * inv_t, static_cast<TokenId>(i));
  }
  if (scratch_.empty()) return 0;
  // Descending by logit, ties to the lower id, so the candidate order is deterministic.
  auto higher = [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  size_t n = scratch_.size();
  if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < n) {
    std::nth_element(scratch_.begin(), scratch_.begin() + params_.top_k, scratch_.end(), higher);
    n = static_cast<size_t>(params_.top_k);
  }
  std::sort(scratch_.begin(), scratch_.begin() + n, higher);

  // Softmax over the kept candidates, in double: the max-subtraction keeps exp() in range.
  const double max_logit = scratch_[0].first;
  double total = 0.0;
  std::vector<double>& probs = probs_;
  probs.resize(n);
  for (size_t i = 0; i < n; ++i) {
    probs[i] = std::exp(static_cast<double>(scratch_[i].first) - max_logit);
    total += probs[i];
  }
  // top-p: keep the smallest prefix whose mass reaches top_p (at least one token).
  size_t kept = n;
  if (params_.top_p < 1.0f) {
    double mass = 0.0;
    for (size_t i = 0; i < n; ++i) {
      mass += probs[i] / total;
      if (mass >= params_.top_p) {
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
    if (target < acc) return scratch_[i].second;
  }
  return scratch_[kept - 1].second;  // rounding left target == kept_total
}

}  // namespace chunkserve::sched
