// ThreadPool: every task runs exactly once on a valid thread index, callers are serialized, scratch
// is per thread and aligned. Also the ISA selection helpers.
#include "kernels/cpu/thread_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
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

// The attention kernels take AVX-512 by default only where its FMAs measure faster; explicit
// requests are kept as they are.
TEST(CpuIsaTest, AttentionTakesAvx512OnlyWhereItsFmasAreFaster) {
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
    }
  }
  EXPECT_EQ(ResolveAttentionIsa(CpuIsa::kScalar, &status), CpuIsa::kScalar);
  if (CpuSupports(CpuIsa::kAvx2)) {
    EXPECT_EQ(ResolveAttentionIsa(CpuIsa::kAvx2, &status), CpuIsa::kAvx2);
  }
}

}  // namespace
}  // namespace chunkserve::kernels::cpu
