#include "runtime/backend/cpu_backend.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/dtype.h"
#include "kernels/cpu/kv_append.h"
#include "kernels/cpu/model_ops.h"
#include "runtime/model/tensor_parallel.h"

namespace chunkserve::backend {
namespace {

namespace kc = ::chunkserve::kernels::cpu;

Status FromKernel(kc::KernelStatus s, const char* what) {
  if (s == kc::KernelStatus::kOk) return Status::Ok();
  return Status::Internal(std::string(what) + " failed: " + kc::KernelStatusName(s));
}

std::vector<float> Widen(const void* src, model::DType dtype, size_t n) {
  std::vector<float> out(n);
  if (src != nullptr) kc::ConvertToFloat(dtype, src, out.data(), n);
  return out;
}

// y[T, out] = x[T, in] * W[out, in]^T (+ bias): the layout of Hugging Face's Linear weights.
// OpenBLAS runs single-threaded; the output columns are split over the kernels' thread pool, so
// one set of threads serves GEMMs and attention alike (two pools spinning against each other on
// the same cores cost more in system time than the GEMMs themselves).
void Linear(kc::ThreadPool* pool, const float* x, const std::vector<float>& w,
            const std::vector<float>& bias, float* y, int32_t tokens, int32_t in, int32_t out,
            bool accumulate) {
  const int32_t parts = std::min<int32_t>(pool->num_threads(), std::max<int32_t>(1, out / 64));
  auto run = [&](int64_t begin, int64_t end, int32_t) {
    for (int64_t p = begin; p < end; ++p) {
      // Column ranges aligned to 16 floats so every part starts on a cache-line boundary.
      const int32_t c0 = static_cast<int32_t>((out * p / parts) & ~15);
      const int32_t c1 = p + 1 == parts ? out : static_cast<int32_t>((out * (p + 1) / parts) & ~15);
      if (c1 <= c0) continue;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, tokens, c1 - c0, in, 1.0f, x, in,
                  w.data() + static_cast<size_t>(c0) * in, in, accumulate ? 1.0f : 0.0f, y + c0,
                  out);
      if (!bias.empty()) {
        for (int32_t t = 0; t < tokens; ++t) {
          for (int32_t j = c0; j < c1; ++j) y[static_cast<size_t>(t) * out + j] += bias[j];
        }
      }
    }
  };
  pool->ParallelFor(parts, 1, 0, run);
}

// Rows [row_begin, row_begin + rows) of a row-major [*, cols] tensor, widened to fp32. Only the
// slice is read, so a tensor-parallel rank touches only its share of a row-split weight.
std::vector<float> WidenRows(const void* src, model::DType dtype, size_t cols, size_t row_begin,
                             size_t rows) {
  if (src == nullptr) return {};
  const auto* base = static_cast<const unsigned char*>(src) +
                     row_begin * cols * kernels::DTypeSize(dtype);
  return Widen(base, dtype, rows * cols);
}

// Columns [col_begin, col_begin + cols) of every row of a row-major [rows, total_cols] tensor.
std::vector<float> WidenCols(const void* src, model::DType dtype, size_t rows, size_t total_cols,
                             size_t col_begin, size_t cols) {
  std::vector<float> out(rows * cols);
  const size_t es = kernels::DTypeSize(dtype);
  const auto* base = static_cast<const unsigned char*>(src);
  for (size_t r = 0; r < rows; ++r) {
    kc::ConvertToFloat(dtype, base + (r * total_cols + col_begin) * es, out.data() + r * cols,
                       cols);
  }
  return out;
}

template <typename T>
void Grow(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
}

}  // namespace

CpuBackend::CpuBackend(const model::ModelConfig& config, const CpuBackendOptions& options)
    : config_(config), options_(options) {}

CpuBackend::~CpuBackend() {
  std::free(k_arena_);
  std::free(v_arena_);
}

