#include "tests/engine/reference_check.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <numeric>

namespace chunkserve::testing {
namespace {

bool Greedy(const sched::SamplingParams& p) { return p.temperature == 0.0f || p.top_k == 1; }

TokenId Argmax(std::span<const double> logits) {
  TokenId best = 0;
  for (size_t j = 1; j < logits.size(); ++j) {
    if (logits[j] > logits[best]) best = static_cast<TokenId>(j);
  }
  return best;
}

// Token ids by logit descending, ties to the lower id.
std::vector<TokenId> ByLogit(std::span<const double> logits) {
  std::vector<TokenId> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](TokenId a, TokenId b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  return order;
}

size_t TopK(const sched::SamplingParams& p, size_t vocab) {
  return p.top_k > 0 ? std::min(static_cast<size_t>(p.top_k), vocab) : vocab;
}

}  // namespace

double SplitMix64::Uniform() {
  uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) / 9007199254740992.0;  // 2^53
}

TokenId ReferenceSample(std::span<const double> logits, const sched::SamplingParams& params,
                        double u) {
  if (Greedy(params)) return Argmax(logits);
  const std::vector<TokenId> order = ByLogit(logits);
  const size_t k = TopK(params, logits.size());
  const double t = params.temperature;
  std::vector<double> w(k);
  double total = 0;
  for (size_t i = 0; i < k; ++i) {
    w[i] = std::exp((logits[order[i]] - logits[order[0]]) / t);
    total += w[i];
  }
  size_t kept = k;
  if (params.top_p < 1.0f) {
    double mass = 0;
    for (size_t i = 0; i < k; ++i) {
      mass += w[i] / total;
      if (mass >= static_cast<double>(params.top_p)) {
        kept = i + 1;
        break;
      }
    }
  }
  const double target = u * std::accumulate(w.begin(), w.begin() + static_cast<long>(kept), 0.0);
  double running = 0;
  for (size_t i = 0; i < kept; ++i) {
    running += w[i];
    if (target < running) return order[i];
  }
  return order[kept - 1];
}

// Greedy: `token` can win when its logit is within 2 * kLogitError of the maximum. Sampled: with
// every logit moved by at most e = kLogitError, each weight exp(logit / T) (relative to the max)
// moves by a factor within [1/r, r], r = exp(2e / T), and so do sums of them. `token` is picked iff
// it survives top-k and top-p and start <= u * kept < end, where start / end are the running mass
// before / through it and kept the mass top-p keeps (all over the top-k mass W). Bounds:
//   start >= (mass of tokens surely ranked above it, logit > its + 2e) / r, over W' <= W r^2;
//   end   <= (that + the tokens that may rank either side + its own) * r, over W' >= W / r^2;
//   kept / W' lies between the cumulative fractions at the earliest and latest plausible top-p
//   cut (each fraction within a factor r^4).
bool CouldPickUnderRounding(std::span<const double> logits, const sched::SamplingParams& params,
                            double u, TokenId token) {
  const double e2 = 2 * kLogitError;
  const double x = logits[token];
  if (Greedy(params)) return *std::max_element(logits.begin(), logits.end()) - x <= e2;
  const std::vector<TokenId> order = ByLogit(logits);
  const size_t k = TopK(params, logits.size());
  size_t surely_above = 0;
  for (double l : logits) surely_above += l > x + e2;
  if (surely_above >= k) return false;  // cannot make the top k
  const double t = params.temperature;
  const double r = std::exp(e2 / t), r2 = r * r, r4 = r2 * r2;
  auto weight = [&](TokenId j) { return std::exp((logits[j] - logits[order[0]]) / t); };
  double w_total = 0, before = 0, around = 0;
  for (size_t i = 0; i < k; ++i) {
    const TokenId j = order[i];
    const double w = weight(j);
    w_total += w;
    if (j == token) continue;
    if (logits[j] > x + e2) {
      before += w;
    } else if (logits[j] >= x - e2) {
      around += w;
    }
  }
  const double start_lo = before / r / (w_total * r2);
  const double end_hi = (before + around + weight(token)) * r / (w_total / r2);
  double kept_lo = 1, kept_hi = 1;
  const double p = params.top_p;
  if (params.top_p < 1.0f) {
    if (start_lo >= p) return false;  // top-p ends before it
    kept_lo = p;
    kept_hi = 0;
    double cum = 0;
    bool earliest_seen = false;
    for (size_t i = 0; i < k; ++i) {
      cum += weight(order[i]) / w_total;
      if (!earliest_seen && cum * r4 >= p) {
        kept_lo = std::max(p, cum / r4);
        earliest_seen = true;
      }
      if (cum / r4 >= p || i + 1 == k) {
        kept_hi = std::min(1.0, cum * r4);
        break;
      }
    }
  }
  return start_lo <= u * kept_hi && u * kept_lo < end_hi;
}

void ReferenceCheck::Expect(const sched::RequestOptions& request, std::span<const TokenId> tokens,
                            const std::string& what) {
  if (tokens.empty()) return;
  std::vector<TokenId> seq = request.prompt;
  seq.insert(seq.end(), tokens.begin(), tokens.end() - 1);
  const std::vector<std::vector<double>> logits = reference_.Logits(seq);
  const sched::SamplingParams& params = request.sampling;
  SplitMix64 draws(params.seed);
  const size_t first = request.prompt.size() - 1;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const std::vector<double>& row = logits[first + i];
    const double u = Greedy(params) ? 0.0 : draws.Uniform();  // one draw per sampled token
    const TokenId want = ReferenceSample(row, params, u);
    const TokenId got = tokens[i];
    ++tokens_checked_;
    if (!Greedy(params) && want != Argmax(row)) ++sampled_off_argmax_;
    if (got == want) continue;
    if (got < 0 || static_cast<size_t>(got) >= row.size()) {
      ADD_FAILURE() << what << ": generated token " << i << " is " << got
                    << ", outside the vocabulary";
      return;
    }
    if (CouldPickUnderRounding(row, params, u, got)) {
      ++near_ties_;
      std::cout << "[ near tie ] " << what << " token " << i << ": engine " << got << " ("
                << row[got] << "), reference " << want << " (" << row[want] << "), u " << u
                << std::endl;
      continue;
    }
    ADD_FAILURE() << what << ": generated token " << i << " is " << got << " (reference logit "
                  << row[got] << "), the reference " << (Greedy(params) ? "argmax" : "sample")
                  << " is " << want << " (logit " << row[want] << ")"
                  << (Greedy(params) ? "" : ", draw u = " + std::to_string(u))
                  << ": beyond float32 rounding (replay with the printed CHUNKSERVE_TEST_SEED)";
    return;  // later positions would only repeat the news
  }
}

void ReferenceCheck::Finish() const {
  EXPECT_LE(near_ties_, 2 + tokens_checked_ / 200)
      << near_ties_ << " near ties in " << tokens_checked_
      << " tokens: more than float32 rounding explains";
}

}  // namespace chunkserve::testing
