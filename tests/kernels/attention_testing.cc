#include "tests/kernels/attention_testing.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "kernels/cpu/dtype.h"
#include "kernels/cpu/reference.h"

namespace chunkserve::kernels::cpu::testing {

using chunkserve::testing::Random;

std::string DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF16:
      return "f16";
    case DType::kBF16:
      return "bf16";
    case DType::kF32:
      break;
  }
  return "f32";
}

namespace {

void FillNaN(std::vector<unsigned char>& bytes, DType dtype) {
  if (dtype == DType::kF32) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    for (size_t i = 0; i + 4 <= bytes.size(); i += 4) std::memcpy(&bytes[i], &nan, 4);
  } else {
    const uint16_t nan = dtype == DType::kF16 ? 0x7e00 : 0x7fc0;
    for (size_t i = 0; i + 2 <= bytes.size(); i += 2) std::memcpy(&bytes[i], &nan, 2);
  }
}

}  // namespace

KvArena::KvArena(const Shape& shape, int32_t num_slots) : shape_(shape), num_slots_(num_slots) {
  const size_t bytes = static_cast<size_t>(num_slots) * shape.num_kv_heads * shape.chunk_size *
                       shape.head_dim * DTypeSize(shape.dtype);
  k_.resize(bytes);
  v_.resize(bytes);
  FillNaN(k_, shape.dtype);
  FillNaN(v_, shape.dtype);
}

KvArenaLayer KvArena::layer() {
  KvArenaLayer l;
  l.k = k_.data();
  l.v = v_.data();
  l.dtype = shape_.dtype;
  l.num_slots = num_slots_;
  l.num_kv_heads = shape_.num_kv_heads;
  l.chunk_size = shape_.chunk_size;
  l.head_dim = shape_.head_dim;
  return l;
}

KvCacheView KvArena::view() const {
  KvCacheView v;
  v.k = k_.data();
  v.v = v_.data();
  v.dtype = shape_.dtype;
  v.num_slots = num_slots_;
  v.num_kv_heads = shape_.num_kv_heads;
  v.chunk_size = shape_.chunk_size;
  v.head_dim = shape_.head_dim;
  return v;
}

size_t KvArena::RowOffset(int32_t slot, int32_t kv_head, int32_t offset) const {
  const size_t row =
      (static_cast<size_t>(slot) * shape_.num_kv_heads + kv_head) * shape_.chunk_size + offset;
  return row * shape_.head_dim * DTypeSize(shape_.dtype);
}

const unsigned char* KvArena::RowK(int32_t slot, int32_t kv_head, int32_t offset) const {
  return k_.data() + RowOffset(slot, kv_head, offset);
}

const unsigned char* KvArena::RowV(int32_t slot, int32_t kv_head, int32_t offset) const {
  return v_.data() + RowOffset(slot, kv_head, offset);
}

void KvArena::FillToken(int32_t slot, int32_t offset, Random& rng) {
  const size_t n = static_cast<size_t>(shape_.head_dim);
  for (int32_t h = 0; h < shape_.num_kv_heads; ++h) {
    const size_t at = RowOffset(slot, h, offset);
    const std::vector<float> k = rng.Floats(n);
    const std::vector<float> v = rng.Floats(n);
    ConvertFromFloat(shape_.dtype, k.data(), k_.data() + at, n);
    ConvertFromFloat(shape_.dtype, v.data(), v_.data() + at, n);
  }
}

int64_t Layout::Tokens(int32_t seq) const {
  int64_t n = 0;
  for (int32_t c : paths[seq]) n += chunks[c].len;
  return n;
}

LayoutBuilder::LayoutBuilder(int32_t num_seqs) {
  layout_.num_seqs = num_seqs;
  layout_.paths.resize(num_seqs);
}

void LayoutBuilder::AddShared(int32_t begin, int32_t end, int32_t len) {
  const int32_t index = static_cast<int32_t>(layout_.shared_len.size());
  layout_.chunks.push_back({-1, len, index});
  layout_.shared_len.push_back(len);
  layout_.shared_seq_begin.push_back(begin);
  layout_.shared_seq_end.push_back(end);
  layout_.shared_partial_offset.push_back(layout_.num_partial_rows);
  layout_.num_partial_rows += end - begin;
  for (int32_t s = begin; s < end; ++s) {
    layout_.paths[s].push_back(static_cast<int32_t>(layout_.chunks.size()) - 1);
  }
}