Result<std::unique_ptr<CpuBackend>> CpuBackend::Create(const model::LoadedModel& model,
                                                       const CpuBackendOptions& options) {
  const model::ModelConfig& c = model.config();
  if (options.num_slots < 1) return Status::InvalidArgument("num_slots must be >= 1");
  if (options.chunk_size < kc::kMinChunkSize || options.chunk_size > kc::kMaxChunkSize) {
    return Status::InvalidArgument("chunk_size must be in [16, 256], got " +
                                   std::to_string(options.chunk_size));
  }
  if (c.head_dim > kc::kMaxHeadDim) {
    return Status::Unimplemented("head_dim " + std::to_string(c.head_dim) + " exceeds " +
                                 std::to_string(kc::kMaxHeadDim));
  }
  if (options.tp_size > 1 && !options.all_reduce) {
    return Status::InvalidArgument("tensor parallelism needs an all_reduce function");
  }
  CHUNKSERVE_ASSIGN_OR_RETURN(const model::TensorParallelShard shard,
                              model::ShardForRank(c, options.tp_rank, options.tp_size));
  std::unique_ptr<CpuBackend> b(new CpuBackend(c, options));
  b->local_qo_heads_ = static_cast<int32_t>(shard.qo_heads.count);
  b->local_kv_heads_ = static_cast<int32_t>(shard.kv_heads.count);
  b->local_intermediate_ = static_cast<int32_t>(shard.intermediate.count);
  b->shape_ = KvArenaShape{.num_layers = c.num_layers,
                           .num_slots = options.num_slots,
                           .num_kv_heads = b->local_kv_heads_,
                           .chunk_size = options.chunk_size,
                           .head_dim = c.head_dim,
                           .dtype = options.kv_dtype};
  b->layer_arena_bytes_ = static_cast<size_t>(options.num_slots) * b->local_kv_heads_ *
                          options.chunk_size * c.head_dim * kernels::DTypeSize(options.kv_dtype);
  const size_t arena = b->layer_arena_bytes_ * c.num_layers;
  const size_t rounded = (arena + 63) / 64 * 64;
  b->k_arena_ = static_cast<unsigned char*>(std::aligned_alloc(64, rounded));
  b->v_arena_ = static_cast<unsigned char*>(std::aligned_alloc(64, rounded));
  if (b->k_arena_ == nullptr || b->v_arena_ == nullptr) {
    return Status::ResourceExhausted("cannot allocate a KV arena of 2 x " + std::to_string(arena) +
                                     " bytes");
  }
  // Zeroed so a kernel bug that reads an unwritten position reads zeros, never stale garbage.
  std::memset(b->k_arena_, 0, rounded);
  std::memset(b->v_arena_, 0, rounded);

  b->pool_ = std::make_unique<kc::ThreadPool>(options.num_threads);
  openblas_set_num_threads(1);

  const model::LlamaWeights& w = model.weights();
  const size_t h = c.hidden_size, q = c.q_dim(), inter = c.intermediate_size;
  const size_t q0 = shard.q_rows.begin, nq = shard.q_rows.count;
  const size_t kv0 = shard.kv_rows.begin, nkv = shard.kv_rows.count;
  const size_t i0 = shard.intermediate.begin, ni = shard.intermediate.count;
  b->embed_ = Widen(w.embed_tokens, w.dtype, c.vocab_size * h);
  b->final_norm_ = Widen(w.final_norm, w.dtype, h);
  // Only rank 0 samples, so only rank 0 needs an untied LM head.
  if (w.lm_head != w.embed_tokens && options.tp_rank == 0) {
    b->lm_head_ = Widen(w.lm_head, w.dtype, c.vocab_size * h);
  }
  b->layers_.resize(c.num_layers);
  for (int32_t i = 0; i < c.num_layers; ++i) {
    const model::LlamaLayerWeights& lw = w.layers[i];
    Layer& l = b->layers_[i];
    l.input_norm = Widen(lw.input_norm, w.dtype, h);
    l.q_proj = WidenRows(lw.q_proj, w.dtype, h, q0, nq);
    l.k_proj = WidenRows(lw.k_proj, w.dtype, h, kv0, nkv);
    l.v_proj = WidenRows(lw.v_proj, w.dtype, h, kv0, nkv);
    l.o_proj = WidenCols(lw.o_proj, w.dtype, h, q, q0, nq);
    l.q_bias = WidenRows(lw.q_bias, w.dtype, 1, q0, nq);
    l.k_bias = WidenRows(lw.k_bias, w.dtype, 1, kv0, nkv);
    l.v_bias = WidenRows(lw.v_bias, w.dtype, 1, kv0, nkv);
    if (lw.o_bias) l.o_bias = Widen(lw.o_bias, w.dtype, h);
    l.post_norm = Widen(lw.post_attention_norm, w.dtype, h);
    l.gate_proj = WidenRows(lw.gate_proj, w.dtype, h, i0, ni);
    l.up_proj = WidenRows(lw.up_proj, w.dtype, h, i0, ni);
    l.down_proj = WidenCols(lw.down_proj, w.dtype, h, inter, i0, ni);
  }
  b->inv_freq_ = model::RopeInverseFrequencies(c);
  return b;
}

void* CpuBackend::LayerK(int32_t layer) const {
  return k_arena_ + static_cast<size_t>(layer) * layer_arena_bytes_;
}
void* CpuBackend::LayerV(int32_t layer) const {
  return v_arena_ + static_cast<size_t>(layer) * layer_arena_bytes_;
}


