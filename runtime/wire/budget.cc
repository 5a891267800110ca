#include "runtime/wire/budget.h"

namespace chunkserve::wire {

bool ByteBudget::TryReserve(size_t n) {
  size_t used = used_.load(std::memory_order_relaxed);
  do {
    if (n > limit_ || used > limit_ - n) {
      refusals_.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
  } while (!used_.compare_exchange_weak(used, used + n, std::memory_order_relaxed));
  return true;
}

void ByteBudget::Release(size_t n) { used_.fetch_sub(n, std::memory_order_relaxed); }

}  // namespace chunkserve::wire
