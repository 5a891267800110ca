// The 8-lane fp32 vector of simd_avx2.h in portable C++ (namespace `scalar`): the fallback for CPUs
// without AVX2/FMA/F16C and the second path the tests run. Same interface and the same algorithms
// (the same exp2 polynomial); multiply-add is not fused here (std::fma is a libm call without FMA
// hardware), so the two paths agree to rounding, not bit for bit. Written as plain lane loops so
// the compiler can use SSE2.
#ifndef CHUNKSERVE_KERNELS_CPU_SIMD_SCALAR_H_
#define CHUNKSERVE_KERNELS_CPU_SIMD_SCALAR_H_

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/dtype.h"
#include "kernels/cpu/exp2_poly.h"

namespace chunkserve::kernels::cpu::scalar {

struct F8 {
  float v[8];
};
using Vec = F8;
inline constexpr int kLanes = 8;

inline F8 Zero() { return F8{}; }
inline F8 Set1(float x) {
  F8 r;
  for (int i = 0; i < 8; ++i) r.v[i] = x;
  return r;
}
inline F8 Load(const float* p) {
  F8 r;
  std::memcpy(r.v, p, sizeof(r.v));
  return r;
}
inline void Store(float* p, F8 a) { std::memcpy(p, a.v, sizeof(a.v)); }
inline F8 Broadcast(const float* p) { return Set1(*p); }
inline F8 LoadPartial(const float* p, int n) {
  F8 r{};
  for (int i = 0; i < n; ++i) r.v[i] = p[i];
  return r;
}
inline void StorePartial(float* p, F8 a, int n) {
  for (int i = 0; i < n; ++i) p[i] = a.v[i];
}

#define CHUNKSERVE_SCALAR_LANEWISE(name, expr) \
  inline F8 name(F8 a, F8 b) {                 \
    F8 r;                                      \
    for (int i = 0; i < 8; ++i) r.v[i] = expr; \
    return r;                                  \
  }
CHUNKSERVE_SCALAR_LANEWISE(Add, a.v[i] + b.v[i])
CHUNKSERVE_SCALAR_LANEWISE(Sub, a.v[i] - b.v[i])
CHUNKSERVE_SCALAR_LANEWISE(Mul, a.v[i] * b.v[i])
CHUNKSERVE_SCALAR_LANEWISE(Max, a.v[i] > b.v[i] ? a.v[i] : b.v[i])
#undef CHUNKSERVE_SCALAR_LANEWISE

inline F8 Fma(F8 a, F8 b, F8 c) {
  F8 r;
  for (int i = 0; i < 8; ++i) r.v[i] = a.v[i] * b.v[i] + c.v[i];
  return r;
}
inline F8 SelectGe(F8 pos, F8 threshold, F8 x, F8 y) {
  F8 r;
  for (int i = 0; i < 8; ++i) r.v[i] = pos.v[i] >= threshold.v[i] ? x.v[i] : y.v[i];
  return r;
}
inline F8 ReplaceNegInf(F8 a, float value) {
  F8 r;
  for (int i = 0; i < 8; ++i) r.v[i] = a.v[i] == -INFINITY ? value : a.v[i];
  return r;
}

inline float ReduceAdd(F8 a) {
  float s = 0.0f;
  for (int i = 0; i < 8; ++i) s += a.v[i];
  return s;
}
inline float ReduceMax(F8 a) {
  float m = a.v[0];
  for (int i = 1; i < 8; ++i) m = a.v[i] > m ? a.v[i] : m;
  return m;
}
inline void ReduceAdd4(const F8* a, float* out) {
  for (int i = 0; i < 4; ++i) out[i] = ReduceAdd(a[i]);
}
inline F8 ReduceAdd8(const F8* a) {
  F8 r;
  for (int i = 0; i < 8; ++i) r.v[i] = ReduceAdd(a[i]);
  return r;
}

// Transposes the 8 x 8 matrix whose rows are a[0..7] in place.
inline void Transpose8(F8* a) {
  for (int i = 0; i < 8; ++i) {
    for (int j = i + 1; j < 8; ++j) {
      const float x = a[i].v[j];
      a[i].v[j] = a[j].v[i];
      a[j].v[i] = x;
    }
  }
}

// See simd_avx2.h: the same range reduction and polynomial.
inline F8 Exp2(F8 x) {
  F8 r;
  for (int i = 0; i < 8; ++i) {
    float xc = x.v[i] < -127.0f ? -127.0f : x.v[i];
    xc = xc > 127.0f ? 127.0f : xc;
    const float n = std::nearbyint(xc);
    const float f = xc - n;
    float p = kExp2Poly[0];
    for (int k = 1; k < kExp2PolyTerms; ++k) p = p * f + kExp2Poly[k];
    r.v[i] = p * BitsFloat(static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23);
  }
  return r;
}

inline F8 LoadF16(const uint16_t* p) {
  F8 r;
  for (int i = 0; i < 8; ++i) r.v[i] = HalfToFloat(p[i]);
  return r;
}
inline F8 LoadBF16(const uint16_t* p) {
  F8 r;
  for (int i = 0; i < 8; ++i) r.v[i] = Bf16ToFloat(p[i]);
  return r;
}
inline void StoreF16(uint16_t* p, F8 a) {
  for (int i = 0; i < 8; ++i) p[i] = FloatToHalf(a.v[i]);
}
inline void StoreBF16(uint16_t* p, F8 a) {
  for (int i = 0; i < 8; ++i) p[i] = FloatToBf16(a.v[i]);
}
inline F8 LoadF16Partial(const uint16_t* p, int n) {
  F8 r{};
  for (int i = 0; i < n; ++i) r.v[i] = HalfToFloat(p[i]);
  return r;
}
inline F8 LoadBF16Partial(const uint16_t* p, int n) {
  F8 r{};
  for (int i = 0; i < n; ++i) r.v[i] = Bf16ToFloat(p[i]);
  return r;
}

inline void CompilerBarrier() {}

inline void KeepAlive(uint32_t x) { asm volatile("" : : "r"(x)); }

inline void PrefetchL2(const void* p) { __builtin_prefetch(p, 0, 1); }

}  // namespace chunkserve::kernels::cpu::scalar

#endif  // CHUNKSERVE_KERNELS_CPU_SIMD_SCALAR_H_
