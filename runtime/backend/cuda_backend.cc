#include "runtime/backend/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <string_view>
#include <unordered_set>
#include <utility>
#include <vector>

#include "kernels/cpu/dtype.h"
#include "kernels/cpu/sampling.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/device_plan.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/model_ops.h"
#include "kernels/cuda/sampling.h"
#include "kernels/cuda/shapes.h"
#include "runtime/backend/row_logprobs.h"

namespace chunkserve::backend {
namespace {

namespace kc = ::chunkserve::kernels::cpu;
namespace kcu = ::chunkserve::kernels::cuda;
using kernels::DType;

// Every CUDA error becomes a Status naming the operation and the error; nothing aborts.
Status FromCuda(cudaError_t e, std::string_view what) {
  if (e == cudaSuccess) return Status::Ok();
  std::string msg =
      std::string(what) + " failed: " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
  switch (e) {
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorDevicesUnavailable:
    case cudaErrorInvalidDevice:
    case cudaErrorInitializationError:
    case cudaErrorSystemNotReady:
    case cudaErrorSystemDriverMismatch:
      return Status::Unavailable(msg);
    case cudaErrorMemoryAllocation:
      return Status::ResourceExhausted(msg);
    case cudaErrorInvalidValue:
      return Status::InvalidArgument(msg);
    default:
      return Status::Internal(msg);
  }
}

// Elements per section of a packed upload: a multiple of 4 ints (16 bytes), so that every
// section starts 16-byte aligned.
size_t Padded(size_t n) { return (n + 3) / 4 * 4; }

}  // namespace

struct CudaBackend::Impl {
  explicit Impl(const CudaBackendOptions& o) : options(o) {}

  ~Impl() {
    // Best effort: queued work must finish before its buffers go; errors here have no caller.
    // The destroying thread may have another current device than the one that ran the steps.
    cudaSetDevice(options.device);
    if (stream != nullptr) cudaStreamSynchronize(stream);
    for (void* p : owned) cudaFree(p);
    if (stream != nullptr) cudaStreamDestroy(stream);
  }

  Status Use() { return FromCuda(cudaSetDevice(options.device), "cudaSetDevice"); }

  Result<void*> Malloc(size_t bytes, std::string_view what) {
    void* p = nullptr;
    CHUNKSERVE_RETURN_IF_ERROR(FromCuda(cudaMalloc(&p, std::max<size_t>(bytes, 16)),
                                        std::string("cudaMalloc (") + std::string(what) + ")"));
    owned.insert(p);
    return p;
  }

  // Frees device memory after the work that may still read it.
  void Free(void* p) {
    if (p == nullptr || owned.erase(p) == 0) return;
    cudaStreamSynchronize(stream);
    cudaFree(p);
  }

  // A device buffer of at least `bytes`, grown with headroom (contents lost).
  Status Grow(void** p, size_t* capacity, size_t bytes, std::string_view what) {
    if (*p != nullptr && *capacity >= bytes) return Status::Ok();
    Free(*p);
    *p = nullptr;
    *capacity = 0;
    const size_t want = std::max<size_t>(bytes + bytes / 2, 256);
    CHUNKSERVE_ASSIGN_OR_RETURN(*p, Malloc(want, what));
    *capacity = want;
    return Status::Ok();
  }

  kcu::KvArenaLayerDevice ArenaLayer(int32_t layer) const {
    kcu::KvArenaLayerDevice l;
    l.k = static_cast<unsigned char*>(k_arena) + static_cast<size_t>(layer) * layer_arena_bytes;
    l.v = static_cast<unsigned char*>(v_arena) + static_cast<size_t>(layer) * layer_arena_bytes;
    l.dtype = shape.dtype;
    l.num_slots = shape.num_slots;
    l.num_kv_heads = shape.num_kv_heads;
    l.chunk_size = shape.chunk_size;
    l.head_dim = shape.head_dim;
    return l;
  }

  kernels::KvCacheView ArenaView(int32_t layer) const {
    const kcu::KvArenaLayerDevice l = ArenaLayer(layer);
    return kernels::KvCacheView{l.k,          l.v,       l.dtype, l.num_slots, l.num_kv_heads,
                                l.chunk_size, l.head_dim};
  }

  Status CheckLayer(int32_t layer) const {
    if (k_arena == nullptr || layer < 0 || layer >= shape.num_layers) {
      return Status::InvalidArgument("no KV arena layer " + std::to_string(layer));
    }
    return Status::Ok();
  }

