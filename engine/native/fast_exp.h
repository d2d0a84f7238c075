/* The arithmetic of the vector exp, one definition for every ISA's build (avx512_math.h's
 * fast_exp16, avx2_math.h's fast_exp8): exp(x) = 2^i * p(r) with i = floor(x * log2(e) + 1/2),
 * r = x - i * ln 2 (ln 2 split in two so the product is exact) and p the degree-6 Taylor
 * polynomial of exp at 0, in Horner form. PFX is the intrinsics' prefix (_mm512, _mm256) and
 * FLOOR the ISA's round-down; the caller clamps x, applies 2^i and masks lanes under the clamp. */
#ifndef TOKENMILL_FAST_EXP_H
#define TOKENMILL_FAST_EXP_H
#define FAST_EXP_MIN_INPUT (-87.0f) /* below it exp underflows float32: the lane becomes 0 */
#define FAST_EXP_REDUCE(PFX, FLOOR, x, i, p)                                                              \
    const __typeof__(x) i = FLOOR(PFX##_fmadd_ps(x, PFX##_set1_ps(1.44269504088896341f), PFX##_set1_ps(0.5f))); \
    const __typeof__(x) i##_r = PFX##_fnmadd_ps(i, PFX##_set1_ps(1.42860682030941723e-6f),                 \
                                                PFX##_fnmadd_ps(i, PFX##_set1_ps(0.693145751953125f), x)); \
    __typeof__(x) p = PFX##_set1_ps(1.0f / 720.0f);                                                       \
    p = PFX##_fmadd_ps(p, i##_r, PFX##_set1_ps(1.0f / 120.0f));                                           \
    p = PFX##_fmadd_ps(p, i##_r, PFX##_set1_ps(1.0f / 24.0f));                                            \
    p = PFX##_fmadd_ps(p, i##_r, PFX##_set1_ps(1.0f / 6.0f));                                             \
    p = PFX##_fmadd_ps(p, i##_r, PFX##_set1_ps(0.5f));                                                    \
    p = PFX##_fmadd_ps(p, i##_r, PFX##_set1_ps(1.0f));                                                    \
    p = PFX##_fmadd_ps(p, i##_r, PFX##_set1_ps(1.0f))
#endif