Status CpuBackend::Forward(const StepBatch& b, std::span<float> logits) {
  CHUNKSERVE_RETURN_IF_ERROR(
      ValidateStepBatch(b, shape_, config_.vocab_size, logits.size()));
  const int32_t T = static_cast<int32_t>(b.tokens.size());
  const size_t H = config_.hidden_size;

  // Copies first: the writes and reads of this step may target the copies' destinations.
  for (int32_t l = 0; l < config_.num_layers; ++l) {
    const kc::KvArenaLayer layer{LayerK(l), LayerV(l), shape_.dtype, shape_.num_slots,
                                 shape_.num_kv_heads, shape_.chunk_size, shape_.head_dim};
    for (const KvCopyOp& c : b.kv_copies) {
      CHUNKSERVE_RETURN_IF_ERROR(
          FromKernel(kc::KvCopy(layer, c.src_slot, c.dst_slot, c.num_tokens), "KvCopy"));
    }
  }
  if (T == 0) return Status::Ok();

  Grow(x_, T * H);
  for (int32_t t = 0; t < T; ++t) {
    std::memcpy(&x_[t * H], &embed_[static_cast<size_t>(b.tokens[t]) * H], H * sizeof(float));
  }
  // Prefill attention indexes, shared by every layer.
  q_indptr_.assign(1, 0);
  q_pos_.clear();
  chunk_indptr_.assign(1, 0);
  chunk_slot_.clear();
  chunk_len_.clear();
  for (const PrefillSegment& s : b.prefill) {
    q_indptr_.push_back(q_indptr_.back() + s.num_tokens);
    for (int32_t i = 0; i < s.num_tokens; ++i) q_pos_.push_back(b.positions[s.token_begin + i]);
    chunk_slot_.insert(chunk_slot_.end(), s.chunk_slots.begin(), s.chunk_slots.end());
    chunk_len_.insert(chunk_len_.end(), s.chunk_lens.begin(), s.chunk_lens.end());
    chunk_indptr_.push_back(static_cast<int32_t>(chunk_slot_.size()));
  }
  if (b.num_decode > 0) {
    const size_t ws = kc::TppDecodeWorkspaceBytes(b.decode_plan, local_qo_heads_,
                                                  config_.head_dim);
    Grow(workspace_, ws);
  }
  for (int32_t l = 0; l < config_.num_layers; ++l) {
    CHUNKSERVE_RETURN_IF_ERROR(RunLayer(l, b, T));
  }

  // Final norm and LM head, only for the rows the engine samples from.
  const int32_t R = static_cast<int32_t>(b.logit_rows.size());
  if (R == 0) return Status::Ok();  // a chunked-prefill step that completes no prompt
  if (options_.tp_rank != 0) {
    return Status::FailedPrecondition("only tensor-parallel rank 0 computes logits");
  }
  Grow(row_, R * H);
  for (int32_t r = 0; r < R; ++r) {
    std::memcpy(&row_[r * H], &x_[static_cast<size_t>(b.logit_rows[r]) * H], H * sizeof(float));
  }
  CHUNKSERVE_RETURN_IF_ERROR(FromKernel(
      kc::RmsNorm(row_.data(), final_norm_.data(), row_.data(), R, config_.hidden_size,
                  static_cast<float>(config_.rms_norm_eps)),
      "RmsNorm"));
  const std::vector<float>& head = lm_head_.empty() ? embed_ : lm_head_;
  Linear(pool_.get(), row_.data(), head, {}, logits.data(), R, config_.hidden_size,
         config_.vocab_size, false);
  return Status::Ok();
}

