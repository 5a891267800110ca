#include "runtime/backend/cpu_backend.h"

#include <cblas.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/dtype.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/kv_append.h"
#include "kernels/cpu/model_ops.h"
#include "runtime/backend/row_logprobs.h"

namespace chunkserve::backend {
namespace {

namespace kc = ::chunkserve::kernels::cpu;
using kernels::DType;

Status FromKernel(kc::KernelStatus s, const char* what) {
  if (s == kc::KernelStatus::kOk) return Status::Ok();
  return Status::Internal(std::string(what) + " failed: " + kc::KernelStatusName(s));
}

Status NeedF32(const Tensor& t, const char* what) {
  if (t.dtype != DType::kF32 || t.data == nullptr) {
    return Status::InvalidArgument(std::string(what) + ": the CPU backend computes in fp32");
  }
  return Status::Ok();
}

float* F(const Tensor& t) { return static_cast<float*>(t.data); }

// Host memory for tensors and the KV arena, 64-byte aligned. Blocks of kMapBytes and more are
// their own anonymous mappings (zero-filled; an arena's pages become resident as chunks are
// written): freed, they go straight back to the OS, and they never sit between a model
// loader's freed buffers in the C heap, where glibc keeps such holes resident. Smaller blocks come
// from aligned_alloc.
constexpr size_t kMapBytes = size_t{1} << 20;

size_t HostBytes(size_t bytes) { return (std::max<size_t>(bytes, 1) + 63) / 64 * 64; }

void* HostAlloc(size_t bytes) {
  bytes = HostBytes(bytes);
  if (bytes < kMapBytes) return std::aligned_alloc(64, bytes);
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  return p;
}

void HostFree(void* p, size_t bytes) {
  if (p == nullptr) return;
  bytes = HostBytes(bytes);
  if (bytes < kMapBytes) {
    std::free(p);
  } else {
    munmap(p, bytes);
  }
}

}  // namespace

Result<std::unique_ptr<CpuBackend>> CpuBackend::Create(const CpuBackendOptions& options) {
  if (options.num_threads < 0) return Status::InvalidArgument("num_threads must be >= 0");
  std::unique_ptr<CpuBackend> b(new CpuBackend());
  b->pool_ = std::make_unique<kc::ThreadPool>(options.num_threads);
  openblas_set_num_threads(1);
  return b;
}

CpuBackend::~CpuBackend() {
  for (const auto& [p, bytes] : owned_) HostFree(p, bytes);
  HostFree(k_arena_, arena_bytes_);
  HostFree(v_arena_, arena_bytes_);
}

Result<Tensor> CpuBackend::Allocate(DType dtype, int64_t numel) {
  if (numel < 0) return Status::InvalidArgument("negative tensor size");
  const size_t bytes = static_cast<size_t>(numel) * kernels::DTypeSize(dtype);
  void* p = HostAlloc(bytes);
  if (p == nullptr) {
    return Status::ResourceExhausted("cannot allocate " + std::to_string(bytes) + " bytes");
  }
  owned_.emplace(p, bytes);
  return Tensor{p, dtype, numel};
}

Status CpuBackend::Reserve(Tensor* t, DType dtype, int64_t numel) {
  if (t->data != nullptr && t->dtype == dtype && t->numel >= numel) return Status::Ok();
  Release(t);
  // Some headroom so a slowly growing batch does not reallocate every step.
  CHUNKSERVE_ASSIGN_OR_RETURN(*t, Allocate(dtype, numel + numel / 2));
  return Status::Ok();
}

void CpuBackend::Release(Tensor* t) {
  if (t->data != nullptr) {
    const auto it = owned_.find(t->data);
    if (it != owned_.end()) {
      HostFree(it->first, it->second);
      owned_.erase(it);
    }
  }
  *t = Tensor{};
}

Result<Tensor> CpuBackend::UploadWeights(const void* src, model::DType src_dtype, int64_t numel) {
  if (src == nullptr) return Status::InvalidArgument("null weights");
  CHUNKSERVE_ASSIGN_OR_RETURN(Tensor t, Allocate(DType::kF32, numel));
  kc::ConvertToFloat(src_dtype, src, F(t), static_cast<size_t>(numel));
  weight_bytes_ += static_cast<uint64_t>(numel) * sizeof(float);
  return t;
}

Result<Tensor> CpuBackend::UploadLinearWeight(const void* src, model::DType src_dtype,
                                              int64_t out, int64_t in) {
  if (src == nullptr) return Status::InvalidArgument("null weights");
  const int64_t numel = kc::PackedWeightElements(out, in);
  if (numel == 0) return Status::InvalidArgument("bad Linear weight shape");
  CHUNKSERVE_ASSIGN_OR_RETURN(Tensor t, Allocate(src_dtype, numel));
  const kc::KernelStatus s = kc::PackWeights(src, src_dtype, out, in, src_dtype, t.data);
  if (s != kc::KernelStatus::kOk) {
    Release(&t);
    return FromKernel(s, "PackWeights");
  }
  t.packed = true;
  weight_bytes_ += static_cast<uint64_t>(numel) * kernels::DTypeSize(src_dtype);
  return t;
}

Result<Tensor> CpuBackend::UploadFloats(std::span<const float> values) {
  CHUNKSERVE_ASSIGN_OR_RETURN(Tensor t, Allocate(DType::kF32, static_cast<int64_t>(values.size())));
  if (!values.empty()) std::memcpy(t.data, values.data(), values.size_bytes());
  weight_bytes_ += values.size_bytes();
  return t;
}

Result<std::vector<const int32_t*>> CpuBackend::StageIndices(
    std::span<const std::span<const int32_t>> sections) {
  std::vector<const int32_t*> out;
  out.reserve(sections.size());
  for (const auto& s : sections) out.push_back(s.data());  // host memory is where kernels read
  return out;
}

Status CpuBackend::AllocateKvArena(const KvArenaShape& s) {
  if (k_arena_ != nullptr) return Status::FailedPrecondition("the KV arena exists already");
  if (s.num_layers < 1 || s.num_slots < 1 || s.num_kv_heads < 1 || s.head_dim < 1) {
    return Status::InvalidArgument("bad KV arena shape");
  }
  if (s.chunk_size < kc::kMinChunkSize || s.chunk_size > kc::kMaxChunkSize) {
    return Status::InvalidArgument("chunk_size must be in [16, 256], got " +
                                   std::to_string(s.chunk_size));
  }
  if (s.head_dim > kc::kMaxHeadDim) {
    return Status::Unimplemented("head_dim " + std::to_string(s.head_dim) + " exceeds " +
                                 std::to_string(kc::kMaxHeadDim));
  }
  shape_ = s;
  layer_arena_bytes_ = static_cast<size_t>(s.num_slots) * s.num_kv_heads * s.chunk_size *
                       s.head_dim * kernels::DTypeSize(s.dtype);
  const size_t arena = layer_arena_bytes_ * s.num_layers;
  k_arena_ = static_cast<unsigned char*>(HostAlloc(arena));
  v_arena_ = static_cast<unsigned char*>(HostAlloc(arena));
  if (k_arena_ == nullptr || v_arena_ == nullptr) {
    HostFree(k_arena_, arena);
    HostFree(v_arena_, arena);
    k_arena_ = v_arena_ = nullptr;
    return Status::ResourceExhausted("cannot allocate a KV arena of 2 x " + std::to_string(arena) +
                                     " bytes");
  }
  arena_bytes_ = arena;
  // Zeroed so a kernel bug that reads an unwritten position reads zeros, never stale garbage (a
  // mapped arena is zero-filled already, and stays non-resident until chunks are written).
  if (HostBytes(arena) < kMapBytes) {
    std::memset(k_arena_, 0, arena);
    std::memset(v_arena_, 0, arena);
  }
  return Status::Ok();
}

void* CpuBackend::LayerK(int32_t layer) const {
  return k_arena_ + static_cast<size_t>(layer) * layer_arena_bytes_;
}
void* CpuBackend::LayerV(int32_t layer) const {
  return v_arena_ + static_cast<size_t>(layer) * layer_arena_bytes_;
}

Status CpuBackend::KvCopy(int32_t layer, int32_t src_slot, int32_t dst_slot, int32_t num_tokens) {
  if (k_arena_ == nullptr || layer < 0 || layer >= shape_.num_layers) {
    return Status::InvalidArgument("KvCopy: no such layer");
  }
  const kc::KvArenaLayer l{LayerK(layer),       LayerV(layer),     shape_.dtype,   shape_.num_slots,
                           shape_.num_kv_heads, shape_.chunk_size, shape_.head_dim};
  return FromKernel(kc::KvCopy(l, src_slot, dst_slot, num_tokens), "KvCopy");
}

Status CpuBackend::Embed(const Tensor& table, int32_t vocab, int32_t dim, const int32_t* ids,
                         int32_t n, Tensor* out) {
  if (!table.packed) CHUNKSERVE_RETURN_IF_ERROR(NeedF32(table, "Embed"));
  if (table.packed && table.numel < kc::PackedWeightElements(vocab, dim)) {
    return Status::InvalidArgument("Embed: the table is smaller than [vocab, dim]");
  }
  CHUNKSERVE_RETURN_IF_ERROR(NeedF32(*out, "Embed"));
  for (int32_t i = 0; i < n; ++i) {
    float* dst = F(*out) + static_cast<size_t>(i) * dim;
    if (ids[i] >= 0 && ids[i] < vocab && table.packed) {
      CHUNKSERVE_RETURN_IF_ERROR(FromKernel(
          kc::UnpackWeightRow(table.data, table.dtype, vocab, dim, ids[i], dst), "Embed"));
    } else if (ids[i] >= 0 && ids[i] < vocab) {
      std::memcpy(dst, F(table) + static_cast<size_t>(ids[i]) * dim, dim * sizeof(float));
    } else {
      std::fill(dst, dst + dim, 0.0f);  // as the CUDA gather: a bad id gives a zero row
    }
  }
  return Status::Ok();
}

template <typename Fn>
kc::KernelStatus CpuBackend::OverRows(int64_t rows, int64_t row_elems, Fn fn) {
  // A part gets at least ~64K elements: below that, waking a pool thread costs more than the
  // elementwise work it would take over (these ops run at memory speed).
  constexpr int64_t kMinElemsPerPart = int64_t{1} << 16;
  const int64_t by_work = std::max<int64_t>(1, rows * row_elems / kMinElemsPerPart);
  const int64_t parts = std::min<int64_t>({pool_->num_threads(), rows, by_work});
  if (parts <= 1) return fn(0, rows);
  std::atomic<int32_t> failed{static_cast<int32_t>(kc::KernelStatus::kOk)};
  auto run = [&](int64_t begin, int64_t end, int32_t) {
    for (int64_t p = begin; p < end; ++p) {
      const kc::KernelStatus s = fn(rows * p / parts, rows * (p + 1) / parts);
      if (s != kc::KernelStatus::kOk) failed.store(static_cast<int32_t>(s));
    }
  };
  pool_->ParallelFor(parts, 1, 0, run);
  return static_cast<kc::KernelStatus>(failed.load());
}

Status CpuBackend::RmsNorm(const Tensor& x, const Tensor& weight, Tensor* y, int32_t rows,
                           int32_t dim, float eps) {
  CHUNKSERVE_RETURN_IF_ERROR(NeedF32(x, "RmsNorm"));
  if (rows < 0 || dim < 1) return Status::InvalidArgument("RmsNorm: bad shape");
  const float* xp = F(x);
  const float* wp = F(weight);
  float* yp = F(*y);
  if (wp == nullptr || yp == nullptr) return Status::InvalidArgument("RmsNorm: null tensor");
  return FromKernel(OverRows(rows, dim,
                             [&](int64_t b, int64_t e) {
                               return kc::RmsNorm(xp + b * dim, wp, yp + b * dim, e - b, dim, eps);
                             }),
                    "RmsNorm");
}

Status CpuBackend::Linear(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor* y,
                          int32_t tokens, int32_t out, int32_t in, bool accumulate) {
  CHUNKSERVE_RETURN_IF_ERROR(NeedF32(x, "Linear"));
  CHUNKSERVE_RETURN_IF_ERROR(NeedF32(*y, "Linear"));
  if (tokens < 0 || out < 1 || in < 1) return Status::InvalidArgument("Linear: bad shape");
  if (tokens == 0) return Status::Ok();
  const float* bias_data = bias != nullptr && bias->data != nullptr ? F(*bias) : nullptr;
  if (w.packed) {
    if (w.numel < kc::PackedWeightElements(out, in)) {
      return Status::InvalidArgument("Linear: the weight is smaller than [out, in]");
    }
    kc::GemmParams p;
    p.x = F(x);
    p.ldx = in;
    p.w = w.data;
    p.w_dtype = w.dtype;
    p.bias = bias_data;
    p.y = F(*y);
    p.ldy = out;
    p.m = tokens;
    p.n = out;
    p.k = in;
    p.accumulate = accumulate;
    p.pool = pool_.get();
    return FromKernel(kc::Gemm(p), "Gemm");
  }
  CHUNKSERVE_RETURN_IF_ERROR(NeedF32(w, "Linear"));
  // y[T, out] = x[T, in] * W[out, in]^T (+ bias), the layout of Hugging Face's Linear weights.
  // OpenBLAS runs single-threaded; the output columns are split over the thread pool.
  const float* xp = F(x);
  const float* wp = F(w);
  const float* bp = bias_data;
  float* yp = F(*y);
  const int32_t parts = std::min<int32_t>(pool_->num_threads(), std::max<int32_t>(1, out / 64));
  auto run = [&](int64_t begin, int64_t end, int32_t) {
    for (int64_t p = begin; p < end; ++p) {
      // Column ranges aligned to 16 floats so every part starts on a cache-line boundary.
      const int32_t c0 = static_cast<int32_t>((out * p / parts) & ~15);
      const int32_t c1 = p + 1 == parts ? out : static_cast<int32_t>((out * (p + 1) / parts) & ~15);
      if (c1 <= c0) continue;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, tokens, c1 - c0, in, 1.0f, xp, in,
                  wp + static_cast<size_t>(c0) * in, in, accumulate ? 1.0f : 0.0f, yp + c0, out);
      if (bp != nullptr) {
        for (int32_t t = 0; t < tokens; ++t) {
          for (int32_t j = c0; j < c1; ++j) yp[static_cast<size_t>(t) * out + j] += bp[j];
        }
      }
    }
  };
  pool_->ParallelFor(parts, 1, 0, run);
  return Status::Ok();
}

