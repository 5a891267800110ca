// The 8-lane fp32 vector the CPU attention kernels are written against, in AVX2 + FMA + F16C
// instructions: the body of simd_avx2.h and of simd_avx512.h's 8-lane half.
//
// NO INCLUDE GUARD and no includes, on purpose: simd_avx2.h includes it inside namespace `avx2` and
// simd_avx512.h inside namespace `avx512`, after <immintrin.h>, <cstdint> and <cstring>, so each
// ISA's translation units get their own copy compiled for their target (the AVX-512 one uses EVEX
// encodings and 32 registers) and the two never meet at link time.

struct F8 {
  __m256 v;
};

inline F8 Zero() { return {_mm256_setzero_ps()}; }
inline F8 Set1(float x) { return {_mm256_set1_ps(x)}; }
inline F8 Load(const float* p) { return {_mm256_loadu_ps(p)}; }
inline void Store(float* p, F8 a) { _mm256_storeu_ps(p, a.v); }
inline F8 Broadcast(const float* p) { return {_mm256_broadcast_ss(p)}; }

inline __m256i PrefixMask(int n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
// The first n (0..8) lanes from p, zeros after; reads nothing past p + n.
inline F8 LoadPartial(const float* p, int n) { return {_mm256_maskload_ps(p, PrefixMask(n))}; }
inline void StorePartial(float* p, F8 a, int n) { _mm256_maskstore_ps(p, PrefixMask(n), a.v); }

inline F8 Add(F8 a, F8 b) { return {_mm256_add_ps(a.v, b.v)}; }
inline F8 Sub(F8 a, F8 b) { return {_mm256_sub_ps(a.v, b.v)}; }
inline F8 Mul(F8 a, F8 b) { return {_mm256_mul_ps(a.v, b.v)}; }
inline F8 Max(F8 a, F8 b) { return {_mm256_max_ps(a.v, b.v)}; }
// a * b + c
inline F8 Fma(F8 a, F8 b, F8 c) { return {_mm256_fmadd_ps(a.v, b.v, c.v)}; }
// pos >= threshold ? x : y, lane by lane.
inline F8 SelectGe(F8 pos, F8 threshold, F8 x, F8 y) {
  return {_mm256_blendv_ps(y.v, x.v, _mm256_cmp_ps(pos.v, threshold.v, _CMP_GE_OQ))};
}
// Lanes equal to -inf become `value`.
inline F8 ReplaceNegInf(F8 a, float value) {
  const __m256 is_neg_inf = _mm256_cmp_ps(a.v, _mm256_set1_ps(-__builtin_inff()), _CMP_EQ_OQ);
  return {_mm256_blendv_ps(a.v, _mm256_set1_ps(value), is_neg_inf)};
}

inline float ReduceAdd(F8 a) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(a.v), _mm256_extractf128_ps(a.v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline float ReduceMax(F8 a) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(a.v), _mm256_extractf128_ps(a.v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
// out[i] = ReduceAdd(a[i]) for i < 4.
inline void ReduceAdd4(const F8* a, float* out) {
  const __m256 h01 = _mm256_hadd_ps(a[0].v, a[1].v);
  const __m256 h23 = _mm256_hadd_ps(a[2].v, a[3].v);
  const __m256 h = _mm256_hadd_ps(h01, h23);
  _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
}
// Lane i of the result = ReduceAdd(a[i]).
inline F8 ReduceAdd8(const F8* a) {
  const __m256 h0123 =
      _mm256_hadd_ps(_mm256_hadd_ps(a[0].v, a[1].v), _mm256_hadd_ps(a[2].v, a[3].v));
  const __m256 h4567 =
      _mm256_hadd_ps(_mm256_hadd_ps(a[4].v, a[5].v), _mm256_hadd_ps(a[6].v, a[7].v));
  return {_mm256_add_ps(_mm256_permute2f128_ps(h0123, h4567, 0x20),
                        _mm256_permute2f128_ps(h0123, h4567, 0x31))};
}

// Transposes the 8 x 8 matrix whose rows are a[0..7] in place: afterwards a[i] holds lane i of
// every input row.
inline void Transpose8(F8* a) {
  const __m256 t0 = _mm256_unpacklo_ps(a[0].v, a[1].v);
  const __m256 t1 = _mm256_unpackhi_ps(a[0].v, a[1].v);
  const __m256 t2 = _mm256_unpacklo_ps(a[2].v, a[3].v);
  const __m256 t3 = _mm256_unpackhi_ps(a[2].v, a[3].v);
  const __m256 t4 = _mm256_unpacklo_ps(a[4].v, a[5].v);
  const __m256 t5 = _mm256_unpackhi_ps(a[4].v, a[5].v);
  const __m256 t6 = _mm256_unpacklo_ps(a[6].v, a[7].v);
  const __m256 t7 = _mm256_unpackhi_ps(a[6].v, a[7].v);
  const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44);
  const __m256 u1 = _mm256_shuffle_ps(t0, t2, 0xee);
  const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44);
  const __m256 u3 = _mm256_shuffle_ps(t1, t3, 0xee);
  const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44);
  const __m256 u5 = _mm256_shuffle_ps(t4, t6, 0xee);
  const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44);
  const __m256 u7 = _mm256_shuffle_ps(t5, t7, 0xee);
  a[0].v = _mm256_permute2f128_ps(u0, u4, 0x20);
  a[1].v = _mm256_permute2f128_ps(u1, u5, 0x20);
  a[2].v = _mm256_permute2f128_ps(u2, u6, 0x20);
  a[3].v = _mm256_permute2f128_ps(u3, u7, 0x20);
  a[4].v = _mm256_permute2f128_ps(u0, u4, 0x31);
  a[5].v = _mm256_permute2f128_ps(u1, u5, 0x31);
  a[6].v = _mm256_permute2f128_ps(u2, u6, 0x31);
  a[7].v = _mm256_permute2f128_ps(u3, u7, 0x31);
}

