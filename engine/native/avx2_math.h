/* Vector helpers of the AVX2 builds (engine/attention/cpu_paged_prefill.c). Include after
 * <immintrin.h>, under __AVX2__ and __FMA__. */
#ifndef TOKENMILL_AVX2_MATH_H
#define TOKENMILL_AVX2_MATH_H
/* avx512_math.h's fast_exp16 on 8 lanes: the same polynomial; 2^i built in the exponent bits
 * (AVX2 has no scalef). Inputs are <= 0 in the kernels, so i stays in [-126, 0]. */
static inline __m256 fast_exp8(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.0f);
    const __m256 keep = _mm256_cmp_ps(x, lo, _CMP_GT_OQ);
    x = _mm256_max_ps(x, lo);
    const __m256 i = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
    const __m256 r = _mm256_fnmadd_ps(i, _mm256_set1_ps(1.42860682030941723e-6f),
                                      _mm256_fnmadd_ps(i, _mm256_set1_ps(0.693145751953125f), x));
    __m256 p = _mm256_set1_ps(1.0f / 720.0f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(i), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(bits)), keep);
}
#endif
