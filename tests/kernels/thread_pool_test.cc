// ThreadPool: every task runs exactly once on a valid thread index, callers are serialized, scratch
// is per thread and aligned, a worker the OS does not run does not hold callers up. Also the ISA
// selection helpers.
#include "kernels/cpu/thread_pool.h"

#include <gtest/gtest.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cpu/cpu_isa.h"

namespace chunkserve::kernels::cpu {
namespace {

struct ForCase {
  int64_t num_tasks;
  int64_t grain;
  int32_t max_threads;
};

class ParallelForTest : public ::testing::TestWithParam<ForCase> {};

TEST_P(ParallelForTest, EveryTaskRunsExactlyOnceOnAnAllowedThread) {
  static ThreadPool pool(4);
  const ForCase c = GetParam();
  std::vector<std::atomic<int32_t>> runs(static_cast<size_t>(c.num_tasks));
  std::atomic<int32_t> bad_index{0};
  const int32_t allowed = c.max_threads > 0 ? c.max_threads : pool.num_threads();
  auto body = [&](int64_t begin, int64_t end, int32_t thread_index) {
    if (thread_index < 0 || thread_index >= allowed) bad_index.fetch_add(1);
    for (int64_t i = begin; i < end; ++i) runs[static_cast<size_t>(i)].fetch_add(1);
  };
  pool.ParallelFor(c.num_tasks, c.grain, c.max_threads, body);
  EXPECT_EQ(bad_index.load(), 0);
  for (int64_t i = 0; i < c.num_tasks; ++i)
    ASSERT_EQ(runs[static_cast<size_t>(i)].load(), 1) << "task " << i;
}

INSTANTIATE_TEST_SUITE_P(Kernels, ParallelForTest,
                         ::testing::Values(ForCase{0, 1, 0}, ForCase{1, 1, 0}, ForCase{7, 3, 0},
                                           ForCase{1000, 1, 0}, ForCase{1000, 64, 2},
                                           ForCase{5, 1, 1}, ForCase{100000, 7, 3}),
                         [](const ::testing::TestParamInfo<ForCase>& info) {
                           std::string name = "n";
                           name += std::to_string(info.param.num_tasks);
                           name += "_grain";
                           name += std::to_string(info.param.grain);
                           name += "_threads";
                           name += std::to_string(info.param.max_threads);
                           return name;
                         });

TEST(ThreadPoolTest, ManySmallCallsInARow) {
  ThreadPool pool(3);
  std::atomic<int64_t> total{0};
  auto body = [&](int64_t begin, int64_t end, int32_t) { total.fetch_add(end - begin); };
  for (int i = 0; i < 2000; ++i) pool.ParallelFor(10, 1, 0, body);
  EXPECT_EQ(total.load(), 20000);
}

TEST(ThreadPoolTest, ConcurrentCallersAreSerialized) {
  ThreadPool pool(3);
  std::atomic<int32_t> inside{0};
  std::atomic<int32_t> overlap{0};
  std::atomic<int64_t> total{0};
  auto body = [&](int64_t begin, int64_t end, int32_t thread_index) {
    // Scratch of one thread index is only ever used by one task at a time.
    auto* slot = static_cast<std::atomic<int32_t>*>(pool.scratch(thread_index));
    if (slot->fetch_add(1) != 0) overlap.fetch_add(1);
    inside.fetch_add(1);
    total.fetch_add(end - begin);
    inside.fetch_sub(1);
    slot->fetch_sub(1);
  };
  for (int32_t t = 0; t < pool.num_threads(); ++t) new (pool.scratch(t)) std::atomic<int32_t>(0);
  std::thread a([&] {
    for (int i = 0; i < 300; ++i) pool.ParallelFor(50, 1, 0, body);
  });
  std::thread b([&] {
    for (int i = 0; i < 300; ++i) pool.ParallelFor(50, 1, 0, body);
  });
  a.join();
  b.join();
  EXPECT_EQ(total.load(), 2 * 300 * 50);
  EXPECT_EQ(overlap.load(), 0);
}

// The cores are shared with other processes, so a worker may not run for a scheduler slice (ms)
// when a job is handed out. The caller must then run the tasks itself instead of waiting for it:
// the pool used to wait for every worker to acknowledge every job, and a decode step (hundreds of
// jobs) ran at ~10 tokens/s beside two busy processes on two cores instead of ~2,000.
// Here the worker is starved for real: it runs at SCHED_IDLE on the caller's core, so the OS gives
// it that core only when the caller blocks. The old pool took >= 2 ms per job here (it polled
// 2 ms, then slept so that the worker could run and acknowledge); 1,000 jobs took >= 2 s.
TEST(ThreadPoolTest, AWorkerTheOsDoesNotRunDoesNotHoldTheCallerUp) {
  cpu_set_t saved;
  ASSERT_EQ(sched_getaffinity(0, sizeof(saved), &saved), 0);
  const int cpu = sched_getcpu();
  ASSERT_GE(cpu, 0);
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);

