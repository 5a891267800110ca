#include "runtime/model/dtype.h"

#include <cstring>
#include <string>

namespace chunkserve::model {

std::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kF16:
      return "f16";
    case DType::kBF16:
      return "bf16";
  }
  return "unknown";
}

std::string_view SafetensorsDTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
  }
  return "unknown";
}

std::string_view TorchDTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "float32";
    case DType::kF16:
      return "float16";
    case DType::kBF16:
      return "bfloat16";
  }
  return "unknown";
}

Result<DType> ParseDType(std::string_view text) {
  if (text == "f32" || text == "F32" || text == "float32" || text == "fp32" || text == "float") {
    return DType::kF32;
  }
  if (text == "f16" || text == "F16" || text == "float16" || text == "fp16" || text == "half") {
    return DType::kF16;
  }
  if (text == "bf16" || text == "BF16" || text == "bfloat16") return DType::kBF16;
  return Status::InvalidArgument("unknown dtype '" + std::string(text) +
                                 "' (expected f32, f16 or bf16)");
}

void ConvertToFloat(DType src_dtype, const void* src, std::span<float> dst) {
  const auto* bytes = static_cast<const unsigned char*>(src);
  switch (src_dtype) {
    case DType::kF32:
      if (!dst.empty()) std::memcpy(dst.data(), bytes, dst.size() * sizeof(float));
      return;
    case DType::kF16:
    case DType::kBF16:
      for (size_t i = 0; i < dst.size(); ++i) {
        uint16_t h;
        std::memcpy(&h, bytes + 2 * i, sizeof(h));  // memcpy: `src` may be unaligned
        dst[i] = src_dtype == DType::kF16 ? HalfToFloat(h) : Bf16ToFloat(h);
      }
      return;
  }
}

void ConvertFromFloat(std::span<const float> src, DType dst_dtype, void* dst) {
  auto* bytes = static_cast<unsigned char*>(dst);
  switch (dst_dtype) {
    case DType::kF32:
      if (!src.empty()) std::memcpy(bytes, src.data(), src.size() * sizeof(float));
      return;
    case DType::kF16:
    case DType::kBF16:
      for (size_t i = 0; i < src.size(); ++i) {
        const uint16_t h = dst_dtype == DType::kF16 ? FloatToHalf(src[i]) : FloatToBf16(src[i]);
        std::memcpy(bytes + 2 * i, &h, sizeof(h));
      }
      return;
  }
}

}  // namespace chunkserve::model
