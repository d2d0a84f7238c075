/* Row quantization of engine/native/int8_rows.c, step for step as engine/quant/linear.py's
 * quantize_rows: scale = max(absmax, 1e-12) / 127 in float32, q = round(x / scale) (a true
 * division, half to even) clamped to +-127. Included there after the ISA macros (LANES, XT,
 * SHIFTED); the callers check in % 64 == 0. Each row is written as int8 (for torch._int_mm) or
 * in the kernel's own form XT: q + 128 as unsigned bytes (vpdpbusd) or q as int16 (vpmaddwd). */
#ifndef TOKENMILL_INT8_ROWS_QUANT_H
#define TOKENMILL_INT8_ROWS_QUANT_H

#if LANES == 16
#define LOAD_F32(p) _mm512_loadu_ps(p)
#define LOAD_BF16(p) _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(p))), 16))
#define F_ABS(v) _mm512_abs_ps(v)
#define F_MAX(a, b) _mm512_max_ps((a), (b))
#define F_HMAX(v) _mm512_reduce_max_ps(v)
#define F_DIV(a, b) _mm512_div_ps((a), (b))
#define F_RINT(v) _mm512_roundscale_ps((v), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define F_CLAMP(v) _mm512_min_ps(_mm512_max_ps((v), _mm512_set1_ps(-127.0f)), _mm512_set1_ps(127.0f))
#define TO_I(v) _mm512_cvtps_epi32(v)
#define STORE_I8(p, v) _mm_storeu_si128((__m128i *)(p), _mm512_cvtepi32_epi8(v))
#define STORE_U8(p, v) STORE_I8((p), _mm512_add_epi32((v), _mm512_set1_epi32(128)))
#define STORE_I16(p, v) _mm256_storeu_si256((__m256i *)(p), _mm512_cvtepi32_epi16(v))
#else
#define LOAD_F32(p) _mm256_loadu_ps(p)
#define LOAD_BF16(p) _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p))), 16))
#define F_ABS(v) _mm256_andnot_ps(_mm256_set1_ps(-0.0f), (v))
#define F_MAX(a, b) _mm256_max_ps((a), (b))
#define F_DIV(a, b) _mm256_div_ps((a), (b))
#define F_RINT(v) _mm256_round_ps((v), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define F_CLAMP(v) _mm256_min_ps(_mm256_max_ps((v), _mm256_set1_ps(-127.0f)), _mm256_set1_ps(127.0f))
#define TO_I(v) _mm256_cvtps_epi32(v)
static inline float hmax8(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps(m, m, 1)));
}
#define F_HMAX(v) hmax8(v)
static inline __m128i pack16(__m256i v) { /* 8 int32 -> 8 int16 (saturating: values are in range) */
    return _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
}
#define STORE_I8(p, v) _mm_storel_epi64((__m128i *)(p), _mm_packs_epi16(pack16(v), pack16(v)))
static inline __m128i shifted_u8(__m256i v) { /* 8 int32 in [-127, 127] -> 8 bytes v + 128 (low half) */
    const __m128i p = pack16(_mm256_add_epi32(v, _mm256_set1_epi32(128)));
    return _mm_packus_epi16(p, p);
}
#define STORE_U8(p, v) _mm_storel_epi64((__m128i *)(p), shifted_u8(v))
#define STORE_I16(p, v) _mm_storeu_si128((__m128i *)(p), pack16(v))
#endif

#if SHIFTED
#define STORE_XT STORE_U8
#else
#define STORE_XT STORE_I16
#endif

#define QUANT_ROW(NAME, T, LOADV, DT, STOREV)                                           \
    static inline void NAME(const T *x, int64_t in, DT *q, float *scale) {              \
        VF m = F_SET1(0.0f);                                                             \
        for (int64_t i = 0; i < in; i += LANES) m = F_MAX(m, F_ABS(LOADV(x + i)));       \
        float a = F_HMAX(m);                                                             \
        a = a < 1e-12f ? 1e-12f : a;                                                     \
        const float s = a / 127.0f;                                                      \
        const VF sv = F_SET1(s);                                                         \
        *scale = s;                                                                      \
        for (int64_t i = 0; i < in; i += LANES) STOREV(q + i, TO_I(F_CLAMP(F_RINT(F_DIV(LOADV(x + i), sv))))); \
    }

QUANT_ROW(quant_prep_f32, float, LOAD_F32, XT, STORE_XT)
QUANT_ROW(quant_prep_bf16, uint16_t, LOAD_BF16, XT, STORE_XT)
QUANT_ROW(quant_i8_f32, float, LOAD_F32, int8_t, STORE_I8)
QUANT_ROW(quant_i8_bf16, uint16_t, LOAD_BF16, int8_t, STORE_I8)
#endif
