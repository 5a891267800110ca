// CUDA model ops, KV copy, sampling and the cuBLAS wrapper against their CPU counterparts
// (kernels/cpu/model_ops.h, kernels/cpu/kv_append.h, runtime/sched/sampler.h, plain loops), on
// fresh random inputs (seed printed). Inputs are 16-bit-representable, so the only differences
// are fp32-vs-fp64 sums, fast transcendental functions and the rounding of 16-bit outputs: the
// tolerances are one or two units of the output format's rounding.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "kernels/cpu/dtype.h"
#include "kernels/cpu/kv_append.h"
#include "kernels/cpu/model_ops.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/model_ops.h"
#include "kernels/cuda/sampling.h"
#include "runtime/sched/sampler.h"
#include "tests/testing/gpu.h"
#include "tests/testing/random.h"

namespace chunkserve::kernels::cuda {
namespace {

using chunkserve::testing::Random;
using chunkserve::testing::TestSeed;
namespace kc = ::chunkserve::kernels::cpu;

#define ASSERT_CUDA(expr)                                               \
  do {                                                                  \
    const cudaError_t cuda_err_ = (expr);                               \
    ASSERT_EQ(cuda_err_, cudaSuccess) << cudaGetErrorString(cuda_err_); \
  } while (0)

template <typename T>
T* Upload(const std::vector<T>& v) {
  void* p = nullptr;
  if (cudaMalloc(&p, std::max<size_t>(v.size() * sizeof(T), 16)) != cudaSuccess) return nullptr;
  cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice);
  return static_cast<T*>(p);
}

template <typename T>
std::vector<T> Download(const T* p, size_t n) {
  std::vector<T> v(n);
  cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost);
  return v;
}

std::vector<uint16_t> Bits(DType t, const std::vector<float>& x) {
  std::vector<uint16_t> out(x.size());
  kc::ConvertFromFloat(t, x.data(), out.data(), x.size());
  return out;
}

std::vector<float> Floats(DType t, const std::vector<uint16_t>& x) {
  std::vector<float> out(x.size());
  kc::ConvertToFloat(t, x.data(), out.data(), x.size());
  return out;
}

std::vector<float> Rounded(DType t, std::vector<float> x) {
  for (float& v : x) v = kc::RoundThrough(t, v);
  return x;
}

// One rounding unit of the format, relative.
double Ulp(DType t) { return t == DType::kF16 ? 1.0 / 1024 : 1.0 / 128; }

void ExpectClose(const std::vector<float>& got, const std::vector<float>& want, double atol,
                 double rtol, const char* what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(std::abs(got[i] - want[i]) <= atol + rtol * std::abs(want[i]))
        << what << ": element " << i << " got " << got[i] << " want " << want[i];
  }
}

class CudaModelOpsTest : public ::chunkserve::testing::GpuTest,
                         public ::testing::WithParamInterface<DType> {};

std::string DTypeCase(const ::testing::TestParamInfo<DType>& info) {
  return info.param == DType::kF16 ? "f16" : "bf16";
}

TEST_P(CudaModelOpsTest, RmsNormMatchesCpu) {
  Random rng(TestSeed());
  const DType t = GetParam();
  const int64_t rows = 7;
  const int32_t dim = 4096 + 40;
  const std::vector<float> x = Rounded(t, rng.Floats(rows * dim, -2.0f, 2.0f));
  const std::vector<float> w = Rounded(t, rng.Floats(dim, 0.5f, 1.5f));
  std::vector<float> want(x.size());
  ASSERT_EQ(kc::RmsNorm(x.data(), w.data(), want.data(), rows, dim, 1e-5f), kc::KernelStatus::kOk);
  uint16_t* dx = Upload(Bits(t, x));
  uint16_t* dw = Upload(Bits(t, w));
  ASSERT_CUDA(RmsNorm(t, t, dx, dw, dx, rows, dim, 1e-5f, nullptr));  // in place
  ASSERT_CUDA(cudaDeviceSynchronize());
  ExpectClose(Floats(t, Download(dx, x.size())), want, 1e-6, 1.01 * Ulp(t), "rmsnorm");
  cudaFree(dx);
  cudaFree(dw);
}

