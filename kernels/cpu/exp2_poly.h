// The polynomial every vector Exp2 evaluates (simd_ymm.h, simd_avx512.h, simd_scalar.h): 2^f for
// f in [-1/2, 1/2] by a degree-5 polynomial with p(0) = 1, fitted for relative error (9e-8 exact,
// 1.9e-7 evaluated in fp32; the degree-6 Taylor polynomial it replaced: 1.6e-7 and 2.4e-7, with one
// FMA more per exponential), highest power first, for Horner's rule. One definition, so that every
// ISA build computes the same softmax weights.
#ifndef CHUNKSERVE_KERNELS_CPU_EXP2_POLY_H_
#define CHUNKSERVE_KERNELS_CPU_EXP2_POLY_H_

namespace chunkserve::kernels::cpu {

inline constexpr int kExp2PolyTerms = 6;
inline constexpr float kExp2Poly[kExp2PolyTerms] = {1.326471882187822e-3f,
                                                    9.671513746117445e-3f,
                                                    5.550733775900224e-2f,
                                                    2.4022242064434354e-1f,
                                                    6.93146977574279e-1f,
                                                    1.0f};

}  // namespace chunkserve::kernels::cpu

#endif  // CHUNKSERVE_KERNELS_CPU_EXP2_POLY_H_
