// The host half of the CUDA TPP decode: turns a TppPlanView (kernels/attention_params.h, built by
// runtime/plan) into the flat work lists the device kernels read, and decides what must be
// uploaded again when the plan changes. Plain C++ (no CUDA headers): g++ compiles it and the CPU
// tests (tests/kernels/cuda_host_test.cc) check it without a GPU. kernels/cuda/device_plan.h does
// the copies.
//
// Work lists. One launch of the attend kernel runs both TPP phases side by side: its grid is
// (task, KV head), and a task is "these <= 64 rows attend to this run of chunks":
//  - chunk-first tasks: a *segment* (consecutive shared chunks of the plan with the same row
//    range, at most max_chunks_per_task of them) times a block of <= 64 rows of that range, where
//    the rows are (sharing sequence x query head of the GQA group): exactly the rows that share
//    the chunk, never padded to the batch. They write fp32 partials (o, m, l) per row.
//  - sequence-first tasks: one sequence's private chunks, split into pieces of at most
//    max_chunks_per_task chunks (split-KV) when that is needed to fill the GPU; rows are the
//    sequence's query heads of the group. A sequence without shared chunks and with one piece
//    writes its output directly; the others write partials.
//  - the merge list: every sequence whose output needs partials combined (and every sequence with
//    no tokens at all, which gets zeros), with the partial entries to combine.
// max_chunks_per_task is chosen so that tasks x KV heads is about num_sms x target_ctas_per_sm:
// enough thread blocks to keep every SM streaming, but no more partials than that needs (a
// partial costs head_dim + 2 floats per row written and read again).
//
// Partial entries: entry e holds o[head_dim] (unnormalized), m (running max, base-2 scaled logits)
// and l (sum of exponentials). A task with `out` = base writes row (sequence s, query head h) to
// entry base + (s - seq_begin) * num_qo_heads + h.
//
// Thread safety: none; these are values.
#ifndef CHUNKSERVE_KERNELS_CUDA_TPP_SCHEDULE_H_
#define CHUNKSERVE_KERNELS_CUDA_TPP_SCHEDULE_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/attention_params.h"

