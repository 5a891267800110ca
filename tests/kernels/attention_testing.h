// Test-side builders for the attention kernels: a KV arena filled with random values (and NaN
// everywhere a kernel must not read), batch layouts shaped like prefix trees, the TppPlanView and
// paged block lists for them, and the contiguous K/V the naive reference reads.
//
// The layouts are generated here, not by runtime/plan, so that the kernels are tested against an
// independent producer of the contract in kernels/attention_params.h.
#ifndef CHUNKSERVE_TESTS_KERNELS_ATTENTION_TESTING_H_
#define CHUNKSERVE_TESTS_KERNELS_ATTENTION_TESTING_H_

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/attention_params.h"
#include "kernels/cpu/common.h"
#include "kernels/cpu/kv_append.h"
#include "tests/testing/random.h"

namespace chunkserve::kernels::cpu::testing {

struct Shape {
  DType dtype = DType::kF32;
  int32_t head_dim = 128;
  int32_t chunk_size = 64;
  int32_t num_qo_heads = 4;
  int32_t num_kv_heads = 1;
};

std::string DTypeName(DType dtype);

// One layer of KV storage. Every element starts as NaN; FillToken writes real values. A kernel that
// reads a position it should not (past a chunk's length, an unused slot) turns its output into NaN.
class KvArena {
 public:
  KvArena(const Shape& shape, int32_t num_slots);

  KvArenaLayer layer();
  KvCacheView view() const;
  const Shape& shape() const { return shape_; }
  int32_t num_slots() const { return num_slots_; }

  // Writes random values (already representable in the dtype) for every KV head at (slot, offset).
  void FillToken(int32_t slot, int32_t offset, chunkserve::testing::Random& rng);
  // Raw bytes of one (slot, kv_head, offset) row of K or V: head_dim elements of the dtype.
  const unsigned char* RowK(int32_t slot, int32_t kv_head, int32_t offset) const;
  const unsigned char* RowV(int32_t slot, int32_t kv_head, int32_t offset) const;

 private:
  size_t RowOffset(int32_t slot, int32_t kv_head, int32_t offset) const;
  Shape shape_;
  int32_t num_slots_;
  std::vector<unsigned char> k_;
  std::vector<unsigned char> v_;
};

// A decode batch: each sequence's path of chunks (root first), which of them are shared, and the
// arrays of the TPP plan and of the paged block lists derived from it.
struct Layout : TppPlanArrays {
  struct Chunk {
    int32_t slot;
    int32_t len;
    int32_t shared_index;  // index into the plan's shared list, -1 when private
  };
  int32_t num_slots = 0;  // slots the arena needs (chunks plus unused ones)
  std::vector<Chunk> chunks;
  std::vector<std::vector<int32_t>> paths;  // per sequence, indices into chunks
  // Paged block lists: every sequence's whole path.
  std::vector<int32_t> block_indptr, block_slot, block_len;

  TppPlanView Plan() const { return View(); }
  int64_t Tokens(int32_t seq) const;
};

// Builds a Layout: shared chunks over sequence ranges, private chunks per sequence, in DFS order.
class LayoutBuilder {
 public:
  explicit LayoutBuilder(int32_t num_seqs);
  // A chunk shared by sequences [begin, end) (end - begin >= 2), appended to each of their paths.
  void AddShared(int32_t begin, int32_t end, int32_t len);
  void AddPrivate(int32_t seq, int32_t len);
  // Assigns slots in a shuffled order with `spare_slots` unused ones mixed in, builds the arrays.
  Layout Finish(chunkserve::testing::Random& rng, int32_t spare_slots = 3);

