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
};
#define CHUNKSERVE_SIMD_HAS_WIDE_OPS 1

}  // namespace chunkserve::kernels::cpu::avx512

#endif  // CHUNKSERVE_KERNELS_CPU_SIMD_AVX512_H_
