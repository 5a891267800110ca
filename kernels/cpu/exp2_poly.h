// The polynomial every vector Exp2 evaluates (simd_ymm.h, simd_avx512.h, simd_scalar.h): 2^f for
// f in [-1/2, 1/2] by its degree-6 Taylor polynomial in f * ln2 (relative error < 2e-7), highest
// power first, for Horner's rule. One definition, so that every ISA build computes the same
// softmax weights.
#ifndef CHUNKSERVE_KERNELS_CPU_EXP2_POLY_H_
#define CHUNKSERVE_KERNELS_CPU_EXP2_POLY_H_

namespace chunkserve::kernels::cpu {

inline constexpr int kExp2PolyTerms = 7;
inline constexpr float kExp2Poly[kExp2PolyTerms] = {1.5403530393381606e-4f,
                                                    1.3333558146428443e-3f,
                                                    9.6181291076284772e-3f,
                                                    5.5504108664821580e-2f,
                                                    2.4022650695910071e-1f,
                                                    6.9314718055994531e-1f,
                                                    1.0f};

}  // namespace chunkserve::kernels::cpu

#endif  // CHUNKSERVE_KERNELS_CPU_EXP2_POLY_H_
