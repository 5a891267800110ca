// Bad params get an error code, never a crash, and nothing is written: one named case per mutation
// of an otherwise valid call.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/kv_append.h"
#include "kernels/cpu/reference.h"
#include "kernels/cpu/thread_pool.h"
#include "tests/kernels/attention_testing.h"
#include "tests/testing/random.h"

namespace chunkserve::kernels::cpu::testing {
namespace {

using chunkserve::testing::Random;

ThreadPool& Pool() {
  static ThreadPool* pool = new ThreadPool(2);
  return *pool;
}

// A valid decode batch: 3 sequences sharing two chunks, private tails; GQA 2.
struct Fixture {
  Fixture() : rng(7), layout(Build(rng)), arena(MakeShape(), layout.num_slots) {
    FillLayout(layout, arena, rng);
    q = rng.Floats(3 * 4 * 64);
    o.assign(q.size(), 42.0f);
    plan = layout.Plan();
    workspace.resize(TppDecodeWorkspaceBytes(plan, 4, 64));
    tpp.q = q.data();
    tpp.o = o.data();
    tpp.kv = arena.view();
    tpp.plan = plan;
    tpp.num_qo_heads = 4;
    tpp.sm_scale = 0.125f;
    tpp.workspace = workspace.data();
    tpp.workspace_bytes = workspace.size();
    tpp.pool = &Pool();
    paged.q = q.data();
    paged.o = o.data();
    paged.kv = arena.view();
    paged.num_seqs = 3;
    paged.num_qo_heads = 4;
    paged.block_indptr = layout.block_indptr.data();
    paged.block_slot = layout.block_slot.data();
    paged.block_len = layout.block_len.data();
    paged.sm_scale = 0.125f;
    paged.pool = &Pool();
    // Prefill: queries at the last 3 positions of sequence 0's path (chunk k covers positions
    // from k * chunk_size, so the path ends at (chunks - 1) * 16 + the last chunk's length).
    const int32_t end = (static_cast<int32_t>(layout.paths[0].size()) - 1) * 16 +
                        layout.chunks[layout.paths[0].back()].len;
    q_indptr = {0, 3};
    q_pos = {end - 3, end - 2, end - 1};
    chunk_indptr = {0, static_cast<int32_t>(layout.paths[0].size())};
    for (int32_t c : layout.paths[0]) {
      chunk_slot.push_back(layout.chunks[c].slot);
      chunk_len.push_back(layout.chunks[c].len);
    }
    prefill.q = q.data();
    prefill.o = o.data();
    prefill.kv = arena.view();
    prefill.num_seqs = 1;
    prefill.num_qo_heads = 4;
    prefill.q_indptr = q_indptr.data();
    prefill.q_pos = q_pos.data();
    prefill.chunk_indptr = chunk_indptr.data();
    prefill.chunk_slot = chunk_slot.data();
    prefill.chunk_len = chunk_len.data();
    prefill.sm_scale = 0.125f;
    prefill.pool = &Pool();
    append_k = rng.Floats(2 * 64);
    append_v = rng.Floats(2 * 64);
    append.kv = arena.layer();
    append.k = append_k.data();
    append.v = append_v.data();
    append.slot = append_slot;
    append.offset = append_offset;
    append.num_tokens = 1;
  }

  static Shape MakeShape() {
    Shape s;
    s.head_dim = 64;
    s.chunk_size = 16;
    s.num_kv_heads = 2;
    s.num_qo_heads = 4;
    return s;
  }
  static Layout Build(Random& rng) {
    LayoutBuilder b(3);
    b.AddShared(0, 3, 16);
    b.AddShared(0, 2, 9);  // a partly filled chunk shared by sequences 0 and 1
    b.AddPrivate(0, 16);
    b.AddPrivate(0, 4);
    b.AddPrivate(1, 3);
    b.AddPrivate(2, 16);
    return b.Finish(rng);
  }

