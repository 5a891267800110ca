#include "kernels/cuda/tpp_schedule.h"

#include <algorithm>
#include <cstring>

#include "kernels/cuda/shapes.h"

namespace chunkserve::kernels::cuda {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

const char* ValidatePlan(const TppPlanView& p, const TppScheduleShape& shape) {
  if (shape.num_kv_heads < 1 || shape.num_qo_heads < 1 ||
      shape.num_qo_heads % shape.num_kv_heads != 0) {
    return "num_qo_heads must be a positive multiple of num_kv_heads";
  }
  if (shape.chunk_size < 1 || shape.num_slots < 1) return "bad chunk_size or num_slots";
  if (p.num_seqs < 0 || p.num_shared < 0) return "negative plan sizes";
  if (p.num_seqs == 0) return nullptr;
  if (p.seq_shared_indptr == nullptr || p.private_indptr == nullptr) return "null plan indptr";
  if (p.num_shared > 0 && (p.shared_slot == nullptr || p.shared_len == nullptr ||
                           p.shared_seq_begin == nullptr || p.shared_seq_end == nullptr)) {
    return "null shared-chunk arrays";
  }
  for (int32_t i = 0; i < p.num_shared; ++i) {
    if (p.shared_slot[i] < 0 || p.shared_slot[i] >= shape.num_slots) {
      return "shared chunk slot out of range";
    }
    if (p.shared_len[i] < 1 || p.shared_len[i] > shape.chunk_size) {
      return "shared chunk length out of [1, chunk_size]";
    }
    if (p.shared_seq_begin[i] < 0 || p.shared_seq_end[i] > p.num_seqs ||
        p.shared_seq_end[i] - p.shared_seq_begin[i] < 2) {
      return "shared chunk row range invalid (needs 0 <= begin, end <= num_seqs, end - begin >= 2)";
    }
  }
  if (p.seq_shared_indptr[0] != 0 || p.private_indptr[0] != 0) return "indptr[0] must be 0";
  for (int32_t s = 0; s < p.num_seqs; ++s) {
    if (p.seq_shared_indptr[s + 1] < p.seq_shared_indptr[s] ||
        p.private_indptr[s + 1] < p.private_indptr[s]) {
      return "plan indptr must be non-decreasing";
    }
  }
  const int32_t num_ids = p.seq_shared_indptr[p.num_seqs];
  const int32_t num_private = p.private_indptr[p.num_seqs];
  if (num_ids > 0 && p.seq_shared_ids == nullptr) return "null seq_shared_ids";
  if (num_private > 0 && (p.private_slot == nullptr || p.private_len == nullptr)) {
    return "null private-chunk arrays";
  }
  for (int32_t j = 0; j < num_private; ++j) {
    if (p.private_slot[j] < 0 || p.private_slot[j] >= shape.num_slots) {
      return "private chunk slot out of range";
    }
    if (p.private_len[j] < 1 || p.private_len[j] > shape.chunk_size) {
      return "private chunk length out of [1, chunk_size]";
    }
  }
  // Every row lists exactly the shared chunks whose range holds it: each listed id holds the row,
  // no id twice, and the count equals the number of ranges holding the row (a difference array).
  std::vector<int32_t> covering(static_cast<size_t>(p.num_seqs) + 1, 0);
  for (int32_t i = 0; i < p.num_shared; ++i) {
    ++covering[p.shared_seq_begin[i]];
    --covering[p.shared_seq_end[i]];
  }
  std::vector<int32_t> seen(static_cast<size_t>(p.num_shared), -1);
  int32_t running = 0;
  for (int32_t s = 0; s < p.num_seqs; ++s) {
    running += covering[s];
    if (p.seq_shared_indptr[s + 1] - p.seq_shared_indptr[s] != running) {
      return "a row's shared list differs from the shared chunks whose range holds it";
    }
    for (int32_t k = p.seq_shared_indptr[s]; k < p.seq_shared_indptr[s + 1]; ++k) {
      const int32_t id = p.seq_shared_ids[k];
      if (id < 0 || id >= p.num_shared) return "seq_shared_ids entry out of range";
      if (p.shared_seq_begin[id] > s || p.shared_seq_end[id] <= s) {
        return "a row lists a shared chunk whose range does not hold it";
      }
      if (seen[id] == s) return "a row lists a shared chunk twice";
      seen[id] = s;
    }
  }
  return nullptr;
}

}  // namespace

