// The vectors of the AVX-512 (F, BW, VL, DQ) builds, in two halves:
//  * namespace `avx512`: the 8-lane F8 interface of simd_avx2.h (the same source, simd_ymm.h),
//    which the attention kernels (attention_impl.h) are written against, here compiled with EVEX
//    encodings and 32 registers; plus `WideOps`, the 16-lane operations their GEMM-shaped tiles
//    use (attention_impl.h's TileOps).
//  * namespace `avx512::zmm`: the 16-lane F16 vector under the names gemm_impl.h expects (Vec,
//    kLanes, Load, Fma, ...). gemm_avx512.cc compiles the GEMM inside `avx512::zmm`, where these
//    names hide the 8-lane ones of the enclosing namespace.
//
// Include only from a translation unit that compiles this header, and everything that uses it,
// under `#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")` (see
// gemm_avx512.cc), and call into it only after a run-time check (cpu_isa.h).
#ifndef CHUNKSERVE_KERNELS_CPU_SIMD_AVX512_H_
#define CHUNKSERVE_KERNELS_CPU_SIMD_AVX512_H_

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/cpu/exp2_poly.h"

namespace chunkserve::kernels::cpu::avx512 {

#include "kernels/cpu/simd_ymm.h"  // F8 and its operations

namespace zmm {

struct F16 {
  __m512 v;
};
using Vec = F16;
inline constexpr int kLanes = 16;

inline F16 Zero() { return {_mm512_setzero_ps()}; }
inline F16 Set1(float x) { return {_mm512_set1_ps(x)}; }
inline F16 Load(const float* p) { return {_mm512_loadu_ps(p)}; }
inline void Store(float* p, F16 a) { _mm512_storeu_ps(p, a.v); }
inline F16 Broadcast(const float* p) { return {_mm512_set1_ps(*p)}; }

inline __mmask16 PrefixMask(int n) { return static_cast<__mmask16>((1u << n) - 1u); }
// The first n (0..16) lanes from p, zeros after; reads nothing past p + n.
inline F16 LoadPartial(const float* p, int n) { return {_mm512_maskz_loadu_ps(PrefixMask(n), p)}; }
inline void StorePartial(float* p, F16 a, int n) { _mm512_mask_storeu_ps(p, PrefixMask(n), a.v); }

inline F16 Add(F16 a, F16 b) { return {_mm512_add_ps(a.v, b.v)}; }
inline F16 Sub(F16 a, F16 b) { return {_mm512_sub_ps(a.v, b.v)}; }
inline F16 Mul(F16 a, F16 b) { return {_mm512_mul_ps(a.v, b.v)}; }
inline F16 Max(F16 a, F16 b) { return {_mm512_max_ps(a.v, b.v)}; }
// a * b + c
inline F16 Fma(F16 a, F16 b, F16 c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }

// pos >= threshold ? x : y, lane by lane.
inline F16 SelectGe(F16 pos, F16 threshold, F16 x, F16 y) {
  return {_mm512_mask_blend_ps(_mm512_cmp_ps_mask(pos.v, threshold.v, _CMP_GE_OQ), y.v, x.v)};
}
// Lanes equal to -inf become `value`.
inline F16 ReplaceNegInf(F16 a, float value) {
  const __mmask16 is_neg_inf =
      _mm512_cmp_ps_mask(a.v, _mm512_set1_ps(-__builtin_inff()), _CMP_EQ_OQ);
  return {_mm512_mask_blend_ps(is_neg_inf, a.v, _mm512_set1_ps(value))};
}
// 2^x: simd_ymm.h's Exp2 (the same clamp, rounding and polynomial), 16 lanes.
inline F16 Exp2(F16 x) {
  const __m512 xc =
      _mm512_min_ps(_mm512_max_ps(x.v, _mm512_set1_ps(-127.0f)), _mm512_set1_ps(127.0f));
  const __m512 n = _mm512_roundscale_ps(xc, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(xc, n);
  __m512 p = _mm512_set1_ps(kExp2Poly[0]);
  for (int i = 1; i < kExp2PolyTerms; ++i) p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kExp2Poly[i]));
  const __m512i e =
      _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return {_mm512_mul_ps(p, _mm512_castsi512_ps(e))};
}

// Weight storage types: 16 halves or bfloat16s widened exactly to fp32.
inline F16 LoadF16(const uint16_t* p) {
  return {_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)))};
}
inline F16 LoadBF16(const uint16_t* p) {
  const __m512i wide =
      _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return {_mm512_castsi512_ps(_mm512_slli_epi32(wide, 16))};
}

}  // namespace zmm