// 2^x for x <= 127: x = n + f with n = round(x), f in [-1/2, 1/2]; 2^f by exp2_poly.h's
// polynomial, 2^n by building the exponent bits. x < -126.5
// (including -inf) gives 0: n = -127 makes the exponent field 0.
inline F8 Exp2(F8 x) {
  const __m256 xc =
      _mm256_min_ps(_mm256_max_ps(x.v, _mm256_set1_ps(-127.0f)), _mm256_set1_ps(127.0f));
  const __m256 n = _mm256_round_ps(xc, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 f = _mm256_sub_ps(xc, n);
  __m256 p = _mm256_set1_ps(kExp2Poly[0]);
  for (int i = 1; i < kExp2PolyTerms; ++i) p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(kExp2Poly[i]));
  const __m256i e =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return {_mm256_mul_ps(p, _mm256_castsi256_ps(e))};
}

// KV storage types.
inline F8 LoadF16(const uint16_t* p) {
  return {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))};
}
inline F8 LoadBF16(const uint16_t* p) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return {_mm256_castsi256_ps(_mm256_slli_epi32(wide, 16))};
}
inline void StoreF16(uint16_t* p, F8 a) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                   _mm256_cvtps_ph(a.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
// Round to nearest even; NaN stays a quiet NaN (same as FloatToBf16 in dtype.h).
inline void StoreBF16(uint16_t* p, F8 a) {
  const __m256i u = _mm256_castps_si256(a.v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r =
      _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
  const __m256i nan = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
  r = _mm256_blendv_epi8(r, nan, _mm256_castps_si256(_mm256_cmp_ps(a.v, a.v, _CMP_UNORD_Q)));
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
}
inline F8 LoadF16Partial(const uint16_t* p, int n) {
  alignas(16) uint16_t tmp[8] = {};
  std::memcpy(tmp, p, static_cast<size_t>(n) * sizeof(uint16_t));
  return LoadF16(tmp);
}
inline F8 LoadBF16Partial(const uint16_t* p, int n) {
  alignas(16) uint16_t tmp[8] = {};
  std::memcpy(tmp, p, static_cast<size_t>(n) * sizeof(uint16_t));
  return LoadBF16(tmp);
}

// Keeps the compiler from moving loads and FMAs across this point (no instruction is emitted).
inline void CompilerBarrier() { asm volatile("" ::: "memory"); }

// Makes the compiler compute x (and the loads behind it) without using it.
inline void KeepAlive(uint32_t x) { asm volatile("" : : "r"(x)); }

// A cache line into L2, not L1 (T2, the hint for the outermost levels; T1 measured the same on
// the Zen 4).
inline void PrefetchL2(const void* p) { _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T2); }