namespace chunkserve::kernels::cuda {

// What the schedule depends on besides the plan.
struct TppScheduleShape {
  int32_t num_qo_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t chunk_size = 0;
  int32_t num_slots = 0;
};

struct TppScheduleOptions {
  int32_t num_sms = 132;            // streaming multiprocessors of the device (H100 SXM: 132)
  int32_t target_ctas_per_sm = 4;   // thread blocks per SM the split aims for
  int32_t max_chunks_per_task = 0;  // 0: derived from the two above; > 0 forces it (tests)
};

// One thread block's work (per KV head). 8 int32 words: the device reads it as two int4.
struct TppTask {
  int32_t seq_begin;    // first sequence of the task's row space
  int32_t row_begin;    // first row of the task in that space; row R is sequence
                        //   seq_begin + R / group, query head kv_head * group + R % group
  int32_t num_rows;     // 1 .. kRowsPerTask
  int32_t chunk_begin;  // chunks [chunk_begin, chunk_end) of TppSchedule::chunk_slot/len
  int32_t chunk_end;
  int32_t out;  // >= 0: partial entry base (see above); kDirectOutput: write o
  int32_t reserved0;
  int32_t reserved1;
};
inline constexpr int32_t kDirectOutput = -1;

struct TppSchedule {
  std::vector<TppTask> tasks;
  // Shared chunks (in plan order) then private chunks (in plan order).
  std::vector<int32_t> chunk_slot, chunk_len;
  int32_t num_shared_chunks = 0;
  // Sequences whose outputs the merge kernel writes: merge_seq[k] combines the entries
  // merge_entry[merge_indptr[k] .. merge_indptr[k + 1]) (each the entry of query head 0; head h
  // is entry + h). No entries: zeros.
  std::vector<int32_t> merge_seq, merge_indptr, merge_entry;
  int32_t num_partial_entries = 0;
  int32_t max_chunks_per_task = 0;  // the value used
};

// Validates `plan` against `shape` (the same checks as the CPU TppDecode: pointers, ranges,
// lengths, and that every row's shared list is exactly the shared chunks whose range holds it)
// and builds the work lists. Returns nullptr on success, else a reason (and `out` is cleared).
const char* BuildTppSchedule(const TppPlanView& plan, const TppScheduleShape& shape,
                             const TppScheduleOptions& options, TppSchedule* out);

// Validates only the lengths (what changes between steps when the structure does not).
const char* CheckPlanLengths(const TppPlanView& plan, int32_t chunk_size);

// Bytes of partial storage a schedule needs: entries x (head_dim + 2) floats.
size_t TppWorkspaceBytes(const TppSchedule& schedule, int32_t head_dim);

// What DevicePlan must copy to bring the device up to date.
enum class PlanUpload : int32_t {
  kNone = 0,     // the device copy is current: nothing is copied
  kLengths = 1,  // only chunk lengths moved (a decode step that did not fill a chunk): the
                 //   lengths array, a suffix of the packed buffer, is copied
  kFull = 2,     // structure, shape or options changed (or first use): everything is rebuilt
};
const char* PlanUploadName(PlanUpload u);

// TppPlanCache keeps the last plan's arrays (a copy, compared exactly: no hash can collide), its
// schedule and the packed int32 buffer the device reads, and says what changed. It is the
// decision half of DevicePlan, separated from the copy so that it runs in CPU tests.
//
// Packed buffer layout (int32 words, in this order, each section starting at a multiple of 4
// words so the device can read int4): tasks (8 words each), chunk_slot, merge_seq, merge_indptr,
// merge_entry, chunk_len. chunk_len is last so that kLengths copies one contiguous suffix.
class TppPlanCache {
 public:
  struct Layout {
    size_t tasks = 0, chunk_slot = 0, merge_seq = 0, merge_indptr = 0, merge_entry = 0,
           chunk_len = 0, total = 0;  // word offsets; total = buffer size in words
  };

  // Compares `plan` with the last one and updates the schedule and packed buffer. Returns nullptr
  // and sets *upload and [*copy_begin_word, *copy_end_word) (the packed words that changed and
  // must be copied) on success; on error returns the reason and forgets the last plan (the next
  // Prepare is kFull).
  const char* Prepare(const TppPlanView& plan, const TppScheduleShape& shape,
                      const TppScheduleOptions& options, PlanUpload* upload,
                      size_t* copy_begin_word, size_t* copy_end_word);

  // Forgets the last plan (e.g. after a failed copy): the next Prepare is kFull.
  void Invalidate() { valid_ = false; }

  const TppSchedule& schedule() const { return schedule_; }
  const std::vector<int32_t>& packed() const { return packed_; }
  const Layout& layout() const { return layout_; }
  bool valid() const { return valid_; }
  // The shape and batch size of the last plan (meaningful when valid()).
  const TppScheduleShape& shape() const { return shape_; }
  int32_t num_seqs() const { return num_seqs_; }

 private:
  bool SameStructure(const TppPlanView& plan, const TppScheduleShape& shape,
                     const TppScheduleOptions& options) const;
  void Remember(const TppPlanView& plan, const TppScheduleShape& shape,
                const TppScheduleOptions& options);
  void Pack();

  bool valid_ = false;
  // The last plan (structure and lengths separately) and what it was built for.
  TppScheduleShape shape_;
  TppScheduleOptions options_;
  int32_t num_seqs_ = 0;
  std::vector<int32_t> shared_slot_, shared_seq_begin_, shared_seq_end_, seq_shared_indptr_,
      seq_shared_ids_, private_indptr_, private_slot_;
  std::vector<int32_t> shared_len_, private_len_;

  TppSchedule schedule_;
  std::vector<int32_t> packed_;
  Layout layout_;
};

}  // namespace chunkserve::kernels::cuda

#endif  // CHUNKSERVE_KERNELS_CUDA_TPP_SCHEDULE_H_