 private:
  Layout layout_;
};

// A random prefix tree over num_seqs sequences: ranges split recursively, shared chains of 0..3
// chunks per node, some partly filled, private tails of 0..3 chunks; every sequence has >= 1 token.
Layout RandomTreeLayout(int32_t num_seqs, int32_t chunk_size, chunkserve::testing::Random& rng);

// Every sequence shares shared_tokens (full chunks, the last one partial if needed), then owns
// private_tokens.
Layout SharedPrefixLayout(int32_t num_seqs, int32_t chunk_size, int64_t shared_tokens,
                          int64_t private_tokens, chunkserve::testing::Random& rng);

// Fills every chunk of the layout's paths with random values.
void FillLayout(const Layout& layout, KvArena& arena, chunkserve::testing::Random& rng);

// The sequences' K/V copied into one contiguous [tokens, num_kv_heads, head_dim] buffer each for
// K and V (raw dtype bytes), plus each sequence's token range: what the naive reference reads.
struct ContiguousKv {
  std::vector<unsigned char> k, v;
  std::vector<int64_t> seq_begin, seq_end;  // per sequence
  int64_t num_tokens = 0;
};
ContiguousKv Gather(const KvArena& arena, const std::vector<std::vector<Layout::Chunk>>& paths);
ContiguousKv Gather(const KvArena& arena, const Layout& layout);

// Naive reference output for a decode batch: [num_seqs, num_qo_heads, head_dim]; all NaN if the
// reference rejects its input.
std::vector<float> NaiveDecode(const KvArena& arena, const Layout& layout,
                               const std::vector<float>& q, float sm_scale);
// The same for a plan view (e.g. one produced by runtime/plan): each sequence's path is its shared
// chunks, then its private ones.
std::vector<float> NaiveDecode(const KvArena& arena, const TppPlanView& plan,
                               const std::vector<float>& q, float sm_scale);

// One sequence of a prefill batch: `cached` tokens already in the arena, then new tokens up to
// `total`; the queries sit at `positions` (empty: the new tokens, cached .. total - 1).
struct PrefillSeq {
  int32_t cached;
  int32_t total;
  std::vector<int32_t> positions;
};

// A prefill batch over a fresh arena whose slots are shuffled (two more than the batch needs, left
// unwritten): the cached tokens are in the arena; the new tokens' K/V are only drawn (new_k, new_v:
// [token][kv_head][head_dim] fp32, in new_slot / new_offset order), for the test to append with
// the KvAppend it exercises. The chunk and query lists are PrefillAttention's.
struct PrefillBatch {
  PrefillBatch(const Shape& shape, int32_t num_slots) : arena(shape, num_slots) {}
  KvArena arena;
  std::vector<int32_t> chunk_indptr{0}, chunk_slot, chunk_len, q_indptr{0}, q_pos;
  std::vector<float> new_k, new_v;
  std::vector<int32_t> new_slot, new_offset;
  std::vector<std::vector<Layout::Chunk>> paths;  // per sequence, for Gather
  int32_t max_q = 0;                              // most queries of one sequence
};
// round_new_kv: new K/V values are rounded through the dtype (for callers that upload them as
// dtype bits); otherwise they are plain fp32 draws that KvAppend converts.
PrefillBatch MakePrefillBatch(std::vector<PrefillSeq> seqs, const Shape& shape, bool round_new_kv,
                              chunkserve::testing::Random& rng);

// The naive reference of a prefill batch once its new tokens are in the arena: query i of a
// sequence sees that sequence's positions 0..q_pos[i]. `want` gets [queries, num_qo_heads,
// head_dim]; returns the reference's status.
KernelStatus NaivePrefill(const PrefillBatch& batch, const std::vector<float>& q, float sm_scale,
                          std::vector<float>* want);

// Largest |got - want| / (atol + rtol * |want|) over all elements (> 1 means out of tolerance);
// NaN anywhere gives +inf. `where` receives the index of the worst element.
double WorstError(const std::vector<float>& got, const std::vector<float>& want, double atol,
                  double rtol, size_t* where = nullptr);

}  // namespace chunkserve::kernels::cpu::testing

#endif  // CHUNKSERVE_TESTS_KERNELS_ATTENTION_TESTING_H_
