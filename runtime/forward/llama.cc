#include "runtime/forward/llama.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include "runtime/backend/cpu_backend.h"
#include "runtime/backend/cuda_plugin.h"
#include "runtime/model/tensor_parallel.h"

namespace chunkserve::forward {
namespace {

using backend::Tensor;
using kernels::DType;

// Rows [row_begin, row_begin + rows) of a row-major [*, cols] checkpoint tensor: a contiguous
// range, so a rank reads only its share of a row-split weight. A bias (cols 1) is a plain
// weight; anything wider is a Linear's [out, in].
Result<Tensor> UploadRows(backend::Backend* b, const void* src, DType dtype, int64_t cols,
                          int64_t row_begin, int64_t rows) {
  const auto* base =
      static_cast<const unsigned char*>(src) + row_begin * cols * kernels::DTypeSize(dtype);
  if (cols == 1) return b->UploadWeights(base, dtype, rows);
  return b->UploadLinearWeight(base, dtype, rows, cols);
}

// Columns [col_begin, col_begin + cols) of every row of a Linear's row-major [rows, total_cols].
Result<Tensor> UploadCols(backend::Backend* b, const void* src, DType dtype, int64_t rows,
                          int64_t total_cols, int64_t col_begin, int64_t cols) {
  if (col_begin == 0 && cols == total_cols) return b->UploadLinearWeight(src, dtype, rows, cols);
  const size_t es = kernels::DTypeSize(dtype);
  std::vector<unsigned char> slice(static_cast<size_t>(rows * cols) * es);
  const auto* base = static_cast<const unsigned char*>(src);
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(slice.data() + static_cast<size_t>(r * cols) * es,
                base + static_cast<size_t>(r * total_cols + col_begin) * es,
                static_cast<size_t>(cols) * es);
  }
  return b->UploadLinearWeight(slice.data(), dtype, rows, cols);
}

}  // namespace

LlamaModel::LlamaModel(const model::ModelConfig& config, std::unique_ptr<backend::Backend> backend,
                       const LlamaOptions& options)
    : config_(config), options_(options), backend_(std::move(backend)) {}

LlamaModel::~LlamaModel() {
  for (Tensor* t : {&x_, &h_, &q_, &k_, &v_, &attn_, &gate_, &up_, &rows_, &rows_norm_, &logits_}) {
    backend_->Release(t);
  }
}

Result<std::unique_ptr<LlamaModel>> LlamaModel::Create(const model::LoadedModel& model,
                                                       std::unique_ptr<backend::Backend> backend,
                                                       const LlamaOptions& options) {
  if (backend == nullptr) return Status::InvalidArgument("LlamaModel needs a backend");
  if (options.num_slots < 1) return Status::InvalidArgument("num_slots must be >= 1");
  if (!model.has_weights()) {
    return Status::FailedPrecondition("the model's weights were released (ReleaseWeights)");
  }
  const TensorParallel& tp = options.tp;
  if (tp.size > 1 && tp.comm == nullptr) {
    return Status::InvalidArgument("tensor parallelism needs a communicator");
  }
  if (tp.comm != nullptr && (tp.comm->size() != tp.size || tp.comm->rank() != tp.rank)) {
    return Status::InvalidArgument("the communicator's rank and size differ from the options'");
  }
  if (tp.op_timeout.count() < 1) return Status::InvalidArgument("op_timeout must be positive");
  const model::ModelConfig& c = model.config();
  CHUNKSERVE_ASSIGN_OR_RETURN(const model::TensorParallelShard shard,
                              model::ShardForRank(c, tp.rank, tp.size));
  std::unique_ptr<LlamaModel> m(new LlamaModel(c, std::move(backend), options));
  m->local_qo_heads_ = static_cast<int32_t>(shard.qo_heads.count);
  m->local_kv_heads_ = static_cast<int32_t>(shard.kv_heads.count);
  m->local_intermediate_ = static_cast<int32_t>(shard.intermediate.count);
  m->shape_ = backend::KvArenaShape{.num_layers = c.num_layers,
                                    .num_slots = options.num_slots,
                                    .num_kv_heads = m->local_kv_heads_,
                                    .chunk_size = options.chunk_size,
                                    .head_dim = c.head_dim,
                                    .dtype = options.kv_dtype};
  // The arena first: a shape the backend refuses fails before any weight is uploaded.
  CHUNKSERVE_RETURN_IF_ERROR(m->backend_->AllocateKvArena(m->shape_));
  CHUNKSERVE_RETURN_IF_ERROR(m->UploadShard(model));
  return m;
}