Status CpuBackend::Rope(Tensor* x, const int32_t* positions, int32_t rows, int32_t heads,
                        int32_t head_dim, const Tensor& inv_freq) {
  if (rows < 0 || heads < 1 || head_dim < 1) return Status::InvalidArgument("Rope: bad shape");
  float* xp = F(*x);
  const float* freq = F(inv_freq);
  if (xp == nullptr || freq == nullptr || (positions == nullptr && rows > 0)) {
    return Status::InvalidArgument("Rope: null tensor");
  }
  const int64_t row_elems = int64_t{heads} * head_dim;
  return FromKernel(OverRows(rows, row_elems,
                             [&](int64_t b, int64_t e) {
                               return kc::ApplyRope(xp + b * row_elems, positions + b, e - b,
                                                    heads, head_dim, freq);
                             }),
                    "ApplyRope");
}

Status CpuBackend::KvAppend(int32_t layer, const Tensor& k, const Tensor& v, const int32_t* slot,
                            const int32_t* offset, int32_t n) {
  if (k_arena_ == nullptr || layer < 0 || layer >= shape_.num_layers) {
    return Status::InvalidArgument("KvAppend: no such layer");
  }
  kc::KvAppendParams ap;
  ap.kv = kc::KvArenaLayer{LayerK(layer),       LayerV(layer),     shape_.dtype,   shape_.num_slots,
                           shape_.num_kv_heads, shape_.chunk_size, shape_.head_dim};
  ap.k = F(k);
  ap.v = F(v);
  ap.slot = slot;
  ap.offset = offset;
  ap.num_tokens = n;
  return FromKernel(kc::KvAppend(ap), "KvAppend");
}