const char* CheckPlanLengths(const TppPlanView& p, int32_t chunk_size) {
  for (int32_t i = 0; i < p.num_shared; ++i) {
    if (p.shared_len[i] < 1 || p.shared_len[i] > chunk_size) {
      return "shared chunk length out of [1, chunk_size]";
    }
  }
  const int32_t num_private = p.num_seqs > 0 ? p.private_indptr[p.num_seqs] : 0;
  for (int32_t j = 0; j < num_private; ++j) {
    if (p.private_len[j] < 1 || p.private_len[j] > chunk_size) {
      return "private chunk length out of [1, chunk_size]";
    }
  }
  return nullptr;
}

const char* BuildTppSchedule(const TppPlanView& p, const TppScheduleShape& shape,
                             const TppScheduleOptions& options, TppSchedule* out) {
  *out = TppSchedule();
  out->merge_indptr.push_back(0);
  if (options.num_sms < 1 || options.target_ctas_per_sm < 1 || options.max_chunks_per_task < 0) {
    return "bad schedule options";
  }
  if (const char* e = ValidatePlan(p, shape)) return e;
  const int32_t group = shape.num_qo_heads / shape.num_kv_heads;
  const int32_t heads = shape.num_qo_heads;
  const int64_t row_blocks_per_seq = CeilDiv(group, kRowsPerTask);

  // Runs: maximal ranges [i, j) of consecutive shared chunks with the same row range.
  struct Run {
    int32_t first, last, seq_begin, seq_end;
  };
  std::vector<Run> runs;
  for (int32_t i = 0; i < p.num_shared;) {
    int32_t j = i + 1;
    while (j < p.num_shared && p.shared_seq_begin[j] == p.shared_seq_begin[i] &&
           p.shared_seq_end[j] == p.shared_seq_end[i]) {
      ++j;
    }
    runs.push_back({i, j, p.shared_seq_begin[i], p.shared_seq_end[i]});
    i = j;
  }

  // Chunk loads per KV head if nothing were split, and the split that gives enough blocks.
  int64_t loads = 0;
  for (const Run& r : runs) {
    loads +=
        int64_t{r.last - r.first} * CeilDiv(int64_t{r.seq_end - r.seq_begin} * group, kRowsPerTask);
  }
  const int32_t num_private = p.num_seqs > 0 ? p.private_indptr[p.num_seqs] : 0;
  loads += int64_t{num_private} * row_blocks_per_seq;
  int64_t cap = options.max_chunks_per_task;
  if (cap == 0) {
    const int64_t target_tasks = std::max<int64_t>(
        1, int64_t{options.num_sms} * options.target_ctas_per_sm / shape.num_kv_heads);
    // At least 2 chunks per task so that the load of one overlaps the math of the other.
    cap = std::max<int64_t>(2, CeilDiv(std::max<int64_t>(loads, 1), target_tasks));
  }
  cap = std::min<int64_t>(cap, int64_t{1} << 30);
  out->max_chunks_per_task = static_cast<int32_t>(cap);

  out->num_shared_chunks = p.num_shared;
  out->chunk_slot.assign(p.shared_slot, p.shared_slot + p.num_shared);
  out->chunk_len.assign(p.shared_len, p.shared_len + p.num_shared);
  if (num_private > 0) {
    out->chunk_slot.insert(out->chunk_slot.end(), p.private_slot, p.private_slot + num_private);
    out->chunk_len.insert(out->chunk_len.end(), p.private_len, p.private_len + num_private);
  }

  int64_t entries = 0;
  auto add_tasks = [&](int32_t seq_begin, int64_t rows, int32_t chunk_begin, int32_t chunk_end,
                       int32_t out_base) {
    for (int64_t r = 0; r < rows; r += kRowsPerTask) {
      TppTask t{};
      t.seq_begin = seq_begin;
      t.row_begin = static_cast<int32_t>(r);
      t.num_rows = static_cast<int32_t>(std::min<int64_t>(kRowsPerTask, rows - r));
      t.chunk_begin = chunk_begin;
      t.chunk_end = chunk_end;
      t.out = out_base;
      out->tasks.push_back(t);
    }
  };

  // Chunk-first: segments of each run; segment_of[i] maps a shared chunk to its segment's base.
  std::vector<int32_t> segment_base(static_cast<size_t>(p.num_shared), 0);
  std::vector<int32_t> segment_id(static_cast<size_t>(p.num_shared), 0);
  int32_t num_segments = 0;
  for (const Run& r : runs) {
    const int64_t n = r.last - r.first;
    const int64_t pieces = CeilDiv(n, cap);
    for (int64_t k = 0; k < pieces; ++k) {
      // Balanced pieces: sizes differ by at most one chunk.
      const int32_t b = r.first + static_cast<int32_t>(n * k / pieces);
      const int32_t e = r.first + static_cast<int32_t>(n * (k + 1) / pieces);
      const int64_t rows = int64_t{r.seq_end - r.seq_begin} * group;
      add_tasks(r.seq_begin, rows, b, e, static_cast<int32_t>(entries));
      for (int32_t i = b; i < e; ++i) {
        segment_base[i] = static_cast<int32_t>(entries);
        segment_id[i] = num_segments;
      }
      ++num_segments;
      entries += int64_t{r.seq_end - r.seq_begin} * heads;
    }
  }

  // Sequence-first, and the merge list.
  std::vector<int32_t> segment_seen(static_cast<size_t>(num_segments), -1);
  for (int32_t s = 0; s < p.num_seqs; ++s) {
    const int64_t n = p.private_indptr[s + 1] - p.private_indptr[s];
    const int32_t first = p.num_shared + p.private_indptr[s];
    const bool has_shared = p.seq_shared_indptr[s + 1] > p.seq_shared_indptr[s];
    const int64_t pieces = n == 0 ? 0 : CeilDiv(n, cap);
    if (!has_shared && pieces == 1) {
      add_tasks(s, group, first, first + static_cast<int32_t>(n), kDirectOutput);
      continue;
    }
    out->merge_seq.push_back(s);
    for (int32_t k = p.seq_shared_indptr[s]; k < p.seq_shared_indptr[s + 1]; ++k) {
      const int32_t id = p.seq_shared_ids[k];
      const int32_t seg = segment_id[id];
      if (segment_seen[seg] == s) continue;  // the segment's partial covers all its chunks
      segment_seen[seg] = s;
      out->merge_entry.push_back(segment_base[id] + (s - p.shared_seq_begin[id]) * heads);
    }
    for (int64_t k = 0; k < pieces; ++k) {
      const int32_t b = first + static_cast<int32_t>(n * k / pieces);
      const int32_t e = first + static_cast<int32_t>(n * (k + 1) / pieces);
      add_tasks(s, group, b, e, static_cast<int32_t>(entries));
      out->merge_entry.push_back(static_cast<int32_t>(entries));
      entries += heads;
    }
    out->merge_indptr.push_back(static_cast<int32_t>(out->merge_entry.size()));
  }
  if (entries > (int64_t{1} << 31) - 1 || out->tasks.size() > (size_t{1} << 31) - 1) {
    *out = TppSchedule();
    out->merge_indptr.push_back(0);
    return "plan too large for one launch";
  }
  out->num_partial_entries = static_cast<int32_t>(entries);
  return nullptr;
}

