#include "runtime/engine/rate_window.h"

namespace chunkserve::engine {

void RateWindow::Add(const Sample& s) {
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
  if (busy > 0) rates_.decode_per_busy_s = static_cast<double>(s.decode - first.decode) / busy;
}

}  // namespace chunkserve::engine