Status LlamaModel::UploadShard(const model::LoadedModel& model) {
  const model::ModelConfig& c = config_;
  const model::LlamaWeights& w = model.weights();
  const DType dt = w.dtype;
  backend::Backend* b = backend_.get();
  CHUNKSERVE_ASSIGN_OR_RETURN(const model::TensorParallelShard shard,
                              model::ShardForRank(c, options_.tp.rank, options_.tp.size));
  const int64_t h = c.hidden_size, q = c.q_dim(), inter = c.intermediate_size;
  const int64_t q0 = shard.q_rows.begin, nq = shard.q_rows.count;
  const int64_t kv0 = shard.kv_rows.begin, nkv = shard.kv_rows.count;
  const int64_t i0 = shard.intermediate.begin, ni = shard.intermediate.count;
  // The embedding table is a Linear weight: tied, it is also the LM head.
  CHUNKSERVE_ASSIGN_OR_RETURN(embed_, b->UploadLinearWeight(w.embed_tokens, dt, c.vocab_size, h));
  CHUNKSERVE_ASSIGN_OR_RETURN(final_norm_, b->UploadWeights(w.final_norm, dt, h));
  tied_ = w.lm_head == w.embed_tokens;
  // Only rank 0 computes logits, so only rank 0 needs an untied LM head.
  if (!tied_ && options_.tp.rank == 0) {
    CHUNKSERVE_ASSIGN_OR_RETURN(lm_head_, b->UploadLinearWeight(w.lm_head, dt, c.vocab_size, h));
  }
  layers_.resize(c.num_layers);
  for (int32_t i = 0; i < c.num_layers; ++i) {
    const model::LlamaLayerWeights& lw = w.layers[i];
    Layer& l = layers_[i];
    CHUNKSERVE_ASSIGN_OR_RETURN(l.input_norm, b->UploadWeights(lw.input_norm, dt, h));
    CHUNKSERVE_ASSIGN_OR_RETURN(l.q_proj, UploadRows(b, lw.q_proj, dt, h, q0, nq));
    CHUNKSERVE_ASSIGN_OR_RETURN(l.k_proj, UploadRows(b, lw.k_proj, dt, h, kv0, nkv));
    CHUNKSERVE_ASSIGN_OR_RETURN(l.v_proj, UploadRows(b, lw.v_proj, dt, h, kv0, nkv));
    CHUNKSERVE_ASSIGN_OR_RETURN(l.o_proj, UploadCols(b, lw.o_proj, dt, h, q, q0, nq));
    if (lw.q_bias != nullptr) {
      CHUNKSERVE_ASSIGN_OR_RETURN(l.q_bias, UploadRows(b, lw.q_bias, dt, 1, q0, nq));
      CHUNKSERVE_ASSIGN_OR_RETURN(l.k_bias, UploadRows(b, lw.k_bias, dt, 1, kv0, nkv));
      CHUNKSERVE_ASSIGN_OR_RETURN(l.v_bias, UploadRows(b, lw.v_bias, dt, 1, kv0, nkv));
    }
    if (lw.o_bias != nullptr) {
      CHUNKSERVE_ASSIGN_OR_RETURN(l.o_bias, b->UploadWeights(lw.o_bias, dt, h));
    }
    CHUNKSERVE_ASSIGN_OR_RETURN(l.post_norm, b->UploadWeights(lw.post_attention_norm, dt, h));
    CHUNKSERVE_ASSIGN_OR_RETURN(l.gate_proj, UploadRows(b, lw.gate_proj, dt, h, i0, ni));
    CHUNKSERVE_ASSIGN_OR_RETURN(l.up_proj, UploadRows(b, lw.up_proj, dt, h, i0, ni));
    CHUNKSERVE_ASSIGN_OR_RETURN(l.down_proj, UploadCols(b, lw.down_proj, dt, h, inter, i0, ni));
  }
  CHUNKSERVE_ASSIGN_OR_RETURN(inv_freq_, b->UploadFloats(model::RopeInverseFrequencies(c)));
  return Status::Ok();
}