// The 16-lane operations of the attention tiles (attention_impl.h's TileOps; NarrowOps there is
// the same over F8).
struct WideOps {
  using V = zmm::F16;
  static constexpr int kLanes = 16;
  static V Zero() { return zmm::Zero(); }
  static V Load(const float* p) { return zmm::Load(p); }
  static void Store(float* p, V a) { zmm::Store(p, a); }
  static V Broadcast(const float* p) { return zmm::Broadcast(p); }
  static V Mul(V a, V b) { return zmm::Mul(a, b); }
  static V Fma(V a, V b, V c) { return zmm::Fma(a, b, c); }
  static V LoadF16(const uint16_t* p) { return zmm::LoadF16(p); }
  static V LoadBF16(const uint16_t* p) { return zmm::LoadBF16(p); }
  // The sum of the two 8-lane halves (horizontal reductions continue on F8).
  static F8 Fold8(V a) {
    return {_mm256_add_ps(_mm512_castps512_ps256(a.v), _mm512_extractf32x8_ps(a.v, 1))};
  }
  static V Set1(float x) { return zmm::Set1(x); }
  static V Add(V a, V b) { return zmm::Add(a, b); }
  static V Sub(V a, V b) { return zmm::Sub(a, b); }
  static V Max(V a, V b) { return zmm::Max(a, b); }
  static V Exp2(V a) { return zmm::Exp2(a); }
  static V SelectGe(V pos, V threshold, V x, V y) { return zmm::SelectGe(pos, threshold, x, y); }
  static V ReplaceNegInf(V a, float value) { return zmm::ReplaceNegInf(a, value); }

  // Pair vectors: 8 rows x 2 head dims, lane 2r + p holding row r's dim j + p, so that blocks of
  // 8 rows fill all 16 lanes. Both dims of one K row, [p[0], p[1]] repeated (a 64-bit broadcast):
  static V BroadcastPair(const float* p) {
    double x;
    std::memcpy(&x, p, sizeof(x));
    return {_mm512_castpd_ps(_mm512_set1_pd(x))};
  }
  // The two 8-float halves [a[0, 8), b[0, 8)] of a pair vector of Q^T (see InterleavePairs).
  static V LoadHalves(const float* a, const float* b) {
    return {_mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(a)), _mm256_loadu_ps(b), 1)};
  }
  // Stores the halves of a pair vector: x's first 8 lanes at a, its last 8 at b.
  static void StoreHalves(float* a, float* b, V x) {
    _mm256_storeu_ps(a, _mm512_castps512_ps256(x.v));
    _mm256_storeu_ps(b, _mm512_extractf32x8_ps(x.v, 1));
  }
  // [x, x].
  static V Dup8(F8 x) { return {_mm512_insertf32x8(_mm512_castps256_ps512(x.v), x.v, 1)}; }
  // Rows a = Q^T[j][r0, r0 + 8) and b = Q^T[j + 1][r0, r0 + 8), in place, become the pair vector
  // [a0 b0 a1 b1 a2 b2 a3 b3 | a4 b4 ... a7 b7], its first half in a, its second in b.
  static void InterleavePairs(float* a, float* b) {
    const __m256 x = _mm256_loadu_ps(a);
    const __m256 y = _mm256_loadu_ps(b);
    const __m256 lo = _mm256_unpacklo_ps(x, y);  // a0 b0 a1 b1 | a4 b4 a5 b5
    const __m256 hi = _mm256_unpackhi_ps(x, y);  // a2 b2 a3 b3 | a6 b6 a7 b7
    _mm256_storeu_ps(a, _mm256_permute2f128_ps(lo, hi, 0x20));
    _mm256_storeu_ps(b, _mm256_permute2f128_ps(lo, hi, 0x31));
  }
  // The 8 rows' sums of a pair vector's two dims.
  static F8 SumPairs(V a) {
    const __m512 s = _mm512_add_ps(a.v, _mm512_permute_ps(a.v, 0xB1));  // swap within pairs
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 0, 2, 4, 6, 8, 10, 12, 14);
    return {_mm512_castps512_ps256(_mm512_permutexvar_ps(even, s))};
  }
};
#define CHUNKSERVE_SIMD_HAS_WIDE_OPS 1

}  // namespace chunkserve::kernels::cpu::avx512

#endif  // CHUNKSERVE_KERNELS_CPU_SIMD_AVX512_H_
