#include "runtime/model/gguf_quant.h"

#include <cstring>
#include <string>

#include "runtime/model/dtype.h"

namespace chunkserve::model {
namespace {

// Blocks are byte-packed (ggml's structs have 2-byte alignment at most and the file gives no
// alignment to a block inside a tensor), so every multi-byte field is read with memcpy.
float Half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return HalfToFloat(h);
}

void Q8_0(const uint8_t* b, float* y) {
  const float d = Half(b);
  for (int i = 0; i < 32; ++i) y[i] = d * static_cast<float>(static_cast<int8_t>(b[2 + i]));
}

void Q4_0(const uint8_t* b, float* y) {
  const float d = Half(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>((qs[j] & 0x0f) - 8) * d;
    y[j + 16] = static_cast<float>((qs[j] >> 4) - 8) * d;
  }
}

void Q4_1(const uint8_t* b, float* y) {
  const float d = Half(b);
  const float m = Half(b + 2);
  const uint8_t* qs = b + 4;
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>(qs[j] & 0x0f) * d + m;
    y[j + 16] = static_cast<float>(qs[j] >> 4) * d + m;
  }
}

// Q5_0 / Q5_1: the fifth bit of element j is bit j of qh, of element j + 16 bit j + 16.
void Q5(const uint8_t* b, float* y, bool has_min) {
  const float d = Half(b);
  const float m = has_min ? Half(b + 2) : 0.0f;
  const uint8_t* p = b + (has_min ? 4 : 2);
  uint32_t qh;
  std::memcpy(&qh, p, 4);
  const uint8_t* qs = p + 4;
  const int offset = has_min ? 0 : 16;
  for (int j = 0; j < 16; ++j) {
    const int x0 = ((qs[j] & 0x0f) | static_cast<int>(((qh >> j) & 1u) << 4)) - offset;
    const int x1 = ((qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4)) - offset;
    if (has_min) {
      y[j] = static_cast<float>(x0) * d + m;
      y[j + 16] = static_cast<float>(x1) * d + m;
    } else {
      y[j] = static_cast<float>(x0) * d;
      y[j + 16] = static_cast<float>(x1) * d;
    }
  }
}