  Status Sync(std::string_view what) {
    CHUNKSERVE_RETURN_IF_ERROR(FromCuda(cudaStreamSynchronize(stream), what));
    return FromCuda(cudaGetLastError(), what);
  }

  const CudaBackendOptions options;
  cudaStream_t stream = nullptr;
  kcu::GemmRunner gemm;
  kcu::DevicePlan plan;
  std::unordered_set<void*> owned;  // every live allocation

  KvArenaShape shape;
  void* k_arena = nullptr;
  void* v_arena = nullptr;
  size_t layer_arena_bytes = 0;

  // Reused per-step buffers.
  void* ints = nullptr;  // staged index arrays
  size_t ints_bytes = 0;
  std::vector<int32_t> host_ints;
  void* ones = nullptr;  // compute-dtype ones for bias adds (rank-1 GEMM)
  size_t ones_bytes = 0;
  int64_t ones_count = 0;
  void* workspace = nullptr;  // TPP partials
  size_t workspace_bytes = 0;
  void* sample = nullptr;  // sampling parameters and results
  size_t sample_bytes = 0;
  std::vector<unsigned char> host_sample;
  std::vector<float> host_row;
  kc::SamplingScratch scratch;
  uint64_t last_plan_upload_bytes = 0;
};

CudaBackend::CudaBackend(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaBackend::~CudaBackend() = default;

DType CudaBackend::compute_dtype() const { return impl_->options.dtype; }
uint64_t CudaBackend::last_plan_upload_bytes() const { return impl_->last_plan_upload_bytes; }
int32_t CudaBackend::device() const { return impl_->options.device; }

Result<std::unique_ptr<CudaBackend>> CudaBackend::Create(const CudaBackendOptions& options) {
  // Host-side checks first, so an unsupported configuration says so even without a device.
  if (options.dtype != DType::kF16 && options.dtype != DType::kBF16) {
    return Status::InvalidArgument(
        "the CUDA backend stores KV, weights and activations in f16 or bf16; f32 is not "
        "supported (choose f16 or bf16)");
  }
  if (options.device < 0) return Status::InvalidArgument("device must be >= 0");
  int count = 0;
  CHUNKSERVE_RETURN_IF_ERROR(FromCuda(kcu::DeviceCount(&count), "cudaGetDeviceCount"));
  if (count == 0) {
    return Status::Unavailable(
        "no CUDA device is available on this machine (no GPU or no driver); the CUDA backend "
        "needs one, use the CPU backend instead");
  }
  if (options.device >= count) {
    return Status::InvalidArgument("CUDA device " + std::to_string(options.device) +
                                   " does not exist (" + std::to_string(count) + " present)");
  }
  auto impl = std::make_unique<Impl>(options);
  CHUNKSERVE_RETURN_IF_ERROR(impl->Use());
  CHUNKSERVE_RETURN_IF_ERROR(FromCuda(
      cudaStreamCreateWithFlags(&impl->stream, cudaStreamNonBlocking), "cudaStreamCreate"));
  CHUNKSERVE_RETURN_IF_ERROR(FromCuda(impl->gemm.Init(), "cublasCreate"));
  return std::unique_ptr<CudaBackend>(new CudaBackend(std::move(impl)));
}

Status CudaBackend::Reserve(Tensor* t, DType dtype, int64_t numel) {
  if (numel < 0) return Status::InvalidArgument("negative tensor size");
  if (t->data != nullptr && t->dtype == dtype && t->numel >= numel) return Status::Ok();
  Impl& m = *impl_;
  CHUNKSERVE_RETURN_IF_ERROR(m.Use());
  Release(t);
  const int64_t want = numel + numel / 2;  // headroom: a growing batch does not realloc each step
  CHUNKSERVE_ASSIGN_OR_RETURN(void* p, m.Malloc(want * kernels::DTypeSize(dtype), "activations"));
  *t = Tensor{p, dtype, want};
  return Status::Ok();
}

void CudaBackend::Release(Tensor* t) {
  if (t->data != nullptr) {
    cudaSetDevice(impl_->options.device);
    impl_->Free(t->data);
  }
  *t = Tensor{};
}

Result<Tensor> CudaBackend::UploadWeights(const void* src, model::DType src_dtype, int64_t numel) {
  Impl& m = *impl_;
  if (src == nullptr || numel < 0) return Status::InvalidArgument("bad weights");
  CHUNKSERVE_RETURN_IF_ERROR(m.Use());
  const DType dtype = m.options.dtype;
  const size_t n = static_cast<size_t>(numel);
  const void* data = src;
  std::vector<uint16_t> converted;
  if (src_dtype != dtype) {
    std::vector<float> wide(n);
    kc::ConvertToFloat(src_dtype, src, wide.data(), n);
    converted.resize(n);
    kc::ConvertFromFloat(dtype, wide.data(), converted.data(), n);
    data = converted.data();
  }
  CHUNKSERVE_ASSIGN_OR_RETURN(void* p, m.Malloc(n * 2, "weights"));
  CHUNKSERVE_RETURN_IF_ERROR(
      FromCuda(cudaMemcpy(p, data, n * 2, cudaMemcpyHostToDevice), "cudaMemcpy (weights)"));
  return Tensor{p, dtype, numel};
}

Result<Tensor> CudaBackend::UploadFloats(std::span<const float> values) {
  Impl& m = *impl_;
  CHUNKSERVE_RETURN_IF_ERROR(m.Use());
  CHUNKSERVE_ASSIGN_OR_RETURN(void* p, m.Malloc(values.size_bytes(), "constants"));
  if (!values.empty()) {
    CHUNKSERVE_RETURN_IF_ERROR(
        FromCuda(cudaMemcpy(p, values.data(), values.size_bytes(), cudaMemcpyHostToDevice),
                 "cudaMemcpy (constants)"));
  }
  return Tensor{p, DType::kF32, static_cast<int64_t>(values.size())};
}

Result<std::vector<const int32_t*>> CudaBackend::StageIndices(
    std::span<const std::span<const int32_t>> sections) {
  Impl& m = *impl_;
  CHUNKSERVE_RETURN_IF_ERROR(m.Use());
  size_t total = 0;
  for (const auto& s : sections) total += Padded(s.size());
  CHUNKSERVE_RETURN_IF_ERROR(
      m.Grow(&m.ints, &m.ints_bytes, std::max<size_t>(total, 4) * sizeof(int32_t), "indices"));
  m.host_ints.assign(total, 0);
  std::vector<const int32_t*> out;
  out.reserve(sections.size());
  size_t at = 0;
  for (const auto& s : sections) {
    if (!s.empty()) std::memcpy(&m.host_ints[at], s.data(), s.size_bytes());
    out.push_back(static_cast<const int32_t*>(m.ints) + at);
    at += Padded(s.size());
  }
  // Pageable source: the call returns once the data is staged, so host_ints may change after.
  if (total > 0) {
    CHUNKSERVE_RETURN_IF_ERROR(
        FromCuda(cudaMemcpyAsync(m.ints, m.host_ints.data(), total * sizeof(int32_t),
                                 cudaMemcpyHostToDevice, m.stream),
                 "cudaMemcpyAsync (indices)"));
  }
  return out;
}

Status CudaBackend::CheckKvArena(const KvArenaShape& s) {
  if (s.dtype != DType::kF16 && s.dtype != DType::kBF16) {
    return Status::InvalidArgument(
        "the CUDA backend stores KV, weights and activations in f16 or bf16; kv_dtype f32 is not "
        "supported (choose f16 or bf16)");
  }
  if (s.num_layers < 1 || s.num_slots < 1) {
    return Status::InvalidArgument("bad KV arena shape: num_layers and num_slots must be >= 1");
  }
  if (s.chunk_size < kcu::kMinChunkSize || s.chunk_size > kcu::kMaxChunkSize ||
      s.chunk_size % kcu::kChunkSizeMultiple != 0) {
    return Status::InvalidArgument(
        "the CUDA backend needs chunk_size a multiple of 16 in [16, 128], got " +
        std::to_string(s.chunk_size));
  }
  if (s.head_dim != 64 && s.head_dim != 128) {
    return Status::Unimplemented(
        "the CUDA attention kernels support head_dim 64 and 128; the model has " +
        std::to_string(s.head_dim));
  }
  if (const char* why =
          kcu::CheckKvArenaShape(s.dtype, s.num_slots, s.num_kv_heads, s.chunk_size, s.head_dim)) {
    return Status::InvalidArgument(std::string("unsupported KV arena shape: ") + why);
  }
  return Status::Ok();
}

Status CudaBackend::AllocateKvArena(const KvArenaShape& s) {
  Impl& m = *impl_;
  if (m.k_arena != nullptr) return Status::FailedPrecondition("the KV arena exists already");
  CHUNKSERVE_RETURN_IF_ERROR(CheckKvArena(s));
  if (s.dtype != m.options.dtype) {
    return Status::InvalidArgument(
        "the CUDA backend keeps KV in its compute dtype (f16 or bf16), the same as its weights "
        "and activations");
  }
  CHUNKSERVE_RETURN_IF_ERROR(m.Use());
  m.layer_arena_bytes = static_cast<size_t>(s.num_slots) * s.num_kv_heads * s.chunk_size *
                        s.head_dim * kernels::DTypeSize(s.dtype);
  const size_t arena = m.layer_arena_bytes * s.num_layers;
  CHUNKSERVE_ASSIGN_OR_RETURN(m.k_arena, m.Malloc(arena, "KV arena"));
  CHUNKSERVE_ASSIGN_OR_RETURN(m.v_arena, m.Malloc(arena, "KV arena"));
  // Zeroed so a kernel bug that reads an unwritten position reads zeros, never stale garbage.
  CHUNKSERVE_RETURN_IF_ERROR(FromCuda(cudaMemset(m.k_arena, 0, arena), "cudaMemset (arena)"));
  CHUNKSERVE_RETURN_IF_ERROR(FromCuda(cudaMemset(m.v_arena, 0, arena), "cudaMemset (arena)"));
  m.shape = s;
  return FromCuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

Status CudaBackend::KvCopy(int32_t layer, int32_t src_slot, int32_t dst_slot, int32_t num_tokens) {
  Impl& m = *impl_;
  CHUNKSERVE_RETURN_IF_ERROR(m.CheckLayer(layer));
  CHUNKSERVE_RETURN_IF_ERROR(m.Use());
  return FromCuda(kcu::KvCopy(m.ArenaLayer(layer), src_slot, dst_slot, num_tokens, m.stream),
                  "KvCopy");
}

Status CudaBackend::Embed(const Tensor& table, int32_t vocab, int32_t dim, const int32_t* ids,
                          int32_t n, Tensor* out) {
  Impl& m = *impl_;
  CHUNKSERVE_RETURN_IF_ERROR(m.Use());
  return FromCuda(kcu::EmbeddingGather(table.dtype, out->dtype, table.data, vocab, dim, ids, n,
                                       out->data, m.stream),
                  "EmbeddingGather");
}

Status CudaBackend::RmsNorm(const Tensor& x, const Tensor& weight, Tensor* y, int32_t rows,
                            int32_t dim, float eps) {
  Impl& m = *impl_;
  CHUNKSERVE_RETURN_IF_ERROR(m.Use());
  if (weight.dtype != y->dtype) return Status::InvalidArgument("RmsNorm: weight and y dtypes");
  return FromCuda(
      kcu::RmsNorm(x.dtype, y->dtype, x.data, weight.data, y->data, rows, dim, eps, m.stream),
      "RmsNorm");
}

Status CudaBackend::Linear(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor* y,
                           int32_t rows, int32_t out, int32_t in, bool accumulate) {
  Impl& m = *impl_;
  CHUNKSERVE_RETURN_IF_ERROR(m.Use());
  const DType dt = m.options.dtype;
  if (x.dtype != dt || w.dtype != dt) return Status::InvalidArgument("Linear: input dtypes");
  CHUNKSERVE_RETURN_IF_ERROR(
      FromCuda(m.gemm.Linear(dt, y->dtype, x.data, w.data, y->data, rows, out, in, m.stream, 1.0f,
                             accumulate ? 1.0f : 0.0f),
               "Linear"));
  if (bias == nullptr || bias->data == nullptr || rows == 0) return Status::Ok();
  // The bias broadcast over the rows is the rank-1 product ones[rows, 1] * bias[1, out], added
  // with beta 1: no separate kernel.
  if (m.ones_count < rows) {
    CHUNKSERVE_RETURN_IF_ERROR(
        m.Grow(&m.ones, &m.ones_bytes, static_cast<size_t>(rows) * 2, "bias ones"));
    const size_t count = m.ones_bytes / 2;
    // 1.0 in fp16 is 0x3C00, in bf16 0x3F80.
    const std::vector<uint16_t> host(count, dt == DType::kF16 ? 0x3C00 : 0x3F80);
    CHUNKSERVE_RETURN_IF_ERROR(FromCuda(
        cudaMemcpy(m.ones, host.data(), count * 2, cudaMemcpyHostToDevice), "cudaMemcpy (ones)"));
    m.ones_count = static_cast<int64_t>(count);
  }
  return FromCuda(
      m.gemm.Linear(dt, y->dtype, m.ones, bias->data, y->data, rows, out, 1, m.stream, 1.0f, 1.0f),
      "bias add");
}

Status CudaBackend::Rope(Tensor* x, const int32_t* positions, int32_t rows, int32_t heads,
                         int32_t head_dim, const Tensor& inv_freq) {
  Impl& m = *impl_;
  CHUNKSERVE_RETURN_IF_ERROR(m.Use());
  return FromCuda(kcu::ApplyRope(x->dtype, x->data, positions, rows, heads, head_dim,
                                 static_cast<const float*>(inv_freq.data), m.stream),
                  "ApplyRope");
}

Status CudaBackend::KvAppend(int32_t layer, const Tensor& k, const Tensor& v, const int32_t* slot,
                             const int32_t* offset, int32_t n) {
  Impl& m = *impl_;
  CHUNKSERVE_RETURN_IF_ERROR(m.CheckLayer(layer));
  CHUNKSERVE_RETURN_IF_ERROR(m.Use());
  return FromCuda(kcu::KvAppend(m.ArenaLayer(layer), k.data, v.data, slot, offset, n, m.stream),
                  "KvAppend");
}

Status CudaBackend::SetDecodePlan(const kernels::TppPlanView& plan, int32_t num_qo_heads) {
  Impl& m = *impl_;
  CHUNKSERVE_RETURN_IF_ERROR(m.Use());
  kcu::TppScheduleShape ps;
  ps.num_qo_heads = num_qo_heads;
  ps.num_kv_heads = m.shape.num_kv_heads;
  ps.chunk_size = m.shape.chunk_size;
  ps.num_slots = m.shape.num_slots;
  m.last_plan_upload_bytes = 0;
  const cudaError_t err = m.plan.Update(plan, ps, m.stream);
  if (err == cudaErrorInvalidValue) {
    return Status::InvalidArgument("the decode plan is malformed or does not fit the arena");
  }
  CHUNKSERVE_RETURN_IF_ERROR(FromCuda(err, "DevicePlan::Update"));
  m.last_plan_upload_bytes = m.plan.last_upload_bytes();
  return m.Grow(&m.workspace, &m.workspace_bytes, m.plan.WorkspaceBytes(m.shape.head_dim),
                "TPP workspace");
}

Status CudaBackend::DecodeAttention(int32_t layer, const Tensor& q, Tensor* o,
                                    int32_t num_qo_heads) {
  Impl& m = *impl_;
  CHUNKSERVE_RETURN_IF_ERROR(m.CheckLayer(layer));
  CHUNKSERVE_RETURN_IF_ERROR(m.Use());
  kcu::TppDecodeParams p;
  p.q = q.data;
  p.o = o->data;
  p.kv = m.ArenaView(layer);
  p.num_qo_heads = num_qo_heads;
  p.sm_scale = 1.0f / std::sqrt(static_cast<float>(m.shape.head_dim));
  p.plan = &m.plan;
  p.workspace = m.workspace;
  p.workspace_bytes = m.workspace_bytes;
  return FromCuda(kcu::TppDecode(p, m.stream), "TppDecode");
}

Status CudaBackend::PrefillAttention(int32_t layer, const Tensor& q, Tensor* o,
                                     int32_t num_qo_heads, const PrefillLists& lists) {
  Impl& m = *impl_;
  CHUNKSERVE_RETURN_IF_ERROR(m.CheckLayer(layer));
  // The device cannot see a bad list: check the host copy, so it is an error, not a silent skip.
  const PrefillLists::Arrays& h = lists.host;
  if (const char* why = kcu::CheckPrefillLists(lists.num_seqs, h.q_indptr, h.q_pos, h.chunk_indptr,
                                               h.chunk_slot, h.chunk_len, m.shape.num_slots,
                                               m.shape.chunk_size, lists.max_q_per_seq)) {
    return Status::InvalidArgument(std::string("bad prefill segment: ") + why);
  }
  CHUNKSERVE_RETURN_IF_ERROR(m.Use());
  kcu::PrefillAttentionParams p;
  p.q = q.data;
  p.o = o->data;
  p.kv = m.ArenaView(layer);
  p.num_seqs = lists.num_seqs;
  p.num_qo_heads = num_qo_heads;
  p.q_indptr = lists.staged.q_indptr;
  p.q_pos = lists.staged.q_pos;
  p.chunk_indptr = lists.staged.chunk_indptr;
  p.chunk_slot = lists.staged.chunk_slot;
  p.chunk_len = lists.staged.chunk_len;
  p.max_q_per_seq = lists.max_q_per_seq;
  p.sm_scale = 1.0f / std::sqrt(static_cast<float>(m.shape.head_dim));
  return FromCuda(kcu::PrefillAttention(p, m.stream), "PrefillAttention");
}

Status CudaBackend::SiluMul(const Tensor& gate, const Tensor& up, Tensor* out, int64_t n) {
  Impl& m = *impl_;
  CHUNKSERVE_RETURN_IF_ERROR(m.Use());
  return FromCuda(kcu::SiluMul(gate.dtype, gate.data, up.data, out->data, n, m.stream), "SiluMul");
}

Status CudaBackend::GatherRows(const Tensor& x, int32_t x_rows, const int32_t* rows, int32_t n,
                               int32_t dim, Tensor* out) {
  Impl& m = *impl_;
  CHUNKSERVE_RETURN_IF_ERROR(m.Use());
  return FromCuda(
      kcu::EmbeddingGather(x.dtype, out->dtype, x.data, x_rows, dim, rows, n, out->data, m.stream),
      "GatherRows");
}

Status CudaBackend::AllReduceSum(parallel::Communicator* comm, Tensor* x, int64_t n,
                                 parallel::Deadline deadline) {
  Impl& m = *impl_;
  if (x->dtype != DType::kF32) return Status::InvalidArgument("AllReduceSum: fp32 only");
  CHUNKSERVE_RETURN_IF_ERROR(m.Use());
  return comm->AllReduceSumOnStream(
      std::span<float>(static_cast<float*>(x->data), static_cast<size_t>(n)), m.stream, deadline);
}

Status CudaBackend::ReadLogits(const Tensor& logits, int32_t rows, int32_t vocab,
                               std::span<float> out) {
  Impl& m = *impl_;
  const size_t n = static_cast<size_t>(rows) * vocab;
  if (out.size() < n) return Status::InvalidArgument("logits buffer too small");
  CHUNKSERVE_RETURN_IF_ERROR(m.Use());
  if (n > 0) {
    CHUNKSERVE_RETURN_IF_ERROR(FromCuda(cudaMemcpyAsync(out.data(), logits.data, n * sizeof(float),
                                                        cudaMemcpyDeviceToHost, m.stream),
                                        "cudaMemcpyAsync (logits)"));
  }
  return m.Sync("forward step");
}

Status CudaBackend::Sample(const Tensor& logits, int32_t rows, int32_t vocab,
                           std::span<const SampleRow> params, std::span<TokenId> out,
                           std::span<TokenLogprobs> logprobs) {
  Impl& m = *impl_;
  if (params.size() < static_cast<size_t>(rows) || out.size() < static_cast<size_t>(rows)) {
    return Status::InvalidArgument("Sample: one parameter set and one output per row");
  }
  for (int32_t r = 0; r < rows; ++r) {
    if (params[r].logprobs >= 0 && logprobs.size() < static_cast<size_t>(rows)) {
      return Status::InvalidArgument("Sample: a row asks for logprobs without an output for them");
    }
  }
  CHUNKSERVE_RETURN_IF_ERROR(m.Use());
  if (rows == 0) return m.Sync("forward step");
  bool all_greedy = true;
  for (int32_t r = 0; r < rows; ++r) {
    const SampleRow& p = params[r];
    all_greedy = all_greedy && kc::IsGreedy({p.temperature, p.top_k, p.top_p});
  }
  // One upload: uniform (double), temperature, top_p (float), top_k, then the results (int32).
  const size_t R = static_cast<size_t>(rows);
  const size_t off_temp = R * sizeof(double);
  const size_t off_topp = off_temp + Padded(R) * sizeof(float);
  const size_t off_topk = off_topp + Padded(R) * sizeof(float);
  const size_t off_out = off_topk + Padded(R) * sizeof(int32_t);
  const size_t bytes = off_out + Padded(R) * sizeof(int32_t);
  CHUNKSERVE_RETURN_IF_ERROR(m.Grow(&m.sample, &m.sample_bytes, bytes, "sampling"));
  auto* base = static_cast<unsigned char*>(m.sample);
  auto* d_out = reinterpret_cast<int32_t*>(base + off_out);
  const auto* d_logits = static_cast<const float*>(logits.data);
  if (all_greedy) {
    CHUNKSERVE_RETURN_IF_ERROR(
        FromCuda(kcu::ArgmaxSample(d_logits, rows, vocab, d_out, m.stream), "ArgmaxSample"));
  } else {
    m.host_sample.assign(off_out, 0);
    for (size_t r = 0; r < R; ++r) {
      const SampleRow& p = params[r];
      std::memcpy(&m.host_sample[r * sizeof(double)], &p.uniform, sizeof(double));
      std::memcpy(&m.host_sample[off_temp + r * sizeof(float)], &p.temperature, sizeof(float));
      std::memcpy(&m.host_sample[off_topp + r * sizeof(float)], &p.top_p, sizeof(float));
      std::memcpy(&m.host_sample[off_topk + r * sizeof(int32_t)], &p.top_k, sizeof(int32_t));
    }
    CHUNKSERVE_RETURN_IF_ERROR(FromCuda(
        cudaMemcpyAsync(base, m.host_sample.data(), off_out, cudaMemcpyHostToDevice, m.stream),
        "cudaMemcpyAsync (sampling parameters)"));
    kcu::TopKTopPParams tp;
    tp.logits = d_logits;
    tp.rows = rows;
    tp.vocab = vocab;
    tp.uniform = reinterpret_cast<const double*>(base);
    tp.temperature = reinterpret_cast<const float*>(base + off_temp);
    tp.top_p = reinterpret_cast<const float*>(base + off_topp);
    tp.top_k = reinterpret_cast<const int32_t*>(base + off_topk);
    tp.out = d_out;
    CHUNKSERVE_RETURN_IF_ERROR(FromCuda(kcu::TopKTopPSample(tp, m.stream), "TopKTopPSample"));
  }
  std::vector<int32_t> ids(R);
  CHUNKSERVE_RETURN_IF_ERROR(FromCuda(
      cudaMemcpyAsync(ids.data(), d_out, R * sizeof(int32_t), cudaMemcpyDeviceToHost, m.stream),
      "cudaMemcpyAsync (tokens)"));
  CHUNKSERVE_RETURN_IF_ERROR(m.Sync("forward step"));
  for (size_t r = 0; r < R; ++r) {
    const SampleRow& p = params[r];
    // A row whose logits the host needs: one with more candidates than the device sorts (the
    // host samples it by the same rule and draw), or one asking for logprobs (rare, and
    // computed by the same code as on the CPU backend).
    const bool host_sample = ids[r] < 0;
    if (!host_sample) out[r] = ids[r];
    if (!host_sample && p.logprobs < 0) continue;
    m.host_row.resize(static_cast<size_t>(vocab));
    CHUNKSERVE_RETURN_IF_ERROR(FromCuda(cudaMemcpy(m.host_row.data(), d_logits + r * vocab,
                                                   vocab * sizeof(float), cudaMemcpyDeviceToHost),
                                        "cudaMemcpy (logits row)"));
    if (host_sample) {
      out[r] = kc::SampleToken(m.host_row, {p.temperature, p.top_k, p.top_p}, p.uniform,
                               &m.scratch);
    }
    if (p.logprobs >= 0) RowLogprobs(m.host_row, out[r], p.logprobs, &m.scratch, &logprobs[r]);
  }
  return Status::Ok();
}

Status CudaBackend::Finish() {
  CHUNKSERVE_RETURN_IF_ERROR(impl_->Use());
  return impl_->Sync("forward step");
}

Result<std::unique_ptr<Backend>> CreateCudaBackendFromSpec(const CudaBackendSpec& spec) {
  CHUNKSERVE_RETURN_IF_ERROR(CudaBackend::CheckKvArena(spec.arena));
  if (spec.device < 0) return Status::InvalidArgument("device must be >= 0");
  CHUNKSERVE_ASSIGN_OR_RETURN(std::unique_ptr<CudaBackend> b,
                              CudaBackend::Create({.device = spec.device, .dtype = spec.dtype}));
  return std::unique_ptr<Backend>(std::move(b));
}

}  // namespace chunkserve::backend
