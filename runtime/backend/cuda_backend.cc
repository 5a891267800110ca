#include "runtime/backend/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kernels/cpu/dtype.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/device_plan.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/model_ops.h"
#include "kernels/cuda/shapes.h"

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
    default:
      return Status::Internal(msg);
  }
}

// A device allocation that grows on demand and is reused across steps. Growing waits for the
// stream first, so a buffer still read by queued work is never freed under it.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  Status Reserve(size_t bytes, cudaStream_t stream, std::string_view what) {
    if (bytes <= bytes_) return Status::Ok();
    CHUNKSERVE_RETURN_IF_ERROR(FromCuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize"));
    if (ptr_ != nullptr) {
      cudaFree(ptr_);
      ptr_ = nullptr;
      bytes_ = 0;
    }
    // Some headroom so a slowly growing batch does not reallocate every step.
    const size_t want = std::max<size_t>(bytes + bytes / 2, 256);
    CHUNKSERVE_RETURN_IF_ERROR(
        FromCuda(cudaMalloc(&ptr_, want), std::string("cudaMalloc (") + std::string(what) + ")"));
    bytes_ = want;
    return Status::Ok();
  }

  void* get() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Ints per section of the packed per-step index upload: a multiple of 4 so that every section
// starts 16-byte aligned.
size_t Padded(size_t n) { return (n + 3) / 4 * 4; }

}  // namespace

struct CudaBackend::Impl {
  struct Layer {
    const void* input_norm = nullptr;
    const void* q_proj = nullptr;
    const void* k_proj = nullptr;
    const void* v_proj = nullptr;
    const void* o_proj = nullptr;
    const void* q_bias = nullptr;
    const void* k_bias = nullptr;
    const void* v_bias = nullptr;
    const void* o_bias = nullptr;
    const void* post_norm = nullptr;
    const void* gate_proj = nullptr;
    const void* up_proj = nullptr;
    const void* down_proj = nullptr;
  };

  Impl(const model::ModelConfig& c, const CudaBackendOptions& o) : config(c), options(o) {}

  ~Impl() {
    // Best effort: queued work must finish before its buffers go; errors here have no caller.
    // The destroying thread may have another current device than the one that ran the steps.
    cudaSetDevice(options.device);
    if (stream != nullptr) cudaStreamSynchronize(stream);
    for (void* p : allocations) cudaFree(p);
    if (stream != nullptr) cudaStreamDestroy(stream);
  }

  Status Alloc(size_t bytes, void** out, std::string_view what) {
    *out = nullptr;
    void* p = nullptr;
    CHUNKSERVE_RETURN_IF_ERROR(FromCuda(cudaMalloc(&p, std::max<size_t>(bytes, 16)),
                                        std::string("cudaMalloc (") + std::string(what) + ")"));
    allocations.push_back(p);
    *out = p;
    return Status::Ok();
  }

  // Copies n elements of a checkpoint tensor to the device in the compute dtype (converted on the
  // host when the checkpoint's dtype differs). A null tensor (absent bias) stays null.
  Status Upload(const void* src, DType src_dtype, size_t n, const void** out,
                std::string_view what) {
    *out = nullptr;
    if (src == nullptr) return Status::Ok();
    const void* data = src;
    std::vector<uint16_t> converted;
    if (src_dtype != dtype) {
      std::vector<float> wide(n);
      kc::ConvertToFloat(src_dtype, src, wide.data(), n);
      converted.resize(n);
      kc::ConvertFromFloat(dtype, wide.data(), converted.data(), n);
      data = converted.data();
    }
    void* dst = nullptr;
    CHUNKSERVE_RETURN_IF_ERROR(Alloc(n * 2, &dst, what));
    CHUNKSERVE_RETURN_IF_ERROR(
        FromCuda(cudaMemcpy(dst, data, n * 2, cudaMemcpyHostToDevice), "cudaMemcpy (weights)"));
    *out = dst;
    return Status::Ok();
  }

  kcu::KvArenaLayerDevice ArenaLayer(int32_t layer) const {
    kcu::KvArenaLayerDevice l;
    l.k = static_cast<unsigned char*>(k_arena) + static_cast<size_t>(layer) * layer_arena_bytes;
    l.v = static_cast<unsigned char*>(v_arena) + static_cast<size_t>(layer) * layer_arena_bytes;
    l.dtype = dtype;
    l.num_slots = options.num_slots;
    l.num_kv_heads = config.num_kv_heads;
    l.chunk_size = options.chunk_size;
    l.head_dim = config.head_dim;
    return l;
  }