Status LlamaModel::Forward(const StepBatch& batch, std::span<float> logits) {
  const int32_t rows = static_cast<int32_t>(batch.logit_rows.size());
  if (logits.size() < static_cast<size_t>(rows) * config_.vocab_size) {
    return Status::InvalidArgument("logits buffer too small");
  }
  CHUNKSERVE_RETURN_IF_ERROR(Run(batch));
  if (rows == 0 || batch.tokens.empty()) return backend_->Finish();
  return backend_->ReadLogits(logits_, rows, config_.vocab_size, logits);
}

Status LlamaModel::ForwardSample(const StepBatch& batch, std::span<const backend::SampleRow> rows,
                                 std::span<TokenId> tokens, std::span<TokenLogprobs> logprobs) {
  const int32_t n = static_cast<int32_t>(batch.logit_rows.size());
  if (rows.size() != static_cast<size_t>(n) || tokens.size() < static_cast<size_t>(n)) {
    return Status::InvalidArgument("one sampling row and one token per logit row");
  }
  CHUNKSERVE_RETURN_IF_ERROR(Run(batch));
  if (n == 0 || batch.tokens.empty()) return backend_->Finish();
  return backend_->Sample(logits_, n, config_.vocab_size, rows, tokens, logprobs);
}

Status LlamaModel::Run(const StepBatch& b) {
  backend::Backend& be = *backend_;
  CHUNKSERVE_RETURN_IF_ERROR(ValidateStepBatch(b, shape_, config_.vocab_size));
  const int32_t T = static_cast<int32_t>(b.tokens.size());
  const int32_t R = static_cast<int32_t>(b.logit_rows.size());
  if (R > 0 && options_.tp.rank != 0) {
    return Status::FailedPrecondition("only tensor-parallel rank 0 computes logits");
  }
  if (R > 0 && T == 0) return Status::InvalidArgument("logit rows in a step without tokens");

  // Copies first: the writes and reads of this step may target the copies' destinations.
  for (int32_t l = 0; l < config_.num_layers; ++l) {
    for (const KvCopyOp& c : b.kv_copies) {
      CHUNKSERVE_RETURN_IF_ERROR(be.KvCopy(l, c.src_slot, c.dst_slot, c.num_tokens));
    }
  }
  if (T == 0) return Status::Ok();

  // Prefill attention lists, shared by every layer.
  q_indptr_.assign(1, 0);
  q_pos_.clear();
  chunk_indptr_.assign(1, 0);
  chunk_slot_.clear();
  chunk_len_.clear();
  int32_t max_q = 0;
  for (const PrefillSegment& s : b.prefill) {
    q_indptr_.push_back(q_indptr_.back() + s.num_tokens);
    for (int32_t i = 0; i < s.num_tokens; ++i) q_pos_.push_back(b.positions[s.token_begin + i]);
    chunk_slot_.insert(chunk_slot_.end(), s.chunk_slots.begin(), s.chunk_slots.end());
    chunk_len_.insert(chunk_len_.end(), s.chunk_lens.begin(), s.chunk_lens.end());
    chunk_indptr_.push_back(static_cast<int32_t>(chunk_slot_.size()));
    max_q = std::max(max_q, s.num_tokens);
  }
  const std::span<const int32_t> sections[] = {b.tokens,     b.positions, b.kv_slot, b.kv_offset,
                                               b.logit_rows, q_indptr_,   q_pos_,    chunk_indptr_,
                                               chunk_slot_,  chunk_len_};
  CHUNKSERVE_ASSIGN_OR_RETURN(const std::vector<const int32_t*> staged, be.StageIndices(sections));
  d_tokens_ = staged[0];
  d_pos_ = staged[1];
  d_slot_ = staged[2];
  d_offset_ = staged[3];
  d_logit_rows_ = staged[4];
  prefill_.num_seqs = static_cast<int32_t>(b.prefill.size());
  prefill_.max_q_per_seq = max_q;
  prefill_.host = {q_indptr_.data(), q_pos_.data(), chunk_indptr_.data(), chunk_slot_.data(),
                   chunk_len_.data()};
  prefill_.staged = {staged[5], staged[6], staged[7], staged[8], staged[9]};
  if (b.num_decode > 0)
    CHUNKSERVE_RETURN_IF_ERROR(be.SetDecodePlan(b.decode_plan, local_qo_heads_));

  const DType cd = be.compute_dtype();
  const int64_t t = T, H = config_.hidden_size, hd = config_.head_dim;
  const int64_t Q = local_qo_heads_ * hd, KV = local_kv_heads_ * hd, I = local_intermediate_;
  CHUNKSERVE_RETURN_IF_ERROR(be.Reserve(&x_, DType::kF32, t * H));
  CHUNKSERVE_RETURN_IF_ERROR(be.Reserve(&h_, cd, t * H));
  CHUNKSERVE_RETURN_IF_ERROR(be.Reserve(&q_, cd, t * Q));
  CHUNKSERVE_RETURN_IF_ERROR(be.Reserve(&k_, cd, t * KV));
  CHUNKSERVE_RETURN_IF_ERROR(be.Reserve(&v_, cd, t * KV));
  CHUNKSERVE_RETURN_IF_ERROR(be.Reserve(&attn_, cd, t * Q));
  CHUNKSERVE_RETURN_IF_ERROR(be.Reserve(&gate_, cd, t * I));
  CHUNKSERVE_RETURN_IF_ERROR(be.Reserve(&up_, cd, t * I));

  CHUNKSERVE_RETURN_IF_ERROR(
      be.Embed(embed_, config_.vocab_size, config_.hidden_size, d_tokens_, T, &x_));
  for (int32_t l = 0; l < config_.num_layers; ++l) {
    CHUNKSERVE_RETURN_IF_ERROR(RunLayer(l, b, T));
  }
  if (R == 0) return Status::Ok();  // a chunked-prefill step that completes no prompt

  // Final norm and LM head, only for the rows the engine samples from.
  CHUNKSERVE_RETURN_IF_ERROR(be.Reserve(&rows_, DType::kF32, int64_t{R} * H));
  CHUNKSERVE_RETURN_IF_ERROR(be.Reserve(&rows_norm_, cd, int64_t{R} * H));
  CHUNKSERVE_RETURN_IF_ERROR(be.Reserve(&logits_, DType::kF32, int64_t{R} * config_.vocab_size));
  CHUNKSERVE_RETURN_IF_ERROR(be.GatherRows(x_, T, d_logit_rows_, R, config_.hidden_size, &rows_));
  CHUNKSERVE_RETURN_IF_ERROR(be.RmsNorm(rows_, final_norm_, &rows_norm_, R, config_.hidden_size,
                                        static_cast<float>(config_.rms_norm_eps)));
  return be.Linear(rows_norm_, tied_ ? embed_ : lm_head_, nullptr, &logits_, R, config_.vocab_size,
                   config_.hidden_size, false);
}

