// ByteBudget: one bound on bytes held across many connections (partial frames a peer has started
// and not finished), so that many slow or hostile peers together cannot pin more memory than the
// process allows. Each connection reserves what it buffers and releases it when the frame
// completes or the connection closes; a connection whose reservation fails is closed.
//
// Thread safety: all methods are safe from any thread (atomics).
#ifndef CHUNKSERVE_RUNTIME_WIRE_BUDGET_H_
#define CHUNKSERVE_RUNTIME_WIRE_BUDGET_H_

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace chunkserve::wire {

class ByteBudget {
 public:
  explicit ByteBudget(size_t limit) : limit_(limit) {}

  // Adds n to the bytes in use unless that would pass the limit (then nothing changes).
  bool TryReserve(size_t n);
  void Release(size_t n);

  size_t used() const { return used_.load(std::memory_order_relaxed); }
  size_t limit() const { return limit_; }
  uint64_t refusals() const { return refusals_.load(std::memory_order_relaxed); }

 private:
  const size_t limit_;
  std::atomic<size_t> used_{0};
  std::atomic<uint64_t> refusals_{0};
};

}  // namespace chunkserve::wire

#endif  // CHUNKSERVE_RUNTIME_WIRE_BUDGET_H_
