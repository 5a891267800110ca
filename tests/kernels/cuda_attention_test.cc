// CUDA TppDecode, PagedDecode, PrefillAttention (+ KvAppend) against the CPU naive reference, on
// fresh random inputs (seed printed; CHUNKSERVE_TEST_SEED replays), with the shapes of the CPU
// kernel tests: random prefix trees, partly filled chunks (shared ones too), batch 1, one sequence
// per chunk, 600 sequences sharing one chunk, long shared prefixes (segments), forced split-KV,
// GQA, fp16/bf16, head dims 64/128, chunk sizes 16/32/48/64/128. Unused arena positions hold NaN,
// so a read past a chunk's length or of an unused slot fails the comparison.
//
// Tolerance. The reference (fp64) reads the same stored 16-bit K/V and the same 16-bit-rounded
// queries, so what differs is (a) P rounded to 16 bits before the P V MMA: an absolute error of
// at most 2^-11 (fp16) / 2^-8 (bf16) times max|v| = 1, random in sign, and (b) the output rounded
// to 16 bits: 2^-11 / 2^-8 relative. Bounds |got - want| <= atol + rtol |want| with (atol, rtol)
// = (1e-3, 2e-3) for fp16 and (1e-2, 1e-2) for bf16 cover both with margin; a lost chunk, a wrong
// row or a bad rescale moves outputs by 1e-2 .. 1e-1 (they are averages of values in [-1, 1] over
// tens to hundreds of tokens), and NaN (an out-of-bounds read) never passes.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "kernels/cpu/dtype.h"
#include "kernels/cpu/kv_append.h"
#include "kernels/cpu/reference.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/device_plan.h"
#include "kernels/cuda/model_ops.h"
#include "kernels/cuda/shapes.h"
#include "runtime/kvcache/prefix_tree.h"
#include "runtime/plan/tpp_plan.h"
#include "tests/kernels/attention_testing.h"
#include "tests/testing/gpu.h"
#include "tests/testing/random.h"
#include "tests/testing/status_matchers.h"

