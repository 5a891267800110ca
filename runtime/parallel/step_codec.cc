#include "runtime/parallel/step_codec.h"

#include <cstring>

namespace chunkserve::parallel {
namespace {

class Writer {
 public:
  void Put(int32_t v) { out_.push_back(v); }
  void Put(std::span<const int32_t> v) { out_.insert(out_.end(), v.begin(), v.end()); }
  void Put(const int32_t* p, int32_t n) {
    if (n > 0) out_.insert(out_.end(), p, p + n);
  }
  std::vector<std::byte> Bytes() const {
    std::vector<std::byte> b(out_.size() * sizeof(int32_t));
    if (!b.empty()) std::memcpy(b.data(), out_.data(), b.size());
    return b;
  }

 private:
  std::vector<int32_t> out_;
};

class Reader {
 public:
  explicit Reader(std::span<const std::byte> b) : b_(b) {}
  bool Get(int32_t* v) {
    if (pos_ + 4 > b_.size()) return false;
    std::memcpy(v, b_.data() + pos_, 4);
    pos_ += 4;
    return true;
  }
  // n int32 values appended to *out; false when n is negative or the bytes run out.
  bool Get(int64_t n, std::vector<int32_t>* out) {
    if (n < 0 || static_cast<uint64_t>(n) > (b_.size() - pos_) / 4) return false;
    const size_t old = out->size();
    out->resize(old + static_cast<size_t>(n));
    if (n > 0) std::memcpy(out->data() + old, b_.data() + pos_, static_cast<size_t>(n) * 4);
    pos_ += static_cast<size_t>(n) * 4;
    return true;
  }
  bool done() const { return pos_ == b_.size(); }