// Q4_K / Q5_K scales: 8 six-bit (scale, min) pairs in 12 bytes. Pairs 0..3 are the low six bits
// of bytes 0..3 (scale) and 4..7 (min); pairs 4..7 take their low four bits from bytes 8..11
// (scale: low nibble, min: high nibble) and their top two bits from the top two bits of bytes
// 0..3 (scale) and 4..7 (min). ggml's get_scale_min_k4.
void ScaleMinK4(int j, const uint8_t* q, uint8_t* sc, uint8_t* mn) {
  if (j < 4) {
    *sc = q[j] & 63;
    *mn = q[j + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4));
    *mn = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

// Q4_K: four groups of 64; group g uses sub-blocks 2g (low nibbles of qs[32g..32g+32)) and 2g + 1
// (their high nibbles).
void Q4_K(const uint8_t* b, float* y) {
  const float d = Half(b);
  const float dmin = Half(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* q = b + 16;
  for (int g = 0; g < 4; ++g) {
    uint8_t sc, mn;
    ScaleMinK4(2 * g, scales, &sc, &mn);
    const float d1 = d * sc, m1 = dmin * mn;
    ScaleMinK4(2 * g + 1, scales, &sc, &mn);
    const float d2 = d * sc, m2 = dmin * mn;
    for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>(q[l] & 0x0f) - m1;
    for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>(q[l] >> 4) - m2;
    q += 32;
  }
}

// Q5_K: as Q4_K; the fifth bit of group g's low-nibble half is bit 2g of qh[l], of its
// high-nibble half bit 2g + 1.
void Q5_K(const uint8_t* b, float* y) {
  const float d = Half(b);
  const float dmin = Half(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* ql = b + 48;
  for (int g = 0; g < 4; ++g) {
    uint8_t sc, mn;
    ScaleMinK4(2 * g, scales, &sc, &mn);
    const float d1 = d * sc, m1 = dmin * mn;
    ScaleMinK4(2 * g + 1, scales, &sc, &mn);
    const float d2 = d * sc, m2 = dmin * mn;
    const uint8_t u1 = static_cast<uint8_t>(1u << (2 * g));
    const uint8_t u2 = static_cast<uint8_t>(2u << (2 * g));
    for (int l = 0; l < 32; ++l) {
      *y++ = d1 * static_cast<float>((ql[l] & 0x0f) + ((qh[l] & u1) ? 16 : 0)) - m1;
    }
    for (int l = 0; l < 32; ++l) {
      *y++ = d2 * static_cast<float>((ql[l] >> 4) + ((qh[l] & u2) ? 16 : 0)) - m2;
    }
    ql += 32;
  }
}

// Q6_K: two halves of 128. In each, element l + 32k (k = 0..3, l = 0..31) takes its low four bits
// from ql[l] (k = 0), ql[l + 32] (k = 1), or their high nibbles (k = 2, 3), its top two bits from
// bits 2k..2k+1 of qh[l], and scale sc[l / 16 + 2k].
void Q6_K(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = Half(b + 208);
  for (int half = 0; half < 2; ++half) {
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = ((ql[l] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l] = d * static_cast<float>(sc[is + 0]) * static_cast<float>(q1);
      y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
      y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
      y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
    }
    y += 128;
    ql += 64;
    qh += 32;
    sc += 8;
  }
}

using BlockFn = void (*)(const uint8_t*, float*);

BlockFn BlockFunction(GgmlType type) {
  switch (type) {
    case GgmlType::kQ8_0: return Q8_0;
    case GgmlType::kQ4_0: return Q4_0;
    case GgmlType::kQ4_1: return Q4_1;
    case GgmlType::kQ5_0: return [](const uint8_t* b, float* y) { Q5(b, y, false); };
    case GgmlType::kQ5_1: return [](const uint8_t* b, float* y) { Q5(b, y, true); };
    case GgmlType::kQ4_K: return Q4_K;
    case GgmlType::kQ5_K: return Q5_K;
    case GgmlType::kQ6_K: return Q6_K;
    default: return nullptr;
  }
}

}  // namespace

bool CanDequantize(GgmlType type) {
  return type == GgmlType::kF32 || type == GgmlType::kF16 || type == GgmlType::kBF16 ||
         BlockFunction(type) != nullptr;
}

Status DequantizeGgml(GgmlType type, std::span<const uint8_t> src, std::span<float> dst) {
  if (!CanDequantize(type)) {
    return Status::Unimplemented("ggml type " + GgmlTypeName(type) +
                                 " cannot be dequantized (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, "
                                 "Q5_1, Q4_K, Q5_K and Q6_K can)");
  }
  const GgmlTypeTraits traits = *GgmlTypeInfo(static_cast<uint32_t>(type));
  const uint64_t n = dst.size();
  if (n % static_cast<uint64_t>(traits.block_size) != 0) {
    return Status::InvalidArgument(std::to_string(n) + " elements of " + GgmlTypeName(type) +
                                   " are not a whole number of " +
                                   std::to_string(traits.block_size) + "-element blocks");
  }
  const uint64_t blocks = n / static_cast<uint64_t>(traits.block_size);
  if (src.size() != blocks * static_cast<uint64_t>(traits.type_size)) {
    return Status::InvalidArgument(std::to_string(n) + " elements of " + GgmlTypeName(type) +
                                   " take " +
                                   std::to_string(blocks * static_cast<uint64_t>(traits.type_size)) +
                                   " bytes, got " + std::to_string(src.size()));
  }
  switch (type) {
    case GgmlType::kF32:
      ConvertToFloat(DType::kF32, src.data(), dst);
      return Status::Ok();
    case GgmlType::kF16:
      ConvertToFloat(DType::kF16, src.data(), dst);
      return Status::Ok();
    case GgmlType::kBF16:
      ConvertToFloat(DType::kBF16, src.data(), dst);
      return Status::Ok();
    default:
      break;
  }
  const BlockFn fn = BlockFunction(type);
  const size_t bs = static_cast<size_t>(traits.block_size);
  const size_t ts = static_cast<size_t>(traits.type_size);
  for (uint64_t i = 0; i < blocks; ++i) fn(src.data() + i * ts, dst.data() + i * bs);
  return Status::Ok();
}

}  // namespace chunkserve::model