Status CpuBackend::SetDecodePlan(const kernels::TppPlanView& plan, int32_t num_qo_heads) {
  plan_ = plan;
  const size_t ws = kc::TppDecodeWorkspaceBytes(plan, num_qo_heads, shape_.head_dim);
  if (workspace_.size() < ws) workspace_.resize(ws);
  return Status::Ok();
}

Status CpuBackend::DecodeAttention(int32_t layer, const Tensor& q, Tensor* o,
                                   int32_t num_qo_heads) {
  kc::TppDecodeParams p;
  p.q = F(q);
  p.o = F(*o);
  p.kv = kc::KvArenaLayer{LayerK(layer),       LayerV(layer),     shape_.dtype,   shape_.num_slots,
                          shape_.num_kv_heads, shape_.chunk_size, shape_.head_dim}
             .View();
  p.plan = plan_;
  p.num_qo_heads = num_qo_heads;
  p.sm_scale = 1.0f / std::sqrt(static_cast<float>(shape_.head_dim));
  p.workspace = workspace_.data();
  p.workspace_bytes = workspace_.size();
  p.pool = pool_.get();
  return FromKernel(kc::TppDecode(p), "TppDecode");
}

Status CpuBackend::PrefillAttention(int32_t layer, const Tensor& q, Tensor* o, int32_t num_qo_heads,
                                    const PrefillLists& lists) {
  kc::PrefillAttentionParams p;
  p.q = F(q);
  p.o = F(*o);
  p.kv = kc::KvArenaLayer{LayerK(layer),       LayerV(layer),     shape_.dtype,   shape_.num_slots,
                          shape_.num_kv_heads, shape_.chunk_size, shape_.head_dim}
             .View();
  p.num_seqs = lists.num_seqs;
  p.num_qo_heads = num_qo_heads;
  p.q_indptr = lists.staged.q_indptr;
  p.q_pos = lists.staged.q_pos;
  p.chunk_indptr = lists.staged.chunk_indptr;
  p.chunk_slot = lists.staged.chunk_slot;
  p.chunk_len = lists.staged.chunk_len;
  p.sm_scale = 1.0f / std::sqrt(static_cast<float>(shape_.head_dim));
  p.pool = pool_.get();
  return FromKernel(kc::PrefillAttention(p), "PrefillAttention");
}

