// ThreadPool: a fixed set of worker threads for the CPU kernels, with per-thread scratch memory.
//
// A ParallelFor runs fn(ctx, begin, end, thread_index) over [0, num_tasks) in grains handed out
// dynamically (one atomic counter), so tasks of unequal cost balance out. The calling thread takes
// part as thread_index 0; workers are 1 .. num_threads() - 1. Nothing is allocated per call: the
// job is a function pointer and a context pointer, and each thread's scratch (scratch_bytes(),
// 64-byte aligned) is allocated once, at construction.
//
// Idle workers spin for about 50 us after a job (decode calls come back to back, one per layer)
// and then sleep on a futex, so an idle pool costs no CPU. Workers join a job only while it is
// open: once the caller finds no task left to claim it closes the job and waits only for the
// workers that joined in time to finish the tasks they took. A worker the OS did not run in time
// (other processes on the cores) does not hold the caller up: the caller runs the tasks itself. The
// caller waits for those that joined by polling for 50 us, then yielding the core up to 2 ms
// (a worker it waits for may be waiting for this core), then sleeping.
//
// Thread safety: ParallelFor may be called from any thread; concurrent calls are serialized. A task
// must not call ParallelFor on the same pool (it would deadlock) and must not throw.
#ifndef CHUNKSERVE_KERNELS_CPU_THREAD_POOL_H_
#define CHUNKSERVE_KERNELS_CPU_THREAD_POOL_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace chunkserve::kernels::cpu {

class ThreadPool {
 public:
  using TaskFn = void (*)(void* ctx, int64_t begin, int64_t end, int32_t thread_index);

  // Per-thread scratch that covers every shape the attention kernels accept (head_dim and
  // chunk_size up to 256).
  static constexpr size_t kDefaultScratchBytes = size_t{1} << 20;

  // num_threads <= 0 means std::thread::hardware_concurrency(). If the OS refuses a thread, the
  // pool runs with the threads it got (num_threads() says how many); if the scratch allocation
  // fails, scratch_bytes() is 0 and kernels that need scratch return kResourceExhausted.
  explicit ThreadPool(int32_t num_threads = 0,
                      size_t scratch_bytes_per_thread = kDefaultScratchBytes);
  ~ThreadPool();

  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Threads including the caller; >= 1.
  int32_t num_threads() const { return static_cast<int32_t>(workers_.size()) + 1; }
  size_t scratch_bytes() const { return scratch_ == nullptr ? 0 : scratch_bytes_; }
  // Scratch of thread `thread_index` (0 .. num_threads() - 1); null when scratch_bytes() == 0.
  void* scratch(int32_t thread_index) const {
    return scratch_ == nullptr ? nullptr
                               : scratch_ + static_cast<size_t>(thread_index) * scratch_bytes_;
  }

  // Runs fn over [0, num_tasks) on min(max_threads, num_threads()) threads (max_threads <= 0: all),
  // handing out `grain` tasks at a time (grain < 1 is taken as 1). Returns when every task is done.
  void ParallelFor(int64_t num_tasks, int64_t grain, int32_t max_threads, TaskFn fn, void* ctx);

  // Same, for a callable f(begin, end, thread_index); f lives on the caller's stack for the call.
  template <typename F>
  void ParallelFor(int64_t num_tasks, int64_t grain, int32_t max_threads, F& f) {
    ParallelFor(num_tasks, grain, max_threads, &Thunk<F>, &f);
  }

 private:
  template <typename F>
  static void Thunk(void* ctx, int64_t begin, int64_t end, int32_t thread_index) {
    (*static_cast<F*>(ctx))(begin, end, thread_index);
  }

  void WorkerLoop(int32_t thread_index);
  void RunTasks(int32_t thread_index);

  std::vector<std::thread> workers_;
  unsigned char* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;

  std::mutex call_mu_;  // one ParallelFor at a time

  // The current job; written by the caller before it opens the job (generation_, release), read by
  // workers after they have joined it, and left alone until every worker that joined has left.
  TaskFn fn_ = nullptr;
  void* ctx_ = nullptr;
  int64_t num_tasks_ = 0;
  int64_t grain_ = 1;
  int32_t active_threads_ = 1;
  bool stop_ = false;

  // Odd while a job is open for workers to join, even once its caller has closed it (and between
  // jobs). A worker joins job g by counting itself in joined_ and then seeing generation_ still at
  // g; the caller closes the job and then waits for joined_ to reach zero (both sequentially
  // consistent, so either the worker sees the job closed or the caller sees the worker).
  alignas(64) std::atomic<uint32_t> generation_{0};
  alignas(64) std::atomic<int64_t> next_task_{0};
  alignas(64) std::atomic<int32_t> joined_{0};
};

}  // namespace chunkserve::kernels::cpu

#endif  // CHUNKSERVE_KERNELS_CPU_THREAD_POOL_H_
