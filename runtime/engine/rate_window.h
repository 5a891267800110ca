// RateWindow: the engine's decode and prefill rates over its last ~2 seconds of steps.
//
//   RateWindow w;
//   w.Add({.t = step_start, .busy_s = total_step_seconds, .decode = tokens, .prefill = tokens});
//   Rates r = w.rates();
//
// Two rates per counter, for two readers. The wall rate (tokens / elapsed time) is what the
// engine did: an idle engine's is low, and it is what the C ABI's stats report. The busy decode
// rate (decode tokens / seconds spent decoding) is what the engine decodes while it runs: the
// router divides by it to predict how soon a busy worker frees a slot, and an engine that sat
// idle for a second before this step decodes no slower for it. Measured over wall time, the
// first step after an idle gap spans the gap and would read as a tenth of the true rate or less.
//
// Seconds spent decoding = step seconds less the prefill in them at the best rate seen in
// prefill-only steps (a step batches both; its time is not split otherwise), and at least a
// tenth of the step seconds. Without that, a worker that has just finished a long prefill and
// is prefilling the suffixes of the requests queued behind it (2,048 prefill tokens beside 31
// decode rows a step) reads as decoding at an eighth of what it does a moment later, and the
// router predicts its slot wait 10x too long. No prefill-only step yet: step seconds as they are.
//
// Not thread-safe: the engine's step thread adds samples under its lock.
#ifndef CHUNKSERVE_RUNTIME_ENGINE_RATE_WINDOW_H_
#define CHUNKSERVE_RUNTIME_ENGINE_RATE_WINDOW_H_

#include <chrono>
#include <cstdint>
#include <deque>

namespace chunkserve::engine {

class RateWindow {
 public:
  using Clock = std::chrono::steady_clock;

  // One sample after a step: its start time and the counters (cumulative) after it.
  struct Sample {
    Clock::time_point t;
    double busy_s = 0;     // seconds spent in steps since creation, this step included
    uint64_t decode = 0;   // decode tokens since creation
    uint64_t prefill = 0;  // prefill tokens since creation
  };

  struct Rates {
    double decode_per_s = 0;       // over wall time
    double prefill_per_s = 0;      // over wall time
    double decode_per_busy_s = 0;  // over the time spent decoding (above)
    double best_prefill_per_s = 0;  // prefill tokens / step seconds, best prefill-only step
  };

  explicit RateWindow(std::chrono::nanoseconds span = std::chrono::seconds(2)) : span_(span) {}

  // Adds a sample and drops those older than the span, keeping two at least. Rates whose
  // interval is empty (one sample, or no step time between the ends) keep their last value.
  void Add(const Sample& s);

  const Rates& rates() const { return rates_; }

 private:
  std::chrono::nanoseconds span_;
  std::deque<Sample> window_;
  Rates rates_;
};

}  // namespace chunkserve::engine

#endif  // CHUNKSERVE_RUNTIME_ENGINE_RATE_WINDOW_H_