void LayoutBuilder::AddPrivate(int32_t seq, int32_t len) {
  layout_.chunks.push_back({-1, len, -1});
  layout_.paths[seq].push_back(static_cast<int32_t>(layout_.chunks.size()) - 1);
}

Layout LayoutBuilder::Finish(Random& rng, int32_t spare_slots) {
  Layout l = std::move(layout_);
  l.num_slots = static_cast<int32_t>(l.chunks.size()) + spare_slots;
  std::vector<int32_t> slots(static_cast<size_t>(l.num_slots));
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), rng.engine());
  for (size_t i = 0; i < l.chunks.size(); ++i) l.chunks[i].slot = slots[i];
  l.shared_slot.assign(l.shared_len.size(), -1);
  for (const Layout::Chunk& c : l.chunks) {
    if (c.shared_index >= 0) l.shared_slot[c.shared_index] = c.slot;
  }
  l.seq_shared_indptr = {0};
  l.private_indptr = {0};
  l.block_indptr = {0};
  for (int32_t s = 0; s < l.num_seqs; ++s) {
    for (int32_t ci : l.paths[s]) {
      const Layout::Chunk& c = l.chunks[ci];
      if (c.shared_index >= 0) {
        l.seq_shared_ids.push_back(c.shared_index);
      } else {
        l.private_slot.push_back(c.slot);
        l.private_len.push_back(c.len);
      }
      l.block_slot.push_back(c.slot);
      l.block_len.push_back(c.len);
    }
    l.seq_shared_indptr.push_back(static_cast<int32_t>(l.seq_shared_ids.size()));
    l.private_indptr.push_back(static_cast<int32_t>(l.private_slot.size()));
    l.block_indptr.push_back(static_cast<int32_t>(l.block_slot.size()));
  }
  return l;
}

namespace {

int32_t RandomLen(int32_t chunk_size, Random& rng) {
  return rng.Bernoulli(0.3) ? static_cast<int32_t>(rng.Int(1, chunk_size)) : chunk_size;
}

void Grow(LayoutBuilder& b, int32_t begin, int32_t end, int depth, int32_t chunk_size,
          std::vector<int64_t>& tokens, Random& rng) {
  if (end - begin == 1) {
    int64_t n = rng.Int(0, 3);
    if (tokens[begin] == 0 && n == 0) n = 1;
    for (int64_t i = 0; i < n; ++i) {
      const int32_t len = RandomLen(chunk_size, rng);
      b.AddPrivate(begin, len);
      tokens[begin] += len;
    }
    return;
  }
  const int64_t shared = rng.Int(depth == 0 ? 0 : 1, 3);
  for (int64_t i = 0; i < shared; ++i) {
    const int32_t len = RandomLen(chunk_size, rng);
    b.AddShared(begin, end, len);
    for (int32_t s = begin; s < end; ++s) tokens[s] += len;
  }
  // Split into 1..4 pieces (one piece: the same range continues one level down, i.e. a longer
  // shared chain); past depth 3 every sequence becomes a leaf.
  const int32_t n = end - begin;
  const int32_t pieces = depth >= 3 ? n : static_cast<int32_t>(rng.Int(1, std::min(4, n)));
  std::vector<int32_t> cuts = {begin, end};
  while (static_cast<int32_t>(cuts.size()) < pieces + 1) {
    const int32_t c = static_cast<int32_t>(rng.Int(begin + 1, end - 1));
    if (std::find(cuts.begin(), cuts.end(), c) == cuts.end()) cuts.push_back(c);
  }
  std::sort(cuts.begin(), cuts.end());
  for (size_t i = 0; i + 1 < cuts.size(); ++i)
    Grow(b, cuts[i], cuts[i + 1], depth + 1, chunk_size, tokens, rng);
}

}  // namespace

Layout RandomTreeLayout(int32_t num_seqs, int32_t chunk_size, Random& rng) {
  LayoutBuilder b(num_seqs);
  std::vector<int64_t> tokens(static_cast<size_t>(num_seqs), 0);
  if (num_seqs > 0) Grow(b, 0, num_seqs, 0, chunk_size, tokens, rng);
  return b.Finish(rng);
}

