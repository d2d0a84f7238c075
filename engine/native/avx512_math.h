/* Vector helpers shared by the AVX-512 kernels (engine/attention/cpu_paged_decode.c and
 * cpu_paged_prefill.c, engine/native/few_rows.c). Include after <immintrin.h>, under __AVX512F__. */
#ifndef TOKENMILL_AVX512_MATH_H
#define TOKENMILL_AVX512_MATH_H
#include "fast_exp.h"

/* fast_exp on 16 lanes (the scalar loop over scores did not vectorize: gcc kept the floor and
 * the exponent bit trick scalar): 2^i applied by scalef. */
#define FLOOR16(v) _mm512_roundscale_ps(v, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC)
static inline __m512 fast_exp16(__m512 x) {
    const __m512 lo = _mm512_set1_ps(FAST_EXP_MIN_INPUT);
    const __mmask16 keep = _mm512_cmp_ps_mask(x, lo, _CMP_GT_OQ);
    x = _mm512_max_ps(x, lo);
    FAST_EXP_REDUCE(_mm512, FLOOR16, x, i, p);
    return _mm512_maskz_mov_ps(keep, _mm512_scalef_ps(p, i));
}

/* out[p] = the sum of the 16 lanes of acc[p], for 16 vectors at once: pairs are interleaved and
 * added (unpack), then quads (64-bit unpack), then the four 128-bit lanes (shuffle), so every
 * add works on useful lanes instead of one horizontal reduction per vector. */
static inline __m512 hsum16(const __m512 acc[16]) {
    __m512 t[8], u[4];
    for (int i = 0; i < 8; ++i)
        t[i] = _mm512_add_ps(_mm512_unpacklo_ps(acc[2 * i], acc[2 * i + 1]), _mm512_unpackhi_ps(acc[2 * i], acc[2 * i + 1]));
    for (int i = 0; i < 4; ++i) {
        const __m512d a = _mm512_castps_pd(t[2 * i]), b = _mm512_castps_pd(t[2 * i + 1]);
        u[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
    }
    const __m512 w01 = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], 0x44), _mm512_shuffle_f32x4(u[0], u[1], 0xEE));
    const __m512 w23 = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], 0x44), _mm512_shuffle_f32x4(u[2], u[3], 0xEE));
    return _mm512_add_ps(_mm512_shuffle_f32x4(w01, w23, 0x88), _mm512_shuffle_f32x4(w01, w23, 0xDD));
}
#endif