namespace chunkserve::kernels::cuda {
namespace {

using chunkserve::testing::Random;
using chunkserve::testing::TestSeed;
namespace kt = ::chunkserve::kernels::cpu::testing;
namespace kc = ::chunkserve::kernels::cpu;

#define ASSERT_CUDA(expr)                                               \
  do {                                                                  \
    const cudaError_t cuda_err_ = (expr);                               \
    ASSERT_EQ(cuda_err_, cudaSuccess) << cudaGetErrorString(cuda_err_); \
  } while (0)

// A device buffer that frees itself.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) { Resize(bytes); }
  ~DeviceBuffer() {
    if (p_ != nullptr) cudaFree(p_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void Resize(size_t bytes) {
    if (p_ != nullptr) cudaFree(p_);
    p_ = nullptr;
    bytes_ = bytes;
    if (bytes > 0 && cudaMalloc(&p_, bytes) != cudaSuccess) p_ = nullptr;
  }
  template <typename T>
  static void Upload(DeviceBuffer& b, const std::vector<T>& v) {
    b.Resize(std::max<size_t>(v.size() * sizeof(T), 16));
    if (!v.empty()) cudaMemcpy(b.p_, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice);
  }
  void* get() const { return p_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

std::vector<uint16_t> ToBits(DType t, const std::vector<float>& x) {
  std::vector<uint16_t> out(x.size());
  kc::ConvertFromFloat(t, x.data(), out.data(), x.size());
  return out;
}

std::vector<float> FromBits(DType t, const std::vector<uint16_t>& x) {
  std::vector<float> out(x.size());
  kc::ConvertToFloat(t, x.data(), out.data(), x.size());
  return out;
}

// Random queries already representable in the dtype (what the device reads, exactly).
std::vector<float> RoundedFloats(DType t, size_t n, Random& rng) {
  std::vector<float> q = rng.Floats(n, -3.0f, 3.0f);
  for (float& x : q) x = kc::RoundThrough(t, x);
  return q;
}

size_t ArenaBytes(const kt::Shape& s, int32_t slots) {
  return static_cast<size_t>(slots) * s.num_kv_heads * s.chunk_size * s.head_dim * 2;
}

struct Case {
  DType dtype;
  int32_t head_dim;
  int32_t chunk_size;
  int32_t gqa;
};

std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return kt::DTypeName(c.dtype) + "_hd" + std::to_string(c.head_dim) + "_c" +
         std::to_string(c.chunk_size) + "_gqa" + std::to_string(c.gqa);
}

double Atol(DType t) { return t == DType::kF16 ? 1e-3 : 1e-2; }
double Rtol(DType t) { return t == DType::kF16 ? 2e-3 : 1e-2; }

class CudaDecodeTest : public ::chunkserve::testing::GpuTest,
                       public ::testing::WithParamInterface<Case> {
 protected:
  kt::Shape MakeShape(int32_t num_kv_heads) const {
    kt::Shape s;
    s.dtype = GetParam().dtype;
    s.head_dim = GetParam().head_dim;
    s.chunk_size = GetParam().chunk_size;
    s.num_kv_heads = num_kv_heads;
    s.num_qo_heads = num_kv_heads * GetParam().gqa;
    return s;
  }

  // TPP (with the automatic split and with `forced_cap` chunks per task) and paged, against the
  // reference.
  void CheckLayout(const kt::Layout& layout, int32_t num_kv_heads, Random& rng,
                   int32_t forced_cap = 1) {
    const kt::Shape shape = MakeShape(num_kv_heads);
    kt::KvArena arena(shape, layout.num_slots);
    kt::FillLayout(layout, arena, rng);
    const size_t n = static_cast<size_t>(layout.num_seqs) * shape.num_qo_heads * shape.head_dim;
    const std::vector<float> q = RoundedFloats(shape.dtype, n, rng);
    const float sm_scale = 1.0f / std::sqrt(static_cast<float>(shape.head_dim));
    const std::vector<float> want = kt::NaiveDecode(arena, layout, q, sm_scale);

    const KvCacheView host_kv = arena.view();
    DeviceBuffer k(ArenaBytes(shape, layout.num_slots)), v(ArenaBytes(shape, layout.num_slots));
    ASSERT_CUDA(cudaMemcpy(k.get(), host_kv.k, k.bytes(), cudaMemcpyHostToDevice));
    ASSERT_CUDA(cudaMemcpy(v.get(), host_kv.v, v.bytes(), cudaMemcpyHostToDevice));
    KvCacheView kv = host_kv;
    kv.k = k.get();
    kv.v = v.get();
    DeviceBuffer dq, dout(std::max<size_t>(n * 2, 16));
    DeviceBuffer::Upload(dq, ToBits(shape.dtype, q));

    auto check = [&](const char* what) {
      std::vector<uint16_t> bits(n);
      ASSERT_CUDA(cudaMemcpy(bits.data(), dout.get(), n * 2, cudaMemcpyDeviceToHost));
      const std::vector<float> got = FromBits(shape.dtype, bits);
      size_t at = 0;
      const double worst = kt::WorstError(got, want, Atol(shape.dtype), Rtol(shape.dtype), &at);
      EXPECT_LE(worst, 1.0) << what << ": element " << at << " (row " << at / shape.head_dim
                            << ") got " << got[at] << " want " << want[at];
    };

    for (int32_t cap : {0, forced_cap}) {
      DevicePlan plan;
      TppScheduleOptions options{0, 4, cap};
      ASSERT_CUDA(
          plan.Update(layout.Plan(),
                      {shape.num_qo_heads, shape.num_kv_heads, shape.chunk_size, layout.num_slots},
                      nullptr, options));
      DeviceBuffer workspace(std::max<size_t>(plan.WorkspaceBytes(shape.head_dim), 16));
      ASSERT_CUDA(cudaMemset(dout.get(), 0xff, dout.bytes()));  // NaN in both 16-bit formats
      TppDecodeParams p;
      p.q = dq.get();
      p.o = dout.get();
      p.kv = kv;
      p.num_qo_heads = shape.num_qo_heads;
      p.sm_scale = sm_scale;
      p.plan = &plan;
      p.workspace = workspace.get();
      p.workspace_bytes = workspace.bytes();
      ASSERT_CUDA(TppDecode(p, nullptr));
      ASSERT_CUDA(cudaDeviceSynchronize());
      check(cap == 0 ? "tpp (automatic split)" : "tpp (forced split)");
    }

    DeviceBuffer indptr, slot, len;
    DeviceBuffer::Upload(indptr, layout.block_indptr);
    DeviceBuffer::Upload(slot, layout.block_slot);
    DeviceBuffer::Upload(len, layout.block_len);
    ASSERT_CUDA(cudaMemset(dout.get(), 0xff, dout.bytes()));
    PagedDecodeParams pp;
    pp.q = dq.get();
    pp.o = dout.get();
    pp.kv = kv;
    pp.num_seqs = layout.num_seqs;
    pp.num_qo_heads = shape.num_qo_heads;
    pp.block_indptr = indptr.as<int32_t>();
    pp.block_slot = slot.as<int32_t>();
    pp.block_len = len.as<int32_t>();
    pp.sm_scale = sm_scale;
    ASSERT_CUDA(PagedDecode(pp, nullptr));
    ASSERT_CUDA(cudaDeviceSynchronize());
    check("paged");
  }
};

TEST_P(CudaDecodeTest, RandomTreeMatchesReference) {
  Random rng(TestSeed());
  const int32_t num_seqs = static_cast<int32_t>(rng.Int(2, 12));
  CheckLayout(kt::RandomTreeLayout(num_seqs, GetParam().chunk_size, rng), 2, rng, 2);
}

TEST_P(CudaDecodeTest, BatchOfOne) {
  Random rng(TestSeed());
  kt::LayoutBuilder b(1);
  b.AddPrivate(0, GetParam().chunk_size);
  b.AddPrivate(0, GetParam().chunk_size);
  b.AddPrivate(0, static_cast<int32_t>(rng.Int(1, GetParam().chunk_size)));
  CheckLayout(b.Finish(rng), 2, rng);
}

TEST_P(CudaDecodeTest, OneSequencePerChunk) {
  Random rng(TestSeed());
  kt::LayoutBuilder b(9);
  for (int32_t s = 0; s < 9; ++s)
    b.AddPrivate(s, static_cast<int32_t>(rng.Int(1, GetParam().chunk_size)));
  CheckLayout(b.Finish(rng), 1, rng);
}

TEST_P(CudaDecodeTest, SixHundredSequencesShareOneChunk) {
  Random rng(TestSeed());
  kt::LayoutBuilder b(600);
  b.AddShared(0, 600, static_cast<int32_t>(rng.Int(1, GetParam().chunk_size)));
  for (int32_t s = 0; s < 600; s += 3) b.AddPrivate(s, static_cast<int32_t>(rng.Int(1, 16)));
  CheckLayout(b.Finish(rng), 1, rng);
}

TEST_P(CudaDecodeTest, LongSharedPrefixWithPrivateTails) {
  Random rng(TestSeed());
  const int64_t shared = 40 * GetParam().chunk_size - 5;
  CheckLayout(
      kt::SharedPrefixLayout(4, GetParam().chunk_size, shared, GetParam().chunk_size + 3, rng), 2,
      rng, 3);
}

TEST_P(CudaDecodeTest, FullSharingNoPrivateTokens) {
  Random rng(TestSeed());
  CheckLayout(kt::SharedPrefixLayout(5, GetParam().chunk_size, 3 * GetParam().chunk_size, 0, rng),
              1, rng);
}

TEST_P(CudaDecodeTest, LongPrivateContextSplitsKv) {
  Random rng(TestSeed());
  CheckLayout(
      kt::SharedPrefixLayout(2, GetParam().chunk_size, 0, 37 * GetParam().chunk_size + 9, rng), 2,
      rng, 4);
}

INSTANTIATE_TEST_SUITE_P(
    Kernels, CudaDecodeTest,
    ::testing::Values(Case{DType::kF16, 128, 64, 1}, Case{DType::kF16, 128, 64, 4},
                      Case{DType::kBF16, 128, 64, 4}, Case{DType::kF16, 64, 16, 8},
                      Case{DType::kBF16, 64, 16, 1}, Case{DType::kF16, 128, 32, 2},
                      Case{DType::kBF16, 128, 128, 8}, Case{DType::kF16, 64, 128, 5},
                      Case{DType::kBF16, 64, 48, 3}, Case{DType::kF16, 128, 16, 12},
                      Case{DType::kBF16, 128, 32, 80}),
    CaseName);

// ---------------------------------------------------------------------------------------------
// Prefill (KvAppend on the device first, checked bit for bit against the CPU KvAppend).
// ---------------------------------------------------------------------------------------------

class CudaPrefillTest : public ::chunkserve::testing::GpuTest,
                        public ::testing::WithParamInterface<Case> {
 protected:
  void Check(std::vector<kt::PrefillSeq> seqs, int32_t num_kv_heads, Random& rng) {
    kt::Shape shape;
    shape.dtype = GetParam().dtype;
    shape.head_dim = GetParam().head_dim;
    shape.chunk_size = GetParam().chunk_size;
    shape.num_kv_heads = num_kv_heads;
    shape.num_qo_heads = num_kv_heads * GetParam().gqa;
    const int32_t c = shape.chunk_size;
    const int32_t d = shape.head_dim;
    const int32_t num_seqs = static_cast<int32_t>(seqs.size());
    kt::PrefillBatch batch =
        kt::MakePrefillBatch(std::move(seqs), shape, /*round_new_kv=*/true, rng);
    kt::KvArena& arena = batch.arena;
    const int32_t num_slots = arena.num_slots();
    ASSERT_EQ(CheckPrefillLists(num_seqs, batch.q_indptr.data(), batch.q_pos.data(),
                                batch.chunk_indptr.data(), batch.chunk_slot.data(),
                                batch.chunk_len.data(), num_slots, c, batch.max_q),
              nullptr);

    // The device arena starts as the host arena (cached tokens; NaN elsewhere), then the new
    // tokens go in through the CUDA KvAppend; the host arena gets them through the CPU one.
    const KvCacheView host_kv = arena.view();
    DeviceBuffer dk(ArenaBytes(shape, num_slots)), dv(ArenaBytes(shape, num_slots));
    ASSERT_CUDA(cudaMemcpy(dk.get(), host_kv.k, dk.bytes(), cudaMemcpyHostToDevice));
    ASSERT_CUDA(cudaMemcpy(dv.get(), host_kv.v, dv.bytes(), cudaMemcpyHostToDevice));
    const int32_t num_new = static_cast<int32_t>(batch.new_slot.size());
    if (num_new > 0) {
      kc::KvAppendParams ap;
      ap.kv = arena.layer();
      ap.k = batch.new_k.data();
      ap.v = batch.new_v.data();
      ap.slot = batch.new_slot.data();
      ap.offset = batch.new_offset.data();
      ap.num_tokens = num_new;
      ASSERT_EQ(kc::KvAppend(ap), kc::KernelStatus::kOk);
      DeviceBuffer nk, nv, ns, no;
      DeviceBuffer::Upload(nk, ToBits(shape.dtype, batch.new_k));
      DeviceBuffer::Upload(nv, ToBits(shape.dtype, batch.new_v));
      DeviceBuffer::Upload(ns, batch.new_slot);
      DeviceBuffer::Upload(no, batch.new_offset);
      KvArenaLayerDevice layer;
      layer.k = dk.get();
      layer.v = dv.get();
      layer.dtype = shape.dtype;
      layer.num_slots = num_slots;
      layer.num_kv_heads = num_kv_heads;
      layer.chunk_size = c;
      layer.head_dim = d;
      ASSERT_CUDA(KvAppend(layer, nk.get(), nv.get(), ns.as<int32_t>(), no.as<int32_t>(), num_new,
                           nullptr));
      ASSERT_CUDA(cudaDeviceSynchronize());
      std::vector<unsigned char> back(dk.bytes());
      ASSERT_CUDA(cudaMemcpy(back.data(), dk.get(), back.size(), cudaMemcpyDeviceToHost));
      EXPECT_EQ(std::memcmp(back.data(), arena.view().k, back.size()), 0) << "KvAppend K";
      ASSERT_CUDA(cudaMemcpy(back.data(), dv.get(), back.size(), cudaMemcpyDeviceToHost));
      EXPECT_EQ(std::memcmp(back.data(), arena.view().v, back.size()), 0) << "KvAppend V";
    }

    const int32_t num_q = batch.q_indptr.back();
    const size_t n = static_cast<size_t>(num_q) * shape.num_qo_heads * d;
    const std::vector<float> q = RoundedFloats(shape.dtype, n, rng);
    const float sm_scale = 1.0f / std::sqrt(static_cast<float>(d));

    std::vector<float> want;
    ASSERT_EQ(kt::NaivePrefill(batch, q, sm_scale, &want), kc::KernelStatus::kOk);

    DeviceBuffer dq, dout(std::max<size_t>(n * 2, 16)), dqi, dqp, dci, dcs, dcl;
    DeviceBuffer::Upload(dq, ToBits(shape.dtype, q));
    DeviceBuffer::Upload(dqi, batch.q_indptr);
    DeviceBuffer::Upload(dqp, batch.q_pos);
    DeviceBuffer::Upload(dci, batch.chunk_indptr);
    DeviceBuffer::Upload(dcs, batch.chunk_slot);
    DeviceBuffer::Upload(dcl, batch.chunk_len);
    ASSERT_CUDA(cudaMemset(dout.get(), 0xff, dout.bytes()));
    PrefillAttentionParams pp;
    pp.q = dq.get();
    pp.o = dout.get();
    pp.kv = host_kv;
    pp.kv.k = dk.get();
    pp.kv.v = dv.get();
    pp.num_seqs = num_seqs;
    pp.num_qo_heads = shape.num_qo_heads;
    pp.q_indptr = dqi.as<int32_t>();
    pp.q_pos = dqp.as<int32_t>();
    pp.chunk_indptr = dci.as<int32_t>();
    pp.chunk_slot = dcs.as<int32_t>();
    pp.chunk_len = dcl.as<int32_t>();
    pp.max_q_per_seq = batch.max_q;
    pp.sm_scale = sm_scale;
    ASSERT_CUDA(PrefillAttention(pp, nullptr));
    ASSERT_CUDA(cudaDeviceSynchronize());
    std::vector<uint16_t> bits(n);
    ASSERT_CUDA(cudaMemcpy(bits.data(), dout.get(), n * 2, cudaMemcpyDeviceToHost));
    const std::vector<float> got = FromBits(shape.dtype, bits);
    size_t at = 0;
    EXPECT_LE(kt::WorstError(got, want, Atol(shape.dtype), Rtol(shape.dtype), &at), 1.0)
        << "element " << at << " (query " << at / (shape.num_qo_heads * d) << ") got " << got[at]
        << " want " << want[at];
  }
};

TEST_P(CudaPrefillTest, PromptWithoutCachedPrefix) {
  Random rng(TestSeed());
  const int32_t c = GetParam().chunk_size;
  Check({{0, 2 * c + c / 2 + 1, {}}}, 2, rng);
}

TEST_P(CudaPrefillTest, SuffixAfterCachedPrefix) {
  Random rng(TestSeed());
  const int32_t c = GetParam().chunk_size;
  const int32_t cached = 2 * c + static_cast<int32_t>(rng.Int(0, c - 1));
  Check({{cached, cached + c + 7, {}}}, 2, rng);
}

TEST_P(CudaPrefillTest, OneNewToken) {
  Random rng(TestSeed());
  const int32_t c = GetParam().chunk_size;
  Check({{3 * c, 3 * c + 1, {}}}, 1, rng);
}

TEST_P(CudaPrefillTest, BatchOfSequences) {
  Random rng(TestSeed());
  const int32_t c = GetParam().chunk_size;
  Check({{0, 5, {}}, {c, 3 * c + 1, {}}, {3, 4, {}}, {c + 1, 2 * c, {}}}, 2, rng);
}

TEST_P(CudaPrefillTest, QueriesAtScatteredPositions) {
  Random rng(TestSeed());
  const int32_t c = GetParam().chunk_size;
  const int32_t total = 3 * c + 5;
  std::vector<int32_t> positions;
  for (int32_t p = 0; p < total; ++p) {
    if (rng.Bernoulli(0.15)) positions.push_back(p);
  }
  if (positions.empty()) positions.push_back(total - 1);
  std::shuffle(positions.begin(), positions.end(), rng.engine());  // any order is allowed
  Check({{total, total, positions}}, 1, rng);
}

INSTANTIATE_TEST_SUITE_P(
    Kernels, CudaPrefillTest,
    ::testing::Values(Case{DType::kF16, 128, 64, 1}, Case{DType::kBF16, 64, 16, 8},
                      Case{DType::kF16, 128, 32, 4}, Case{DType::kBF16, 128, 128, 2},
                      Case{DType::kF16, 64, 48, 3}, Case{DType::kBF16, 128, 64, 80}),
    CaseName);

// ---------------------------------------------------------------------------------------------
// Decode steps driven by the real plan producer (runtime/plan over a prefix tree): DevicePlan
// copies only the lengths while no chunk fills, and the device result stays right every step
// (so the lengths-only copy lands where the kernel reads).
// ---------------------------------------------------------------------------------------------

class CudaDecodeStepsTest : public ::chunkserve::testing::GpuTest {};

TEST_F(CudaDecodeStepsTest, RuntimePlanStepsUploadLengthsOnlyAndStayCorrect) {
  Random rng(TestSeed());
  constexpr int32_t kChunk = 16;
  constexpr int32_t kSlots = 96;
  Result<kv::PrefixTree> created =
      kv::PrefixTree::Create({.chunk_size = kChunk, .num_slots = kSlots});
  ASSERT_OK(created.status());
  kv::PrefixTree tree = std::move(*created);
  auto add = [&](const std::vector<TokenId>& prompt) {
    Result<kv::InsertResult> r = tree.Insert(prompt, static_cast<int32_t>(prompt.size()) - 1);
    EXPECT_OK(r.status());
    const std::vector<TokenId> rest(prompt.begin() + r->num_cached_tokens, prompt.end());
    kv::AppendResult out;
    const kv::SeqTokens req{r->seq, rest};
    EXPECT_OK(tree.Append(std::span<const kv::SeqTokens>(&req, 1), &out));
    return r->seq;
  };
  std::vector<TokenId> system(37);
  for (TokenId& t : system) t = static_cast<TokenId>(rng.Int(0, 999));
  std::vector<SeqId> batch;
  for (int i = 0; i < 5; ++i) {
    std::vector<TokenId> p = system;
    for (int j = 0; j < 3 + 6 * i; ++j) p.push_back(static_cast<TokenId>(1000 + 40 * i + j));
    batch.push_back(add(p));
  }
  batch.push_back(add({1, 2, 3, 4, 5}));

  kt::Shape shape;
  shape.dtype = DType::kF16;
  shape.head_dim = 64;
  shape.chunk_size = kChunk;
  shape.num_kv_heads = 2;
  shape.num_qo_heads = 8;
  // Every position of every slot holds a value: the tree decides which ones a step reads.
  kt::KvArena arena(shape, kSlots);
  for (int32_t slot = 0; slot < kSlots; ++slot) {
    for (int32_t t = 0; t < kChunk; ++t) arena.FillToken(slot, t, rng);
  }
  const KvCacheView host_kv = arena.view();
  DeviceBuffer dk(ArenaBytes(shape, kSlots)), dv(ArenaBytes(shape, kSlots));
  ASSERT_CUDA(cudaMemcpy(dk.get(), host_kv.k, dk.bytes(), cudaMemcpyHostToDevice));
  ASSERT_CUDA(cudaMemcpy(dv.get(), host_kv.v, dv.bytes(), cudaMemcpyHostToDevice));
  KvCacheView kv = host_kv;
  kv.k = dk.get();
  kv.v = dv.get();

  plan::TppPlan plan;
  DevicePlan dplan;
  const float sm_scale = 0.125f;
  int lengths_only = 0;
  for (int step = 0; step < 36; ++step) {
    ASSERT_OK(plan.Update(tree, batch));
    const TppPlanView view = plan.view();
    ASSERT_CUDA(dplan.Update(view, {shape.num_qo_heads, shape.num_kv_heads, kChunk, kSlots},
                             nullptr, TppScheduleOptions{0, 4, 2}));
    if (step > 0 && plan.last_update() == plan::TppPlan::UpdateKind::kLengths) {
      EXPECT_EQ(dplan.last_upload(), PlanUpload::kLengths) << "step " << step;
      ++lengths_only;
    }
    const size_t n = static_cast<size_t>(view.num_seqs) * shape.num_qo_heads * shape.head_dim;
    const std::vector<float> q = RoundedFloats(shape.dtype, n, rng);
    const std::vector<float> want = kt::NaiveDecode(arena, view, q, sm_scale);
    DeviceBuffer dq, dout(n * 2), workspace(std::max<size_t>(dplan.WorkspaceBytes(64), 16));
    DeviceBuffer::Upload(dq, ToBits(shape.dtype, q));
    ASSERT_CUDA(cudaMemset(dout.get(), 0xff, dout.bytes()));
    TppDecodeParams p;
    p.q = dq.get();
    p.o = dout.get();
    p.kv = kv;
    p.num_qo_heads = shape.num_qo_heads;
    p.sm_scale = sm_scale;
    p.plan = &dplan;
    p.workspace = workspace.get();
    p.workspace_bytes = workspace.bytes();
    ASSERT_CUDA(TppDecode(p, nullptr));
    std::vector<uint16_t> bits(n);
    ASSERT_CUDA(cudaMemcpy(bits.data(), dout.get(), n * 2, cudaMemcpyDeviceToHost));
    const std::vector<float> got = FromBits(shape.dtype, bits);
    size_t at = 0;
    ASSERT_LE(kt::WorstError(got, want, Atol(shape.dtype), Rtol(shape.dtype), &at), 1.0)
        << "step " << step << " element " << at << " got " << got[at] << " want " << want[at];
    std::vector<std::vector<TokenId>> toks(batch.size());
    std::vector<kv::SeqTokens> reqs;
    for (size_t i = 0; i < batch.size(); ++i) {
      toks[i] = {static_cast<TokenId>(rng.Int(0, 999))};
      reqs.push_back({batch[i], toks[i]});
    }
    kv::AppendResult out;
    ASSERT_OK(tree.Append(reqs, &out));
  }
  EXPECT_GT(lengths_only, 10);
}

// ---------------------------------------------------------------------------------------------
// Errors: nothing launches, nothing aborts.
// ---------------------------------------------------------------------------------------------

class CudaAttentionErrorsTest : public ::chunkserve::testing::GpuTest {};

TEST_F(CudaAttentionErrorsTest, UnsupportedShapesAreInvalidValue) {
  DeviceBuffer buf(4096);
  KvCacheView kv;
  kv.k = buf.get();
  kv.v = buf.as<unsigned char>() + 1024;
  kv.dtype = DType::kF16;
  kv.num_slots = 1;
  kv.num_kv_heads = 1;
  kv.chunk_size = 16;
  kv.head_dim = 96;  // not instantiated
  PagedDecodeParams p;
  p.q = buf.as<unsigned char>() + 2048;
  p.o = buf.as<unsigned char>() + 3072;
  p.kv = kv;
  p.num_seqs = 1;
  p.num_qo_heads = 1;
  p.block_indptr = buf.as<int32_t>();
  p.block_slot = buf.as<int32_t>();
  p.block_len = buf.as<int32_t>();
  EXPECT_EQ(PagedDecode(p, nullptr), cudaErrorInvalidValue);
  p.kv.head_dim = 64;
  p.kv.dtype = DType::kF32;
  EXPECT_EQ(PagedDecode(p, nullptr), cudaErrorInvalidValue);
  p.kv.dtype = DType::kF16;
  p.kv.chunk_size = 24;
  EXPECT_EQ(PagedDecode(p, nullptr), cudaErrorInvalidValue);
  p.kv.chunk_size = 16;
  p.block_len = nullptr;
  EXPECT_EQ(PagedDecode(p, nullptr), cudaErrorInvalidValue);

  TppDecodeParams t;
  t.q = p.q;
  t.o = p.o;
  t.kv = p.kv;
  t.num_qo_heads = 1;
  EXPECT_EQ(TppDecode(t, nullptr), cudaErrorInvalidValue);  // no plan
  DevicePlan plan;
  t.plan = &plan;
  EXPECT_EQ(TppDecode(t, nullptr), cudaErrorInvalidValue);  // plan never updated
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

TEST_F(CudaAttentionErrorsTest, PlanForAnotherShapeIsInvalidValue) {
  Random rng(TestSeed());
  const kt::Layout layout = kt::SharedPrefixLayout(3, 16, 20, 5, rng);
  DevicePlan plan;
  ASSERT_CUDA(plan.Update(layout.Plan(), {2, 1, 16, layout.num_slots}, nullptr));
  EXPECT_EQ(plan.last_upload(), PlanUpload::kFull);
  ASSERT_CUDA(plan.Update(layout.Plan(), {2, 1, 16, layout.num_slots}, nullptr));
  EXPECT_EQ(plan.last_upload(), PlanUpload::kNone);
  EXPECT_EQ(plan.last_upload_bytes(), 0u);
  // A malformed plan: an error, and the next good Update uploads everything again.
  EXPECT_EQ(plan.Update(layout.Plan(), {2, 1, 16, 1}, nullptr), cudaErrorInvalidValue);
  ASSERT_CUDA(plan.Update(layout.Plan(), {2, 1, 16, layout.num_slots}, nullptr));
  EXPECT_EQ(plan.last_upload(), PlanUpload::kFull);

  DeviceBuffer buf(1 << 16);
  TppDecodeParams t;
  t.q = buf.get();
  t.o = buf.as<unsigned char>() + 4096;
  t.kv.k = buf.as<unsigned char>() + 8192;
  t.kv.v = buf.as<unsigned char>() + 16384;
  t.kv.dtype = DType::kBF16;
  t.kv.num_slots = layout.num_slots;
  t.kv.num_kv_heads = 1;
  t.kv.chunk_size = 16;
  t.kv.head_dim = 64;
  t.num_qo_heads = 4;  // the plan was built for 2
  t.plan = &plan;
  t.workspace = buf.as<unsigned char>() + 32768;
  t.workspace_bytes = 32768;
  EXPECT_EQ(TppDecode(t, nullptr), cudaErrorInvalidValue);
  t.num_qo_heads = 2;
  t.workspace_bytes = 0;  // too small
  EXPECT_EQ(TppDecode(t, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace chunkserve::kernels::cuda