Status LlamaModel::RunLayer(int32_t li, const StepBatch& b, int32_t T) {
  backend::Backend& be = *backend_;
  const Layer& w = layers_[li];
  const int32_t hd = config_.head_dim, H = config_.hidden_size;
  const int32_t Q = local_qo_heads_ * hd, KV = local_kv_heads_ * hd, I = local_intermediate_;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  auto bias = [](const Tensor& t) { return t.data != nullptr ? &t : nullptr; };

  // Attention block.
  CHUNKSERVE_RETURN_IF_ERROR(be.RmsNorm(x_, w.input_norm, &h_, T, H, eps));
  CHUNKSERVE_RETURN_IF_ERROR(be.Linear(h_, w.q_proj, bias(w.q_bias), &q_, T, Q, H, false));
  CHUNKSERVE_RETURN_IF_ERROR(be.Linear(h_, w.k_proj, bias(w.k_bias), &k_, T, KV, H, false));
  CHUNKSERVE_RETURN_IF_ERROR(be.Linear(h_, w.v_proj, bias(w.v_bias), &v_, T, KV, H, false));
  CHUNKSERVE_RETURN_IF_ERROR(be.Rope(&q_, d_pos_, T, local_qo_heads_, hd, inv_freq_));
  CHUNKSERVE_RETURN_IF_ERROR(be.Rope(&k_, d_pos_, T, local_kv_heads_, hd, inv_freq_));
  CHUNKSERVE_RETURN_IF_ERROR(be.KvAppend(li, k_, v_, d_slot_, d_offset_, T));
  if (b.num_decode > 0) {
    CHUNKSERVE_RETURN_IF_ERROR(be.DecodeAttention(li, q_, &attn_, local_qo_heads_));
  }
  if (!b.prefill.empty()) {
    const int64_t first = int64_t{b.num_decode} * Q;
    Tensor o = attn_.From(first);
    CHUNKSERVE_RETURN_IF_ERROR(
        be.PrefillAttention(li, q_.From(first), &o, local_qo_heads_, prefill_));
  }
  CHUNKSERVE_RETURN_IF_ERROR(AddToResidual(attn_, w.o_proj, bias(w.o_bias), T, Q));

  // MLP block (SwiGLU).
  CHUNKSERVE_RETURN_IF_ERROR(be.RmsNorm(x_, w.post_norm, &h_, T, H, eps));
  CHUNKSERVE_RETURN_IF_ERROR(be.Linear(h_, w.gate_proj, nullptr, &gate_, T, I, H, false));
  CHUNKSERVE_RETURN_IF_ERROR(be.Linear(h_, w.up_proj, nullptr, &up_, T, I, H, false));
  CHUNKSERVE_RETURN_IF_ERROR(be.SiluMul(gate_, up_, &gate_, int64_t{T} * I));
  return AddToResidual(gate_, w.down_proj, nullptr, T, I);
}

