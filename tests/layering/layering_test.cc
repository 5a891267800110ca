#include "tests/layering/layering.h"

#include <gtest/gtest.h>

#include <fstream>

#include "tests/testing/temp_dir.h"

namespace chunkserve::layering {
namespace {

namespace fs = std::filesystem;

void WriteFile(const fs::path& path, const std::string& contents) {
  fs::create_directories(path.parent_path());
  std::ofstream(path) << contents;
}

TEST(LayeringTest, PlantedRouterIncludeOfKernelsFails) {
  testing::TempDir dir;
  WriteFile(dir.path() / "router/index.cc",
            "#include \"runtime/kvcache/chunk_hash.h\"\n#include \"kernels/cpu/tpp_decode.h\"\n");
  const auto v = CheckTree(dir.path());
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].file, "router/index.cc");
  EXPECT_EQ(v[0].line, 2);
  EXPECT_EQ(v[0].include, "kernels/cpu/tpp_decode.h");
}

TEST(LayeringTest, PlantedCudaHeaderInRouterFails) {
  testing::TempDir dir;
  WriteFile(dir.path() / "router/policy.h", "#include <vector>\n#include <cuda_runtime.h>\n");
  const auto v = CheckTree(dir.path());
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].include, "cuda_runtime.h");
}

TEST(LayeringTest, KernelsMayNotUseRuntimeTypesOrLogging) {
  EXPECT_EQ(CheckFile("kernels/cpu/x.cc", "#include \"runtime/base/status.h\"\n").size(), 1u);
  EXPECT_EQ(CheckFile("kernels/cpu/x.cc", "#include <glog/logging.h>\n").size(), 1u);
  EXPECT_TRUE(CheckFile("kernels/cuda/x.cu", "#include <cuda_fp16.h>\n").empty());
  EXPECT_TRUE(CheckFile("kernels/cpu/x.cc", "#include <immintrin.h>\n#include <cblas.h>\n").empty());
}

TEST(LayeringTest, CapnpOnlyInsideRuntimeWire) {
  EXPECT_EQ(CheckFile("runtime/plan/p.cc", "#include <capnp/message.h>\n").size(), 1u);
  EXPECT_TRUE(CheckFile("runtime/wire/framing.cc", "#include <capnp/message.h>\n").empty());
  EXPECT_EQ(CheckFile("router/server.cc", "#include <openssl/hmac.h>\n").size(), 1u);
  EXPECT_TRUE(CheckFile("runtime/wire/auth.cc", "#include <openssl/hmac.h>\n").empty());
}

TEST(LayeringTest, RuntimeUsesKernelHostHeadersNotDeviceHeaders) {
  EXPECT_TRUE(CheckFile("runtime/backend/cuda_backend.cc", "#include \"kernels/cuda/api.h\"\n")
                  .empty());
  EXPECT_EQ(
      CheckFile("runtime/backend/cuda_backend.cc", "#include \"kernels/cuda/mma.cuh\"\n").size(),
      1u);
  EXPECT_EQ(CheckFile("runtime/engine/engine.cc", "#include <cuda_runtime.h>\n").size(), 1u);
}

TEST(LayeringTest, RouterSeesTheWorkloadGeneratorButNotTheEngine) {
  EXPECT_TRUE(
      CheckFile("router/sim/sim_main.cc", "#include \"runtime/workload/workload.h\"\n").empty());
  EXPECT_EQ(CheckFile("router/sim/sim_main.cc", "#include \"runtime/engine/engine.h\"\n").size(),
            1u);
}

TEST(LayeringTest, BindingsSeeOnlyTheCHeader) {
  EXPECT_TRUE(CheckFile("bindings/go/shim.c", "#include <chunkserve/chunkserve.h>\n").empty());
  EXPECT_EQ(CheckFile("bindings/go/shim.c", "#include \"runtime/base/status.h\"\n").size(), 1u);
}

TEST(LayeringTest, CleanTreePasses) {
  testing::TempDir dir;
  WriteFile(dir.path() / "router/index.cc", "#include \"runtime/kvcache/chunk_hash.h\"\n");
  WriteFile(dir.path() / "tests/any_test.cc", "#include \"kernels/cuda/x.cuh\"\n");
  EXPECT_TRUE(CheckTree(dir.path()).empty());
}

TEST(LayeringTest, RepositoryFollowsTheDependencyTable) {
  const auto v = CheckTree(CHUNKSERVE_SOURCE_DIR);
  for (const auto& x : v) ADD_FAILURE() << x.file << ":" << x.line << " " << x.reason;
  EXPECT_TRUE(v.empty());
}

}  // namespace
}  // namespace chunkserve::layering
