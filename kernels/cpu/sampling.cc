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

float TokenLogprobs(std::span<const float> logits, int32_t token, int32_t k, int32_t* top_ids,
                    float* top_logprobs, int32_t* top_count, SamplingScratch* scratch) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  *top_count = 0;
  double max_logit = -std::numeric_limits<double>::infinity();
  for (const float x : logits) {
    if (std::isfinite(x)) max_logit = std::max(max_logit, static_cast<double>(x));
  }
  if (!std::isfinite(max_logit)) return kNegInf;
  double total = 0.0;
  for (const float x : logits) {
    if (std::isfinite(x)) total += std::exp(static_cast<double>(x) - max_logit);
  }
  const double log_z = max_logit + std::log(total);
  const auto logprob = [&](float x) {
    return std::isfinite(x) ? static_cast<float>(static_cast<double>(x) - log_z) : kNegInf;
  };
  if (k > 0) {
    auto& cand = scratch->candidates;
    cand.clear();
    for (size_t i = 0; i < logits.size(); ++i) {
      if (std::isfinite(logits[i])) cand.emplace_back(logits[i], static_cast<int32_t>(i));
    }
    const size_t n = std::min(cand.size(), static_cast<size_t>(k));
    std::partial_sort(cand.begin(), cand.begin() + static_cast<std::ptrdiff_t>(n), cand.end(),
                      [](const auto& a, const auto& b) {
                        return a.first > b.first || (a.first == b.first && a.second < b.second);
                      });
    for (size_t i = 0; i < n; ++i) {
      top_ids[i] = cand[i].second;
      top_logprobs[i] = logprob(cand[i].first);
    }
    *top_count = static_cast<int32_t>(n);
  }
  const bool in_range = token >= 0 && static_cast<size_t>(token) < logits.size();
  return in_range ? logprob(logits[static_cast<size_t>(token)]) : kNegInf;
}

}  // namespace chunkserve::kernels::cpu
