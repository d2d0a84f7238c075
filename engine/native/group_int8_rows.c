/* Few-row products with a group-wise int8 weight (GGUF Q8_0 / Q5_0 as stored: int8 values, one
 * float16 scale per 32 columns), dequantised in registers: y[r, o] = sum_i x[r, i] * q[o, i] * d[o, i / 32].
 *
 * Why: GroupInt8Linear dequantised its whole weight in torch for every call, so a decode step's
 * product of 1-8 rows cost a full float weight's writes and reads; here the weight is read once,
 * at 1.06 bytes per value, and each loaded vector serves every row (rows stay in L1).
 *
 * Same arithmetic as the dequantised product: q * d of an int8 and a float16 is exact in float32,
 * so with float32 rows this is F.linear(x, dequantised weight) up to the order of the float32
 * sums. With bfloat16 rows the weight is first rounded to bfloat16 (nearest even), as
 * GroupInt8Linear's torch route rounds it (``w.to(x.dtype)``); bfloat16 x bfloat16 products are
 * exact in float32 (vdpbf16ps with avx512_bf16, widened FMAs otherwise) and the result is rounded
 * to bfloat16 once.
 *
 * Layout: q [out, in] int8, d [out, in / 32] float16 bits, x [rows, in] with row stride xs, y
 * [rows, out] with row stride ys. The caller checks 1 <= rows <= 8, in % 32 == 0, out % 16 == 0.
 * Built with FMA contraction (the sums need not match torch's rounding); outputs shared out a
 * tile at a time by OpenMP on torch's threads (engine/native explains why).
 */
#include <immintrin.h>
#include <stdint.h>

#define MAX_ROWS 8
#define GROUP 32

#if defined(__AVX512F__) && defined(__AVX512BW__)
#include "avx512_math.h"
#define LANES 16
typedef __m512 VF;
#define F_ZERO() _mm512_setzero_ps()
#define F_ADD(a, b) _mm512_add_ps((a), (b))
#define F_FMA(a, b, c) _mm512_fmadd_ps((a), (b), (c))
#define F_SET1(s) _mm512_set1_ps(s)
#define HSUM(parts) hsum16(parts)
#define F_STORE(p, v) _mm512_storeu_ps((p), (v))
#define PARTS 2 /* float vectors per group of 32 */
/* The group's 32 values as PARTS float vectors, times d. */
#define DEQUANT(wv, p, d)                                                                              \
    do {                                                                                               \
        const __m256i raw = _mm256_loadu_si256((const __m256i *)(p));                                  \
        wv[0] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(raw))), d); \
        wv[1] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(raw, 1))), d); \
    } while (0)
#define LOAD_F32(p) _mm512_loadu_ps(p)
#define LOAD_BF16(p) _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(p))), 16))
#define ROUND_BF16(v) _mm512_castsi512_ps(_mm512_and_si512(                                            \
    _mm512_add_epi32(_mm512_castps_si512(v), _mm512_add_epi32(_mm512_set1_epi32(0x7fff),                \
        _mm512_and_si512(_mm512_srli_epi32(_mm512_castps_si512(v), 16), _mm512_set1_epi32(1)))),          \
    _mm512_set1_epi32((int)0xffff0000)))
#elif defined(__AVX2__) && defined(__FMA__)
#include "avx2_math.h"
#define LANES 8
typedef __m256 VF;
#define F_ZERO() _mm256_setzero_ps()
#define F_ADD(a, b) _mm256_add_ps((a), (b))
#define F_FMA(a, b, c) _mm256_fmadd_ps((a), (b), (c))
#define F_SET1(s) _mm256_set1_ps(s)
#define F_STORE(p, v) _mm256_storeu_ps((p), (v))
#define PARTS 4
#define HSUM(parts) hsum8(parts)
#define DEQUANT(wv, p, d)                                                                              \
    do {                                                                                               \
        const __m256i raw = _mm256_loadu_si256((const __m256i *)(p));                                  \
        const __m128i lo = _mm256_castsi256_si128(raw), hi = _mm256_extracti128_si256(raw, 1);         \
        wv[0] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)), d);                        \
        wv[1] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8))), d);     \
        wv[2] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)), d);                        \
        wv[3] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8))), d);     \
    } while (0)
