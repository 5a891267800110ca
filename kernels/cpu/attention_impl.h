// Internal: the CPU attention kernels, written once against the 8-lane vector interface of
// simd_avx512.h / simd_avx2.h / simd_scalar.h (F8; in the AVX-512 build the hot loops use its
// 16-lane WideOps, see TileOps) and compiled once per ISA.
//
// NO INCLUDE GUARD, on purpose. attention_avx512.cc, attention_avx2.cc and attention_scalar.cc each
// define CHUNKSERVE_CPU_ISA (the namespace: avx512, avx2 or scalar), include their simd header and
// then this file; everything below lands in chunkserve::kernels::cpu::<isa>, helpers in an
// anonymous namespace, so the copies never meet at link time (no ODR clash between code built for
// different ISAs).
//
// Three building blocks:
//  * AttendBlock: up to kBlockRows query rows x a list of chunks, GEMM-shaped (compute-bound). Q^T
//    is packed once (scaled by sm_scale * log2 e); per chunk S^T = K Q^T in token x row register
//    tiles (vectorized over rows; 6 x 16 with AVX2, 8 x 32 or 6 x 64 with AVX-512), an online
//    softmax vectorized over rows, and O += P V in row x dim tiles (6 x 16, 8 x 32); the next K/V
//    are prefetched a few lines per tile. Chunk-first (phase 1) and prefill (with a causal mask)
//    use it.
//  * Sequence units (SeqUnit, AttendChunk): up to kMaxRowsPerPass query heads of one sequence (a
//    GQA group or part of it) x its chunks, streaming (memory-bound): each K/V row is read once, in
//    address order, for all the unit's rows; online softmax per row. Sequence-first (phase 2) and
//    the paged baseline use them, one task per sequence and range of KV heads.
//  * The merge of partial (o, m, l) rows, in base 2 with -inf guards.
// Every kernel is instantiated for each KV dtype and head_dim in {64, 128, any} (kD = 0: run time).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "kernels/attention_params.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/dtype.h"
#include "kernels/cpu/isa_kernels.h"
#include "kernels/cpu/kv_append.h"
#include "kernels/cpu/thread_pool.h"

#ifndef CHUNKSERVE_CPU_ISA
#error "define CHUNKSERVE_CPU_ISA and include the matching simd_<isa>.h before attention_impl.h"
#endif

namespace chunkserve::kernels::cpu::CHUNKSERVE_CPU_ISA {
namespace {

constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2 = 0.693147180559945309f;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// Stride of the sequence-first score rows: a chunk's scores plus room to pad to 8 lanes.
constexpr int kScoreStride = kMaxChunkSize + 8;

inline int RoundUp8(int x) { return (x + 7) & ~7; }

// ---------------------------------------------------------------------------------------------
// KV element access by storage dtype.
// ---------------------------------------------------------------------------------------------
template <DType kDt>
struct Kv;

template <>
struct Kv<DType::kF32> {
  using T = float;
  static F8 Get(const T* p) { return Load(p); }
  static F8 GetPartial(const T* p, int n) { return LoadPartial(p, n); }
  static void Put(T* p, F8 a) { Store(p, a); }
  static void PutScalar(T* p, float x) { *p = x; }
};

template <>
struct Kv<DType::kF16> {
  using T = uint16_t;
  static F8 Get(const T* p) { return LoadF16(p); }
  static F8 GetPartial(const T* p, int n) { return LoadF16Partial(p, n); }
  static void Put(T* p, F8 a) { StoreF16(p, a); }
  static void PutScalar(T* p, float x) { *p = FloatToHalf(x); }
};

template <>
struct Kv<DType::kBF16> {
  using T = uint16_t;
  static F8 Get(const T* p) { return LoadBF16(p); }
  static F8 GetPartial(const T* p, int n) { return LoadBF16Partial(p, n); }
  static void Put(T* p, F8 a) { StoreBF16(p, a); }
  static void PutScalar(T* p, float x) { *p = FloatToBf16(x); }
};

// First element of the (slot, kv_head) block of one layer: chunk_size x head_dim, contiguous.
template <DType kDt>
const typename Kv<kDt>::T* BlockPtr(const void* base, const KvCacheView& kv, int32_t slot,
                                    int32_t kv_head) {
  const int64_t block = static_cast<int64_t>(slot) * kv.num_kv_heads + kv_head;
  return static_cast<const typename Kv<kDt>::T*>(base) + block * kv.chunk_size * kv.head_dim;
}

// Prefetches the next chunk's K and V blocks a few cache lines at a time, spread over the work on
// the current chunk (one Step() per register tile), so the loads overlap compute without a burst
// that would overflow the core's miss buffers. With nothing to prefetch, Step() does nothing.
//
// Into L2, not L1, for every walk: an L1 prefetch holds one of the L1's few miss buffers until its
// line arrives, and a streaming step, with little compute per line, issues a burst of them that
// stalls the loads behind it (a Zen 4 thread streamed fp32 KV at 0.41-0.51 of its read bandwidth
// with L1 prefetches, 0.71-0.82 with L2 ones); the GEMM-shaped tiles, whose blocks the L1 cannot
// hold beside Q^T anyway, run 2-12% faster with 24-32 rows and the same with 48-64
// (kernels/README.md, "Prefetch level"). fp16 KV needs the prefetch (see SequenceTask).
struct PrefetchStream {
  const char* k = nullptr;
  const char* v = nullptr;
  int64_t bytes = 0;  // per block
  int64_t next = 0;   // the next line, counting through k, then v
  int64_t lines_per_step = 0;