 private:
  std::span<const std::byte> b_;
  size_t pos_ = 0;
};

constexpr int32_t kStepVersion = 3;  // 3: TpInit carries weight_dtype

Status Malformed(const char* what) {
  return Status::DataLoss(std::string("malformed tensor-parallel step descriptor: ") + what);
}

}  // namespace

std::vector<std::byte> EncodeTpInit(const TpInit& init) {
  Writer w;
  w.Put(kStepVersion);
  w.Put(static_cast<int32_t>(init.model_fingerprint & 0xffffffffu));
  w.Put(static_cast<int32_t>(init.model_fingerprint >> 32));
  w.Put(init.num_slots);
  w.Put(init.chunk_size);
  w.Put(init.kv_dtype);
  w.Put(init.num_threads);
  w.Put(init.op_timeout_ms);
  w.Put(init.heartbeat_ms);
  w.Put(init.backend);
  w.Put(init.weight_dtype);
  w.Put(static_cast<int32_t>(init.model_dir.size()));
  std::vector<std::byte> out = w.Bytes();
  const auto* p = reinterpret_cast<const std::byte*>(init.model_dir.data());
  out.insert(out.end(), p, p + init.model_dir.size());
  return out;
}

Result<TpInit> DecodeTpInit(std::span<const std::byte> bytes) {
  constexpr size_t kHeader = 12 * sizeof(int32_t);
  Reader r(bytes.first(std::min<size_t>(bytes.size(), kHeader)));
  int32_t v[12];
  for (int32_t& x : v) {
    if (!r.Get(&x)) return Status::DataLoss("truncated tensor-parallel init message");
  }
  if (v[0] != kStepVersion) {
    return Status::FailedPrecondition("tensor-parallel ranks run different chunkserve versions");
  }
  if (v[11] < 0 || static_cast<size_t>(v[11]) != bytes.size() - kHeader) {
    return Status::DataLoss("bad model path in the tensor-parallel init message");
  }
  TpInit init;
  init.model_fingerprint =
      static_cast<uint32_t>(v[1]) | (static_cast<uint64_t>(static_cast<uint32_t>(v[2])) << 32);
  init.num_slots = v[3];
  init.chunk_size = v[4];
  init.kv_dtype = v[5];
  init.num_threads = v[6];
  init.op_timeout_ms = v[7];
  init.heartbeat_ms = v[8];
  init.backend = v[9];
  init.weight_dtype = v[10];
  init.model_dir.assign(reinterpret_cast<const char*>(bytes.data()) + kHeader,
                        bytes.size() - kHeader);
  return init;
}

std::vector<std::byte> EncodeStep(const forward::StepBatch& b) {
  Writer w;
  const int32_t T = static_cast<int32_t>(b.tokens.size());
  const kernels::TppPlanView& p = b.decode_plan;
  const bool plan = b.num_decode > 0;
  w.Put(kStepVersion);
  w.Put(T);
  w.Put(b.num_decode);
  w.Put(static_cast<int32_t>(b.prefill.size()));
  w.Put(static_cast<int32_t>(b.kv_copies.size()));
  w.Put(plan ? p.num_seqs : 0);
  w.Put(plan ? p.num_shared : 0);
  w.Put(plan ? p.num_partial_rows : 0);
  w.Put(plan ? p.seq_shared_indptr[p.num_seqs] : 0);
  w.Put(plan ? p.private_indptr[p.num_seqs] : 0);
  w.Put(b.tokens);
  w.Put(b.positions);
  w.Put(b.kv_slot);
  w.Put(b.kv_offset);
  for (const forward::PrefillSegment& s : b.prefill) {
    w.Put(s.token_begin);
    w.Put(s.num_tokens);
    w.Put(static_cast<int32_t>(s.chunk_slots.size()));
    w.Put(s.chunk_slots);
    w.Put(s.chunk_lens);
  }
  for (const forward::KvCopyOp& c : b.kv_copies) {
    w.Put(c.src_slot);
    w.Put(c.dst_slot);
    w.Put(c.num_tokens);
  }
  if (plan) {
    const int32_t n = p.num_seqs, s = p.num_shared;
    w.Put(p.shared_slot, s);
    w.Put(p.shared_len, s);
    w.Put(p.shared_seq_begin, s);
    w.Put(p.shared_seq_end, s);
    w.Put(p.shared_partial_offset, s);
    w.Put(p.seq_shared_indptr, n + 1);
    w.Put(p.seq_shared_ids, p.seq_shared_indptr[n]);
    w.Put(p.private_indptr, n + 1);
    w.Put(p.private_slot, p.private_indptr[n]);
    w.Put(p.private_len, p.private_indptr[n]);
  }
  return w.Bytes();
}

Status DecodeStep(std::span<const std::byte> bytes, DecodedStep* out) {
  Reader r(bytes);
  int32_t h[10];
  for (int32_t& x : h) {
    if (!r.Get(&x)) return Malformed("truncated header");
  }
  if (h[0] != kStepVersion) return Malformed("unknown version");
  const int32_t T = h[1], num_decode = h[2], num_prefill = h[3], num_copies = h[4];
  const int32_t n = h[5], s = h[6], partial_rows = h[7], num_seq_shared = h[8], num_private = h[9];
  if (T < 0 || num_decode < 0 || num_decode > T || num_prefill < 0 || num_copies < 0 || n < 0 ||
      s < 0 || (num_decode > 0) != (n > 0) || (num_decode > 0 && n != num_decode)) {
    return Malformed("bad counts");
  }
  out->tokens_.clear();
  out->positions_.clear();
  out->kv_slot_.clear();
  out->kv_offset_.clear();
  out->paths_.clear();
  out->segments_.clear();
  out->copies_.clear();
  out->plan_.clear();
  if (!r.Get(T, &out->tokens_) || !r.Get(T, &out->positions_) || !r.Get(T, &out->kv_slot_) ||
      !r.Get(T, &out->kv_offset_)) {
    return Malformed("truncated token arrays");
  }
  // Segment paths go into one array first; the spans are taken once it stopped growing.
  std::vector<std::pair<size_t, size_t>> ranges;
  for (int32_t i = 0; i < num_prefill; ++i) {
    int32_t begin = 0, count = 0, path = 0;
    if (!r.Get(&begin) || !r.Get(&count) || !r.Get(&path) || path < 0) {
      return Malformed("truncated prefill segment");
    }
    const size_t at = out->paths_.size();
    if (!r.Get(path, &out->paths_) || !r.Get(path, &out->paths_)) {
      return Malformed("truncated chunk path");
    }
    forward::PrefillSegment seg;
    seg.token_begin = begin;
    seg.num_tokens = count;
    out->segments_.push_back(seg);
    ranges.push_back({at, static_cast<size_t>(path)});
  }
  for (size_t i = 0; i < ranges.size(); ++i) {
    const std::span<const int32_t> all(out->paths_);
    out->segments_[i].chunk_slots = all.subspan(ranges[i].first, ranges[i].second);
    out->segments_[i].chunk_lens =
        all.subspan(ranges[i].first + ranges[i].second, ranges[i].second);
  }
  for (int32_t i = 0; i < num_copies; ++i) {
    forward::KvCopyOp c;
    if (!r.Get(&c.src_slot) || !r.Get(&c.dst_slot) || !r.Get(&c.num_tokens)) {
      return Malformed("truncated KV copies");
    }
    out->copies_.push_back(c);
  }
  kernels::TppPlanView plan;
  if (n > 0) {
    const int64_t total = 5ll * s + 2ll * (n + 1) + num_seq_shared + 2ll * num_private;
    if (num_seq_shared < 0 || num_private < 0 || !r.Get(total, &out->plan_)) {
      return Malformed("truncated decode plan");
    }
    const int32_t* p = out->plan_.data();
    plan.num_seqs = n;
    plan.num_shared = s;
    plan.num_partial_rows = partial_rows;
    plan.shared_slot = p;
    plan.shared_len = p + s;
    plan.shared_seq_begin = p + 2 * s;
    plan.shared_seq_end = p + 3 * s;
    plan.shared_partial_offset = p + 4 * s;
    p += 5 * s;
    plan.seq_shared_indptr = p;
    p += n + 1;
    plan.seq_shared_ids = p;
    p += num_seq_shared;
    plan.private_indptr = p;
    p += n + 1;
    plan.private_slot = p;
    plan.private_len = p + num_private;
    if (plan.seq_shared_indptr[n] != num_seq_shared || plan.private_indptr[n] != num_private ||
        plan.seq_shared_indptr[0] != 0 || plan.private_indptr[0] != 0) {
      return Malformed("plan offsets disagree with the counts");
    }
  }
  if (!r.done()) return Malformed("trailing bytes");
  forward::StepBatch& b = out->batch_;
  b = forward::StepBatch{};
  b.tokens = out->tokens_;
  b.positions = out->positions_;
  b.kv_slot = out->kv_slot_;
  b.kv_offset = out->kv_offset_;
  b.num_decode = num_decode;
  b.decode_plan = plan;
  b.prefill = out->segments_;
  b.kv_copies = out->copies_;
  return Status::Ok();
}

}  // namespace chunkserve::parallel