Layout SharedPrefixLayout(int32_t num_seqs, int32_t chunk_size, int64_t shared_tokens,
                          int64_t private_tokens, Random& rng) {
  LayoutBuilder b(num_seqs);
  for (int64_t t = 0; t < shared_tokens; t += chunk_size) {
    const int32_t len = static_cast<int32_t>(std::min<int64_t>(chunk_size, shared_tokens - t));
    if (num_seqs >= 2) {
      b.AddShared(0, num_seqs, len);
    } else {
      for (int32_t s = 0; s < num_seqs; ++s) b.AddPrivate(s, len);
    }
  }
  for (int32_t s = 0; s < num_seqs; ++s) {
    for (int64_t t = 0; t < private_tokens; t += chunk_size) {
      b.AddPrivate(s, static_cast<int32_t>(std::min<int64_t>(chunk_size, private_tokens - t)));
    }
  }
  return b.Finish(rng);
}

void FillLayout(const Layout& layout, KvArena& arena, Random& rng) {
  for (const Layout::Chunk& c : layout.chunks) {
    for (int32_t t = 0; t < c.len; ++t) arena.FillToken(c.slot, t, rng);
  }
}

ContiguousKv Gather(const KvArena& arena, const std::vector<std::vector<Layout::Chunk>>& paths) {
  const Shape& shape = arena.shape();
  const size_t row_bytes = static_cast<size_t>(shape.head_dim) * DTypeSize(shape.dtype);
  ContiguousKv out;
  for (const auto& path : paths) {
    out.seq_begin.push_back(out.num_tokens);
    for (const Layout::Chunk& c : path) {
      for (int32_t t = 0; t < c.len; ++t) {
        for (int32_t h = 0; h < shape.num_kv_heads; ++h) {
          out.k.insert(out.k.end(), arena.RowK(c.slot, h, t), arena.RowK(c.slot, h, t) + row_bytes);
          out.v.insert(out.v.end(), arena.RowV(c.slot, h, t), arena.RowV(c.slot, h, t) + row_bytes);
        }
        ++out.num_tokens;
      }
    }
    out.seq_end.push_back(out.num_tokens);
  }
  return out;
}

ContiguousKv Gather(const KvArena& arena, const Layout& layout) {
  std::vector<std::vector<Layout::Chunk>> paths;
  for (const auto& path : layout.paths) {
    paths.emplace_back();
    for (int32_t c : path) paths.back().push_back(layout.chunks[c]);
  }
  return Gather(arena, paths);
}

namespace {

std::vector<float> NaiveDecodeOf(const KvArena& arena, const ContiguousKv& kv, int32_t num_seqs,
                                 const std::vector<float>& q, float sm_scale) {
  const Shape& shape = arena.shape();
  std::vector<float> o(q.size(), -1.0f);
  NaiveAttentionParams p;
  p.q = q.data();
  p.o = o.data();
  p.k = kv.k.data();
  p.v = kv.v.data();
  p.dtype = shape.dtype;
  p.num_kv_tokens = kv.num_tokens;
  p.kv_begin = kv.seq_begin.data();
  p.kv_end = kv.seq_end.data();
  p.num_queries = num_seqs;
  p.num_qo_heads = shape.num_qo_heads;
  p.num_kv_heads = shape.num_kv_heads;
  p.head_dim = shape.head_dim;
  p.sm_scale = sm_scale;
  if (NaiveAttention(p) != KernelStatus::kOk) std::fill(o.begin(), o.end(), std::nanf(""));
  return o;
}

}  // namespace

std::vector<float> NaiveDecode(const KvArena& arena, const Layout& layout,
                               const std::vector<float>& q, float sm_scale) {
  return NaiveDecodeOf(arena, Gather(arena, layout), layout.num_seqs, q, sm_scale);
}

std::vector<float> NaiveDecode(const KvArena& arena, const TppPlanView& plan,
                               const std::vector<float>& q, float sm_scale) {
  std::vector<std::vector<Layout::Chunk>> paths(static_cast<size_t>(plan.num_seqs));
  for (int32_t s = 0; s < plan.num_seqs; ++s) {
    for (int32_t k = plan.seq_shared_indptr[s]; k < plan.seq_shared_indptr[s + 1]; ++k) {
      const int32_t id = plan.seq_shared_ids[k];
      paths[s].push_back({plan.shared_slot[id], plan.shared_len[id], id});
    }
    for (int32_t j = plan.private_indptr[s]; j < plan.private_indptr[s + 1]; ++j) {
      paths[s].push_back({plan.private_slot[j], plan.private_len[j], -1});
    }
  }
  return NaiveDecodeOf(arena, Gather(arena, paths), plan.num_seqs, q, sm_scale);
}