  Random rng;
  Layout layout;
  KvArena arena;
  std::vector<float> q, o;
  TppPlanView plan;
  std::vector<unsigned char> workspace;
  TppDecodeParams tpp;
  PagedDecodeParams paged;
  std::vector<int32_t> q_indptr, q_pos, chunk_indptr, chunk_slot, chunk_len;
  PrefillAttentionParams prefill;
  std::vector<float> append_k, append_v;
  int32_t append_slot[1] = {0};
  int32_t append_offset[1] = {3};
  KvAppendParams append;
};

struct Mutation {
  std::string name;
  std::function<KernelStatus(Fixture&)> run;
  KernelStatus want;
};

// The mutated arrays are copies, so the fixture's layout stays intact.
std::vector<Mutation> Mutations() {
  const KernelStatus kInvalid = KernelStatus::kInvalidArgument;
  const KernelStatus kExhausted = KernelStatus::kResourceExhausted;
  auto tpp = [](std::function<void(Fixture&, TppDecodeParams&)> mutate) {
    return [mutate](Fixture& f) {
      TppDecodeParams p = f.tpp;
      mutate(f, p);
      return TppDecode(p);
    };
  };
  std::vector<Mutation> m = {
      {"TppValidCallIsOk", tpp([](Fixture&, TppDecodeParams&) {}), KernelStatus::kOk},
      {"TppNullQuery", tpp([](Fixture&, TppDecodeParams& p) { p.q = nullptr; }), kInvalid},
      {"TppNullOutput", tpp([](Fixture&, TppDecodeParams& p) { p.o = nullptr; }), kInvalid},
      {"TppNullPool", tpp([](Fixture&, TppDecodeParams& p) { p.pool = nullptr; }), kInvalid},
      {"TppNullKeys", tpp([](Fixture&, TppDecodeParams& p) { p.kv.k = nullptr; }), kInvalid},
      {"TppZeroHeadDim", tpp([](Fixture&, TppDecodeParams& p) { p.kv.head_dim = 0; }), kInvalid},
      {"TppNegativeHeadDim", tpp([](Fixture&, TppDecodeParams& p) { p.kv.head_dim = -64; }),
       kInvalid},
      {"TppHeadDimTooLarge", tpp([](Fixture&, TppDecodeParams& p) { p.kv.head_dim = 512; }),
       kInvalid},
      {"TppChunkSizeTooSmall", tpp([](Fixture&, TppDecodeParams& p) { p.kv.chunk_size = 8; }),
       kInvalid},
      {"TppChunkSizeTooLarge", tpp([](Fixture&, TppDecodeParams& p) { p.kv.chunk_size = 512; }),
       kInvalid},
      {"TppQueryHeadsNotMultipleOfKvHeads",
       tpp([](Fixture&, TppDecodeParams& p) { p.num_qo_heads = 3; }), kInvalid},
      {"TppUnknownDtype",
       tpp([](Fixture&, TppDecodeParams& p) { p.kv.dtype = static_cast<DType>(7); }), kInvalid},
      {"TppSharedSlotOutOfRange", tpp([](Fixture& f, TppDecodeParams& p) {
         static std::vector<int32_t> slots;
         slots = f.layout.shared_slot;
         slots[1] = f.layout.num_slots;
         p.plan.shared_slot = slots.data();
       }),
       kInvalid},
      {"TppSharedLenZero", tpp([](Fixture& f, TppDecodeParams& p) {
         static std::vector<int32_t> lens;
         lens = f.layout.shared_len;
         lens[0] = 0;
         p.plan.shared_len = lens.data();
       }),
       kInvalid},
      {"TppSharedLenBeyondChunk", tpp([](Fixture& f, TppDecodeParams& p) {
         static std::vector<int32_t> lens;
         lens = f.layout.shared_len;
         lens[0] = 17;
         p.plan.shared_len = lens.data();
       }),
       kInvalid},
      {"TppSharedByOneRow", tpp([](Fixture& f, TppDecodeParams& p) {
         static std::vector<int32_t> ends;
         ends = f.layout.shared_seq_end;
         ends[1] = 1;
         p.plan.shared_seq_end = ends.data();
       }),
       kInvalid},
      {"TppSharedRangePastBatch", tpp([](Fixture& f, TppDecodeParams& p) {
         static std::vector<int32_t> ends;
         ends = f.layout.shared_seq_end;
         ends[0] = 4;
         p.plan.shared_seq_end = ends.data();
       }),
       kInvalid},
      {"TppPartialRowsOverflow",
       tpp([](Fixture&, TppDecodeParams& p) { p.plan.num_partial_rows -= 1; }), kInvalid},
      {"TppSharedIdNotCoveringSequence", tpp([](Fixture& f, TppDecodeParams& p) {
         // Sequence 2 claims chunk 1, which covers sequences 0 and 1 only.
         static std::vector<int32_t> ids, indptr;
         ids = f.layout.seq_shared_ids;
         indptr = f.layout.seq_shared_indptr;
         ids.insert(ids.begin() + indptr[3], 1);
         indptr[3] += 1;
         p.plan.seq_shared_ids = ids.data();
         p.plan.seq_shared_indptr = indptr.data();
       }),
       kInvalid},
      {"TppSharedIdOutOfRange", tpp([](Fixture& f, TppDecodeParams& p) {
         static std::vector<int32_t> ids;
         ids = f.layout.seq_shared_ids;
         ids[0] = 9;
         p.plan.seq_shared_ids = ids.data();
       }),
       kInvalid},
      {"TppPrivateIndptrDecreasing", tpp([](Fixture& f, TppDecodeParams& p) {
         static std::vector<int32_t> indptr;
         indptr = f.layout.private_indptr;
         indptr[2] = indptr[1] - 1;
         p.plan.private_indptr = indptr.data();
       }),
       kInvalid},
      {"TppPrivateLenZero", tpp([](Fixture& f, TppDecodeParams& p) {
         static std::vector<int32_t> lens;
         lens = f.layout.private_len;
         lens[0] = 0;
         p.plan.private_len = lens.data();
       }),
       kInvalid},
      {"TppNullPrivateIndptr",
       tpp([](Fixture&, TppDecodeParams& p) { p.plan.private_indptr = nullptr; }), kInvalid},
      {"TppWorkspaceTooSmall", tpp([](Fixture&, TppDecodeParams& p) { p.workspace_bytes -= 1; }),
       kExhausted},
      {"TppNullWorkspace", tpp([](Fixture&, TppDecodeParams& p) { p.workspace = nullptr; }),
       kExhausted},
      {"TppPoolScratchTooSmall", tpp([](Fixture&, TppDecodeParams& p) {
         static ThreadPool small(1, 1024);
         p.pool = &small;
       }),
       kExhausted},
      {"PagedValidCallIsOk", [](Fixture& f) { return PagedDecode(f.paged); }, KernelStatus::kOk},
      {"PagedNullIndptr",
       [](Fixture& f) {
         PagedDecodeParams p = f.paged;
         p.block_indptr = nullptr;
         return PagedDecode(p);
       },
       kInvalid},
      {"PagedSlotOutOfRange",
       [](Fixture& f) {
         PagedDecodeParams p = f.paged;
         std::vector<int32_t> slots = f.layout.block_slot;
         slots.back() = -1;
         p.block_slot = slots.data();
         return PagedDecode(p);
       },
       kInvalid},
      {"PagedNegativeBatch",
       [](Fixture& f) {
         PagedDecodeParams p = f.paged;
         p.num_seqs = -1;
         return PagedDecode(p);
       },
       kInvalid},
      {"PrefillValidCallIsOk", [](Fixture& f) { return PrefillAttention(f.prefill); },
       KernelStatus::kOk},
      {"PrefillPositionPastPath",
       [](Fixture& f) {
         PrefillAttentionParams p = f.prefill;
         std::vector<int32_t> pos = f.q_pos;
         pos.back() += 1;
         p.q_pos = pos.data();
         return PrefillAttention(p);
       },
       kInvalid},
      {"PrefillNegativePosition",
       [](Fixture& f) {
         PrefillAttentionParams p = f.prefill;
         std::vector<int32_t> pos = f.q_pos;
         pos[0] = -1;
         p.q_pos = pos.data();
         return PrefillAttention(p);
       },
       kInvalid},
      {"PrefillNullPositions",
       [](Fixture& f) {
         PrefillAttentionParams p = f.prefill;
         p.q_pos = nullptr;
         return PrefillAttention(p);
       },
       kInvalid},
      {"PrefillBadQueryIndptr",
       [](Fixture& f) {
         PrefillAttentionParams p = f.prefill;
         const int32_t indptr[2] = {1, 3};
         p.q_indptr = indptr;
         return PrefillAttention(p);
       },
       kInvalid},
      {"AppendValidCallIsOk", [](Fixture& f) { return KvAppend(f.append); }, KernelStatus::kOk},
      {"AppendOffsetPastChunk",
       [](Fixture& f) {
         KvAppendParams p = f.append;
         const int32_t offset[1] = {16};
         p.offset = offset;
         return KvAppend(p);
       },
       kInvalid},
      {"AppendSlotOutOfRange",
       [](Fixture& f) {
         KvAppendParams p = f.append;
         const int32_t slot[1] = {f.layout.num_slots};
         p.slot = slot;
         return KvAppend(p);
       },
       kInvalid},
      {"AppendNullValues",
       [](Fixture& f) {
         KvAppendParams p = f.append;
         p.v = nullptr;
         return KvAppend(p);
       },
       kInvalid},
      {"CopyToSameSlot", [](Fixture& f) { return KvCopy(f.arena.layer(), 1, 1, 4); }, kInvalid},
      {"CopyTooManyTokens", [](Fixture& f) { return KvCopy(f.arena.layer(), 1, 2, 17); }, kInvalid},
      {"CopySlotOutOfRange",
       [](Fixture& f) { return KvCopy(f.arena.layer(), 1, f.layout.num_slots, 4); }, kInvalid},
      {"NaiveRangePastTokens",
       [](Fixture& f) {
         const std::vector<int64_t> begin = {0}, end = {5};
         NaiveAttentionParams p;
         p.q = f.q.data();
         p.o = f.o.data();
         p.k = f.append_k.data();
         p.v = f.append_v.data();
         p.num_kv_tokens = 4;
         p.kv_begin = begin.data();
         p.kv_end = end.data();
         p.num_queries = 1;
         p.num_qo_heads = 2;
         p.num_kv_heads = 1;
         p.head_dim = 64;
         return NaiveAttention(p);
       },
       kInvalid},
  };
  return m;
}

class KernelErrorTest : public ::testing::TestWithParam<Mutation> {};

TEST_P(KernelErrorTest, ReturnsExpectedStatus) {
  Fixture f;
  const std::vector<float> before = f.o;
  EXPECT_EQ(GetParam().run(f), GetParam().want);
  if (GetParam().want != KernelStatus::kOk && GetParam().name.rfind("Append", 0) != 0 &&
      GetParam().name.rfind("Copy", 0) != 0) {
    EXPECT_EQ(f.o, before) << "a failed call wrote its output";
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, KernelErrorTest, ::testing::ValuesIn(Mutations()),
                         [](const ::testing::TestParamInfo<Mutation>& info) {
                           return info.param.name;
                         });

}  // namespace
}  // namespace chunkserve::kernels::cpu::testing