Status CpuBackend::SiluMul(const Tensor& gate, const Tensor& up, Tensor* out, int64_t n) {
  if (n < 0) return Status::InvalidArgument("SiluMul: bad size");
  const float* g = F(gate);
  const float* u = F(up);
  float* o = F(*out);
  if (g == nullptr || u == nullptr || o == nullptr) {
    return Status::InvalidArgument("SiluMul: null tensor");
  }
  // Elementwise: "rows" of 1 element.
  return FromKernel(OverRows(n, 1,
                             [&](int64_t b, int64_t e) {
                               return kc::SiluMul(g + b, u + b, o + b, e - b);
                             }),
                    "SiluMul");
}

Status CpuBackend::GatherRows(const Tensor& x, int32_t x_rows, const int32_t* rows, int32_t n,
                              int32_t dim, Tensor* out) {
  CHUNKSERVE_RETURN_IF_ERROR(NeedF32(x, "GatherRows"));
  for (int32_t i = 0; i < n; ++i) {
    if (rows[i] < 0 || rows[i] >= x_rows) return Status::InvalidArgument("GatherRows: bad row");
    std::memcpy(F(*out) + static_cast<size_t>(i) * dim, F(x) + static_cast<size_t>(rows[i]) * dim,
                dim * sizeof(float));
  }
  return Status::Ok();
}