#define LOAD_F32(p) _mm256_loadu_ps(p)
#define LOAD_BF16(p) _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p))), 16))
#define ROUND_BF16(v) _mm256_castsi256_ps(_mm256_and_si256(                                            \
    _mm256_add_epi32(_mm256_castps_si256(v), _mm256_add_epi32(_mm256_set1_epi32(0x7fff),                \
        _mm256_and_si256(_mm256_srli_epi32(_mm256_castps_si256(v), 16), _mm256_set1_epi32(1)))),          \
    _mm256_set1_epi32((int)0xffff0000)))
#endif

#ifdef LANES
#include "bf16_store.h"
#include "bf16.h"

static inline float half_to_f32(uint16_t h) { return _cvtsh_ss(h); }

/* One tile of LANES outputs for ROWS rows: per output, its groups in order, each dequantised
 * once into PARTS vectors (BF16_IN: rounded to bfloat16) and multiplied into every row. */
#define TILE(ROWS, BF16_IN)                                                                   \
    do {                                                                                      \
        VF part[ROWS][LANES];                                                                 \
        for (int o = 0; o < LANES; ++o) {                                                     \
            const int64_t row = tile * LANES + o;                                             \
            const int8_t *qr = q + row * in;                                                  \
            const uint16_t *dr = d + row * (in / GROUP);                                      \
            VF acc[ROWS][PARTS];                                                              \
            for (int r = 0; r < ROWS; ++r)                                                    \
                for (int k = 0; k < PARTS; ++k) acc[r][k] = F_ZERO();                         \
            for (int64_t g = 0; g < in / GROUP; ++g) {                                        \
                VF wv[PARTS];                                                                 \
                DEQUANT(wv, qr + g * GROUP, F_SET1(half_to_f32(dr[g])));                      \
                for (int k = 0; k < PARTS; ++k) {                                             \
                    if (BF16_IN) wv[k] = ROUND_BF16(wv[k]);                                   \
                    for (int r = 0; r < ROWS; ++r) {                                          \
                        const int64_t at = r * xs + g * GROUP + k * LANES;                    \
                        acc[r][k] = F_FMA(wv[k], BF16_IN ? LOAD_BF16(xb + at) : LOAD_F32(xf + at), acc[r][k]); \
                    }                                                                         \
                }                                                                             \
            }                                                                                 \
            for (int r = 0; r < ROWS; ++r) {                                                  \
                for (int k = 1; k < PARTS; ++k) acc[r][0] = F_ADD(acc[r][0], acc[r][k]);      \
                part[r][o] = acc[r][0];                                                       \
            }                                                                                 \
        }                                                                                     \
        for (int r = 0; r < ROWS; ++r) {                                                      \
            const VF s = HSUM(part[r]);                                                       \
            if (BF16_IN) {                                                                    \
                store_bf16(yb + r * ys + tile * LANES, s);                                    \
            } else {                                                                          \
                F_STORE(yf + r * ys + tile * LANES, s);                                       \
            }                                                                                 \
        }                                                                                     \
    } while (0)

#if defined(__AVX512BF16__) && LANES == 16
/* bfloat16 rows with avx512_bf16: each group's 32 dequantised values rounded to bfloat16 in one
 * vcvtne2ps2bf16 (nearest even, as w.to(bfloat16)) and multiplied into every row by vdpbf16ps;
 * two accumulators per row (even and odd groups) keep the chains in flight at one row. The
 * widened route below (its rounding is integer arithmetic) took about 1.25x as long at 1-8 rows
 * in one run of bench/probe_int8.py --group-int8. */
