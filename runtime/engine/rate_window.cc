#include "runtime/engine/rate_window.h"

#include <algorithm>

namespace chunkserve::engine {

void RateWindow::Add(const Sample& s) {
  if (!window_.empty()) {
    const Sample& prev = window_.back();
    const double step_s = s.busy_s - prev.busy_s;
    if (step_s > 0 && s.prefill > prev.prefill && s.decode == prev.decode) {
      rates_.best_prefill_per_s =
          std::max(rates_.best_prefill_per_s, static_cast<double>(s.prefill - prev.prefill) / step_s);
    }
  }
  window_.push_back(s);
  while (window_.size() > 2 && s.t - window_.front().t > span_) window_.pop_front();
  const Sample& first = window_.front();
  const double dt = std::chrono::duration<double>(s.t - first.t).count();
  if (dt > 0) {
    rates_.decode_per_s = static_cast<double>(s.decode - first.decode) / dt;
    rates_.prefill_per_s = static_cast<double>(s.prefill - first.prefill) / dt;
  }
  // The first sample's step is not in the interval (its tokens are in first.decode), and
  // neither is its step time (in first.busy_s).
  const double busy = s.busy_s - first.busy_s;
  if (busy > 0) {
    double decoding = busy;
    if (rates_.best_prefill_per_s > 0) {
      const double prefilling =
          static_cast<double>(s.prefill - first.prefill) / rates_.best_prefill_per_s;
      decoding = std::max(0.1 * busy, busy - prefilling);
    }
    rates_.decode_per_busy_s = static_cast<double>(s.decode - first.decode) / decoding;
  }
}

}  // namespace chunkserve::engine