PrefillBatch MakePrefillBatch(std::vector<PrefillSeq> seqs, const Shape& shape, bool round_new_kv,
                              chunkserve::testing::Random& rng) {
  const int32_t c = shape.chunk_size;
  const size_t token_floats = static_cast<size_t>(shape.num_kv_heads) * shape.head_dim;
  int32_t num_chunks = 0;
  for (PrefillSeq& s : seqs) {
    num_chunks += (s.total + c - 1) / c;
    if (s.positions.empty()) {
      for (int32_t p = s.cached; p < s.total; ++p) s.positions.push_back(p);
    }
  }
  const int32_t num_slots = num_chunks + 2;
  std::vector<int32_t> slots(static_cast<size_t>(num_slots));
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), rng.engine());
  PrefillBatch b(shape, num_slots);
  size_t next = 0;
  for (const PrefillSeq& s : seqs) {
    b.paths.emplace_back();
    for (int32_t first = 0; first < s.total; first += c) {
      const int32_t slot = slots[next++];
      const int32_t len = std::min(c, s.total - first);
      b.chunk_slot.push_back(slot);
      b.chunk_len.push_back(len);
      b.paths.back().push_back({slot, len, -1});
      for (int32_t t = 0; t < len; ++t) {
        if (first + t < s.cached) {
          b.arena.FillToken(slot, t, rng);
          continue;
        }
        std::vector<float> k = rng.Floats(token_floats);
        std::vector<float> v = rng.Floats(token_floats);
        if (round_new_kv) {
          for (float& x : k) x = RoundThrough(shape.dtype, x);
          for (float& x : v) x = RoundThrough(shape.dtype, x);
        }
        b.new_k.insert(b.new_k.end(), k.begin(), k.end());
        b.new_v.insert(b.new_v.end(), v.begin(), v.end());
        b.new_slot.push_back(slot);
        b.new_offset.push_back(t);
      }
    }
    b.chunk_indptr.push_back(static_cast<int32_t>(b.chunk_slot.size()));
    b.q_pos.insert(b.q_pos.end(), s.positions.begin(), s.positions.end());
    b.q_indptr.push_back(static_cast<int32_t>(b.q_pos.size()));
    b.max_q = std::max(b.max_q, static_cast<int32_t>(s.positions.size()));
  }
  return b;
}

KernelStatus NaivePrefill(const PrefillBatch& batch, const std::vector<float>& q, float sm_scale,
                          std::vector<float>* want) {
  const Shape& shape = batch.arena.shape();
  const ContiguousKv ckv = Gather(batch.arena, batch.paths);
  std::vector<int64_t> kv_begin, kv_end;
  for (size_t s = 0; s + 1 < batch.q_indptr.size(); ++s) {
    for (int32_t i = batch.q_indptr[s]; i < batch.q_indptr[s + 1]; ++i) {
      kv_begin.push_back(ckv.seq_begin[s]);
      kv_end.push_back(ckv.seq_begin[s] + batch.q_pos[i] + 1);
    }
  }
  const int32_t num_q = batch.q_indptr.back();
  want->assign(static_cast<size_t>(num_q) * shape.num_qo_heads * shape.head_dim, -1.0f);
  NaiveAttentionParams np;
  np.q = q.data();
  np.o = want->data();
  np.k = ckv.k.data();
  np.v = ckv.v.data();
  np.dtype = shape.dtype;
  np.num_kv_tokens = ckv.num_tokens;
  np.kv_begin = kv_begin.data();
  np.kv_end = kv_end.data();
  np.num_queries = num_q;
  np.num_qo_heads = shape.num_qo_heads;
  np.num_kv_heads = shape.num_kv_heads;
  np.head_dim = shape.head_dim;
  np.sm_scale = sm_scale;
  return NaiveAttention(np);
}

double WorstError(const std::vector<float>& got, const std::vector<float>& want, double atol,
                  double rtol, size_t* where) {
  if (got.size() != want.size()) return std::numeric_limits<double>::infinity();
  double worst = 0.0;
  size_t worst_at = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err =
        std::isfinite(got[i]) && std::isfinite(want[i])
            ? std::abs(static_cast<double>(got[i]) - want[i]) / (atol + rtol * std::abs(want[i]))
            : std::numeric_limits<double>::infinity();
    if (err > worst || std::isinf(err)) {
      worst = err;
      worst_at = i;
      if (std::isinf(err)) break;
    }
  }
  if (where != nullptr) *where = worst_at;
  return worst;
}

}  // namespace chunkserve::kernels::cpu::testing