// The residual stream is fp32: normalizing it into the 16-bit compute dtype rounds only once.
TEST_P(CudaModelOpsTest, RmsNormOfFp32ResidualMatchesCpu) {
  Random rng(TestSeed());
  const DType t = GetParam();
  const int64_t rows = 5;
  const int32_t dim = 1000;
  const std::vector<float> x = rng.Floats(rows * dim, -3.0f, 3.0f);  // not 16-bit representable
  const std::vector<float> w = Rounded(t, rng.Floats(dim, 0.5f, 1.5f));
  std::vector<float> want(x.size());
  ASSERT_EQ(kc::RmsNorm(x.data(), w.data(), want.data(), rows, dim, 1e-5f), kc::KernelStatus::kOk);
  float* dx = Upload(x);
  uint16_t* dw = Upload(Bits(t, w));
  uint16_t* dy = Upload(std::vector<uint16_t>(x.size(), 0xffff));
  ASSERT_CUDA(RmsNorm(DType::kF32, t, dx, dw, dy, rows, dim, 1e-5f, nullptr));
  ASSERT_CUDA(cudaDeviceSynchronize());
  ExpectClose(Floats(t, Download(dy, x.size())), want, 1e-6, 1.01 * Ulp(t), "rmsnorm f32");
  // A 16-bit x with another output dtype, and fp32 output, are refused.
  const DType other = t == DType::kF16 ? DType::kBF16 : DType::kF16;
  EXPECT_EQ(RmsNorm(other, t, dy, dw, dy, rows, dim, 1e-5f, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(RmsNorm(DType::kF32, DType::kF32, dx, dw, dx, rows, dim, 1e-5f, nullptr),
            cudaErrorInvalidValue);
  cudaFree(dx);
  cudaFree(dw);
  cudaFree(dy);
}

TEST_P(CudaModelOpsTest, RopeMatchesCpu) {
  Random rng(TestSeed());
  const DType t = GetParam();
  const int64_t rows = 5;
  const int32_t heads = 3, head_dim = 128;
  const std::vector<float> x = Rounded(t, rng.Floats(rows * heads * head_dim));
  const std::vector<int32_t> pos = {0, 1, 17, 4095, 131071};
  std::vector<float> inv_freq(head_dim / 2);
  for (int32_t i = 0; i < head_dim / 2; ++i) {
    inv_freq[i] = static_cast<float>(std::pow(500000.0, -2.0 * i / head_dim));
  }
  std::vector<float> want = x;
  ASSERT_EQ(kc::ApplyRope(want.data(), pos.data(), rows, heads, head_dim, inv_freq.data()),
            kc::KernelStatus::kOk);
  uint16_t* dx = Upload(Bits(t, x));
  int32_t* dp = Upload(pos);
  float* df = Upload(inv_freq);
  ASSERT_CUDA(ApplyRope(t, dx, dp, rows, heads, head_dim, df, nullptr));
  ASSERT_CUDA(cudaDeviceSynchronize());
  // |x| <= 1: the fp32 sin/cos of the reduced angle add ~1e-6 absolute.
  ExpectClose(Floats(t, Download(dx, x.size())), want, 1e-5, 1.01 * Ulp(t), "rope");
  cudaFree(dx);
  cudaFree(dp);
  cudaFree(df);
}

TEST_P(CudaModelOpsTest, SiluMulMatchesCpu) {
  Random rng(TestSeed());
  const DType t = GetParam();
  const int64_t n = 100003;
  const std::vector<float> g = Rounded(t, rng.Floats(n, -8.0f, 8.0f));
  const std::vector<float> u = Rounded(t, rng.Floats(n, -2.0f, 2.0f));
  std::vector<float> want(n);
  ASSERT_EQ(kc::SiluMul(g.data(), u.data(), want.data(), n), kc::KernelStatus::kOk);
  uint16_t* dg = Upload(Bits(t, g));
  uint16_t* du = Upload(Bits(t, u));
  ASSERT_CUDA(SiluMul(t, dg, du, dg, n, nullptr));
  ASSERT_CUDA(cudaDeviceSynchronize());
  ExpectClose(Floats(t, Download(dg, n)), want, 1e-6, 1.01 * Ulp(t), "silu_mul");
  cudaFree(dg);
  cudaFree(du);
}

TEST_P(CudaModelOpsTest, EmbeddingGatherCopiesRowsAndZeroesBadIds) {
  Random rng(TestSeed());
  const DType t = GetParam();
  const int32_t vocab = 1000, dim = 72;
  const std::vector<uint16_t> table = Bits(t, rng.Floats(vocab * dim));
  const std::vector<int32_t> ids = {5, 999, 0, -1, 1000, 5, 123};
  uint16_t* dt = Upload(table);
  int32_t* di = Upload(ids);
  uint16_t* dout = Upload(std::vector<uint16_t>(ids.size() * dim, 0xffff));
  ASSERT_CUDA(
      EmbeddingGather(t, t, dt, vocab, dim, di, static_cast<int64_t>(ids.size()), dout, nullptr));
  const std::vector<uint16_t> got = Download(dout, ids.size() * dim);
  // Widened into the fp32 residual stream: exactly the 16-bit values.
  float* dwide = Upload(std::vector<float>(ids.size() * dim, NAN));
  ASSERT_CUDA(EmbeddingGather(t, DType::kF32, dt, vocab, dim, di, static_cast<int64_t>(ids.size()),
                              dwide, nullptr));
  const std::vector<float> wide = Download(dwide, ids.size() * dim);
  // fp32 rows of an fp32 table (the residual rows the LM head reads): exact copies.
  float* dtable32 = Upload(wide);
  const std::vector<int32_t> rows32 = {6, 0, 3};
  int32_t* dr = Upload(rows32);
  float* dout32 = Upload(std::vector<float>(rows32.size() * dim, NAN));
  ASSERT_CUDA(EmbeddingGather(DType::kF32, DType::kF32, dtable32, static_cast<int32_t>(ids.size()),
                              dim, dr, 3, dout32, nullptr));
  const std::vector<float> got32 = Download(dout32, rows32.size() * dim);
  for (size_t r = 0; r < ids.size(); ++r) {
    for (int32_t d = 0; d < dim; ++d) {
      const uint16_t want =
          ids[r] >= 0 && ids[r] < vocab ? table[static_cast<size_t>(ids[r]) * dim + d] : 0;
      ASSERT_EQ(got[r * dim + d], want) << "row " << r << " dim " << d;
      float f = 0.0f;
      kc::ConvertToFloat(t, &want, &f, 1);
      ASSERT_EQ(wide[r * dim + d], f) << "widened row " << r << " dim " << d;
    }
  }
  for (size_t r = 0; r < rows32.size(); ++r) {
    for (int32_t d = 0; d < dim; ++d) {
      ASSERT_EQ(got32[r * dim + d], wide[static_cast<size_t>(rows32[r]) * dim + d]);
    }
  }
  // 16-bit rows of another 16-bit dtype are refused.
  EXPECT_EQ(EmbeddingGather(t, t == DType::kF16 ? DType::kBF16 : DType::kF16, dt, vocab, dim, di, 1,
                            dout, nullptr),
            cudaErrorInvalidValue);
  cudaFree(dt);
  cudaFree(di);
  cudaFree(dout);
  cudaFree(dwide);
  cudaFree(dtable32);
  cudaFree(dr);
  cudaFree(dout32);
}

TEST_P(CudaModelOpsTest, KvCopyMatchesCpu) {
  Random rng(TestSeed());
  const DType t = GetParam();
  const int32_t slots = 4, heads = 3, chunk = 32, hd = 64;
  const size_t n = static_cast<size_t>(slots) * heads * chunk * hd;
  std::vector<uint16_t> k = Bits(t, rng.Floats(n)), v = Bits(t, rng.Floats(n));
  uint16_t* dk = Upload(k);
  uint16_t* dv = Upload(v);
  kc::KvArenaLayer host{k.data(), v.data(), t, slots, heads, chunk, hd};
  ASSERT_EQ(kc::KvCopy(host, 2, 0, 19), kc::KernelStatus::kOk);
  KvArenaLayerDevice dev{dk, dv, t, slots, heads, chunk, hd};
  ASSERT_CUDA(KvCopy(dev, 2, 0, 19, nullptr));
  EXPECT_EQ(KvCopy(dev, 2, 2, 19, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(KvCopy(dev, 2, 0, 33, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(Download(dk, n), k);
  EXPECT_EQ(Download(dv, n), v);
  cudaFree(dk);
  cudaFree(dv);
}

TEST_P(CudaModelOpsTest, GemmMatchesLoops) {
  Random rng(TestSeed());
  const DType t = GetParam();
  const int32_t m = 5, n = 67, k = 96;
  const std::vector<float> x = Rounded(t, rng.Floats(m * k));
  const std::vector<float> w = Rounded(t, rng.Floats(n * k));
  std::vector<float> want(m * n);
  for (int32_t i = 0; i < m; ++i) {
    for (int32_t j = 0; j < n; ++j) {
      double s = 0.0;
      for (int32_t l = 0; l < k; ++l) s += double{x[i * k + l]} * w[j * k + l];
      want[i * n + j] = static_cast<float>(s);
    }
  }
  uint16_t* dx = Upload(Bits(t, x));
  uint16_t* dw = Upload(Bits(t, w));
  float* dy = Upload(std::vector<float>(m * n, 0.0f));
  uint16_t* dy16 = Upload(std::vector<uint16_t>(m * n, 0));
  GemmRunner gemm;
  ASSERT_CUDA(gemm.Linear(t, DType::kF32, dx, dw, dy, m, n, k, nullptr));
  ASSERT_CUDA(gemm.Linear(t, t, dx, dw, dy16, m, n, k, nullptr));
  ASSERT_CUDA(cudaDeviceSynchronize());
  // Sums of 96 products of values <= 1: fp32 accumulation differs from fp64 by ~1e-5.
  ExpectClose(Download(dy, m * n), want, 1e-4, 1e-4, "gemm f32 out");
  ExpectClose(Floats(t, Download(dy16, m * n)), want, 1e-3, Ulp(t), "gemm 16-bit out");
  EXPECT_EQ(gemm.Linear(DType::kF32, DType::kF32, dx, dw, dy, m, n, k, nullptr),
            cudaErrorInvalidValue);
  cudaFree(dx);
  cudaFree(dw);
  cudaFree(dy);
  cudaFree(dy16);
}

INSTANTIATE_TEST_SUITE_P(Kernels, CudaModelOpsTest, ::testing::Values(DType::kF16, DType::kBF16),
                         DTypeCase);

class CudaSamplingTest : public ::chunkserve::testing::GpuTest {};

TEST_F(CudaSamplingTest, ArgmaxFollowsTheHostRule) {
  Random rng(TestSeed());
  const int32_t vocab = 32000;
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<std::vector<float>> rows;
  rows.push_back(rng.Floats(vocab, -10.0f, 10.0f));
  rows.push_back(std::vector<float>(vocab, 1.5f));  // all tied: id 0
  rows.push_back(std::vector<float>(vocab, -inf));  // nothing above -inf: id 0
  rows.push_back(std::vector<float>(vocab, nan));
  std::vector<float> r4 = rng.Floats(vocab);
  r4[7] = nan;
  r4[20000] = 5.0f;
  r4[30000] = 5.0f;  // tie: the lower id wins
  rows.push_back(r4);
  std::vector<float> flat;
  for (const auto& r : rows) flat.insert(flat.end(), r.begin(), r.end());
  float* dl = Upload(flat);
  int32_t* dout = Upload(std::vector<int32_t>(rows.size(), -7));
  ASSERT_CUDA(ArgmaxSample(dl, static_cast<int32_t>(rows.size()), vocab, dout, nullptr));
  const std::vector<int32_t> got = Download(dout, rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(got[i], sched::Argmax(rows[i])) << "row " << i;
  }
  cudaFree(dl);
  cudaFree(dout);
}

TEST_F(CudaSamplingTest, TopKTopPMatchesHostSampler) {
  Random rng(TestSeed());
  const int32_t vocab = 50000;
  struct RowCase {
    float temperature;
    int32_t top_k;
    float top_p;
  };
  const std::vector<RowCase> cases = {{1.0f, 50, 1.0f},  {0.7f, 1024, 0.9f}, {1.3f, 7, 0.5f},
                                      {0.0f, 40, 1.0f},  {1.0f, 1, 1.0f},    {1.0f, 0, 0.95f},
                                      {0.9f, 200, 0.99f}};
  const int32_t rows = static_cast<int32_t>(cases.size()) * 8;
  std::vector<float> logits, temperature, top_p;
  std::vector<int32_t> top_k, want;
  std::vector<double> uniform;
  for (int32_t r = 0; r < rows; ++r) {
    const RowCase& c = cases[r % cases.size()];
    std::vector<float> row = rng.Floats(vocab, -6.0f, 6.0f);
    for (int32_t i = 0; i < 40; ++i) row[rng.Int(0, vocab - 1)] = 9.0f;  // ties in the top set
    if (r % 5 == 0) row[rng.Int(0, vocab - 1)] = std::numeric_limits<float>::quiet_NaN();
    sched::SamplingParams sp;
    sp.temperature = c.temperature;
    sp.top_k = c.top_k;
    sp.top_p = c.top_p;
    sp.seed = static_cast<uint64_t>(rng.Int(0, 1 << 30));
    sched::Sampler draw(sp);
    uniform.push_back(draw.NextUniform());  // the draw Sample() makes first
    sched::Sampler sampler(sp);
    want.push_back(sampler.Sample(row));
    logits.insert(logits.end(), row.begin(), row.end());
    temperature.push_back(c.temperature);
    top_k.push_back(c.top_k);
    top_p.push_back(c.top_p);
  }
  float* dl = Upload(logits);
  float* dt = Upload(temperature);
  int32_t* dk = Upload(top_k);
  float* dp = Upload(top_p);
  double* du = Upload(uniform);
  int32_t* dout = Upload(std::vector<int32_t>(rows, -7));
  TopKTopPParams p;
  p.logits = dl;
  p.rows = rows;
  p.vocab = vocab;
  p.temperature = dt;
  p.top_k = dk;
  p.top_p = dp;
  p.uniform = du;
  p.out = dout;
  ASSERT_CUDA(TopKTopPSample(p, nullptr));
  const std::vector<int32_t> got = Download(dout, rows);
  for (int32_t r = 0; r < rows; ++r) {
    const RowCase& c = cases[r % cases.size()];
    if (c.top_k == 0 && c.temperature != 0.0f) {
      EXPECT_EQ(got[r], -1) << "row " << r << ": more than 1024 candidates is the host's job";
    } else {
      EXPECT_EQ(got[r], want[r]) << "row " << r;
    }
  }
  for (void* ptr : {static_cast<void*>(dl), static_cast<void*>(dt), static_cast<void*>(dk),
                    static_cast<void*>(dp), static_cast<void*>(du), static_cast<void*>(dout)}) {
    cudaFree(ptr);
  }
}

TEST_F(CudaSamplingTest, CopyBytesCopiesAndChecksAlignment) {
  const size_t bytes = (1 << 22) + 48;
  std::vector<unsigned char> src(bytes);
  for (size_t i = 0; i < bytes; ++i) src[i] = static_cast<unsigned char>(i * 131 + 7);
  unsigned char* ds = Upload(src);
  unsigned char* dd = Upload(std::vector<unsigned char>(bytes, 0));
  ASSERT_CUDA(CopyBytes(dd, ds, bytes, nullptr));
  EXPECT_EQ(Download(dd, bytes), src);
  EXPECT_EQ(CopyBytes(dd, ds, 15, nullptr), cudaErrorInvalidValue);
  // ReadWords (the benchmarks' read-only L2 flush) reads every word: the sink is written exactly
  // when the words' XOR equals `never` (0x3c003c00 repeated 8 times XORs to 0).
  ASSERT_CUDA(FillWords(dd, 32, 0x3c003c00u, nullptr));
  unsigned* sink = Upload(std::vector<unsigned>{0xdeadbeefu, 0, 0, 0});
  ASSERT_CUDA(ReadWords(dd, 32, 1u, sink, nullptr));
  EXPECT_EQ(Download(sink, 1)[0], 0xdeadbeefu);
  ASSERT_CUDA(ReadWords(dd, 32, 0u, sink, nullptr));
  EXPECT_EQ(Download(sink, 1)[0], 0u);
  EXPECT_EQ(ReadWords(dd + 1, 32, 0u, sink, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(ReadWords(dd, 20, 0u, sink, nullptr), cudaErrorInvalidValue);
  cudaFree(sink);
  EXPECT_EQ(CopyBytes(dd + 1, ds, 16, nullptr), cudaErrorInvalidValue);
  cudaFree(ds);
  cudaFree(dd);
}

}  // namespace
}  // namespace chunkserve::kernels::cuda