  kernels::KvCacheView ArenaView(int32_t layer) const {
    const kcu::KvArenaLayerDevice l = ArenaLayer(layer);
    return kernels::KvCacheView{l.k,          l.v,       l.dtype, l.num_slots, l.num_kv_heads,
                                l.chunk_size, l.head_dim};
  }

  // y[T, n] (+)= x[T, k] W[n, k]^T (+ bias): beta 1 accumulates into y (the residual adds).
  Status Linear(const void* x, const void* w, const void* bias, void* y, int32_t tokens, int32_t n,
                int32_t k, bool accumulate, const char* what) {
    CHUNKSERVE_RETURN_IF_ERROR(FromCuda(
        gemm.Linear(dtype, dtype, x, w, y, tokens, n, k, stream, 1.0f, accumulate ? 1.0f : 0.0f),
        what));
    if (bias == nullptr) return Status::Ok();
    // The bias broadcast over the rows is the rank-1 product ones[T, 1] * bias[1, n], added with
    // beta 1: no separate kernel needed.
    return FromCuda(
        gemm.Linear(dtype, dtype, ones.get(), bias, y, tokens, n, 1, stream, 1.0f, 1.0f),
        "bias add");
  }

  Status RunLayer(int32_t li, const StepBatch& b, int32_t T);

  const model::ModelConfig config;
  const CudaBackendOptions options;
  DType dtype = DType::kF16;
  size_t elem = 2;  // bytes per element of the compute dtype

  cudaStream_t stream = nullptr;
  kcu::GemmRunner gemm;
  kcu::DevicePlan plan;
  std::vector<void*> allocations;  // weights, inverse frequencies and the arena

  const void* embed = nullptr;
  const void* final_norm = nullptr;
  const void* lm_head = nullptr;
  std::vector<Layer> layers;
  float* inv_freq = nullptr;  // [head_dim / 2], fp32
  void* k_arena = nullptr;
  void* v_arena = nullptr;
  size_t layer_arena_bytes = 0;

  // Per-step buffers, grown on demand.
  DeviceBuffer ints, x, h, q, k, v, attn, gate, up, rows, logits, workspace, ones;
  size_t ones_count = 0;  // how many ones `ones` holds
  std::vector<int32_t> host_ints;
  std::vector<uint16_t> host_ones;
  // Device pointers into `ints` for this step.
  const int32_t* d_tokens = nullptr;
  const int32_t* d_pos = nullptr;
  const int32_t* d_slot = nullptr;
  const int32_t* d_offset = nullptr;
  const int32_t* d_logit_rows = nullptr;
  const int32_t* d_q_indptr = nullptr;
  const int32_t* d_q_pos = nullptr;
  const int32_t* d_chunk_indptr = nullptr;
  const int32_t* d_chunk_slot = nullptr;
  const int32_t* d_chunk_len = nullptr;
  int32_t max_q_per_seq = 0;
  uint64_t last_plan_upload_bytes = 0;
};

CudaBackend::CudaBackend(std::unique_ptr<Impl> impl, const KvArenaShape& shape)
    : impl_(std::move(impl)), shape_(shape) {}

CudaBackend::~CudaBackend() = default;

int32_t CudaBackend::vocab_size() const { return impl_->config.vocab_size; }

uint64_t CudaBackend::last_plan_upload_bytes() const { return impl_->last_plan_upload_bytes; }