  {
    ThreadPool pool(2);
    // Two tasks that each wait for the other to start: thread 0 holds task 0, so the worker takes
    // task 1 and moves itself onto the caller's core at idle priority.
    std::atomic<int32_t> started{0};
    std::atomic<int32_t> worker_status{-1};
    auto starve = [&](int64_t, int64_t, int32_t thread_index) {
      started.fetch_add(1);
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (started.load() < 2 && std::chrono::steady_clock::now() < deadline)
        std::this_thread::yield();
      if (thread_index == 1) {
        sched_param param{};
        param.sched_priority = 0;
        worker_status.store(sched_setaffinity(0, sizeof(one), &one) == 0 &&
                                    sched_setscheduler(0, SCHED_IDLE, &param) == 0
                                ? 0
                                : 1);
      }
    };
    pool.ParallelFor(2, 1, 0, starve);
    ASSERT_EQ(started.load(), 2);
    if (worker_status.load() != 0) {
      ASSERT_EQ(sched_setaffinity(0, sizeof(saved), &saved), 0);
      GTEST_SKIP() << "this system does not let a thread take SCHED_IDLE";
    }

    std::atomic<int64_t> total{0};
    auto body = [&](int64_t begin, int64_t end, int32_t) { total.fetch_add(end - begin); };
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < 1000; ++i) pool.ParallelFor(4, 1, 0, body);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("1000 jobs with the worker starved: %.1f ms\n", seconds * 1e3);
    EXPECT_EQ(total.load(), 4000);
    EXPECT_LT(seconds, 1.0) << "the caller waited for a worker that was not running";
  }
  ASSERT_EQ(sched_setaffinity(0, sizeof(saved), &saved), 0);
}

TEST(ThreadPoolTest, ScratchIsPerThreadAndAligned) {
  ThreadPool pool(3, 1000);
  EXPECT_EQ(pool.num_threads(), 3);
  EXPECT_GE(pool.scratch_bytes(), 1000u);
  for (int32_t t = 0; t < 3; ++t) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(pool.scratch(t)) % 64, 0u);
    if (t > 0) {
      EXPECT_GE(static_cast<char*>(pool.scratch(t)) - static_cast<char*>(pool.scratch(t - 1)),
                static_cast<ptrdiff_t>(1000));
    }
  }
}

TEST(ThreadPoolTest, DefaultThreadCountIsHardwareConcurrency) {
  ThreadPool pool;
  EXPECT_EQ(pool.num_threads(),
            static_cast<int32_t>(std::max(1u, std::thread::hardware_concurrency())));
}