size_t TppWorkspaceBytes(const TppSchedule& schedule, int32_t head_dim) {
  return static_cast<size_t>(schedule.num_partial_entries) * (static_cast<size_t>(head_dim) + 2) *
         sizeof(float);
}

const char* PlanUploadName(PlanUpload u) {
  switch (u) {
    case PlanUpload::kNone:
      return "none";
    case PlanUpload::kLengths:
      return "lengths";
    case PlanUpload::kFull:
      break;
  }
  return "full";
}

namespace {

bool SameArray(const std::vector<int32_t>& kept, const int32_t* p, size_t n) {
  if (kept.size() != n) return false;
  return n == 0 || std::memcmp(kept.data(), p, n * sizeof(int32_t)) == 0;
}

void Keep(std::vector<int32_t>& kept, const int32_t* p, size_t n) {
  if (n == 0) {
    kept.clear();
  } else {
    kept.assign(p, p + n);
  }
}

size_t RoundUp4(size_t words) { return (words + 3) & ~size_t{3}; }

}  // namespace

bool TppPlanCache::SameStructure(const TppPlanView& p, const TppScheduleShape& shape,
                                 const TppScheduleOptions& o) const {
  if (!valid_) return false;
  if (shape.num_qo_heads != shape_.num_qo_heads || shape.num_kv_heads != shape_.num_kv_heads ||
      shape.chunk_size != shape_.chunk_size || shape.num_slots != shape_.num_slots) {
    return false;
  }
  if (o.num_sms != options_.num_sms || o.target_ctas_per_sm != options_.target_ctas_per_sm ||
      o.max_chunks_per_task != options_.max_chunks_per_task) {
    return false;
  }
  if (p.num_seqs != num_seqs_) return false;
  const size_t ns = static_cast<size_t>(std::max(p.num_shared, 0));
  const size_t rows = static_cast<size_t>(p.num_seqs) + 1;
  if (p.num_seqs == 0) return p.num_shared == 0 && shared_slot_.empty();
  if (!SameArray(seq_shared_indptr_, p.seq_shared_indptr, rows) ||
      !SameArray(private_indptr_, p.private_indptr, rows)) {
    return false;
  }
  const size_t ids = static_cast<size_t>(p.seq_shared_indptr[p.num_seqs]);
  const size_t priv = static_cast<size_t>(p.private_indptr[p.num_seqs]);
  return SameArray(shared_slot_, p.shared_slot, ns) &&
         SameArray(shared_seq_begin_, p.shared_seq_begin, ns) &&
         SameArray(shared_seq_end_, p.shared_seq_end, ns) &&
         SameArray(seq_shared_ids_, p.seq_shared_ids, ids) &&
         SameArray(private_slot_, p.private_slot, priv);
}

