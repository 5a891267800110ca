// Portable fp16 / bf16 <-> fp32 conversions for KV storage.
//
// Both narrowing conversions round to nearest, ties to even, as the hardware does (F16C's
// vcvtps2ph with _MM_FROUND_TO_NEAREST_INT; bf16 as PyTorch and Eigen round). fp16: values beyond
// the largest finite half (65504, after rounding) become +-inf; values below the smallest subnormal
// round to +-0; NaN stays NaN (quiet). bf16: NaN stays a quiet NaN (rounding must not carry a NaN
// into inf); everything else rounds, overflow to +-inf like fp32 arithmetic would.
//
// These are the reference conversions: the AVX2 kernels use F16C and shifts, and the tests check
// that both agree on every half and on the rounding ties.
#ifndef CHUNKSERVE_KERNELS_CPU_DTYPE_H_
#define CHUNKSERVE_KERNELS_CPU_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/attention_params.h"

namespace chunkserve::kernels::cpu {

inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

inline float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

inline float Bf16ToFloat(uint16_t h) { return BitsFloat(static_cast<uint32_t>(h) << 16); }

inline uint16_t FloatToBf16(float f) {
  const uint32_t u = FloatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // NaN
  const uint32_t rounding_bias = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding_bias) >> 16);
}

inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) return BitsFloat(sign | 0x7f800000u | (mantissa << 13));  // inf, NaN
  if (exponent != 0) return BitsFloat(sign | ((exponent + 112u) << 23) | (mantissa << 13));
  if (mantissa == 0) return BitsFloat(sign);  // +-0
  // Subnormal half: normalize into a normal float.
  uint32_t e = 113;
  while ((mantissa & 0x400u) == 0) {
    mantissa <<= 1;
    --e;
  }
  return BitsFloat(sign | (e << 23) | ((mantissa & 0x3ffu) << 13));
}

inline uint16_t FloatToHalf(float f) {
  const uint32_t u = FloatBits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (abs >= 0x38800000u) {  // normal half: exponent >= -14
    // Rebias the exponent (127 -> 15) and round the 13 dropped mantissa bits to nearest even.
    const uint32_t rebased = abs - 0x38000000u;
    const uint32_t rounded = rebased + 0xfffu + ((rebased >> 13) & 1u);
    return static_cast<uint16_t>(sign | (rounded >> 13));
  }
  if (abs < 0x33000000u) return sign;  // below half the smallest subnormal (2^-25): +-0
  // Subnormal half: value = mantissa * 2^-24; shift the full 24-bit significand into place and
  // round to nearest even on the dropped bits.
  const uint32_t exponent = abs >> 23;  // 102..112
  const uint32_t significand = (abs & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126 - exponent;  // 14..24
  const uint32_t half_bits = significand >> shift;
  const uint32_t remainder = significand & ((1u << shift) - 1);
  const uint32_t halfway = 1u << (shift - 1);
  const uint32_t round_up = remainder > halfway || (remainder == halfway && (half_bits & 1u));
  return static_cast<uint16_t>(sign | (half_bits + round_up));
}

// Converts n values between fp32 and a KV storage dtype (plain loops; the kernels have faster
// paths). `src`/`dst` hold n elements of the named type.
void ConvertToFloat(DType dtype, const void* src, float* dst, size_t n);
void ConvertFromFloat(DType dtype, const float* src, void* dst, size_t n);

// Rounds x through the dtype and back: what a value looks like after being stored as K or V.
inline float RoundThrough(DType dtype, float x) {
  switch (dtype) {
    case DType::kF16:
      return HalfToFloat(FloatToHalf(x));
    case DType::kBF16:
      return Bf16ToFloat(FloatToBf16(x));
    case DType::kF32:
      break;
  }
  return x;
}

}  // namespace chunkserve::kernels::cpu

#endif  // CHUNKSERVE_KERNELS_CPU_DTYPE_H_
