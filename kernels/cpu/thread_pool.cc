#include "kernels/cpu/thread_pool.h"

#include <chrono>
#include <cstdlib>
#include <new>
#include <system_error>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace chunkserve::kernels::cpu {
namespace {

// Polling time before an idle worker sleeps: long enough to catch the next decode layer's job
// without a futex round trip, short enough not to burn a shared core.
constexpr auto kSpinTime = std::chrono::microseconds(50);
// A caller waiting for the workers that joined its job polls as long as a worker, then yields the
// core until kJoinYieldTime: the last tasks of a job end up to one task apart (~100-300 us for
// attention), and waking it from the futex took 50-90 us on a virtualized 2-core machine, 3% of a
// 3 ms attention call. Yielding instead of polling lets a worker that shares this core finish.
constexpr auto kJoinYieldTime = std::chrono::milliseconds(2);

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#endif
}

// Returns a value of `value` for which done(value) holds: polls until `spin`, then yields the core
// until `yield` (if later), then sleeps until the value changes. Loads are sequentially consistent
// (plain loads on x86): the caller's close-then-count relies on it.
template <typename T, typename Pred>
T SpinThenWait(const std::atomic<T>& value, std::chrono::microseconds spin,
               std::chrono::microseconds yield, Pred done) {
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0;; ++i) {
    const T now = value.load(std::memory_order_seq_cst);
    if (done(now)) return now;
    CpuRelax();
    if ((i & 63) == 63 && std::chrono::steady_clock::now() > start + spin) break;
  }
  for (int i = 0;; ++i) {
    const T now = value.load(std::memory_order_seq_cst);
    if (done(now)) return now;
    if ((i & 15) == 15 && std::chrono::steady_clock::now() > start + yield) break;
    std::this_thread::yield();
  }
  for (;;) {
    const T now = value.load(std::memory_order_seq_cst);
    if (done(now)) return now;
    value.wait(now, std::memory_order_seq_cst);
  }
}

}  // namespace

ThreadPool::ThreadPool(int32_t num_threads, size_t scratch_bytes_per_thread) {
  if (num_threads <= 0) num_threads = static_cast<int32_t>(std::thread::hardware_concurrency());
  if (num_threads <= 0) num_threads = 1;
  scratch_bytes_ = (scratch_bytes_per_thread + 63) / 64 * 64;
  if (scratch_bytes_ > 0) {
    scratch_ = static_cast<unsigned char*>(
        std::aligned_alloc(64, scratch_bytes_ * static_cast<size_t>(num_threads)));
  }
  workers_.reserve(static_cast<size_t>(num_threads - 1));
  for (int32_t i = 1; i < num_threads; ++i) {
    try {
      workers_.emplace_back([this, i] { WorkerLoop(i); });
    } catch (const std::system_error&) {
      break;  // run with the threads we got
    }
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(call_mu_);
    stop_ = true;
    // An open job that is never closed: every worker joins it, sees stop_ and returns.
    generation_.fetch_add(1, std::memory_order_release);
    generation_.notify_all();
  }
  for (std::thread& t : workers_) t.join();
  std::free(scratch_);
}

void ThreadPool::RunTasks(int32_t thread_index) {
  for (;;) {
    const int64_t begin = next_task_.fetch_add(grain_, std::memory_order_relaxed);
    if (begin >= num_tasks_) return;
    const int64_t end = begin + grain_ < num_tasks_ ? begin + grain_ : num_tasks_;
    fn_(ctx_, begin, end, thread_index);
  }
}

void ThreadPool::WorkerLoop(int32_t thread_index) {
  uint32_t seen = 0;
  for (;;) {
    const uint32_t job = SpinThenWait(generation_, kSpinTime, kSpinTime,
                                      [seen](uint32_t g) { return (g & 1) != 0 && g != seen; });
    seen = job;
    joined_.fetch_add(1, std::memory_order_seq_cst);
    if (generation_.load(std::memory_order_seq_cst) == job) {  // joined while open
      if (stop_) return;
      if (thread_index < active_threads_) RunTasks(thread_index);
    }
    if (joined_.fetch_sub(1, std::memory_order_acq_rel) == 1) joined_.notify_one();
  }
}

void ThreadPool::ParallelFor(int64_t num_tasks, int64_t grain, int32_t max_threads, TaskFn fn,
                             void* ctx) {
  if (num_tasks <= 0) return;
  if (grain < 1) grain = 1;
  int32_t threads = num_threads();
  if (max_threads > 0 && max_threads < threads) threads = max_threads;
  const int64_t num_grains = (num_tasks + grain - 1) / grain;
  if (threads > num_grains) threads = static_cast<int32_t>(num_grains);
  // Held also on the single-thread path: thread index 0's scratch belongs to one caller at a time.
  std::lock_guard<std::mutex> lock(call_mu_);
  if (threads <= 1) {
    fn(ctx, 0, num_tasks, 0);
    return;
  }
  fn_ = fn;
  ctx_ = ctx;
  num_tasks_ = num_tasks;
  grain_ = grain;
  active_threads_ = threads;
  next_task_.store(0, std::memory_order_relaxed);
  const uint32_t job = generation_.load(std::memory_order_relaxed) + 1;  // even between jobs
  generation_.store(job, std::memory_order_release);
  generation_.notify_all();
  RunTasks(0);
  // Every task is claimed: close the job and wait for the workers that joined it.
  generation_.store(job + 1, std::memory_order_seq_cst);
  SpinThenWait(joined_, kSpinTime, kJoinYieldTime, [](int32_t n) { return n == 0; });
}

}  // namespace chunkserve::kernels::cpu