void TppPlanCache::Remember(const TppPlanView& p, const TppScheduleShape& shape,
                            const TppScheduleOptions& o) {
  shape_ = shape;
  options_ = o;
  num_seqs_ = p.num_seqs;
  const size_t ns = static_cast<size_t>(p.num_shared);
  const size_t rows = p.num_seqs > 0 ? static_cast<size_t>(p.num_seqs) + 1 : 0;
  const size_t ids = p.num_seqs > 0 ? static_cast<size_t>(p.seq_shared_indptr[p.num_seqs]) : 0;
  const size_t priv = p.num_seqs > 0 ? static_cast<size_t>(p.private_indptr[p.num_seqs]) : 0;
  Keep(shared_slot_, p.shared_slot, ns);
  Keep(shared_seq_begin_, p.shared_seq_begin, ns);
  Keep(shared_seq_end_, p.shared_seq_end, ns);
  Keep(shared_len_, p.shared_len, ns);
  Keep(seq_shared_indptr_, p.seq_shared_indptr, rows);
  Keep(seq_shared_ids_, p.seq_shared_ids, ids);
  Keep(private_indptr_, p.private_indptr, rows);
  Keep(private_slot_, p.private_slot, priv);
  Keep(private_len_, p.private_len, priv);
}

void TppPlanCache::Pack() {
  const TppSchedule& s = schedule_;
  Layout l;
  size_t at = 0;
  l.tasks = at;
  at = RoundUp4(at + s.tasks.size() * 8);
  l.chunk_slot = at;
  at = RoundUp4(at + s.chunk_slot.size());
  l.merge_seq = at;
  at = RoundUp4(at + s.merge_seq.size());
  l.merge_indptr = at;
  at = RoundUp4(at + s.merge_indptr.size());
  l.merge_entry = at;
  at = RoundUp4(at + s.merge_entry.size());
  l.chunk_len = at;
  at = RoundUp4(at + s.chunk_len.size());
  l.total = std::max<size_t>(at, 4);
  layout_ = l;
  packed_.assign(l.total, 0);
  static_assert(sizeof(TppTask) == 8 * sizeof(int32_t));
  if (!s.tasks.empty()) std::memcpy(&packed_[l.tasks], s.tasks.data(), s.tasks.size() * 32);
  std::copy(s.chunk_slot.begin(), s.chunk_slot.end(), packed_.begin() + l.chunk_slot);
  std::copy(s.merge_seq.begin(), s.merge_seq.end(), packed_.begin() + l.merge_seq);
  std::copy(s.merge_indptr.begin(), s.merge_indptr.end(), packed_.begin() + l.merge_indptr);
  std::copy(s.merge_entry.begin(), s.merge_entry.end(), packed_.begin() + l.merge_entry);
  std::copy(s.chunk_len.begin(), s.chunk_len.end(), packed_.begin() + l.chunk_len);
}