Status CpuBackend::RunLayer(int32_t li, const StepBatch& b, int32_t T) {
  const Layer& w = layers_[li];
  const int32_t hd = config_.head_dim, H = config_.hidden_size;
  const int32_t Q = local_qo_heads_ * hd, KV = local_kv_heads_ * hd, I = local_intermediate_;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  Grow(h_, static_cast<size_t>(T) * H);
  Grow(q_, static_cast<size_t>(T) * Q);
  Grow(k_, static_cast<size_t>(T) * KV);
  Grow(v_, static_cast<size_t>(T) * KV);
  Grow(attn_, static_cast<size_t>(T) * Q);

  CHUNKSERVE_RETURN_IF_ERROR(
      FromKernel(kc::RmsNorm(x_.data(), w.input_norm.data(), h_.data(), T, H, eps), "RmsNorm"));
  Linear(pool_.get(), h_.data(), w.q_proj, w.q_bias, q_.data(), T, H, Q, false);
  Linear(pool_.get(), h_.data(), w.k_proj, w.k_bias, k_.data(), T, H, KV, false);
  Linear(pool_.get(), h_.data(), w.v_proj, w.v_bias, v_.data(), T, H, KV, false);
  CHUNKSERVE_RETURN_IF_ERROR(FromKernel(
      kc::ApplyRope(q_.data(), b.positions.data(), T, local_qo_heads_, hd, inv_freq_.data()),
      "ApplyRope"));
  CHUNKSERVE_RETURN_IF_ERROR(FromKernel(
      kc::ApplyRope(k_.data(), b.positions.data(), T, local_kv_heads_, hd, inv_freq_.data()),
      "ApplyRope"));

  const kc::KvArenaLayer layer{LayerK(li), LayerV(li), shape_.dtype, shape_.num_slots,
                               shape_.num_kv_heads, shape_.chunk_size, shape_.head_dim};
  kc::KvAppendParams ap;
  ap.kv = layer;
  ap.k = k_.data();
  ap.v = v_.data();
  ap.slot = b.kv_slot.data();
  ap.offset = b.kv_offset.data();
  ap.num_tokens = T;
  CHUNKSERVE_RETURN_IF_ERROR(FromKernel(kc::KvAppend(ap), "KvAppend"));

  const float sm_scale = 1.0f / std::sqrt(static_cast<float>(hd));
  if (b.num_decode > 0) {
    kc::TppDecodeParams p;
    p.q = q_.data();
    p.o = attn_.data();
    p.kv = layer.View();
    p.plan = b.decode_plan;
    p.num_qo_heads = local_qo_heads_;
    p.sm_scale = sm_scale;
    p.workspace = workspace_.data();
    p.workspace_bytes = workspace_.size();
    p.pool = pool_.get();
    CHUNKSERVE_RETURN_IF_ERROR(FromKernel(kc::TppDecode(p), "TppDecode"));
  }
  if (!b.prefill.empty()) {
    const size_t first = static_cast<size_t>(b.num_decode) * Q;
    kc::PrefillAttentionParams p;
    p.q = q_.data() + first;
    p.o = attn_.data() + first;
    p.kv = layer.View();
    p.num_seqs = static_cast<int32_t>(b.prefill.size());
    p.num_qo_heads = local_qo_heads_;
    p.q_indptr = q_indptr_.data();
    p.q_pos = q_pos_.data();
    p.chunk_indptr = chunk_indptr_.data();
    p.chunk_slot = chunk_slot_.data();
    p.chunk_len = chunk_len_.data();
    p.sm_scale = sm_scale;
    p.pool = pool_.get();
    CHUNKSERVE_RETURN_IF_ERROR(FromKernel(kc::PrefillAttention(p), "PrefillAttention"));
  }
  // x += attn * Wo^T (+ bo)
  CHUNKSERVE_RETURN_IF_ERROR(ProjectAndAdd(attn_.data(), w.o_proj, w.o_bias, T, Q));

  Grow(gate_, static_cast<size_t>(T) * I);
  Grow(up_, static_cast<size_t>(T) * I);
  CHUNKSERVE_RETURN_IF_ERROR(
      FromKernel(kc::RmsNorm(x_.data(), w.post_norm.data(), h_.data(), T, H, eps), "RmsNorm"));
  Linear(pool_.get(), h_.data(), w.gate_proj, {}, gate_.data(), T, H, I, false);
  Linear(pool_.get(), h_.data(), w.up_proj, {}, up_.data(), T, H, I, false);
  CHUNKSERVE_RETURN_IF_ERROR(FromKernel(
      kc::SiluMul(gate_.data(), up_.data(), gate_.data(), static_cast<int64_t>(T) * I), "SiluMul"));
  return ProjectAndAdd(gate_.data(), w.down_proj, {}, T, I);
}

Status CpuBackend::ProjectAndAdd(const float* in, const std::vector<float>& w,
                                 const std::vector<float>& bias, int32_t T, int32_t in_dim) {
  const int32_t H = config_.hidden_size;
  if (options_.tp_size == 1) {
    Linear(pool_.get(), in, w, bias, x_.data(), T, in_dim, H, true);
    return Status::Ok();
  }
  // Each rank holds a partial sum over its heads or MLP columns: reduce it first, then add the
  // bias once, so every rank ends the layer with bit-identical hidden states (the all-reduce
  // hands every rank the same sums).
  const size_t n = static_cast<size_t>(T) * H;
  Grow(reduce_, n);
  Linear(pool_.get(), in, w, {}, reduce_.data(), T, in_dim, H, false);
  CHUNKSERVE_RETURN_IF_ERROR(options_.all_reduce(std::span<float>(reduce_.data(), n)));
  for (size_t i = 0; i < n; ++i) x_[i] += reduce_[i];
  if (!bias.empty()) {
    for (int32_t t = 0; t < T; ++t) {
      for (int32_t j = 0; j < H; ++j) x_[static_cast<size_t>(t) * H + j] += bias[j];
    }
  }
  return Status::Ok();
}

}  // namespace chunkserve::backend
