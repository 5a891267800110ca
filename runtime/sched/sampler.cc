#include "runtime/sched/sampler.h"

namespace chunkserve::sched {

TokenId Argmax(std::span<const float> logits) { return kernels::cpu::ArgmaxToken(logits); }

double Sampler::NextUniform() {
  // splitmix64: tiny, full-period, and identical on every platform.
  uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1.0p-53;
}

TokenId Sampler::Sample(std::span<const float> logits) {
  const double u = Draw();  // drawn first: one draw per token whatever the filters keep
  return kernels::cpu::SampleToken(logits, rule(), u, &scratch_);
}

}  // namespace chunkserve::sched