Status LlamaModel::AddToResidual(const Tensor& in, const Tensor& w, const Tensor* bias, int32_t T,
                                 int32_t in_dim) {
  backend::Backend& be = *backend_;
  const TensorParallel& tp = options_.tp;
  const int32_t H = config_.hidden_size;
  if (tp.comm == nullptr) return be.Linear(in, w, bias, &x_, T, H, in_dim, true);
  // The residual is the all-reduce buffer: rank 0 contributes x + its partial (+ the bias, once),
  // the others their partial alone; the sum is the complete update on every rank.
  const bool leader = tp.rank == 0;
  CHUNKSERVE_RETURN_IF_ERROR(
      be.Linear(in, w, leader ? bias : nullptr, &x_, T, H, in_dim, /*accumulate=*/leader));
  return be.AllReduceSum(tp.comm, &x_, int64_t{T} * H, parallel::Deadline::After(tp.op_timeout));
}

Result<std::unique_ptr<LlamaModel>> CreateLlamaModel(const model::LoadedModel& model,
                                                     const RunnerOptions& options,
                                                     const TensorParallel& tp) {
  if (options.num_slots < 1) return Status::InvalidArgument("num_slots must be >= 1");
  std::unique_ptr<backend::Backend> b;
  if (options.backend == BackendKind::kCpu) {
    CHUNKSERVE_ASSIGN_OR_RETURN(b,
                                backend::CpuBackend::Create({.num_threads = options.num_threads}));
  } else if (options.backend == BackendKind::kCuda) {
    // Linked into this program or loaded from the plugin (cuda_plugin.h).
    const model::ModelConfig& c = model.config();
    CHUNKSERVE_ASSIGN_OR_RETURN(
        b, backend::CreateCudaBackend(
               {.device = options.cuda_device,
                .dtype = options.kv_dtype,
                .arena = {.num_layers = c.num_layers,
                          .num_slots = options.num_slots,
                          .num_kv_heads = std::max(1, c.num_kv_heads / std::max(1, tp.size)),
                          .chunk_size = options.chunk_size,
                          .head_dim = c.head_dim,
                          .dtype = options.kv_dtype}}));
  } else {
    return Status::Unimplemented("unknown backend kind");
  }
  return LlamaModel::Create(model, std::move(b),
                            {.num_slots = options.num_slots,
                             .chunk_size = options.chunk_size,
                             .kv_dtype = options.kv_dtype,
                             .tp = tp});
}

}  // namespace chunkserve::forward
