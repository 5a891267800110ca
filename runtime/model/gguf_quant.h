// Dequantization of ggml tensor data (GGUF) to fp32.
//
// Supported types and their block layouts (little-endian; "half" is IEEE binary16; ggml's
// ggml-common.h names; values are reconstructed exactly as ggml's dequantize_row_* do, in fp32):
//
//   type  elems bytes  layout                                        value of element i
//   F32   1     4      float                                         x
//   F16   1     2      half                                          x
//   BF16  1     2      bfloat16                                      x
//   Q8_0  32    34     half d; int8 qs[32]                           d * qs[i]
//   Q4_0  32    18     half d; u8 qs[16]                             d * (nib(i) - 8)
//   Q4_1  32    20     half d, m; u8 qs[16]                          d * nib(i) + m
//   Q5_0  32    22     half d; u8 qh[4]; u8 qs[16]                   d * ((nib(i) | hi(i) << 4) - 16)
//   Q5_1  32    24     half d, m; u8 qh[4]; u8 qs[16]                d * (nib(i) | hi(i) << 4) + m
//   Q4_K  256   144    half d, dmin; u8 scales[12]; u8 qs[128]       (d * sc[s]) * q - dmin * mn[s]
//   Q5_K  256   176    half d, dmin; u8 scales[12]; u8 qh[32]; qs[128]   as Q4_K, q has 5 bits
//   Q6_K  256   210    u8 ql[128]; u8 qh[64]; int8 scales[16]; half d    (d * sc[s]) * (q - 32)
//
// In the 32-element types nib(i) is the low nibble of qs[i] for i < 16 and the high nibble of
// qs[i - 16] otherwise; hi(i) is bit i of qh read as a little-endian u32. K-quants are
// "super-blocks" of 256 split into sub-blocks of 32 (Q4_K, Q5_K: 8 six-bit scale/min pairs packed
// into 12 bytes) or 16 (Q6_K: 16 int8 scales). See gguf_quant.cc for the bit positions.
//
// Thread safety: pure functions.
#ifndef CHUNKSERVE_RUNTIME_MODEL_GGUF_QUANT_H_
#define CHUNKSERVE_RUNTIME_MODEL_GGUF_QUANT_H_

#include <cstdint>
#include <span>

#include "runtime/base/status.h"
#include "runtime/model/gguf.h"

namespace chunkserve::model {

// Whether DequantizeGgml handles `type` (the table above).
bool CanDequantize(GgmlType type);

// Dequantizes `src`, the data of dst.size() elements of `type`, into `dst`. dst.size() must be a
// multiple of the type's block size and src.size() exactly dst.size() / block_size * type_size
// (InvalidArgument otherwise); Unimplemented, naming the type, for types outside the table.
// `src` needs no alignment.
Status DequantizeGgml(GgmlType type, std::span<const uint8_t> src, std::span<float> dst);

}  // namespace chunkserve::model

#endif  // CHUNKSERVE_RUNTIME_MODEL_GGUF_QUANT_H_