TEST(CpuIsaTest, ParsesNames) {
  bool ok = false;
  EXPECT_EQ(ParseCpuIsa("scalar", &ok), CpuIsa::kScalar);
  EXPECT_TRUE(ok);
  EXPECT_EQ(ParseCpuIsa("avx2", &ok), CpuIsa::kAvx2);
  EXPECT_TRUE(ok);
  EXPECT_EQ(ParseCpuIsa("", &ok), CpuIsa::kAuto);
  EXPECT_TRUE(ok);
  EXPECT_EQ(ParseCpuIsa(nullptr, &ok), CpuIsa::kAuto);
  EXPECT_TRUE(ok);
  EXPECT_EQ(ParseCpuIsa("avx512", &ok), CpuIsa::kAvx512);
  EXPECT_TRUE(ok);
  EXPECT_EQ(ParseCpuIsa("avx1024", &ok), CpuIsa::kAuto);
  EXPECT_FALSE(ok);
  EXPECT_STREQ(CpuIsaName(CpuIsa::kScalar), "scalar");
  EXPECT_STREQ(CpuIsaName(CpuIsa::kAvx512), "avx512");
  EXPECT_STREQ(KernelStatusName(KernelStatus::kInvalidArgument), "invalid argument");
}

TEST(CpuIsaTest, ExplicitRequestsResolveToThemselves) {
  KernelStatus status = KernelStatus::kInvalidArgument;
  EXPECT_EQ(ResolveCpuIsa(CpuIsa::kScalar, &status), CpuIsa::kScalar);
  EXPECT_EQ(status, KernelStatus::kOk);
  for (const CpuIsa isa : {CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    const CpuIsa resolved = ResolveCpuIsa(isa, &status);
    if (CpuSupports(isa)) {
      EXPECT_EQ(resolved, isa);
      EXPECT_EQ(status, KernelStatus::kOk);
    } else {
      EXPECT_EQ(status, KernelStatus::kUnsupported);
    }
  }
  // AVX-512 implies AVX2; the detected ISA is one the CPU supports.
  if (CpuSupports(CpuIsa::kAvx512)) {
    EXPECT_TRUE(CpuSupports(CpuIsa::kAvx2));
  }
  EXPECT_TRUE(CpuSupports(DetectCpuIsa()));
  EXPECT_NE(ResolveCpuIsa(CpuIsa::kAuto, &status), CpuIsa::kAuto);
}

// The attention kernels take AVX-512 by default only where its FMAs do not measure slower;
// explicit requests are kept as they are.
TEST(CpuIsaTest, AttentionTakesAvx512OnlyWhereItsFmasAreNotSlower) {
  const double speedup = WideFmaSpeedup();
  std::printf("512-bit / 256-bit FMA throughput: %.2f\n", speedup);
  KernelStatus status = KernelStatus::kInvalidArgument;
  if (!CpuSupports(CpuIsa::kAvx512)) {
    EXPECT_EQ(speedup, 0.0);
  } else {
    // Two 256-bit halves at worst, two full 512-bit pipes at best; the probe is a ratio of bests.
    EXPECT_GT(speedup, 0.5);
    EXPECT_LT(speedup, 3.0);
    EXPECT_EQ(WideFmaSpeedup(), speedup) << "measured once per process";
    EXPECT_EQ(ResolveAttentionIsa(CpuIsa::kAvx512, &status), CpuIsa::kAvx512);
    EXPECT_EQ(status, KernelStatus::kOk);
    const char* env = std::getenv("CHUNKSERVE_CPU_ISA");
    if (env == nullptr || *env == '\0') {
      EXPECT_EQ(ResolveAttentionIsa(CpuIsa::kAuto, &status),
                speedup >= kWideFmaPays ? CpuIsa::kAvx512 : CpuIsa::kAvx2);
      // 512-bit FMAs at the 256-bit rate (Zen 4) take AVX-512 too: its 32 registers make the
      // tiles faster there (kernels/README.md, "ISA choice").
      if (speedup >= 0.95) {
        EXPECT_EQ(ResolveAttentionIsa(CpuIsa::kAuto, &status), CpuIsa::kAvx512);
      }
    }
  }
  EXPECT_EQ(ResolveAttentionIsa(CpuIsa::kScalar, &status), CpuIsa::kScalar);
  if (CpuSupports(CpuIsa::kAvx2)) {
    EXPECT_EQ(ResolveAttentionIsa(CpuIsa::kAvx2, &status), CpuIsa::kAvx2);
  }
}

}  // namespace
}  // namespace chunkserve::kernels::cpu