#define BF16_DP 1
#define TILE_DP(ROWS)                                                                          \
    do {                                                                                      \
        VF part[ROWS][LANES];                                                                 \
        const int64_t groups = in / GROUP;                                                    \
        for (int o = 0; o < LANES; ++o) {                                                     \
            const int64_t row = tile * LANES + o;                                             \
            const int8_t *qr = q + row * in;                                                  \
            const uint16_t *dr = d + row * groups;                                            \
            VF acc[ROWS][2];                                                                  \
            for (int r = 0; r < ROWS; ++r) acc[r][0] = acc[r][1] = F_ZERO();                  \
            for (int64_t g = 0; g < groups; g += 2)                                           \
                for (int h = 0; h < 2 && g + h < groups; ++h) {                               \
                    VF wv[PARTS];                                                             \
                    DEQUANT(wv, qr + (g + h) * GROUP, F_SET1(half_to_f32(dr[g + h])));        \
                    const __m512bh wb = _mm512_cvtne2ps_pbh(wv[1], wv[0]);                    \
                    for (int r = 0; r < ROWS; ++r)                                            \
                        acc[r][h] = _mm512_dpbf16_ps(acc[r][h], wb,                           \
                            (__m512bh)_mm512_loadu_si512((const void *)(xb + r * xs + (g + h) * GROUP))); \
                }                                                                             \
            for (int r = 0; r < ROWS; ++r) part[r][o] = F_ADD(acc[r][0], acc[r][1]);          \
        }                                                                                     \
        for (int r = 0; r < ROWS; ++r) store_bf16(yb + r * ys + tile * LANES, HSUM(part[r])); \
    } while (0)
#else
#define BF16_DP 0
#define TILE_DP(ROWS) TILE(ROWS, 1)
#endif

#define ROWS_TILE(ROWS, BF16_IN)                                                              \
    do {                                                                                      \
        if (BF16_IN && BF16_DP) TILE_DP(ROWS);                                                \
        else TILE(ROWS, BF16_IN);                                                             \
    } while (0)

#define BODY(BF16_IN)                                                                         \
    _Pragma("omp parallel for schedule(static) num_threads(threads) if (threads > 1)")        \
    for (int64_t tile = 0; tile < out / LANES; ++tile) {                                      \
        switch (rows) {                                                                       \
        case 1: ROWS_TILE(1, BF16_IN); break;                                                 \
        case 2: ROWS_TILE(2, BF16_IN); break;                                                 \
        case 3: ROWS_TILE(3, BF16_IN); break;                                                 \
        case 4: ROWS_TILE(4, BF16_IN); break;                                                 \
        case 5: ROWS_TILE(5, BF16_IN); break;                                                 \
        case 6: ROWS_TILE(6, BF16_IN); break;                                                 \
        case 7: ROWS_TILE(7, BF16_IN); break;                                                 \
        default: ROWS_TILE(8, BF16_IN); break;                                                \
        }                                                                                     \
    }

int group_int8_f32(const float *x, int64_t xs, int64_t rows, int64_t in, const int8_t *q, const uint16_t *d,
                   float *y, int64_t ys, int64_t out, int64_t threads) {
    if (rows < 1 || rows > MAX_ROWS || in % GROUP || out % 16) return 1;
    const float *xf = x;
    float *yf = y;
    const uint16_t *xb = 0;
    uint16_t *yb = 0;
    BODY(0)
    (void)xb, (void)yb;
    return 0;
}

int group_int8_bf16(const uint16_t *x, int64_t xs, int64_t rows, int64_t in, const int8_t *q, const uint16_t *d,
                    uint16_t *y, int64_t ys, int64_t out, int64_t threads) {
    if (rows < 1 || rows > MAX_ROWS || in % GROUP || out % 16) return 1;
    const float *xf = 0;
    float *yf = 0;
    const uint16_t *xb = x;
    uint16_t *yb = y;
    BODY(1)
    (void)xf, (void)yf;
    return 0;
}
#endif
