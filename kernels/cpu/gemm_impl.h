// Internal: the packed-weight GEMM of gemm.h, written once against the vector interface of
// simd_{avx512,avx2,scalar}.h (Vec, kLanes, Load, Fma, LoadF16, LoadBF16, ...) and compiled once
// per ISA into namespace CHUNKSERVE_CPU_ISA (gemm_avx512.cc, gemm_avx2.cc, gemm_scalar.cc). The
// includer puts the simd header first. gemm.cc validates; nothing here does.
//
// A tile is kTileRows rows of x by kTileCols = 2 vectors of columns, all accumulators in registers
// over the whole k: 12 x 32 with AVX-512 (24 of its 32 registers, plus 2 weight vectors and the
// broadcast), 6 x 16 with AVX2 (12 of 16). Per k-step a tile loads two weight vectors (widened from
// fp16 / bf16 in registers) and kTileRows broadcasts of x, and issues 2 * kTileRows FMAs, so the
// FMA units, not the loads, set its pace once x rows sit in L1. Panels are taken in blocks of about
// 256 KiB of weights, which stay in L2 while every row tile of x passes over them: x is read once
// per block, the weights once per call.

// No include guard: included once per ISA namespace.
#include <algorithm>
#include <array>
#include <cstdint>
#include <utility>

#include "kernels/cpu/gemm.h"

namespace chunkserve::kernels::cpu::CHUNKSERVE_CPU_ISA {
namespace {

constexpr int kTileCols = 2 * kLanes;
constexpr int kTileRows = kLanes == 16 ? 12 : 6;
static_assert(kGemmPanel % kTileCols == 0, "a panel is whole tiles");
constexpr int64_t kPanelBlockBytes = int64_t{256} << 10;

template <DType kDt>
inline Vec LoadWeights(const void* w, int64_t i) {
  if constexpr (kDt == DType::kF32) {
    return Load(static_cast<const float*>(w) + i);
  } else if constexpr (kDt == DType::kF16) {
    return LoadF16(static_cast<const uint16_t*>(w) + i);
  } else {
    return LoadBF16(static_cast<const uint16_t*>(w) + i);
  }
}

inline Vec LoadUpTo(const float* p, int n) { return n == kLanes ? Load(p) : LoadPartial(p, n); }
inline void StoreUpTo(float* p, Vec a, int n) {
  if (n == kLanes) {
    Store(p, a);
  } else {
    StorePartial(p, a, n);
  }
}

struct TileArgs {
  const float* x;  // the tile's first row
  int64_t ldx;
  const void* w;  // the packed weights
  int64_t w_index;  // element of the tile's first column at k = 0
  int64_t k;
  float* y;  // the tile's first row and column
  int64_t ldy;
  int cols;  // valid columns, 1..kTileCols
  const float* bias;  // at the tile's first column, or null
  bool accumulate;
};

template <DType kDt, int kRows>
void Tile(const TileArgs& t) {
  Vec acc0[kRows];
  Vec acc1[kRows];
  for (int r = 0; r < kRows; ++r) acc0[r] = acc1[r] = Zero();
  const float* x = t.x;
  const int64_t ldx = t.ldx;
  for (int64_t i = 0; i < t.k; ++i) {
    const int64_t wi = t.w_index + i * kGemmPanel;
    const Vec b0 = LoadWeights<kDt>(t.w, wi);
    const Vec b1 = LoadWeights<kDt>(t.w, wi + kLanes);
    for (int r = 0; r < kRows; ++r) {
      const Vec a = Set1(x[r * ldx + i]);
      acc0[r] = Fma(a, b0, acc0[r]);
      acc1[r] = Fma(a, b1, acc1[r]);
    }
  }
  const int n0 = std::min(t.cols, kLanes);
  const int n1 = t.cols - n0;
  for (int r = 0; r < kRows; ++r) {
    float* y = t.y + r * t.ldy;
    Vec v0 = acc0[r];
    Vec v1 = acc1[r];
    if (t.bias != nullptr) {
      v0 = Add(v0, LoadUpTo(t.bias, n0));
      if (n1 > 0) v1 = Add(v1, LoadUpTo(t.bias + kLanes, n1));
    }
    if (t.accumulate) {
      v0 = Add(v0, LoadUpTo(y, n0));
      if (n1 > 0) v1 = Add(v1, LoadUpTo(y + kLanes, n1));
    }
    StoreUpTo(y, v0, n0);
    if (n1 > 0) StoreUpTo(y + kLanes, v1, n1);
  }
}

using TileFn = void (*)(const TileArgs&);

template <DType kDt, int... kRows>
constexpr auto MakeTileTable(std::integer_sequence<int, kRows...>) {
  return std::array<TileFn, sizeof...(kRows)>{&Tile<kDt, kRows + 1>...};
}

// Panels [panel_begin, panel_end) of the output, every row.
template <DType kDt>
void GemmPanelsOf(const GemmParams& p, int64_t panel_begin, int64_t panel_end) {
  static constexpr auto kTiles = MakeTileTable<kDt>(std::make_integer_sequence<int, kTileRows>{});
  const int64_t panel_elems = int64_t{kGemmPanel} * p.k;
  const int64_t panel_bytes = panel_elems * static_cast<int64_t>(DTypeSize(kDt));
  const int64_t block = std::max<int64_t>(1, kPanelBlockBytes / panel_bytes);
  for (int64_t pb = panel_begin; pb < panel_end; pb += block) {
    const int64_t pe = std::min(panel_end, pb + block);
    for (int64_t m0 = 0; m0 < p.m; m0 += kTileRows) {
      const int rows = static_cast<int>(std::min<int64_t>(kTileRows, p.m - m0));
      const TileFn tile = kTiles[rows - 1];
      for (int64_t panel = pb; panel < pe; ++panel) {
        for (int c = 0; c < kGemmPanel; c += kTileCols) {
          const int64_t col = panel * kGemmPanel + c;
          if (col >= p.n) break;
          TileArgs t;
          t.x = p.x + m0 * p.ldx;
          t.ldx = p.ldx;
          t.w = p.w;
          t.w_index = panel * panel_elems + c;
          t.k = p.k;
          t.y = p.y + m0 * p.ldy + col;
          t.ldy = p.ldy;
          t.cols = static_cast<int>(std::min<int64_t>(kTileCols, p.n - col));
          t.bias = p.bias != nullptr ? p.bias + col : nullptr;
          t.accumulate = p.accumulate;
          tile(t);
        }
      }
    }
  }
}

}  // namespace

void GemmPanels(const GemmParams& p, int64_t panel_begin, int64_t panel_end) {
  switch (p.w_dtype) {
    case DType::kF16:
      return GemmPanelsOf<DType::kF16>(p, panel_begin, panel_end);
    case DType::kBF16:
      return GemmPanelsOf<DType::kBF16>(p, panel_begin, panel_end);
    default:
      return GemmPanelsOf<DType::kF32>(p, panel_begin, panel_end);
  }
}

}  // namespace chunkserve::kernels::cpu::CHUNKSERVE_CPU_ISA
