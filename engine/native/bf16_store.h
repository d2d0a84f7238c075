/* Vectors of float32 stored as bfloat16, rounded as bf16.h's f32_to_bf16 (nearest even, NaN kept
 * quiet), for the kernels that pick their vector width by LANES (16: AVX-512, 8: AVX2); included
 * after that choice. One pass instead of a scalar loop per lane: in engine/native/int8_rows.c,
 * scaling 2,048 x 1,536 int32 sums into bfloat16 took 1,266 us with the loop and 216 with this
 * (float32 outputs: 224; 2-core Zen 5, bench/published/product-paths-20261208-030034.json). */
#ifndef TOKENMILL_BF16_STORE_H
#define TOKENMILL_BF16_STORE_H
#include <immintrin.h>
#include <stdint.h>

#if LANES == 16
static inline void store_bf16(uint16_t *dst, __m512 f) {
    const __m512i u = _mm512_castps_si512(f);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                  _mm512_set1_epi32(0x7f800000));
    r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40)));
    _mm256_storeu_si256((__m256i *)dst, _mm512_cvtepi32_epi16(r));
}
#else
static inline void store_bf16(uint16_t *dst, __m256 f) {
    const __m256i u = _mm256_castps_si256(f);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                           _mm256_set1_epi32(0x7f800000)); /* both sides non-negative */
    r = _mm256_blendv_epi8(r, _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40)), nan);
    /* 0..65535 in each int32: the unsigned saturating pack is exact */
    _mm_storeu_si128((__m128i *)dst, _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1)));
}
#endif
#endif
