// Element types of model weights and the conversions between them and fp32.
//
// The model layer uses the kernels' DType (kernels/attention_params.h) so that a weight's dtype
// can be handed to a backend unchanged. Three names exist for each type, one per ecosystem:
//
//   DType       chunkserve name   safetensors   torch_dtype (config.json)
//   kF32        "f32"             "F32"         "float32"
//   kF16        "f16"             "F16"         "float16"
//   kBF16       "bf16"            "BF16"        "bfloat16"
//
// Conversions are bit-exact and independent of the host's floating-point environment: fp32 ->
// fp16 / bf16 rounds to nearest, ties to even, in integer arithmetic; overflow becomes infinity;
// NaN stays NaN (quiet, sign kept); fp16 subnormals are produced and read exactly. The same bits
// come out on every compiler and standard library, which the tiny-model writer relies on.
//
// Thread safety: all functions are pure.
#ifndef CHUNKSERVE_RUNTIME_MODEL_DTYPE_H_
#define CHUNKSERVE_RUNTIME_MODEL_DTYPE_H_

#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "kernels/attention_params.h"
#include "runtime/base/status.h"

namespace chunkserve::model {

using DType = ::chunkserve::kernels::DType;
using ::chunkserve::kernels::DTypeSize;

// "f32", "f16", "bf16".
std::string_view DTypeName(DType dtype);
// "F32", "F16", "BF16": the dtype strings of the safetensors header.
std::string_view SafetensorsDTypeName(DType dtype);
// "float32", "float16", "bfloat16": config.json's torch_dtype.
std::string_view TorchDTypeName(DType dtype);

// Accepts any of the three spellings above (case-sensitive), plus "fp32", "fp16", "half" and
// "float". InvalidArgument naming the text otherwise.
Result<DType> ParseDType(std::string_view text);

// fp32 -> IEEE binary16, round to nearest even.
inline uint16_t FloatToHalf(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) {  // NaN: quiet it, keep the top payload bits
    return static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));
  }
  // 65520 is halfway between the largest half (65504) and 2^16; ties go to even, i.e. infinity.
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);
  if (abs >= 0x38800000u) {  // normal half: rebias the exponent (127 -> 15), round 13 bits away
    abs -= 112u << 23;
    abs += 0xfffu + ((abs >> 13) & 1u);
    return static_cast<uint16_t>(sign | (abs >> 13));
  }
  // Half subnormal (or zero): count units of 2^-24, rounding the remainder to nearest even.
  // Below 2^-25 (including float subnormals) everything rounds to zero; 2^-25 itself ties to 0.
  if (abs <= 0x33000000u) return sign;
  const uint32_t exponent = abs >> 23;                         // 102..112
  const uint32_t significand = (abs & 0x7fffffu) | 0x800000u;  // 24 bits
  const uint32_t shift = 126u - exponent;                      // 14..24
  uint32_t half = significand >> shift;
  const uint32_t rest = significand & ((1u << shift) - 1u);
  const uint32_t halfway = 1u << (shift - 1u);
  if (rest > halfway || (rest == halfway && (half & 1u))) ++half;  // may carry into the exponent
  return static_cast<uint16_t>(sign | half);
}

// IEEE binary16 -> fp32 (exact).
inline float HalfToFloat(uint16_t half) {
  const uint32_t sign = static_cast<uint32_t>(half & 0x8000u) << 16;
  const uint32_t exponent = (half >> 10) & 0x1fu;
  uint32_t mantissa = half & 0x3ffu;
  uint32_t bits;
  if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112u) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;
  } else {  // subnormal: normalize
    uint32_t e = 113;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --e;
    }
    bits = sign | (e << 23) | ((mantissa & 0x3ffu) << 13);
  }
  return std::bit_cast<float>(bits);
}

// fp32 -> bfloat16, round to nearest even.
inline uint16_t FloatToBf16(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {  // NaN: quiet it (rounding could turn it into inf)
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  }
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

// bfloat16 -> fp32 (exact).
inline float Bf16ToFloat(uint16_t value) {
  return std::bit_cast<float>(static_cast<uint32_t>(value) << 16);
}

// Converts dst.size() elements of type `src_dtype` starting at `src` to fp32. `src` needs no
// particular alignment.
void ConvertToFloat(DType src_dtype, const void* src, std::span<float> dst);

// Converts `src` to dst_dtype, writing src.size() * DTypeSize(dst_dtype) bytes at `dst` (no
// particular alignment needed).
void ConvertFromFloat(std::span<const float> src, DType dst_dtype, void* dst);

}  // namespace chunkserve::model

#endif  // CHUNKSERVE_RUNTIME_MODEL_DTYPE_H_