  void Reset(const void* kb, const void* vb, int64_t block_bytes, int64_t steps) {
    k = static_cast<const char*>(kb);
    v = static_cast<const char*>(vb);
    bytes = block_bytes;
    next = 0;
    const int64_t lines = 2 * ((block_bytes + 63) / 64);
    lines_per_step = steps > 0 ? (lines + steps - 1) / steps : lines;
  }
  void Step() {
    for (int64_t i = 0; i < lines_per_step && next < 2 * bytes; ++i, next += 64) {
      PrefetchL2(next < bytes ? k + next : v + (next - bytes));
    }
  }
};

// Loads one word of every cache line of [a, a + bytes) and [b, b + bytes), in address order and
// with no dependency between the loads: many misses in flight at once, in an order the hardware
// prefetcher follows (prefetch instructions achieve neither as well on the machines we measured).
inline void TouchLines(const void* a, const void* b, int64_t bytes) {
  const char* pa = static_cast<const char*>(a);
  const char* pb = static_cast<const char*>(b);
  uint32_t sink = 0;
  for (int64_t i = 0; i < bytes; i += 64) {
    uint32_t wa, wb;
    std::memcpy(&wa, pa + i, sizeof(wa));
    std::memcpy(&wb, pb + i, sizeof(wb));
    sink |= wa | wb;
  }
  KeepAlive(sink);
}

// rows x d elements (row stride d) -> fp32 rows of stride ld = RoundUp8(d), zero padded.
template <DType kDt>
void WidenRows(const typename Kv<kDt>::T* src, int rows, int d, float* dst, int ld) {
  const int d8 = d & ~7;
  for (int r = 0; r < rows; ++r) {
    const typename Kv<kDt>::T* s = src + static_cast<int64_t>(r) * d;
    float* o = dst + static_cast<int64_t>(r) * ld;
    for (int j = 0; j < d8; j += 8) Store(o + j, Kv<kDt>::Get(s + j));
    if (d8 < d) Store(o + d8, Kv<kDt>::GetPartial(s + d8, d - d8));
  }
}

// Row r of a tile is query token tok0 + r / group, query head head0 + r % group; Index is its row
// in a [tokens, num_qo_heads] array (q, o, or the partial rows).
struct RowMap {
  int64_t tok0;
  int32_t group;
  int32_t head0;
  int32_t num_qo_heads;
  int64_t Index(int64_t row) const {
    return (tok0 + row / group) * num_qo_heads + head0 + row % group;
  }
};

// ---------------------------------------------------------------------------------------------
// AttendBlock: the GEMM-shaped path (chunk-first phase and prefill).
// ---------------------------------------------------------------------------------------------

// A block task's scratch (carved from the thread's pool scratch; isa_kernels.h's BlockTempFloats /
// BlockHeadFloats must match): temporaries shared by the task's KV heads, then one BlockHead state
// per KV head, so that a task can walk chunk by chunk and, within a chunk, head by head (the
// (slot, head) blocks of a slot are adjacent: one sequential stream, see SequenceTask).
struct BlockTemps {
  float* st;     // [chunk_size][rp]     S^T, then P^T
  float* kc;     // [chunk_size][dp]     K widened to fp32 (fp16/bf16 KV)
  float* vc;     // [chunk_size][dp]     V widened / padded to fp32
  float* alpha;  // [kBlockRows]         this chunk's rescale of o
  float* pos;    // [kBlockRows]         query positions (prefill)
  float* cmax;   // [kBlockRows]         this chunk's largest score per row (unmasked)
};

struct BlockHead {
  float* qt;  // [head_dim][rp]  Q^T, pre-scaled by sm_scale * log2 e, zero rows >= nrows
  float* o;   // [rp][dp]        unnormalized output rows
  float* m;   // [rp]            running max (base 2)
  float* l;   // [rp]            running sum
};

BlockTemps CarveBlockTemps(void* base, int d, int c) {
  const int dp = RoundUp8(d);
  float* p = static_cast<float*>(base);
  BlockTemps t;
  t.st = p;
  p += static_cast<size_t>(c) * kBlockRows;
  t.kc = p;
  p += static_cast<size_t>(c) * dp;
  t.vc = p;
  p += static_cast<size_t>(c) * dp;
  t.alpha = p;
  t.pos = p + kBlockRows;
  t.cmax = p + 2 * kBlockRows;
  return t;
}

// State of the index-th head of a task whose blocks have `rows` rows.
BlockHead CarveBlockHead(void* base, int d, int c, int rows, int index) {
  const int dp = RoundUp8(d);
  const int rp = RoundUp8(rows);
  float* p = static_cast<float*>(base) + BlockTempFloats(d, c) + index * BlockHeadFloats(d, rows);
  BlockHead h;
  h.qt = p;
  h.o = p + static_cast<size_t>(d) * rp;
  h.m = h.o + static_cast<size_t>(rp) * dp;
  h.l = h.m + rp;
  return h;
}

// The hot loops below (register tiles, the block softmax, the streaming dot products and P V) are
// written against an operations struct: V, kLanes, Zero, Load, Store, Broadcast, Mul, Fma,
// LoadF16, LoadBF16, Fold8 (the sum of a vector's 8-lane halves), and the softmax's Set1, Add,
// Sub, Max, Exp2, SelectGe, ReplaceNegInf. NarrowOps is the 8-lane F8 every ISA has; an ISA with
// wider vectors adds WideOps (simd_avx512.h: 16 lanes). TileOps is the widest; 8-lane code takes
// what is left over.
struct NarrowOps {
  using V = F8;
  static constexpr int kLanes = 8;
  static V Zero() { return CHUNKSERVE_CPU_ISA::Zero(); }
  static V Load(const float* p) { return CHUNKSERVE_CPU_ISA::Load(p); }
  static void Store(float* p, V a) { CHUNKSERVE_CPU_ISA::Store(p, a); }
  static V Broadcast(const float* p) { return CHUNKSERVE_CPU_ISA::Broadcast(p); }
  static V Mul(V a, V b) { return CHUNKSERVE_CPU_ISA::Mul(a, b); }
  static V Fma(V a, V b, V c) { return CHUNKSERVE_CPU_ISA::Fma(a, b, c); }
  static V LoadF16(const uint16_t* p) { return CHUNKSERVE_CPU_ISA::LoadF16(p); }
  static V LoadBF16(const uint16_t* p) { return CHUNKSERVE_CPU_ISA::LoadBF16(p); }
  static F8 Fold8(V a) { return a; }
  static V Set1(float x) { return CHUNKSERVE_CPU_ISA::Set1(x); }
  static V Add(V a, V b) { return CHUNKSERVE_CPU_ISA::Add(a, b); }
  static V Sub(V a, V b) { return CHUNKSERVE_CPU_ISA::Sub(a, b); }
  static V Max(V a, V b) { return CHUNKSERVE_CPU_ISA::Max(a, b); }
  static V Exp2(V a) { return CHUNKSERVE_CPU_ISA::Exp2(a); }
  static V SelectGe(V pos, V threshold, V x, V y) {
    return CHUNKSERVE_CPU_ISA::SelectGe(pos, threshold, x, y);
  }
  static V ReplaceNegInf(V a, float value) { return CHUNKSERVE_CPU_ISA::ReplaceNegInf(a, value); }
};

// Tile shapes. S^T tiles: kQkTokens tokens x 2 vectors of rows; P V tiles: kPvRows rows x kPvVecs
// vectors of head dims. With 16 registers (AVX2) 6 x 2 and 6 x 2: 12 accumulators. With 32
// (AVX-512) S^T 8 x 2: a 64-token chunk in eight tiles without an edge tile (12 x 2, 24
// accumulators, left a 4-token one: 5.53-5.59 against 5.41-5.50 ms); a full 64-row block takes
// 6 x 4, 10 loads per 24 FMAs instead of 14. P V 8 x 2: 32 rows in four tiles without an edge
// tile, V read by 4 row tiles instead of 6 (8 x 2 5.5 ms, 6 x 4 5.7, 8 x 3 5.7). All measured on
// one thread, n_p = n_s = 2048.
#ifdef CHUNKSERVE_SIMD_HAS_WIDE_OPS
using TileOps = WideOps;
constexpr int kQkTokens = 8;
constexpr int kPvRows = 8;
constexpr int kPvVecs = 2;
#else
using TileOps = NarrowOps;
constexpr int kQkTokens = 6;
constexpr int kPvRows = 6;
constexpr int kPvVecs = 2;
#endif
constexpr int kQkRows = 2 * TileOps::kLanes;
constexpr int kPvDims = kPvVecs * TileOps::kLanes;
// An S^T tile takes one prefetch Step() per kStepDims head dims: a few lines at a time, spread
// evenly (every 32 dims, 22-line bursts, measured 1-2% slower at full sharing).
constexpr int kStepDims = 8;

// A vector of Ops' width of KV elements, widened to fp32.
template <typename Ops, DType kDt>
inline typename Ops::V KvLoad(const typename Kv<kDt>::T* p) {
  if constexpr (kDt == DType::kF32) {
    return Ops::Load(p);
  } else if constexpr (kDt == DType::kF16) {
    return Ops::LoadF16(p);
  } else {
    return Ops::LoadBF16(p);
  }
}

// Calls f(std::integral_constant<int, n>) for a run-time n in [1, kMax]: a tile template per edge.
template <int kMax, typename F>
inline void WithCount(int n, F&& f) {
  if constexpr (kMax > 1) {
    if (n < kMax) return WithCount<kMax - 1>(n, f);
  }
  f(std::integral_constant<int, kMax>{});
}

// S^T[t][r] for kNt tokens x kNv vectors of rows: broadcast K[t][j], multiply by the row vector
// Q^T[j]. With cmax, also folds the tile's largest score of each row into cmax[r] (the softmax's
// chunk maximum, taken here from the registers instead of by another pass over S^T).
template <typename Ops, int kNt, int kNv, int kD>
inline void QkTile(const float* k, int ldk, const float* qt, int rp, int d_runtime, float* st,
                   float* cmax, PrefetchStream& prefetch) {
  using V = typename Ops::V;
  constexpr int kL = Ops::kLanes;
  const int d = kD > 0 ? kD : d_runtime;
  // With head_dim fixed, K's row stride is head_dim too (fp32 KV, or widened rows of a multiple of
  // 8): a constant stride turns the kNt row addresses into displacements off one register, where
  // kNt pointers would spill to the stack inside the loop.
  const int64_t ld = kD > 0 ? kD : ldk;
  V acc[kNt][kNv];
#pragma GCC unroll 16
  for (int t = 0; t < kNt; ++t) {
#pragma GCC unroll 16
    for (int v = 0; v < kNv; ++v) acc[t][v] = Ops::Zero();
  }
  for (int j0 = 0; j0 < d; j0 += kStepDims) {
    const int j1 = std::min(d, j0 + kStepDims);
    for (int j = j0; j < j1; ++j) {
      V qv[kNv];
#pragma GCC unroll 16
      for (int v = 0; v < kNv; ++v) qv[v] = Ops::Load(qt + static_cast<int64_t>(j) * rp + kL * v);
#pragma GCC unroll 16
      for (int t = 0; t < kNt; ++t) {
        const V kb = Ops::Broadcast(k + t * ld + j);
#pragma GCC unroll 16
        for (int v = 0; v < kNv; ++v) acc[t][v] = Ops::Fma(kb, qv[v], acc[t][v]);
      }
    }
    prefetch.Step();
  }
#pragma GCC unroll 16
  for (int t = 0; t < kNt; ++t) {
#pragma GCC unroll 16
    for (int v = 0; v < kNv; ++v) Ops::Store(st + static_cast<int64_t>(t) * rp + kL * v, acc[t][v]);
  }
  if (cmax != nullptr) {
#pragma GCC unroll 16
    for (int v = 0; v < kNv; ++v) {
      V mx = acc[0][v];
#pragma GCC unroll 16
      for (int t = 1; t < kNt; ++t) mx = Ops::Max(mx, acc[t][v]);
      Ops::Store(cmax + kL * v, Ops::Max(Ops::Load(cmax + kL * v), mx));
    }
  }
}

#ifdef CHUNKSERVE_SIMD_HAS_WIDE_OPS
// Blocks whose row count leaves 8 rows after the 16-lane tiles (rp = 8, 24, 40, 56) take those 8
// rows two head dims per vector (WideOps' pair vectors) instead of 8 lanes wide: half the FMAs.
// AttendBlock stores their Q^T columns interleaved in pairs (InterleavePairs), which needs an even
// head_dim.
inline bool PairRows(int rp, int d) { return rp % 16 == 8 && d % 2 == 0; }

// S^T[t][r] for kNt tokens and the 8 rows at qt (pair layout): lane 2r + p accumulates row r's
// products over dims j = p mod 2, and the two are summed at the end.
template <int kNt, int kD>
inline void QkPairTile(const float* k, int ldk, const float* qt, int rp, int d_runtime, float* st,
                       float* cmax, PrefetchStream& prefetch) {
  using Ops = WideOps;
  using V = Ops::V;
  const int d = kD > 0 ? kD : d_runtime;
  const int64_t ld = kD > 0 ? kD : ldk;
  V acc[kNt];
#pragma GCC unroll 16
  for (int t = 0; t < kNt; ++t) acc[t] = Ops::Zero();
  for (int j0 = 0; j0 < d; j0 += kStepDims) {
    const int j1 = std::min(d, j0 + kStepDims);
    for (int j = j0; j < j1; j += 2) {
      const float* qj = qt + static_cast<int64_t>(j) * rp;
      const V qv = Ops::LoadHalves(qj, qj + rp);
#pragma GCC unroll 16
      for (int t = 0; t < kNt; ++t) acc[t] = Ops::Fma(Ops::BroadcastPair(k + t * ld + j), qv, acc[t]);
    }
    prefetch.Step();
  }
  F8 mx = Ops::SumPairs(acc[0]);
  Store(st, mx);
#pragma GCC unroll 16
  for (int t = 1; t < kNt; ++t) {
    const F8 row = Ops::SumPairs(acc[t]);
    Store(st + static_cast<int64_t>(t) * rp, row);
    mx = Max(mx, row);
  }
  if (cmax != nullptr) Store(cmax, Max(Load(cmax), mx));
}
#endif

// S^T = K Q^T for len tokens and rp (multiple of 8) rows. Token tiles outermost: the K rows of a
// tile stay in L1 while every row tile of Q^T (at most kBlockRows x head_dim, also L1) passes by.
// Rows left over by the wide tiles (8 with AVX-512 when rp is not a multiple of 16) take the pair
// tile (an 8-lane one when head_dim is odd).
// With cmax (rp floats), also leaves each row's largest score of the chunk there.
template <int kD>
void QkBlock(const float* k, int ldk, int len, const float* qt, int rp, int d, float* st,
             float* cmax, PrefetchStream& prefetch) {
  if (cmax != nullptr) std::fill(cmax, cmax + rp, kNegInf);
  if constexpr (TileOps::kLanes == 16) {
    if (rp == 4 * TileOps::kLanes) {  // a full block: 6 tokens x 64 rows, 10 loads per 24 FMAs
      for (int t0 = 0; t0 < len; t0 += 6) {
        WithCount<6>(std::min(6, len - t0), [&](auto tokens) {
          QkTile<TileOps, decltype(tokens)::value, 4, kD>(
              k + static_cast<int64_t>(t0) * ldk, ldk, qt, rp, d,
              st + static_cast<int64_t>(t0) * rp, cmax, prefetch);
        });
      }
      return;
    }
  }
  for (int t0 = 0; t0 < len; t0 += kQkTokens) {
    const int nt = std::min(kQkTokens, len - t0);
    const float* kt = k + static_cast<int64_t>(t0) * ldk;
    for (int r0 = 0; r0 < rp;) {
      float* s = st + static_cast<int64_t>(t0) * rp + r0;
      const float* q0 = qt + r0;
      float* m0 = cmax != nullptr ? cmax + r0 : nullptr;
      const int left = rp - r0;
      WithCount<kQkTokens>(nt, [&](auto tokens) {
        constexpr int kNt = decltype(tokens)::value;
        if (left >= kQkRows) {
          QkTile<TileOps, kNt, 2, kD>(kt, ldk, q0, rp, d, s, m0, prefetch);
        } else if (left >= TileOps::kLanes) {
          QkTile<TileOps, kNt, 1, kD>(kt, ldk, q0, rp, d, s, m0, prefetch);
        } else {
#ifdef CHUNKSERVE_SIMD_HAS_WIDE_OPS
          if (PairRows(rp, d)) {
            QkPairTile<kNt, kD>(kt, ldk, q0, rp, d, s, m0, prefetch);
            return;
          }
#endif
          QkTile<NarrowOps, kNt, 1, kD>(kt, ldk, q0, rp, d, s, m0, prefetch);
        }
      });
      r0 += left >= kQkRows ? kQkRows : (left >= TileOps::kLanes ? TileOps::kLanes : 8);
    }
  }
}

// The prefetch Step()s QkBlock and PvBlock take (their loops, counted).
inline int64_t QkSteps(int len, int rp, int d) {
  const int64_t per_tile = (d + kStepDims - 1) / kStepDims;
  if (TileOps::kLanes == 16 && rp == 4 * TileOps::kLanes) return (len + 5) / 6 * per_tile;
  const int row_tiles = rp / kQkRows + (rp % kQkRows >= TileOps::kLanes ? 1 : 0) +
                        (rp % TileOps::kLanes != 0 ? 1 : 0);
  return static_cast<int64_t>((len + kQkTokens - 1) / kQkTokens) * row_tiles * per_tile;
}
inline int64_t PvSteps(int nrows, int dp) {
  const int dim_tiles = dp / kPvDims + (dp % kPvDims >= TileOps::kLanes ? 1 : 0) +
                        (dp % TileOps::kLanes != 0 ? 1 : 0);
  return static_cast<int64_t>(dim_tiles) * ((nrows + kPvRows - 1) / kPvRows);
}

// Online softmax over one chunk, vectorized over rows: S^T (base-2 scores) becomes P^T, and
// m, l, alpha are updated. Unmasked, cmax[r] holds the chunk's largest score of row r (QkBlock
// leaves it). kMasked: keys at position first_pos + t > pos[r] are dropped (and the maximum taken
// here, over what is left), and a row that has seen no key yet (m = -inf) takes its exponents
// relative to 0, so that exp2(-inf - (-inf)) = NaN never happens: such a row keeps o = 0, l = 0.
// Rows [r, r + Ops::kLanes) of SoftmaxBlock.
template <typename Ops, bool kMasked>
inline void SoftmaxRows(int r, float* st, int len, int rp, float* m, float* l, float* alpha,
                        const float* pos, int first_pos, const float* cmax) {
  using V = typename Ops::V;
  V mc;
  if constexpr (kMasked) {
    const V neg_inf = Ops::Set1(kNegInf);
    const V p = Ops::Load(pos + r);
    mc = neg_inf;
    for (int t = 0; t < len; ++t) {
      float* s = st + static_cast<int64_t>(t) * rp + r;
      const V masked =
          Ops::SelectGe(p, Ops::Set1(static_cast<float>(first_pos + t)), Ops::Load(s), neg_inf);
      Ops::Store(s, masked);
      mc = Ops::Max(mc, masked);
    }
  } else {
    mc = Ops::Load(cmax + r);
  }
  const V m_old = Ops::Load(m + r);
  const V m_new = Ops::Max(m_old, mc);
  const V m_use = kMasked ? Ops::ReplaceNegInf(m_new, 0.0f) : m_new;
  const V a = Ops::Exp2(Ops::Sub(m_old, m_use));  // m_old = -inf -> 0
  // Four running sums: one would make the pass wait on the adds' latency.
  V sum[4] = {Ops::Zero(), Ops::Zero(), Ops::Zero(), Ops::Zero()};
  int t = 0;
  for (; t + 4 <= len; t += 4) {
#pragma GCC unroll 4
    for (int u = 0; u < 4; ++u) {
      float* s = st + static_cast<int64_t>(t + u) * rp + r;
      const V p = Ops::Exp2(Ops::Sub(Ops::Load(s), m_use));
      Ops::Store(s, p);
      sum[u] = Ops::Add(sum[u], p);
    }
  }
  for (; t < len; ++t) {
    float* s = st + static_cast<int64_t>(t) * rp + r;
    const V p = Ops::Exp2(Ops::Sub(Ops::Load(s), m_use));
    Ops::Store(s, p);
    sum[0] = Ops::Add(sum[0], p);
  }
  const V total = Ops::Add(Ops::Add(sum[0], sum[1]), Ops::Add(sum[2], sum[3]));
  Ops::Store(l + r, Ops::Fma(Ops::Load(l + r), a, total));
  Ops::Store(m + r, m_new);
  Ops::Store(alpha + r, a);
}

#ifdef CHUNKSERVE_SIMD_HAS_WIDE_OPS
// SoftmaxRows (unmasked) for the 8 rows at r left over by the 16-lane ones, two tokens per vector
// (WideOps::LoadHalves) instead of 8 lanes wide.
inline void SoftmaxPairRows(int r, float* st, int len, int rp, float* m, float* l, float* alpha,
                            const float* cmax) {
  using Ops = WideOps;
  using V = Ops::V;
  const F8 m_old = Load(m + r);
  const F8 m_new = Max(m_old, Load(cmax + r));
  const F8 a = Exp2(Sub(m_old, m_new));  // m_old = -inf -> 0
  const V m2 = Ops::Dup8(m_new);
  V sum[2] = {Ops::Zero(), Ops::Zero()};
  int t = 0;
  for (; t + 4 <= len; t += 4) {
#pragma GCC unroll 2
    for (int u = 0; u < 2; ++u) {
      float* s = st + static_cast<int64_t>(t + 2 * u) * rp + r;
      const V p = Ops::Exp2(Ops::Sub(Ops::LoadHalves(s, s + rp), m2));
      Ops::StoreHalves(s, s + rp, p);
      sum[u] = Ops::Add(sum[u], p);
    }
  }
  for (; t + 2 <= len; t += 2) {
    float* s = st + static_cast<int64_t>(t) * rp + r;
    const V p = Ops::Exp2(Ops::Sub(Ops::LoadHalves(s, s + rp), m2));
    Ops::StoreHalves(s, s + rp, p);
    sum[0] = Ops::Add(sum[0], p);
  }
  F8 total = Ops::Fold8(Ops::Add(sum[0], sum[1]));
  if (t < len) {
    float* s = st + static_cast<int64_t>(t) * rp + r;
    const F8 p = Exp2(Sub(Load(s), m_new));
    Store(s, p);
    total = Add(total, p);
  }
  Store(l + r, Fma(Load(l + r), a, total));
  Store(m + r, m_new);
  Store(alpha + r, a);
}
#endif

template <bool kMasked>
void SoftmaxBlock(float* st, int len, int rp, float* m, float* l, float* alpha, const float* pos,
                  int first_pos, const float* cmax) {
  int r = 0;
  for (; r + TileOps::kLanes <= rp; r += TileOps::kLanes) {
    SoftmaxRows<TileOps, kMasked>(r, st, len, rp, m, l, alpha, pos, first_pos, cmax);
  }
#ifdef CHUNKSERVE_SIMD_HAS_WIDE_OPS
  if (!kMasked && r < rp) {
    SoftmaxPairRows(r, st, len, rp, m, l, alpha, cmax);
    return;
  }
#endif
  for (; r < rp; r += 8)
    SoftmaxRows<NarrowOps, kMasked>(r, st, len, rp, m, l, alpha, pos, first_pos, cmax);
}

// O[kNr rows][kNv vectors of dims] = O * alpha + P V over len tokens; P^T columns are the rows.
template <typename Ops, int kNr, int kNv>
inline void PvTile(const float* pt, int rp, const float* v, int ldv, int len, float* o, int ldo,
                   const float* alpha) {
  using V = typename Ops::V;
  constexpr int kL = Ops::kLanes;
  V acc[kNr][kNv];
#pragma GCC unroll 16
  for (int r = 0; r < kNr; ++r) {
    const V a = Ops::Broadcast(alpha + r);
#pragma GCC unroll 16
    for (int j = 0; j < kNv; ++j)
      acc[r][j] = Ops::Mul(Ops::Load(o + static_cast<int64_t>(r) * ldo + kL * j), a);
  }
  for (int t = 0; t < len; ++t) {
    V vv[kNv];
#pragma GCC unroll 16
    for (int j = 0; j < kNv; ++j) vv[j] = Ops::Load(v + static_cast<int64_t>(t) * ldv + kL * j);
#pragma GCC unroll 16
    for (int r = 0; r < kNr; ++r) {
      const V p = Ops::Broadcast(pt + static_cast<int64_t>(t) * rp + r);
#pragma GCC unroll 16
      for (int j = 0; j < kNv; ++j) acc[r][j] = Ops::Fma(p, vv[j], acc[r][j]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < kNr; ++r) {
#pragma GCC unroll 16
    for (int j = 0; j < kNv; ++j) Ops::Store(o + static_cast<int64_t>(r) * ldo + kL * j, acc[r][j]);
  }
}

// O = O * alpha + P V for nrows rows and dp (multiple of 8) dims: dim tiles of kPvDims, then one
// wide vector, then 8 lanes (AVX-512 when dp is not a multiple of 16).
void PvBlock(const float* pt, int rp, const float* v, int ldv, int len, int nrows, int dp, float* o,
             const float* alpha, PrefetchStream& prefetch) {
  for (int d0 = 0; d0 < dp;) {
    const int left = dp - d0;
    for (int r0 = 0; r0 < nrows; r0 += kPvRows) {
      prefetch.Step();
      const int nr = std::min(kPvRows, nrows - r0);
      float* ot = o + static_cast<int64_t>(r0) * dp + d0;
      const float* p0 = pt + r0;
      const float* v0 = v + d0;
      WithCount<kPvRows>(nr, [&](auto rows) {
        constexpr int kNr = decltype(rows)::value;
        if (left >= kPvDims) {
          PvTile<TileOps, kNr, kPvVecs>(p0, rp, v0, ldv, len, ot, dp, alpha + r0);
        } else if (left >= TileOps::kLanes) {
          PvTile<TileOps, kNr, 1>(p0, rp, v0, ldv, len, ot, dp, alpha + r0);
        } else {
          PvTile<NarrowOps, kNr, 1>(p0, rp, v0, ldv, len, ot, dp, alpha + r0);
        }
      });
    }
    d0 += left >= kPvDims ? kPvDims : (left >= TileOps::kLanes ? TileOps::kLanes : 8);
  }
}

// The chunks a tile attends to: indices [begin, end) into slot[] / len[]; for prefill the k-th
// entry covers positions [k * chunk_size, k * chunk_size + len).
struct ChunkRange {
  const int32_t* slot;
  const int32_t* len;
  int32_t begin;
  int32_t end;
};

// Rows [row0, row0 + nrows) (nrows <= kBlockRows) attend to `chunks`, for each KV head h in
// [h0, h1): the rows' query heads are map's with head0 = h * group. Chunk by chunk, head by head.
// Leaves head h's unnormalized output and softmax state (base 2) in CarveBlockHead(.., h - h0).
// kCausal: query token i (an index into q_pos) sees positions <= q_pos[i].
template <DType kDt, int kD, bool kCausal>
void AttendBlock(const KvCacheView& kv, int32_t h0, int32_t h1, const ChunkRange& chunks,
                 const float* q, RowMap map, int64_t row0, int nrows, float scale2,
                 const int32_t* q_pos, void* scratch) {
  using T = typename Kv<kDt>::T;
  const int d = kD > 0 ? kD : kv.head_dim;
  const int dp = RoundUp8(d);
  const int c = kv.chunk_size;
  const int rp = RoundUp8(nrows);
  const BlockTemps s = CarveBlockTemps(scratch, d, c);

  for (int32_t h = h0; h < h1; ++h) {
    const BlockHead b = CarveBlockHead(scratch, d, c, nrows, h - h0);
    map.head0 = h * map.group;
    // Q^T, scaled, in 8 x 8 blocks; rows past nrows are zero so their (unused) scores stay finite.
    const F8 scale = Set1(scale2);
    const int d8 = d & ~7;
    int r0 = 0;
    for (; r0 + 8 <= nrows; r0 += 8) {
      const float* qrows[8];
      for (int i = 0; i < 8; ++i) qrows[i] = q + map.Index(row0 + r0 + i) * d;
      for (int j0 = 0; j0 < d8; j0 += 8) {
        F8 blk[8];
#pragma GCC unroll 8
        for (int i = 0; i < 8; ++i) blk[i] = Mul(Load(qrows[i] + j0), scale);
        Transpose8(blk);
#pragma GCC unroll 8
        for (int i = 0; i < 8; ++i) Store(b.qt + static_cast<int64_t>(j0 + i) * rp + r0, blk[i]);
      }
      for (int j = d8; j < d; ++j) {
        for (int i = 0; i < 8; ++i)
          b.qt[static_cast<int64_t>(j) * rp + r0 + i] = qrows[i][j] * scale2;
      }
    }
    for (int r = r0; r < nrows; ++r) {
      const float* qrow = q + map.Index(row0 + r) * d;
      for (int j = 0; j < d; ++j) b.qt[static_cast<int64_t>(j) * rp + r] = qrow[j] * scale2;
    }
    for (int r = nrows; r < rp; ++r) {
      for (int j = 0; j < d; ++j) b.qt[static_cast<int64_t>(j) * rp + r] = 0.0f;
    }
#ifdef CHUNKSERVE_SIMD_HAS_WIDE_OPS
    if (PairRows(rp, d)) {
      for (int j = 0; j < d; j += 2) {
        float* qj = b.qt + static_cast<int64_t>(j) * rp + rp - 8;
        WideOps::InterleavePairs(qj, qj + rp);
      }
    }
#endif
    for (int r = 0; r < rp; ++r) {
      b.m[r] = kNegInf;
      b.l[r] = 0.0f;
    }
    std::memset(b.o, 0, sizeof(float) * static_cast<size_t>(nrows) * dp);
  }

  int pos_min = 0;
  int pos_max = 0;
  if (kCausal) {
    pos_min = std::numeric_limits<int>::max();
    for (int r = 0; r < nrows; ++r) {
      const int p = q_pos[map.tok0 + (row0 + r) / map.group];
      s.pos[r] = static_cast<float>(p);
      pos_min = std::min(pos_min, p);
      pos_max = std::max(pos_max, p);
    }
    for (int r = nrows; r < rp; ++r) s.pos[r] = 3.0e38f;  // padding rows see everything
  }

  for (int32_t i = chunks.begin; i < chunks.end; ++i) {
    const int len = chunks.len[i];
    const int first_pos = kCausal ? (i - chunks.begin) * c : 0;
    if (kCausal && first_pos > pos_max) break;  // later chunks are in every row's future
    const bool masked = kCausal && first_pos + len - 1 > pos_min;
    for (int32_t h = h0; h < h1; ++h) {
      const BlockHead b = CarveBlockHead(scratch, d, c, nrows, h - h0);
      const T* kb = BlockPtr<kDt>(kv.k, kv, chunks.slot[i], h);
      const T* vb = BlockPtr<kDt>(kv.v, kv, chunks.slot[i], h);
      // Prefetch the blocks worked on next (the next head's, or across the jump to the next
      // chunk's slot its first head's) while working on these: with few rows the work per block
      // is short and its loads would otherwise wait for DRAM block after block.
      PrefetchStream prefetch;
      const bool next_head = h + 1 < h1;
      if (next_head || (i + 1 < chunks.end && !(kCausal && first_pos + c > pos_max))) {
        const int64_t steps = QkSteps(len, rp, d) + PvSteps(nrows, dp);
        const int32_t next_slot = next_head ? chunks.slot[i] : chunks.slot[i + 1];
        const int32_t next_h = next_head ? h + 1 : h0;
        const int next_len = next_head ? len : chunks.len[i + 1];
        prefetch.Reset(BlockPtr<kDt>(kv.k, kv, next_slot, next_h),
                       BlockPtr<kDt>(kv.v, kv, next_slot, next_h),
                       static_cast<int64_t>(next_len) * d * sizeof(T), steps);
      }

      // The tiles below walk K and V column-wise, which the hardware prefetcher does not follow;
      // the software prefetch above brings every block but the task's first, which is read in
      // address order first (full sharing, one thread: 3% faster). Tiles of at most 16 rows did
      // that for every block while the prefetch went to L1; with the L2 one they take 0.78-1.01x
      // the time without it (kernels/README.md, "Prefetch level").
      if (i == chunks.begin && h == h0) {
        TouchLines(kb, vb, static_cast<int64_t>(len) * d * sizeof(T));
      }
      const float* kf;
      int ldk;
      if constexpr (kDt == DType::kF32) {
        kf = kb;
        ldk = d;
      } else {
        WidenRows<kDt>(kb, len, d, s.kc, dp);
        kf = s.kc;
        ldk = dp;
      }
      QkBlock<kD>(kf, ldk, len, b.qt, rp, d, s.st, masked ? nullptr : s.cmax, prefetch);
      if (masked) {
        SoftmaxBlock<true>(s.st, len, rp, b.m, b.l, s.alpha, s.pos, first_pos, nullptr);
      } else {
        SoftmaxBlock<false>(s.st, len, rp, b.m, b.l, s.alpha, nullptr, 0, s.cmax);
      }
      const float* vf;
      int ldv;
      if (kDt == DType::kF32 && d == dp) {
        vf = reinterpret_cast<const float*>(vb);
        ldv = d;
      } else {
        WidenRows<kDt>(vb, len, d, s.vc, dp);
        vf = s.vc;
        ldv = dp;
      }
      PvBlock(s.st, rp, vf, ldv, len, nrows, dp, b.o, s.alpha, prefetch);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// AttendSequence: the streaming path (sequence-first phase and the paged baseline).
// ---------------------------------------------------------------------------------------------

// The streaming kernels below read each K and V block strictly in address order, token row after
// token row. On the machines we measured (Zen 4), the hardware prefetcher follows such a stream at
// full bandwidth, but loses it when a loop walks several rows of the same block side by side
// (column-tiled register blocking): that pattern ran at a third of the bandwidth. Register tiles
// are therefore over query rows only, and each token's dot products are reduced on the spot.

// Scores of kNr query rows against kNt consecutive token rows of K (kNr * kNt <= 8 accumulators,
// one per (row, token), reduced together at the end). Tokens are walked one after the other; the
// empty asm between them keeps the compiler from interleaving rows of K (see above).
template <DType kDt, int kD, int kNr, int kNt>
inline void DotGroup(const typename Kv<kDt>::T* k, int d_runtime, const float* qs, int dp,
                     float* sc) {
  using W = TileOps;
  const int d = kD > 0 ? kD : d_runtime;
  const int dw = d - d % W::kLanes;  // wide vectors, then 8 lanes, then a partial vector
  const int d8 = d & ~7;
  typename W::V aw[kNr * kNt];
  F8 a[kNr * kNt];
#pragma GCC unroll 16
  for (int i = 0; i < kNr * kNt; ++i) {
    aw[i] = W::Zero();
    a[i] = Zero();
  }
#pragma GCC unroll 16
  for (int t = 0; t < kNt; ++t) {
    const typename Kv<kDt>::T* kt = k + static_cast<int64_t>(t) * d;
    for (int j = 0; j < dw; j += W::kLanes) {
      const typename W::V kv = KvLoad<W, kDt>(kt + j);
#pragma GCC unroll 16
      for (int r = 0; r < kNr; ++r) {
        aw[r * kNt + t] = W::Fma(W::Load(qs + r * dp + j), kv, aw[r * kNt + t]);
      }
    }
    for (int j = dw; j < d8; j += 8) {  // AVX-512 with head_dim % 16 >= 8
      const F8 kv = Kv<kDt>::Get(kt + j);
#pragma GCC unroll 16
      for (int r = 0; r < kNr; ++r) a[r * kNt + t] = Fma(Load(qs + r * dp + j), kv, a[r * kNt + t]);
    }
    if (kD == 0 && d8 < d) {  // head_dim % 8 != 0: a partial last vector (qs is zero padded)
      const F8 kv = Kv<kDt>::GetPartial(kt + d8, d - d8);
#pragma GCC unroll 16
      for (int r = 0; r < kNr; ++r)
        a[r * kNt + t] = Fma(Load(qs + r * dp + d8), kv, a[r * kNt + t]);
    }
    CompilerBarrier();
  }
#pragma GCC unroll 16
  for (int i = 0; i < kNr * kNt; ++i) a[i] = Add(a[i], W::Fold8(aw[i]));
  alignas(32) float sums[8];
  if constexpr (kNr * kNt == 8) {
    Store(sums, ReduceAdd8(a));
  } else if constexpr (kNr * kNt == 4) {
    ReduceAdd4(a, sums);
  } else {
#pragma GCC unroll 16
    for (int i = 0; i < kNr * kNt; ++i) sums[i] = ReduceAdd(a[i]);
  }
#pragma GCC unroll 16
  for (int r = 0; r < kNr; ++r) {
#pragma GCC unroll 16
    for (int t = 0; t < kNt; ++t) sc[r * kScoreStride + t] = sums[r * kNt + t];
  }
}

// Scores of kNr query rows against len token rows of K, in address order.
template <DType kDt, int kD, int kNr>
void DotLinear(const typename Kv<kDt>::T* k, int len, int d, const float* qs, int dp, float* sc,
               PrefetchStream& prefetch) {
  constexpr int kNt = 8 / kNr;
  int t = 0;
  for (; t + kNt <= len; t += kNt) {
    prefetch.Step();
    DotGroup<kDt, kD, kNr, kNt>(k + static_cast<int64_t>(t) * d, d, qs, dp, sc + t);
  }
  for (; t < len; ++t)
    DotGroup<kDt, kD, kNr, 1>(k + static_cast<int64_t>(t) * d, d, qs, dp, sc + t);
}

// Rows per pass of PvRegisters: the rows whose whole accumulators fit in 16 registers (0: none).
template <int kD>
constexpr int PvRegisterRows() {
  if constexpr (TileOps::kLanes == 16 && kD > 0 && kD % 16 == 0 && kD / 16 <= 8) {
    return 16 / (kD / 16);
  } else {
    return 0;
  }
}

// Rows per PvRegisters pass over V (4 at head dim 64, 2 at 128), or 0 where AttendChunk takes
// PvLinear, one pass per group of rows.
template <int kD>
constexpr int PvPassRows() {
  return PvRegisterRows<kD>() >= 4 ? 4 : (PvRegisterRows<kD>() >= 2 ? 2 : 0);
}

// PvLinear for kNr <= PvRegisterRows<kD>() rows with the accumulators in registers (AVX-512, head
// dims 64 and 128): V still read row after row, and no load and store of acc per FMA.
template <DType kDt, int kD, int kNr>
void PvRegisters(const float* p, const typename Kv<kDt>::T* v, int len, float* acc, int dp,
                 const float* alpha, PrefetchStream& prefetch) {
  using W = TileOps;
  constexpr int kV = kD / W::kLanes;
  typename W::V a[kNr][kV];
#pragma GCC unroll 16
  for (int r = 0; r < kNr; ++r) {
    const typename W::V s = W::Broadcast(alpha + r);
#pragma GCC unroll 16
    for (int j = 0; j < kV; ++j) a[r][j] = W::Mul(W::Load(acc + r * dp + j * W::kLanes), s);
  }
  for (int t = 0; t < len; ++t) {
    if ((t & 7) == 0) prefetch.Step();
    const typename Kv<kDt>::T* vt = v + static_cast<int64_t>(t) * kD;
    typename W::V pw[kNr];
#pragma GCC unroll 16
    for (int r = 0; r < kNr; ++r) pw[r] = W::Broadcast(p + r * kScoreStride + t);
#pragma GCC unroll 16
    for (int j = 0; j < kV; ++j) {
      const typename W::V vv = KvLoad<W, kDt>(vt + j * W::kLanes);
#pragma GCC unroll 16
      for (int r = 0; r < kNr; ++r) a[r][j] = W::Fma(pw[r], vv, a[r][j]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < kNr; ++r) {
#pragma GCC unroll 16
    for (int j = 0; j < kV; ++j) W::Store(acc + r * dp + j * W::kLanes, a[r][j]);
  }
}

// acc[r] = acc[r] * alpha[r] + sum_t p[r][t] V[t] for kNr (<= 4) rows, V read row after row. The
// accumulators stay in L1: a 128-dim row is 16 vectors, more than the registers left, and keeping
// a column tile in registers instead would walk V column-wise. (With AVX-512 and head dims 64 or
// 128, AttendChunk takes PvRegisters instead.)
template <DType kDt, int kD, int kNr>
void PvLinear(const float* p, const typename Kv<kDt>::T* v, int len, int d_runtime, float* acc,
              int dp, const float* alpha, PrefetchStream& prefetch) {
  using W = TileOps;
  const int d = kD > 0 ? kD : d_runtime;
  const int dw = d - d % W::kLanes;  // wide vectors, then 8 lanes, then a partial vector
  const int d8 = d & ~7;
#pragma GCC unroll 16
  for (int r = 0; r < kNr; ++r) {
    const F8 a = Set1(alpha[r]);
    for (int j = 0; j < dp; j += 8) Store(acc + r * dp + j, Mul(Load(acc + r * dp + j), a));
  }
  for (int t = 0; t < len; ++t) {
    if ((t & 7) == 0) prefetch.Step();
    const typename Kv<kDt>::T* vt = v + static_cast<int64_t>(t) * d;
    typename W::V pw[kNr];
#pragma GCC unroll 16
    for (int r = 0; r < kNr; ++r) pw[r] = W::Broadcast(p + r * kScoreStride + t);
#pragma GCC unroll 16
    for (int j = 0; j < dw; j += W::kLanes) {
      const typename W::V vv = KvLoad<W, kDt>(vt + j);
#pragma GCC unroll 16
      for (int r = 0; r < kNr; ++r) {
        W::Store(acc + r * dp + j, W::Fma(pw[r], vv, W::Load(acc + r * dp + j)));
      }
    }
    if (dw < d8 || (kD == 0 && d8 < d)) {
      F8 pb[kNr];
#pragma GCC unroll 16
      for (int r = 0; r < kNr; ++r) pb[r] = Broadcast(p + r * kScoreStride + t);
      for (int j = dw; j < d8; j += 8) {  // AVX-512 with head_dim % 16 >= 8
        const F8 vv = Kv<kDt>::Get(vt + j);
#pragma GCC unroll 16
        for (int r = 0; r < kNr; ++r)
          Store(acc + r * dp + j, Fma(pb[r], vv, Load(acc + r * dp + j)));
      }
      if (kD == 0 && d8 < d) {
        const F8 vv = Kv<kDt>::GetPartial(vt + d8, d - d8);
#pragma GCC unroll 16
        for (int r = 0; r < kNr; ++r)
          Store(acc + r * dp + d8, Fma(pb[r], vv, Load(acc + r * dp + d8)));
      }
    }
  }
}

// Where a sequence's shared partials are (TPP phase 2); plan == nullptr for the paged baseline.
struct PartialSource {
  const TppPlanView* plan = nullptr;
  const float* o_part = nullptr;
  const float* m_part = nullptr;
  const float* l_part = nullptr;
  const uint8_t* seg_first = nullptr;  // TppWorkspace::seg_first
};

// A streaming unit: up to kMaxRowsPerPass query rows, rows [row0, row0 + nr) of `map`, all using
// one KV head. In the sequence-first phase they are the query heads of one GQA group of one
// sequence; in the chunk-first phase, when a shared chunk has few rows, the sharing sequences'
// rows. Its state lives in the thread's scratch (SequenceUnitFloats floats, see isa_kernels.h)
// while the task walks its chunks.
struct SeqUnit {
  float* qs;   // [kMaxRowsPerPass][dp] queries * sm_scale * log2 e, zero padded
  float* acc;  // [kMaxRowsPerPass][dp] unnormalized output
  float* m;    // [kMaxRowsPerPass] running max, base 2
  float* l;    // [kMaxRowsPerPass] running sum
  RowMap map;
  int64_t row0;
  int nr;
};

SeqUnit CarveSeqUnit(float* base, int dp, const RowMap& map, int64_t row0, int nr) {
  SeqUnit u;
  u.qs = base;
  u.acc = base + kMaxRowsPerPass * dp;
  u.m = base + 2 * kMaxRowsPerPass * dp;
  u.l = u.m + kMaxRowsPerPass;
  u.map = map;
  u.row0 = row0;
  u.nr = nr;
  return u;
}

// Moves the unit's output state (acc, m, l) to its rows of the workspace's sequence state, which
// outlives the task (TppWorkspace::seq_*); its queries stay in the thread's scratch.
void PointAtSequenceState(SeqUnit* u, const TppWorkspace& ws, int dp) {
  const int64_t row = u->map.Index(u->row0);
  u->acc = ws.seq_o + row * dp;
  u->m = ws.seq_m + row;
  u->l = ws.seq_l + row;
}

void InitUnit(const SeqUnit& u, const float* q, int d, int dp, float scale2) {
  for (int r = 0; r < u.nr; ++r) {
    const float* qrow = q + u.map.Index(u.row0 + r) * d;
    for (int j = 0; j < d; ++j) u.qs[r * dp + j] = qrow[j] * scale2;
    for (int j = d; j < dp; ++j) u.qs[r * dp + j] = 0.0f;
    for (int j = 0; j < dp; ++j) u.acc[r * dp + j] = 0.0f;
    u.m[r] = kNegInf;
    u.l[r] = 0.0f;
  }
}

// Merges the chunk-first partials of the sequence's shared chunks (paper Eq. 2), in base 2: one per
// segment, in the partial rows of its first chunk (the other chunks' rows are not written). An
// empty partial (m = -inf) is skipped without touching its o; m = -inf on our side gives weight
// exp2(-inf) = 0.
void MergePartials(const SeqUnit& u, const PartialSource& partials, int32_t seq,
                   int32_t num_qo_heads, int dp) {
  const TppPlanView& plan = *partials.plan;
  for (int32_t j = plan.seq_shared_indptr[seq]; j < plan.seq_shared_indptr[seq + 1]; ++j) {
    const int32_t i = plan.seq_shared_ids[j];
    if (partials.seg_first[i] == 0) continue;
    // The unit's rows are consecutive query heads of `seq`; their partial rows are consecutive.
    const int64_t prow =
        (static_cast<int64_t>(plan.shared_partial_offset[i]) + seq - plan.shared_seq_begin[i]) *
            num_qo_heads +
        (u.map.Index(u.row0) - static_cast<int64_t>(seq) * num_qo_heads);
    for (int r = 0; r < u.nr; ++r) {
      const float pm_nat = partials.m_part[prow + r];
      if (pm_nat == kNegInf) continue;
      const float pm = pm_nat * kLog2e;
      const float m_new = std::max(u.m[r], pm);
      const float wa = std::exp2(u.m[r] - m_new);
      const float wb = std::exp2(pm - m_new);
      const float* po = partials.o_part + (prow + r) * dp;
      const F8 va = Set1(wa);
      const F8 vb = Set1(wb);
      float* acc = u.acc + r * dp;
      for (int k = 0; k < dp; k += 8) Store(acc + k, Fma(Load(po + k), vb, Mul(Load(acc + k), va)));
      u.l[r] = u.l[r] * wa + partials.l_part[prow + r] * wb;
      u.m[r] = m_new;
    }
  }
}

// The Step()s AttendChunk takes for a unit of nr rows and a chunk of len tokens: per group of 4, 2
// or 1 rows, one per DotLinear group of 8 / rows tokens and one per 8 tokens of PvLinear. A
// prefetch spread over fewer steps than are taken comes in bursts (with 4 rows, 64 lines every
// 2 tokens where 16 were meant).
template <int kD>
int64_t UnitSteps(int nr, int len) {
  constexpr int kPass = PvPassRows<kD>();
  int64_t steps = 0;
  for (int r = 0; r < nr;) {
    const int rows = nr - r >= 4 ? 4 : (nr - r >= 2 ? 2 : 1);
    const int pv_passes = kPass > 0 ? (rows + kPass - 1) / kPass : 1;  // walks of V
    steps += len / (8 / rows) + pv_passes * ((len + 7) / 8);
    r += rows;
  }
  return steps;
}

// One chunk (len tokens of the unit's KV head) into the unit's online softmax.
template <DType kDt, int kD>
void AttendChunk(const SeqUnit& u, const typename Kv<kDt>::T* kb, const typename Kv<kDt>::T* vb,
                 int len, int d_runtime, PrefetchStream& prefetch) {
  const int d = kD > 0 ? kD : d_runtime;
  const int dp = RoundUp8(d);
  alignas(64) float sc[kMaxRowsPerPass * kScoreStride];
  float alpha[kMaxRowsPerPass];

  for (int r = 0; r < u.nr;) {
    const int rows = u.nr - r >= 4 ? 4 : (u.nr - r >= 2 ? 2 : 1);
    const float* qr = u.qs + r * dp;
    float* sr = sc + r * kScoreStride;
    if (rows == 4) {
      DotLinear<kDt, kD, 4>(kb, len, d, qr, dp, sr, prefetch);
    } else if (rows == 2) {
      DotLinear<kDt, kD, 2>(kb, len, d, qr, dp, sr, prefetch);
    } else {
      DotLinear<kDt, kD, 1>(kb, len, d, qr, dp, sr, prefetch);
    }
    r += rows;
  }

  const int len8 = RoundUp8(len);
  for (int r = 0; r < u.nr; ++r) {
    float* sr = sc + r * kScoreStride;
    for (int t = len; t < len8; ++t) sr[t] = kNegInf;
    F8 mv = Set1(kNegInf);
    for (int t = 0; t < len8; t += 8) mv = Max(mv, Load(sr + t));
    const float m_new = std::max(u.m[r], ReduceMax(mv));  // finite: len >= 1
    const F8 mn = Set1(m_new);
    F8 sum = Zero();
    for (int t = 0; t < len8; t += 8) {
      const F8 p = Exp2(Sub(Load(sr + t), mn));
      Store(sr + t, p);
      sum = Add(sum, p);
    }
    alpha[r] = std::exp2(u.m[r] - m_new);  // m = -inf before the first key: 0
    u.l[r] = u.l[r] * alpha[r] + ReduceAdd(sum);
    u.m[r] = m_new;
  }

  for (int r = 0; r < u.nr;) {
    const int rows = u.nr - r >= 4 ? 4 : (u.nr - r >= 2 ? 2 : 1);
    const float* pr = sc + r * kScoreStride;
    if constexpr (PvPassRows<kD>() > 0) {
      // Passes of up to PvPassRows rows over V (one pass for 2 rows at head dim 128).
      const int pass = std::min(rows, PvPassRows<kD>());
      for (int q = 0; q < rows; q += pass) {
        WithCount<PvPassRows<kD>()>(pass, [&](auto n) {
          PvRegisters<kDt, kD, decltype(n)::value>(
              pr + q * kScoreStride, vb, len, u.acc + (r + q) * dp, dp, alpha + r + q, prefetch);
        });
      }
      r += rows;
      continue;
    }
    if (rows == 4) {
      PvLinear<kDt, kD, 4>(pr, vb, len, d, u.acc + r * dp, dp, alpha + r, prefetch);
    } else if (rows == 2) {
      PvLinear<kDt, kD, 2>(pr, vb, len, d, u.acc + r * dp, dp, alpha + r, prefetch);
    } else {
      PvLinear<kDt, kD, 1>(pr, vb, len, d, u.acc + r * dp, dp, alpha + r, prefetch);
    }
    r += rows;
  }
}

// An output row: the unnormalized acc (d values) over l; no keys at all (l = 0) gives zeros.
inline void WriteOutputRow(const float* acc, float l, float* orow, int d) {
  const int d8 = d & ~7;
  const F8 inv = Set1(l > 0.0f ? 1.0f / l : 0.0f);
  for (int j = 0; j < d8; j += 8) Store(orow + j, Mul(Load(acc + j), inv));
  if (d8 < d) StorePartial(orow + d8, Mul(Load(acc + d8), inv), d - d8);
}

void FinishUnit(const SeqUnit& u, float* o, int d, int dp) {
  for (int r = 0; r < u.nr; ++r) {
    WriteOutputRow(u.acc + r * dp, u.l[r], o + u.map.Index(u.row0 + r) * d, d);
  }
}

// ---------------------------------------------------------------------------------------------
// Tasks.
// ---------------------------------------------------------------------------------------------

// Picks Kernel<dtype, head_dim>::Run with head_dim 64 and 128 specialized.
template <template <DType, int> class Kernel>
ThreadPool::TaskFn SelectTask(DType dtype, int head_dim) {
  switch (dtype) {
    case DType::kF16:
      return head_dim == 128  ? &Kernel<DType::kF16, 128>::Run
             : head_dim == 64 ? &Kernel<DType::kF16, 64>::Run
                              : &Kernel<DType::kF16, 0>::Run;
    case DType::kBF16:
      return head_dim == 128  ? &Kernel<DType::kBF16, 128>::Run
             : head_dim == 64 ? &Kernel<DType::kBF16, 64>::Run
                              : &Kernel<DType::kBF16, 0>::Run;
    case DType::kF32:
      break;
  }
  return head_dim == 128  ? &Kernel<DType::kF32, 128>::Run
         : head_dim == 64 ? &Kernel<DType::kF32, 64>::Run
                          : &Kernel<DType::kF32, 0>::Run;
}

struct Context {
  KvCacheView kv;
  const float* q;
  float* o;
  int32_t num_seqs;
  int32_t num_qo_heads;
  int32_t group;
  float scale2;
  ThreadPool* pool;
  // TPP
  const TppPlanView* plan = nullptr;
  const TppWorkspace* ws = nullptr;
  // Paged / prefill chunk lists
  const int32_t* chunk_indptr = nullptr;
  const int32_t* chunk_slot = nullptr;
  const int32_t* chunk_len = nullptr;
  bool head_major = false;
  int32_t heads_per_task = 1;  // sequence-first tasks: KV heads per task ...
  int32_t head_blocks = 1;     // ... and tasks per sequence
  // TPP with shared chunks: the sequence-first tasks leave their state in ws->seq_* for the merge
  // pass, and run in one task list with the chunk-first tasks (OverlapTask).
  bool defer_merge = false;
  bool block_sequences = false;  // TPP: SequenceBlockTask instead of SequenceTask
  int64_t chunk_first_tasks = 0;
  int64_t sequence_tasks = 0;
  // Prefill
  const int32_t* q_indptr = nullptr;
  const int32_t* q_pos = nullptr;
};

// A sequence-first task: sequence `seq`, KV heads [h0, h1).
struct SequenceHeads {
  int32_t seq, h0, h1;
};
SequenceHeads SequenceTaskHeads(const Context& ctx, int64_t task) {
  if (ctx.head_major) {
    const int32_t h0 = static_cast<int32_t>(task / ctx.num_seqs);
    return {static_cast<int32_t>(task % ctx.num_seqs), h0, h0 + 1};
  }
  const int32_t h0 = static_cast<int32_t>(task % ctx.head_blocks) * ctx.heads_per_task;
  return {static_cast<int32_t>(task / ctx.head_blocks), h0,
          std::min(h0 + ctx.heads_per_task, ctx.kv.num_kv_heads)};
}

int32_t BlocksOf(int64_t rows) {
  return static_cast<int32_t>((rows + kBlockRows - 1) / kBlockRows);
}

// Chunk-first for a chunk run with few rows (<= kStreamRows: the GEMM tiles would mostly compute
// padding, and this is memory-bound): one streaming unit per KV head of [h0, h1), the rows being
// the sharing sequences' query heads of that KV head. Unit (h - h0) is at scratch + (h - h0) *
// SequenceUnitFloats; the caller reads its acc / m / l as the partial rows.
template <DType kDt, int kD>
void StreamChunks(const Context& ctx, int32_t h0, int32_t h1, const ChunkRange& chunks,
                  int32_t seq_begin, int rows, float* scratch) {
  const KvCacheView& kv = ctx.kv;
  const int d = kD > 0 ? kD : kv.head_dim;
  const int dp = RoundUp8(d);
  auto unit = [&](int32_t h) {
    return CarveSeqUnit(scratch + (h - h0) * SequenceUnitFloats(kv.head_dim), dp,
                        RowMap{seq_begin, ctx.group, h * ctx.group, ctx.num_qo_heads}, 0, rows);
  };
  for (int32_t h = h0; h < h1; ++h) InitUnit(unit(h), ctx.q, d, dp, ctx.scale2);
  for (int32_t i = chunks.begin; i < chunks.end; ++i) {
    const int len = chunks.len[i];
    for (int32_t h = h0; h < h1; ++h) {
      // The blocks worked on next: the next head's, or the next chunk's first (see SequenceTask).
      PrefetchStream prefetch;
      if (h + 1 < h1 || i + 1 < chunks.end) {
        const int32_t next_i = h + 1 < h1 ? i : i + 1;
        const int32_t next_h = h + 1 < h1 ? h + 1 : h0;
        prefetch.Reset(BlockPtr<kDt>(kv.k, kv, chunks.slot[next_i], next_h),
                       BlockPtr<kDt>(kv.v, kv, chunks.slot[next_i], next_h),
                       static_cast<int64_t>(chunks.len[next_i]) * d * sizeof(typename Kv<kDt>::T),
                       UnitSteps<kD>(rows, len));
      }
      AttendChunk<kDt, kD>(unit(h), BlockPtr<kDt>(kv.k, kv, chunks.slot[i], h),
                           BlockPtr<kDt>(kv.v, kv, chunks.slot[i], h), len, d, prefetch);
    }
  }
}

// Phase 1: task -> (segment, range of KV heads, row block); writes the segment's partial rows for
// that block, in its first chunk's slots, or, for sequences the segment is all of
// (TppWorkspace::seq_direct), their output rows.
template <DType kDt, int kD>
struct ChunkFirstTask {
  static void Run(void* ctx_ptr, int64_t begin, int64_t end, int32_t thread_index) {
    const Context& ctx = *static_cast<const Context*>(ctx_ptr);
    const TppPlanView& plan = *ctx.plan;
    const TppWorkspace& ws = *ctx.ws;
    const int d = ctx.kv.head_dim;
    const int dp = RoundUp8(d);
    void* scratch = ctx.pool->scratch(thread_index);
    for (int64_t task = begin; task < end; ++task) {
      const int32_t seg = static_cast<int32_t>(
          std::upper_bound(ws.seg_task_begin, ws.seg_task_begin + ws.num_segments + 1, task) -
          ws.seg_task_begin - 1);
      const int32_t i0 = ws.seg_begin[seg];
      const int32_t i1 = ws.seg_begin[seg + 1];
      const int64_t rows =
          static_cast<int64_t>(plan.shared_seq_end[i0] - plan.shared_seq_begin[i0]) * ctx.group;
      const int32_t blocks = BlocksOf(rows);
      const int64_t local = task - ws.seg_task_begin[seg];
      const bool stream = rows <= kStreamRows;
      const int32_t heads = stream ? ws.stream_heads_per_task : 1;
      const int32_t h0 = static_cast<int32_t>(local / blocks) * heads;
      const int32_t h1 = std::min(h0 + heads, ctx.kv.num_kv_heads);
      const int64_t row0 = (local % blocks) * kBlockRows;
      const int nrows = static_cast<int>(std::min<int64_t>(kBlockRows, rows - row0));

      const ChunkRange chunks{plan.shared_slot, plan.shared_len, i0, i1};
      if (stream) {
        StreamChunks<kDt, kD>(ctx, h0, h1, chunks, plan.shared_seq_begin[i0],
                              static_cast<int>(rows), static_cast<float*>(scratch));
      } else {
        const RowMap qmap{plan.shared_seq_begin[i0], ctx.group, 0, ctx.num_qo_heads};
        AttendBlock<kDt, kD, false>(ctx.kv, h0, h1, chunks, ctx.q, qmap, row0, nrows, ctx.scale2,
                                    nullptr, scratch);
      }
      for (int32_t h = h0; h < h1; ++h) {
        const RowMap pmap{plan.shared_partial_offset[i0], ctx.group, h * ctx.group,
                          ctx.num_qo_heads};
        const float* o;
        const float* m;
        const float* l;
        if (stream) {
          const SeqUnit u =
              CarveSeqUnit(static_cast<float*>(scratch) + (h - h0) * SequenceUnitFloats(d), dp,
                           pmap, 0, static_cast<int>(rows));
          o = u.acc;
          m = u.m;
          l = u.l;
        } else {
          const BlockHead b = CarveBlockHead(scratch, d, ctx.kv.chunk_size, nrows, h - h0);
          o = b.o;
          m = b.m;
          l = b.l;
        }
        const RowMap omap{plan.shared_seq_begin[i0], ctx.group, h * ctx.group, ctx.num_qo_heads};
        for (int r = 0; r < nrows; ++r) {
          const float* acc = o + static_cast<int64_t>(r) * dp;
          if (ws.seq_direct[plan.shared_seq_begin[i0] + (row0 + r) / ctx.group] != 0) {
            WriteOutputRow(acc, l[r], ctx.o + omap.Index(row0 + r) * d, d);
            continue;
          }
          const int64_t idx = pmap.Index(row0 + r);
          std::memcpy(ws.o_part + idx * dp, acc, sizeof(float) * dp);
          ws.m_part[idx] = m[r] * kLn2;
          ws.l_part[idx] = l[r];
        }
      }
    }
  }
};

// Phase 2 of TPP and the paged baseline. A task is a sequence and a range of its KV heads
// [h0, h0 + heads_per_task); it walks the sequence's chunks and, within each chunk, the heads in
// order. The (slot, kv_head) blocks of one slot are adjacent in the arena, so each task reads two
// long sequential streams (K and V) instead of many 32 KB pieces: the hardware prefetcher keeps up
// with them, where it does not with scattered blocks (measured: ~2x the bandwidth on 2 cores).
// kHeadMajor (paged only) is one task per (KV head, sequence), heads outermost.
template <DType kDt, int kD>
struct SequenceTask {
  static void Run(void* ctx_ptr, int64_t begin, int64_t end, int32_t thread_index) {
    const Context& ctx = *static_cast<const Context*>(ctx_ptr);
    const KvCacheView& kv = ctx.kv;
    const int d = kD > 0 ? kD : kv.head_dim;
    const int dp = RoundUp8(d);
    const int passes = (ctx.group + kMaxRowsPerPass - 1) / kMaxRowsPerPass;
    const int64_t unit_floats = SequenceUnitFloats(kv.head_dim);
    float* scratch = static_cast<float*>(ctx.pool->scratch(thread_index));
    PartialSource partials;
    if (ctx.plan != nullptr) {
      partials.plan = ctx.plan;
      partials.o_part = ctx.ws->o_part;
      partials.m_part = ctx.ws->m_part;
      partials.l_part = ctx.ws->l_part;
      partials.seg_first = ctx.ws->seg_first;
    }
    auto unit = [&](int32_t seq, int32_t h0, int32_t h, int p) {
      SeqUnit u =
          CarveSeqUnit(scratch + ((h - h0) * passes + p) * unit_floats, dp,
                       RowMap{seq, ctx.group, h * ctx.group, ctx.num_qo_heads}, p * kMaxRowsPerPass,
                       std::min(kMaxRowsPerPass, ctx.group - p * kMaxRowsPerPass));
      if (ctx.defer_merge) PointAtSequenceState(&u, *ctx.ws, dp);
      return u;
    };
    for (int64_t task = begin; task < end; ++task) {
      const auto [seq, h0, h1] = SequenceTaskHeads(ctx, task);
      if (ctx.defer_merge && ctx.ws->seq_direct[seq] != 0) continue;  // its segment's task wrote it
      for (int32_t h = h0; h < h1; ++h) {
        for (int p = 0; p < passes; ++p) {
          const SeqUnit u = unit(seq, h0, h, p);
          InitUnit(u, ctx.q, d, dp, ctx.scale2);
          if (partials.plan != nullptr && !ctx.defer_merge) {
            MergePartials(u, partials, seq, ctx.num_qo_heads, dp);
          }
        }
      }
      const int32_t first = ctx.chunk_indptr[seq];
      const int32_t last = ctx.chunk_indptr[seq + 1];
      for (int32_t i = first; i < last; ++i) {
        const int len = ctx.chunk_len[i];
        for (int32_t h = h0; h < h1; ++h) {
          const typename Kv<kDt>::T* kb = BlockPtr<kDt>(kv.k, kv, ctx.chunk_slot[i], h);
          const typename Kv<kDt>::T* vb = BlockPtr<kDt>(kv.v, kv, ctx.chunk_slot[i], h);
          // Prefetch the blocks worked on next (the next head's, adjacent in memory, or across
          // the jump to the next chunk's slot its first head's) into L2 while working on these:
          // the hardware prefetcher alone left a single thread at 0.58 of the bandwidth with fp16
          // KV on a Zen 5, and two at 0.70-0.73 on a Zen 4 (0.89-0.90 with the L2 prefetch).
          PrefetchStream prefetch;
          if (h + 1 < h1 || i + 1 < last) {
            const int32_t next_i = h + 1 < h1 ? i : i + 1;
            const int32_t next_h = h + 1 < h1 ? h + 1 : h0;
            prefetch.Reset(
                BlockPtr<kDt>(kv.k, kv, ctx.chunk_slot[next_i], next_h),
                BlockPtr<kDt>(kv.v, kv, ctx.chunk_slot[next_i], next_h),
                static_cast<int64_t>(ctx.chunk_len[next_i]) * d * sizeof(typename Kv<kDt>::T),
                UnitSteps<kD>(std::min(kMaxRowsPerPass, ctx.group), len));  // the first pass's
          }
          for (int p = 0; p < passes; ++p)
            AttendChunk<kDt, kD>(unit(seq, h0, h, p), kb, vb, len, d, prefetch);
        }
      }
      if (ctx.defer_merge) continue;  // MergeTask finishes them
      for (int32_t h = h0; h < h1; ++h) {
        for (int p = 0; p < passes; ++p) FinishUnit(unit(seq, h0, h, p), ctx.o, d, dp);
      }
    }
  }
};

// TPP's sequence-first phase for GQA groups (SequenceUsesBlocks): a task is a sequence and a range
// of its KV heads, as in SequenceTask, but each KV head's group of query heads goes through
// AttendBlock (the GEMM-shaped tiles) over the sequence's private chunks, chunk by chunk and head
// by head. The result is merged and finished like a SequenceTask unit's.
template <DType kDt, int kD>
struct SequenceBlockTask {
  static void Run(void* ctx_ptr, int64_t begin, int64_t end, int32_t thread_index) {
    const Context& ctx = *static_cast<const Context*>(ctx_ptr);
    const int d = kD > 0 ? kD : ctx.kv.head_dim;
    const int dp = RoundUp8(d);
    void* scratch = ctx.pool->scratch(thread_index);
    const PartialSource partials = ctx.plan == nullptr
                                       ? PartialSource{}
                                       : PartialSource{ctx.plan, ctx.ws->o_part, ctx.ws->m_part,
                                                       ctx.ws->l_part, ctx.ws->seg_first};
    for (int64_t task = begin; task < end; ++task) {
      const auto [seq, h0, h1] = SequenceTaskHeads(ctx, task);
      if (ctx.defer_merge && ctx.ws->seq_direct[seq] != 0) continue;  // its segment's task wrote it
      const ChunkRange chunks{ctx.chunk_slot, ctx.chunk_len, ctx.chunk_indptr[seq],
                              ctx.chunk_indptr[seq + 1]};
      AttendBlock<kDt, kD, false>(ctx.kv, h0, h1, chunks, ctx.q,
                                  RowMap{seq, ctx.group, 0, ctx.num_qo_heads}, 0, ctx.group,
                                  ctx.scale2, nullptr, scratch);
      for (int32_t h = h0; h < h1; ++h) {
        const BlockHead b = CarveBlockHead(scratch, d, ctx.kv.chunk_size, ctx.group, h - h0);
        SeqUnit u{};
        u.acc = b.o;
        u.m = b.m;
        u.l = b.l;
        u.map = RowMap{seq, ctx.group, h * ctx.group, ctx.num_qo_heads};
        u.nr = ctx.group;
        if (ctx.defer_merge) {
          SeqUnit state = u;
          PointAtSequenceState(&state, *ctx.ws, dp);
          std::memcpy(state.acc, u.acc, sizeof(float) * static_cast<size_t>(u.nr) * dp);
          std::memcpy(state.m, u.m, sizeof(float) * static_cast<size_t>(u.nr));
          std::memcpy(state.l, u.l, sizeof(float) * static_cast<size_t>(u.nr));
          continue;
        }
        if (partials.plan != nullptr) MergePartials(u, partials, seq, ctx.num_qo_heads, dp);
        FinishUnit(u, ctx.o, d, dp);
      }
    }
  }
};

// TPP with shared chunks, first pass: the chunk-first and the sequence-first tasks in one list, so
// that compute-bound shared tiles and memory-bound private walks run side by side instead of one
// phase waiting for the other (each leaves its partial state in the workspace). Task i is
// chunk-first task c(i) = i * C / (C + S) when c(i + 1) > c(i), else sequence task i - c(i): the
// two kinds spread evenly over the list, which the pool hands out in order.
template <DType kDt, int kD>
struct OverlapTask {
  static void Run(void* ctx_ptr, int64_t begin, int64_t end, int32_t thread_index) {
    const Context& ctx = *static_cast<const Context*>(ctx_ptr);
    const int64_t c = ctx.chunk_first_tasks;
    const int64_t total = c + ctx.sequence_tasks;
    for (int64_t i = begin; i < end; ++i) {
      const int64_t before = i * c / total;
      if ((i + 1) * c / total > before) {
        ChunkFirstTask<kDt, kD>::Run(ctx_ptr, before, before + 1, thread_index);
      } else if (ctx.block_sequences) {
        SequenceBlockTask<kDt, kD>::Run(ctx_ptr, i - before, i - before + 1, thread_index);
      } else {
        SequenceTask<kDt, kD>::Run(ctx_ptr, i - before, i - before + 1, thread_index);
      }
    }
  }
};

// TPP with shared chunks, second pass: per (sequence, range of KV heads), merges the private state
// with the sequence's shared partials and writes the output rows.
void MergeTask(void* ctx_ptr, int64_t begin, int64_t end, int32_t /*thread_index*/) {
  const Context& ctx = *static_cast<const Context*>(ctx_ptr);
  const int d = ctx.kv.head_dim;
  const int dp = RoundUp8(d);
  const int passes = (ctx.group + kMaxRowsPerPass - 1) / kMaxRowsPerPass;
  const PartialSource partials{ctx.plan, ctx.ws->o_part, ctx.ws->m_part, ctx.ws->l_part,
                               ctx.ws->seg_first};
  for (int64_t task = begin; task < end; ++task) {
    const auto [seq, h0, h1] = SequenceTaskHeads(ctx, task);
    if (ctx.ws->seq_direct[seq] != 0) continue;  // its segment's task wrote it
    for (int32_t h = h0; h < h1; ++h) {
      for (int p = 0; p < passes; ++p) {
        SeqUnit u{};
        u.map = RowMap{seq, ctx.group, h * ctx.group, ctx.num_qo_heads};
        u.row0 = p * kMaxRowsPerPass;
        u.nr = std::min(kMaxRowsPerPass, ctx.group - p * kMaxRowsPerPass);
        PointAtSequenceState(&u, *ctx.ws, dp);
        MergePartials(u, partials, seq, ctx.num_qo_heads, dp);
        FinishUnit(u, ctx.o, d, dp);
      }
    }
  }
}

// Prefill: task -> (sequence, KV head, row block), the last (most expensive, causal) blocks first.
template <DType kDt, int kD>
struct PrefillTask {
  static void Run(void* ctx_ptr, int64_t begin, int64_t end, int32_t thread_index) {
    const Context& ctx = *static_cast<const Context*>(ctx_ptr);
    const int d = kD > 0 ? kD : ctx.kv.head_dim;
    const int dp = RoundUp8(d);
    void* scratch = ctx.pool->scratch(thread_index);
    for (int64_t task = begin; task < end; ++task) {
      // TODO(perf): a linear scan over sequences per task; fine for the few sequences of a prefill.
      int64_t local = task;
      int32_t seq = 0;
      int32_t blocks = 0;
      for (;; ++seq) {
        const int64_t rows =
            static_cast<int64_t>(ctx.q_indptr[seq + 1] - ctx.q_indptr[seq]) * ctx.group;
        blocks = BlocksOf(rows);
        const int64_t seq_tasks = static_cast<int64_t>(blocks) * ctx.kv.num_kv_heads;
        if (local < seq_tasks) break;
        local -= seq_tasks;
      }
      const int64_t rows =
          static_cast<int64_t>(ctx.q_indptr[seq + 1] - ctx.q_indptr[seq]) * ctx.group;
      const int32_t kv_head = static_cast<int32_t>(local / blocks);
      const int64_t row0 = (blocks - 1 - local % blocks) * static_cast<int64_t>(kBlockRows);
      const int nrows = static_cast<int>(std::min<int64_t>(kBlockRows, rows - row0));
      const RowMap map{ctx.q_indptr[seq], ctx.group, kv_head * ctx.group, ctx.num_qo_heads};
      AttendBlock<kDt, kD, true>(ctx.kv, kv_head, kv_head + 1,
                                 ChunkRange{ctx.chunk_slot, ctx.chunk_len, ctx.chunk_indptr[seq],
                                            ctx.chunk_indptr[seq + 1]},
                                 ctx.q, map, row0, nrows, ctx.scale2, ctx.q_pos, scratch);
      const BlockHead b = CarveBlockHead(scratch, d, ctx.kv.chunk_size, nrows, 0);
      for (int r = 0; r < nrows; ++r) {
        WriteOutputRow(b.o + static_cast<int64_t>(r) * dp, b.l[r], ctx.o + map.Index(row0 + r) * d,
                       d);
      }
    }
  }
};

template <DType kDt>
void AppendRows(const KvAppendParams& p) {
  using T = typename Kv<kDt>::T;
  const KvArenaLayer& kv = p.kv;
  const int d = kv.head_dim;
  const int d8 = d & ~7;
  for (int32_t i = 0; i < p.num_tokens; ++i) {
    for (int32_t h = 0; h < kv.num_kv_heads; ++h) {
      const int64_t dst =
          ((static_cast<int64_t>(p.slot[i]) * kv.num_kv_heads + h) * kv.chunk_size + p.offset[i]) *
          d;
      const int64_t src = (static_cast<int64_t>(i) * kv.num_kv_heads + h) * d;
      for (int which = 0; which < 2; ++which) {
        const float* s = (which == 0 ? p.k : p.v) + src;
        T* o = static_cast<T*>(which == 0 ? kv.k : kv.v) + dst;
        for (int j = 0; j < d8; j += 8) Kv<kDt>::Put(o + j, Load(s + j));
        for (int j = d8; j < d; ++j) Kv<kDt>::PutScalar(o + j, s[j]);
      }
    }
  }
}

Context BaseContext(const KvCacheView& kv, const float* q, float* o, int32_t num_seqs,
                    int32_t num_qo_heads, float sm_scale, ThreadPool* pool) {
  Context ctx;
  ctx.kv = kv;
  ctx.q = q;
  ctx.o = o;
  ctx.num_seqs = num_seqs;
  ctx.num_qo_heads = num_qo_heads;
  ctx.group = num_qo_heads / kv.num_kv_heads;
  ctx.scale2 = sm_scale * kLog2e;
  ctx.pool = pool;
  return ctx;
}

// Sequence-first tasks: as many KV heads per task as the scratch holds and the balance allows
// (long head ranges stream best). Balance: the longest sequence's task should be at most about
// 1 / (kTasksPerThread * threads) of all the chunks walked, so that one sequence much longer than
// the rest (or the only one with private chunks) does not finish alone on one thread.
void SplitHeads(Context* ctx, int32_t threads) {
  constexpr int64_t kTasksPerThread = 8;
  const int32_t num_kv_heads = ctx->kv.num_kv_heads;
  int64_t longest = 0;
  for (int32_t s = 0; s < ctx->num_seqs; ++s) {
    longest = std::max<int64_t>(longest, ctx->chunk_indptr[s + 1] - ctx->chunk_indptr[s]);
  }
  const int64_t total = std::max<int64_t>(1, ctx->chunk_indptr[ctx->num_seqs]);
  const int64_t blocks = std::clamp<int64_t>(
      (kTasksPerThread * threads * longest + total - 1) / total, 1, num_kv_heads);
  const int64_t passes = (ctx->group + kMaxRowsPerPass - 1) / kMaxRowsPerPass;
  const int64_t scratch_floats = static_cast<int64_t>(ctx->pool->scratch_bytes() / sizeof(float));
  const int64_t fit =
      ctx->block_sequences
          ? (scratch_floats - BlockTempFloats(ctx->kv.head_dim, ctx->kv.chunk_size)) /
                BlockHeadFloats(ctx->kv.head_dim, ctx->group)
          : scratch_floats / (passes * SequenceUnitFloats(ctx->kv.head_dim));
  int64_t heads = (num_kv_heads + blocks - 1) / blocks;
  heads = std::max<int64_t>(1, std::min(heads, fit));
  ctx->heads_per_task = static_cast<int32_t>(heads);
  ctx->head_blocks = static_cast<int32_t>((num_kv_heads + heads - 1) / heads);
}

}  // namespace

void TppDecode(const TppDecodeParams& p, const TppWorkspace& ws, int32_t threads) {
  Context ctx = BaseContext(p.kv, p.q, p.o, p.plan.num_seqs, p.num_qo_heads, p.sm_scale, p.pool);
  ctx.plan = &p.plan;
  ctx.ws = &ws;
  ctx.chunk_indptr = p.plan.private_indptr;
  ctx.chunk_slot = p.plan.private_slot;
  ctx.chunk_len = p.plan.private_len;
  // Streaming units with register accumulators (PvRegisters) beat the block tiles up to groups of
  // 10 (n_p 2048, no sharing, ~80 GB/s: group 4 by 18%, 8 by 10%, 10 even; 12 blocks 5% ahead).
  const bool register_pv = (p.kv.head_dim == 128 && PvPassRows<128>() > 0) ||
                           (p.kv.head_dim == 64 && PvPassRows<64>() > 0);
  ctx.block_sequences =
      SequenceUsesBlocks(ctx.group) && (!register_pv || ctx.group >= kBlockGroupMinWide);
  SplitHeads(&ctx, threads);
  const int64_t sequence_tasks = static_cast<int64_t>(p.plan.num_seqs) * ctx.head_blocks;
  if (ws.num_segments == 0) {  // nothing shared: one sequence-first pass writes the output
    p.pool->ParallelFor(sequence_tasks, 1, threads,
                        ctx.block_sequences
                            ? SelectTask<SequenceBlockTask>(p.kv.dtype, p.kv.head_dim)
                            : SelectTask<SequenceTask>(p.kv.dtype, p.kv.head_dim),
                        &ctx);
    return;
  }
  ctx.defer_merge = true;
  ctx.chunk_first_tasks = ws.seg_task_begin[ws.num_segments];
  ctx.sequence_tasks = sequence_tasks;
  p.pool->ParallelFor(ctx.chunk_first_tasks + sequence_tasks, 1, threads,
                      SelectTask<OverlapTask>(p.kv.dtype, p.kv.head_dim), &ctx);
  p.pool->ParallelFor(sequence_tasks, 1, threads, &MergeTask, &ctx);
}

void PagedDecode(const PagedDecodeParams& p, int32_t threads) {
  Context ctx = BaseContext(p.kv, p.q, p.o, p.num_seqs, p.num_qo_heads, p.sm_scale, p.pool);
  ctx.chunk_indptr = p.block_indptr;
  ctx.chunk_slot = p.block_slot;
  ctx.chunk_len = p.block_len;
  ctx.head_major = p.order == PagedTaskOrder::kHeadMajor;
  SplitHeads(&ctx, threads);
  const int64_t tasks = ctx.head_major ? static_cast<int64_t>(p.num_seqs) * p.kv.num_kv_heads
                                       : static_cast<int64_t>(p.num_seqs) * ctx.head_blocks;
  p.pool->ParallelFor(tasks, 1, threads, SelectTask<SequenceTask>(p.kv.dtype, p.kv.head_dim), &ctx);
}

void PrefillAttention(const PrefillAttentionParams& p, int32_t threads) {
  Context ctx = BaseContext(p.kv, p.q, p.o, p.num_seqs, p.num_qo_heads, p.sm_scale, p.pool);
  ctx.chunk_indptr = p.chunk_indptr;
  ctx.chunk_slot = p.chunk_slot;
  ctx.chunk_len = p.chunk_len;
  ctx.q_indptr = p.q_indptr;
  ctx.q_pos = p.q_pos;
  int64_t tasks = 0;
  for (int32_t s = 0; s < p.num_seqs; ++s) {
    tasks += static_cast<int64_t>(
                 BlocksOf(static_cast<int64_t>(p.q_indptr[s + 1] - p.q_indptr[s]) * ctx.group)) *
             p.kv.num_kv_heads;
  }
  p.pool->ParallelFor(tasks, 1, threads, SelectTask<PrefillTask>(p.kv.dtype, p.kv.head_dim), &ctx);
}

void KvAppend(const KvAppendParams& p) {
  switch (p.kv.dtype) {
    case DType::kF16:
      return AppendRows<DType::kF16>(p);
    case DType::kBF16:
      return AppendRows<DType::kBF16>(p);
    case DType::kF32:
      return AppendRows<DType::kF32>(p);
  }
}

}  // namespace chunkserve::kernels::cpu::CHUNKSERVE_CPU_ISA