const char* TppPlanCache::Prepare(const TppPlanView& plan, const TppScheduleShape& shape,
                                  const TppScheduleOptions& options, PlanUpload* upload,
                                  size_t* copy_begin_word, size_t* copy_end_word) {
  *upload = PlanUpload::kNone;
  *copy_begin_word = *copy_end_word = 0;
  if (SameStructure(plan, shape, options)) {
    // Only lengths can differ; they are checked again, the structure was validated when built.
    if (const char* e = CheckPlanLengths(plan, shape.chunk_size)) {
      valid_ = false;
      return e;
    }
    const size_t ns = static_cast<size_t>(plan.num_shared);
    const size_t priv =
        plan.num_seqs > 0 ? static_cast<size_t>(plan.private_indptr[plan.num_seqs]) : 0;
    if (SameArray(shared_len_, plan.shared_len, ns) &&
        SameArray(private_len_, plan.private_len, priv)) {
      return nullptr;
    }
    Keep(shared_len_, plan.shared_len, ns);
    Keep(private_len_, plan.private_len, priv);
    // The schedule depends on chunk counts only; refresh its lengths and the packed suffix.
    schedule_.chunk_len = shared_len_;
    schedule_.chunk_len.insert(schedule_.chunk_len.end(), private_len_.begin(), private_len_.end());
    std::copy(schedule_.chunk_len.begin(), schedule_.chunk_len.end(),
              packed_.begin() + layout_.chunk_len);
    *upload = PlanUpload::kLengths;
    *copy_begin_word = layout_.chunk_len;
    *copy_end_word = layout_.chunk_len + schedule_.chunk_len.size();
    return nullptr;
  }
  valid_ = false;
  if (const char* e = BuildTppSchedule(plan, shape, options, &schedule_)) return e;
  Remember(plan, shape, options);
  Pack();
  valid_ = true;
  *upload = PlanUpload::kFull;
  *copy_begin_word = 0;
  *copy_end_word = layout_.total;
  return nullptr;
}

}  // namespace chunkserve::kernels::cuda