Status CpuBackend::AllReduceSum(parallel::Communicator* comm, Tensor* x, int64_t n,
                                parallel::Deadline deadline) {
  CHUNKSERVE_RETURN_IF_ERROR(NeedF32(*x, "AllReduceSum"));
  return comm->AllReduceSum(std::span<float>(F(*x), static_cast<size_t>(n)), deadline);
}

Status CpuBackend::ReadLogits(const Tensor& logits, int32_t rows, int32_t vocab,
                              std::span<float> out) {
  const size_t n = static_cast<size_t>(rows) * vocab;
  if (out.size() < n) return Status::InvalidArgument("logits buffer too small");
  if (n > 0 && out.data() != F(logits)) std::memcpy(out.data(), F(logits), n * sizeof(float));
  return Status::Ok();
}

Status CpuBackend::Sample(const Tensor& logits, int32_t rows, int32_t vocab,
                          std::span<const SampleRow> params, std::span<TokenId> out,
                          std::span<TokenLogprobs> logprobs) {
  if (params.size() < static_cast<size_t>(rows) || out.size() < static_cast<size_t>(rows)) {
    return Status::InvalidArgument("Sample: one parameter set and one output per row");
  }
  for (int32_t r = 0; r < rows; ++r) {
    const SampleRow& p = params[r];
    const std::span<const float> row(F(logits) + static_cast<size_t>(r) * vocab, vocab);
    out[r] = kc::SampleToken(row, {.temperature = p.temperature, .top_k = p.top_k, .top_p = p.top_p},
                             p.uniform, &sampling_);
    if (p.logprobs >= 0) {
      if (logprobs.size() < static_cast<size_t>(rows)) {
        return Status::InvalidArgument("Sample: a row asks for logprobs without an output for them");
      }
      RowLogprobs(row, out[r], p.logprobs, &sampling_, &logprobs[r]);
    }
  }
  return Status::Ok();
}

}  // namespace chunkserve::backend