Result<std::unique_ptr<CudaBackend>> CudaBackend::Create(const model::LoadedModel& model,
                                                         const CudaBackendOptions& options) {
  const model::ModelConfig& c = model.config();
  // Host-side checks first, so an unsupported configuration says so even without a device.
  if (options.kv_dtype != DType::kF16 && options.kv_dtype != DType::kBF16) {
    return Status::InvalidArgument(
        "the CUDA backend stores KV, weights and activations in f16 or bf16; kv_dtype f32 is not "
        "supported (choose f16 or bf16)");
  }
  if (options.num_slots < 1) return Status::InvalidArgument("num_slots must be >= 1");
  if (options.chunk_size < kcu::kMinChunkSize || options.chunk_size > kcu::kMaxChunkSize ||
      options.chunk_size % kcu::kChunkSizeMultiple != 0) {
    return Status::InvalidArgument(
        "the CUDA backend needs chunk_size a multiple of 16 in [16, 128], got " +
        std::to_string(options.chunk_size));
  }
  if (c.head_dim != 64 && c.head_dim != 128) {
    return Status::Unimplemented(
        "the CUDA attention kernels support head_dim 64 and 128; the model has " +
        std::to_string(c.head_dim));
  }
  kcu::AttentionShape shape;
  shape.dtype = options.kv_dtype;
  shape.num_qo_heads = c.num_qo_heads;
  shape.num_kv_heads = c.num_kv_heads;
  shape.head_dim = c.head_dim;
  shape.chunk_size = options.chunk_size;
  shape.num_slots = options.num_slots;
  if (const char* why = kcu::CheckAttentionShape(shape)) {
    return Status::InvalidArgument(std::string("unsupported attention shape: ") + why);
  }
  if (const char* why = kcu::CheckKvArenaShape(options.kv_dtype, options.num_slots, c.num_kv_heads,
                                               options.chunk_size, c.head_dim)) {
    return Status::InvalidArgument(std::string("unsupported KV arena shape: ") + why);
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
  CHUNKSERVE_RETURN_IF_ERROR(FromCuda(cudaSetDevice(options.device), "cudaSetDevice"));

  auto impl = std::make_unique<Impl>(c, options);
  impl->dtype = options.kv_dtype;
  CHUNKSERVE_RETURN_IF_ERROR(FromCuda(
      cudaStreamCreateWithFlags(&impl->stream, cudaStreamNonBlocking), "cudaStreamCreate"));
  CHUNKSERVE_RETURN_IF_ERROR(FromCuda(impl->gemm.Init(), "cublasCreate"));

  const model::LlamaWeights& w = model.weights();
  const size_t H = c.hidden_size, Q = c.q_dim(), KV = c.kv_dim(), I = c.intermediate_size;
  const size_t V = c.vocab_size;
  CHUNKSERVE_RETURN_IF_ERROR(impl->Upload(w.embed_tokens, w.dtype, V * H, &impl->embed, "embed"));
  CHUNKSERVE_RETURN_IF_ERROR(impl->Upload(w.final_norm, w.dtype, H, &impl->final_norm, "norm"));
  if (w.lm_head == w.embed_tokens) {
    impl->lm_head = impl->embed;
  } else {
    CHUNKSERVE_RETURN_IF_ERROR(impl->Upload(w.lm_head, w.dtype, V * H, &impl->lm_head, "lm_head"));
  }
  impl->layers.resize(c.num_layers);
  for (int32_t i = 0; i < c.num_layers; ++i) {
    const model::LlamaLayerWeights& lw = w.layers[i];
    Impl::Layer& l = impl->layers[i];
    Impl& m = *impl;
    CHUNKSERVE_RETURN_IF_ERROR(m.Upload(lw.input_norm, w.dtype, H, &l.input_norm, "weights"));
    CHUNKSERVE_RETURN_IF_ERROR(m.Upload(lw.q_proj, w.dtype, Q * H, &l.q_proj, "weights"));
    CHUNKSERVE_RETURN_IF_ERROR(m.Upload(lw.k_proj, w.dtype, KV * H, &l.k_proj, "weights"));
    CHUNKSERVE_RETURN_IF_ERROR(m.Upload(lw.v_proj, w.dtype, KV * H, &l.v_proj, "weights"));
    CHUNKSERVE_RETURN_IF_ERROR(m.Upload(lw.o_proj, w.dtype, H * Q, &l.o_proj, "weights"));
    CHUNKSERVE_RETURN_IF_ERROR(m.Upload(lw.q_bias, w.dtype, Q, &l.q_bias, "weights"));
    CHUNKSERVE_RETURN_IF_ERROR(m.Upload(lw.k_bias, w.dtype, KV, &l.k_bias, "weights"));
    CHUNKSERVE_RETURN_IF_ERROR(m.Upload(lw.v_bias, w.dtype, KV, &l.v_bias, "weights"));
    CHUNKSERVE_RETURN_IF_ERROR(m.Upload(lw.o_bias, w.dtype, H, &l.o_bias, "weights"));
    CHUNKSERVE_RETURN_IF_ERROR(
        m.Upload(lw.post_attention_norm, w.dtype, H, &l.post_norm, "weights"));
    CHUNKSERVE_RETURN_IF_ERROR(m.Upload(lw.gate_proj, w.dtype, I * H, &l.gate_proj, "weights"));
    CHUNKSERVE_RETURN_IF_ERROR(m.Upload(lw.up_proj, w.dtype, I * H, &l.up_proj, "weights"));
    CHUNKSERVE_RETURN_IF_ERROR(m.Upload(lw.down_proj, w.dtype, H * I, &l.down_proj, "weights"));
  }
  const std::vector<float> inv_freq = model::RopeInverseFrequencies(c);
  void* f = nullptr;
  CHUNKSERVE_RETURN_IF_ERROR(impl->Alloc(inv_freq.size() * sizeof(float), &f, "inv_freq"));
  CHUNKSERVE_RETURN_IF_ERROR(FromCuda(
      cudaMemcpy(f, inv_freq.data(), inv_freq.size() * sizeof(float), cudaMemcpyHostToDevice),
      "cudaMemcpy (inv_freq)"));
  impl->inv_freq = static_cast<float*>(f);

  const KvArenaShape kv_shape{.num_layers = c.num_layers,
                              .num_slots = options.num_slots,
                              .num_kv_heads = c.num_kv_heads,
                              .chunk_size = options.chunk_size,
                              .head_dim = c.head_dim,
                              .dtype = options.kv_dtype};
  impl->layer_arena_bytes = static_cast<size_t>(options.num_slots) * c.num_kv_heads *
                            options.chunk_size * c.head_dim * impl->elem;
  const size_t arena = impl->layer_arena_bytes * c.num_layers;
  CHUNKSERVE_RETURN_IF_ERROR(impl->Alloc(arena, &impl->k_arena, "KV arena"));
  CHUNKSERVE_RETURN_IF_ERROR(impl->Alloc(arena, &impl->v_arena, "KV arena"));
  // Zeroed so a kernel bug that reads an unwritten position reads zeros, never stale garbage.
  CHUNKSERVE_RETURN_IF_ERROR(FromCuda(cudaMemset(impl->k_arena, 0, arena), "cudaMemset (arena)"));
  CHUNKSERVE_RETURN_IF_ERROR(FromCuda(cudaMemset(impl->v_arena, 0, arena), "cudaMemset (arena)"));
  CHUNKSERVE_RETURN_IF_ERROR(FromCuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize"));
  return std::unique_ptr<CudaBackend>(new CudaBackend(std::move(impl), kv_shape));
}

Status CudaBackend::Forward(const StepBatch& b, std::span<float> logits) {
  Impl& m = *impl_;
  const model::ModelConfig& c = m.config;
  CHUNKSERVE_RETURN_IF_ERROR(ValidateStepBatch(b, shape_, c.vocab_size, logits.size()));
  const int32_t T = static_cast<int32_t>(b.tokens.size());
  const int32_t R = static_cast<int32_t>(b.logit_rows.size());
  const size_t H = c.hidden_size, Q = c.q_dim(), KV = c.kv_dim(), I = c.intermediate_size;
  const size_t V = c.vocab_size, e = m.elem;
  m.last_plan_upload_bytes = 0;

  // The engine's step thread is not the thread that created the backend.
  CHUNKSERVE_RETURN_IF_ERROR(FromCuda(cudaSetDevice(m.options.device), "cudaSetDevice"));

  // Prefill attention lists (host), checked here so a bad list is an error, not a silent skip.
  const int32_t S = static_cast<int32_t>(b.prefill.size());
  std::vector<int32_t> q_indptr{0}, q_pos, chunk_indptr{0}, chunk_slot, chunk_len;
  m.max_q_per_seq = 0;
  for (const PrefillSegment& s : b.prefill) {
    q_indptr.push_back(q_indptr.back() + s.num_tokens);
    for (int32_t i = 0; i < s.num_tokens; ++i) q_pos.push_back(b.positions[s.token_begin + i]);
    chunk_slot.insert(chunk_slot.end(), s.chunk_slots.begin(), s.chunk_slots.end());
    chunk_len.insert(chunk_len.end(), s.chunk_lens.begin(), s.chunk_lens.end());
    chunk_indptr.push_back(static_cast<int32_t>(chunk_slot.size()));
    m.max_q_per_seq = std::max(m.max_q_per_seq, s.num_tokens);
  }
  if (S > 0) {
    if (const char* why = kcu::CheckPrefillLists(
            S, q_indptr.data(), q_pos.data(), chunk_indptr.data(), chunk_slot.data(),
            chunk_len.data(), shape_.num_slots, shape_.chunk_size, m.max_q_per_seq)) {
      return Status::InvalidArgument(std::string("bad prefill segment: ") + why);
    }
  }

  // Reserve every buffer of the step before the first launch (growing waits for the stream).
  const size_t Tz = static_cast<size_t>(std::max(T, 1)), Rz = static_cast<size_t>(std::max(R, 1));
  std::vector<std::pair<const int32_t*, size_t>> sections = {
      {b.tokens.data(), b.tokens.size()},
      {b.positions.data(), b.positions.size()},
      {b.kv_slot.data(), b.kv_slot.size()},
      {b.kv_offset.data(), b.kv_offset.size()},
      {b.logit_rows.data(), b.logit_rows.size()},
      {q_indptr.data(), q_indptr.size()},
      {q_pos.data(), q_pos.size()},
      {chunk_indptr.data(), chunk_indptr.size()},
      {chunk_slot.data(), chunk_slot.size()},
      {chunk_len.data(), chunk_len.size()}};
  size_t num_ints = 0;
  for (const auto& sec : sections) num_ints += Padded(sec.second);
  if (T > 0) {
    CHUNKSERVE_RETURN_IF_ERROR(m.ints.Reserve(num_ints * sizeof(int32_t), m.stream, "indices"));
    CHUNKSERVE_RETURN_IF_ERROR(m.x.Reserve(Tz * H * e, m.stream, "activations"));
    CHUNKSERVE_RETURN_IF_ERROR(m.h.Reserve(Tz * H * e, m.stream, "activations"));
    CHUNKSERVE_RETURN_IF_ERROR(m.q.Reserve(Tz * Q * e, m.stream, "activations"));
    CHUNKSERVE_RETURN_IF_ERROR(m.k.Reserve(Tz * KV * e, m.stream, "activations"));
    CHUNKSERVE_RETURN_IF_ERROR(m.v.Reserve(Tz * KV * e, m.stream, "activations"));
    CHUNKSERVE_RETURN_IF_ERROR(m.attn.Reserve(Tz * Q * e, m.stream, "activations"));
    CHUNKSERVE_RETURN_IF_ERROR(m.gate.Reserve(Tz * I * e, m.stream, "activations"));
    CHUNKSERVE_RETURN_IF_ERROR(m.up.Reserve(Tz * I * e, m.stream, "activations"));
    CHUNKSERVE_RETURN_IF_ERROR(m.rows.Reserve(Rz * H * e, m.stream, "activations"));
    CHUNKSERVE_RETURN_IF_ERROR(m.logits.Reserve(Rz * V * sizeof(float), m.stream, "logits"));
    if (m.ones_count < static_cast<size_t>(T)) {
      // 1.0 in fp16 is 0x3C00, in bf16 0x3F80.
      CHUNKSERVE_RETURN_IF_ERROR(m.ones.Reserve(Tz * e, m.stream, "bias ones"));
      m.host_ones.assign(m.ones.bytes() / e, m.dtype == DType::kF16 ? 0x3C00 : 0x3F80);
      CHUNKSERVE_RETURN_IF_ERROR(
          FromCuda(cudaMemcpyAsync(m.ones.get(), m.host_ones.data(), m.host_ones.size() * e,
                                   cudaMemcpyHostToDevice, m.stream),
                   "cudaMemcpyAsync (ones)"));
      m.ones_count = m.host_ones.size();
    }
  }

  // Copies first: this step's writes and reads may target the copies' destinations.
  for (int32_t l = 0; l < c.num_layers; ++l) {
    const kcu::KvArenaLayerDevice layer = m.ArenaLayer(l);
    for (const KvCopyOp& op : b.kv_copies) {
      CHUNKSERVE_RETURN_IF_ERROR(FromCuda(
          kcu::KvCopy(layer, op.src_slot, op.dst_slot, op.num_tokens, m.stream), "KvCopy"));
    }
  }
  if (T == 0) return FromCuda(cudaStreamSynchronize(m.stream), "KV copies");

  // One upload of every index array of the step (pageable memory: the call returns once the
  // source is staged, so the host vectors may go out of scope).
  m.host_ints.assign(num_ints, 0);
  std::vector<const int32_t*> device_sections;
  size_t at = 0;
  for (const auto& sec : sections) {
    if (sec.second > 0) std::memcpy(&m.host_ints[at], sec.first, sec.second * sizeof(int32_t));
    device_sections.push_back(m.ints.as<int32_t>() + at);
    at += Padded(sec.second);
  }
  CHUNKSERVE_RETURN_IF_ERROR(
      FromCuda(cudaMemcpyAsync(m.ints.get(), m.host_ints.data(), num_ints * sizeof(int32_t),
                               cudaMemcpyHostToDevice, m.stream),
               "cudaMemcpyAsync (indices)"));
  m.d_tokens = device_sections[0];
  m.d_pos = device_sections[1];
  m.d_slot = device_sections[2];
  m.d_offset = device_sections[3];
  m.d_logit_rows = device_sections[4];
  m.d_q_indptr = device_sections[5];
  m.d_q_pos = device_sections[6];
  m.d_chunk_indptr = device_sections[7];
  m.d_chunk_slot = device_sections[8];
  m.d_chunk_len = device_sections[9];

  if (b.num_decode > 0) {
    kcu::TppScheduleShape ps;
    ps.num_qo_heads = c.num_qo_heads;
    ps.num_kv_heads = c.num_kv_heads;
    ps.chunk_size = shape_.chunk_size;
    ps.num_slots = shape_.num_slots;
    const cudaError_t err = m.plan.Update(b.decode_plan, ps, m.stream);
    if (err == cudaErrorInvalidValue) {
      return Status::InvalidArgument("the decode plan is malformed or does not fit the arena");
    }
    CHUNKSERVE_RETURN_IF_ERROR(FromCuda(err, "DevicePlan::Update"));
    m.last_plan_upload_bytes = m.plan.last_upload_bytes();
    CHUNKSERVE_RETURN_IF_ERROR(
        m.workspace.Reserve(m.plan.WorkspaceBytes(c.head_dim), m.stream, "TPP workspace"));
  }

  CHUNKSERVE_RETURN_IF_ERROR(
      FromCuda(kcu::EmbeddingGather(m.dtype, m.embed, c.vocab_size, c.hidden_size, m.d_tokens, T,
                                    m.x.get(), m.stream),
               "EmbeddingGather"));
  for (int32_t l = 0; l < c.num_layers; ++l) {
    CHUNKSERVE_RETURN_IF_ERROR(m.RunLayer(l, b, T));
  }

  if (R > 0) {
    // Final norm and LM head only for the rows the engine samples from: gather them (the
    // embedding gather over the hidden states as a table), normalize, project to fp32 logits.
    const float eps = static_cast<float>(c.rms_norm_eps);
    CHUNKSERVE_RETURN_IF_ERROR(
        FromCuda(kcu::EmbeddingGather(m.dtype, m.x.get(), T, c.hidden_size, m.d_logit_rows, R,
                                      m.rows.get(), m.stream),
                 "gather logit rows"));
    CHUNKSERVE_RETURN_IF_ERROR(FromCuda(kcu::RmsNorm(m.dtype, m.rows.get(), m.final_norm,
                                                     m.rows.get(), R, c.hidden_size, eps, m.stream),
                                        "RmsNorm (final)"));
    CHUNKSERVE_RETURN_IF_ERROR(
        FromCuda(m.gemm.Linear(m.dtype, DType::kF32, m.rows.get(), m.lm_head, m.logits.get(), R,
                               c.vocab_size, c.hidden_size, m.stream),
                 "LM head"));
    CHUNKSERVE_RETURN_IF_ERROR(FromCuda(
        cudaMemcpyAsync(logits.data(), m.logits.get(), static_cast<size_t>(R) * V * sizeof(float),
                        cudaMemcpyDeviceToHost, m.stream),
        "cudaMemcpyAsync (logits)"));
  }
  // Forward is synchronous: kernel faults surface here, as this step's error.
  CHUNKSERVE_RETURN_IF_ERROR(FromCuda(cudaStreamSynchronize(m.stream), "forward step"));
  return FromCuda(cudaGetLastError(), "forward step");
}

Status CudaBackend::Impl::RunLayer(int32_t li, const StepBatch& b, int32_t T) {
  const Layer& w = layers[li];
  const int32_t hd = config.head_dim, H = config.hidden_size, I = config.intermediate_size;
  const int32_t Q = config.q_dim(), KV = config.kv_dim();
  const float eps = static_cast<float>(config.rms_norm_eps);

  CHUNKSERVE_RETURN_IF_ERROR(
      FromCuda(kcu::RmsNorm(dtype, x.get(), w.input_norm, h.get(), T, H, eps, stream), "RmsNorm"));
  CHUNKSERVE_RETURN_IF_ERROR(
      Linear(h.get(), w.q_proj, w.q_bias, q.get(), T, Q, H, false, "q_proj"));
  CHUNKSERVE_RETURN_IF_ERROR(
      Linear(h.get(), w.k_proj, w.k_bias, k.get(), T, KV, H, false, "k_proj"));
  CHUNKSERVE_RETURN_IF_ERROR(
      Linear(h.get(), w.v_proj, w.v_bias, v.get(), T, KV, H, false, "v_proj"));
  CHUNKSERVE_RETURN_IF_ERROR(
      FromCuda(kcu::ApplyRope(dtype, q.get(), d_pos, T, config.num_qo_heads, hd, inv_freq, stream),
               "ApplyRope (q)"));
  CHUNKSERVE_RETURN_IF_ERROR(
      FromCuda(kcu::ApplyRope(dtype, k.get(), d_pos, T, config.num_kv_heads, hd, inv_freq, stream),
               "ApplyRope (k)"));
  CHUNKSERVE_RETURN_IF_ERROR(FromCuda(
      kcu::KvAppend(ArenaLayer(li), k.get(), v.get(), d_slot, d_offset, T, stream), "KvAppend"));

  const float sm_scale = 1.0f / std::sqrt(static_cast<float>(hd));
  if (b.num_decode > 0) {
    kcu::TppDecodeParams p;
    p.q = q.get();
    p.o = attn.get();
    p.kv = ArenaView(li);
    p.num_qo_heads = config.num_qo_heads;
    p.sm_scale = sm_scale;
    p.plan = &plan;
    p.workspace = workspace.get();
    p.workspace_bytes = workspace.bytes();
    CHUNKSERVE_RETURN_IF_ERROR(FromCuda(kcu::TppDecode(p, stream), "TppDecode"));
  }
  if (!b.prefill.empty()) {
    const size_t first = static_cast<size_t>(b.num_decode) * Q * elem;
    kcu::PrefillAttentionParams p;
    p.q = q.as<unsigned char>() + first;
    p.o = attn.as<unsigned char>() + first;
    p.kv = ArenaView(li);
    p.num_seqs = static_cast<int32_t>(b.prefill.size());
    p.num_qo_heads = config.num_qo_heads;
    p.q_indptr = d_q_indptr;
    p.q_pos = d_q_pos;
    p.chunk_indptr = d_chunk_indptr;
    p.chunk_slot = d_chunk_slot;
    p.chunk_len = d_chunk_len;
    p.max_q_per_seq = max_q_per_seq;
    p.sm_scale = sm_scale;
    CHUNKSERVE_RETURN_IF_ERROR(FromCuda(kcu::PrefillAttention(p, stream), "PrefillAttention"));
  }
  // x += attn Wo^T (+ bo)
  CHUNKSERVE_RETURN_IF_ERROR(
      Linear(attn.get(), w.o_proj, w.o_bias, x.get(), T, H, Q, true, "o_proj"));

  CHUNKSERVE_RETURN_IF_ERROR(
      FromCuda(kcu::RmsNorm(dtype, x.get(), w.post_norm, h.get(), T, H, eps, stream), "RmsNorm"));
  CHUNKSERVE_RETURN_IF_ERROR(
      Linear(h.get(), w.gate_proj, nullptr, gate.get(), T, I, H, false, "gate_proj"));
  CHUNKSERVE_RETURN_IF_ERROR(
      Linear(h.get(), w.up_proj, nullptr, up.get(), T, I, H, false, "up_proj"));
  CHUNKSERVE_RETURN_IF_ERROR(FromCuda(
      kcu::SiluMul(dtype, gate.get(), up.get(), gate.get(), static_cast<int64_t>(T) * I, stream),
      "SiluMul"));
  // x += silu(gate) * up Wd^T
  return Linear(gate.get(), w.down_proj, nullptr, x.get(), T, H, I, true, "down_proj");
}

}  // namespace chunkserve::backend
