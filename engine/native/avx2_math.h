/* Vector helpers of the AVX2 builds (attention prefill, few_rows.c, the quant kernels). Include after
 * <immintrin.h>, under __AVX2__ and __FMA__. */
#ifndef TOKENMILL_AVX2_MATH_H
#define TOKENMILL_AVX2_MATH_H
#include "fast_exp.h"

/* avx512_math.h's fast_exp16 on 8 lanes: 2^i built in the exponent bits (AVX2 has no scalef).
 * Inputs are <= 0 in the kernels, so i stays in [-126, 0]. */
static inline __m256 fast_exp8(__m256 x) {
    const __m256 lo = _mm256_set1_ps(FAST_EXP_MIN_INPUT);
    const __m256 keep = _mm256_cmp_ps(x, lo, _CMP_GT_OQ);
    x = _mm256_max_ps(x, lo);
    FAST_EXP_REDUCE(_mm256, _mm256_floor_ps, x, i, p);
    const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(i), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(bits)), keep);
}

/* out[p] = the sum of the 8 lanes of acc[p]: pairwise horizontal adds within each 128-bit half,
 * then the two halves added (avx512_math.h's hsum16 scheme on 8 lanes). */
static inline __m256 hsum8(const __m256 acc[8]) {
    const __m256 s0123 = _mm256_hadd_ps(_mm256_hadd_ps(acc[0], acc[1]), _mm256_hadd_ps(acc[2], acc[3]));
    const __m256 s4567 = _mm256_hadd_ps(_mm256_hadd_ps(acc[4], acc[5]), _mm256_hadd_ps(acc[6], acc[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(s0123, s4567, 0x20), _mm256_permute2f128_ps(s0123, s4567, 0x31));
}
#endif
