/* W8A8 products with exact int32 sums, on every x86 vector unit:
 *   y[r, o] = (float)(sum_i q[r, i] * w[o, i]) * x_scale[r] * w_scale[o] (+ bias[o])
 * where q is row r of x rounded to int8 with its own scale (absmax / 127, half to even, clamped
 * to +-127: engine/quant/linear.py's quantize_rows, step for step, so the same int8 values).
 *
 * Why: at a decode step's 1-8 rows, torch's W8A8 product was a dozen eager ops around
 * torch._int_mm (row scales, rounding, int32 -> float, two scalings, the cast back) and cost
 * more than the bfloat16 product it replaces; and without VNNI oneDNN's int8 GEMM returned wrong
 * sums (its vpmaddubsw saturates), so AVX2 CPUs had no int8 product at all. Here one call
 * quantizes the rows, streams the weight once and writes the scaled result.
 *
 * The dot products, all exact (no saturating step; int32 sums hold in * 255 * 128 for any in
 * below 65,000):
 *   AVX-512 VNNI   vpdpbusd on (q + 128) as unsigned bytes x w as signed bytes, 64 per
 *                  instruction; the shift is taken back by comp[o] = 128 * sum_i w[o, i]
 *                  (precomputed by the caller). Weights may be -128 (compressed-tensors' range).
 *   AVX-512 BW     w widened to int16 (vpmovsxbw) x q as int16, vpmaddwd, 32 per instruction.
 *   AVX-VNNI       vpdpbusd on 256 bits (Alder Lake and later without AVX-512), 32 per instruction.
 *   AVX2           as AVX-512 BW on 256 bits, 16 per instruction.
 * -march=native picks one; tests build the others with -march=haswell / skylake-avx512 / alderlake.
 *
 * Layout: w [out, in] int8 row-major (the checkpoint's, torch's Linear weight), x [rows, in]
 * float32 or bfloat16 with row stride xs, y [rows, out] with row stride ys. The caller checks
 * in % 64 == 0 and out % 16 == 0. Outputs are shared out a tile at a time by an OpenMP loop on
 * torch's threads (engine/native explains why that holds); every weight vector loaded serves a
 * block of rows, which stay in L1. The float epilogue is rounded as torch's
 * ``sums.float().mul_(x_scale).mul_(w_scale).add_(bias)`` is (built without FMA contraction).
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>

#include "bf16.h"

#if defined(__AVX512F__) && defined(__AVX512BW__)
#define LANES 16 /* outputs per tile: one vector of int32 sums */
typedef __m512i VI;
typedef __m512 VF;
#define VI_ZERO() _mm512_setzero_si512()
#define VI_ADD(a, b) _mm512_add_epi32((a), (b))
#define VI_SUB(a, b) _mm512_sub_epi32((a), (b))
#define VI_LOAD(p) _mm512_loadu_si512((const void *)(p))
#define VI_STORE(p, v) _mm512_storeu_si512((void *)(p), (v))
#define TO_F(v) _mm512_cvtepi32_ps(v)
#define F_MUL(a, b) _mm512_mul_ps((a), (b))
#define F_ADD(a, b) _mm512_add_ps((a), (b))
#define F_LOAD(p) _mm512_loadu_ps(p)
#define F_SET1(s) _mm512_set1_ps(s)
#define F_STORE(p, v) _mm512_storeu_ps((p), (v))
#ifdef __AVX512VNNI__
#define ISA "avx512-vnni"
#define SHIFTED 1 /* x stored as q + 128 (unsigned), comp taken back */
typedef uint8_t XT;
#define STEP 64
#define WLOAD(p) _mm512_loadu_si512((const void *)(p))
#define DOT(acc, wv, xp) _mm512_dpbusd_epi32((acc), _mm512_loadu_si512((const void *)(xp)), (wv))
#else
#define ISA "avx512-bw"
#define SHIFTED 0
typedef int16_t XT;
#define STEP 32
#define WLOAD(p) _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(p)))
#define DOT(acc, wv, xp) _mm512_add_epi32((acc), _mm512_madd_epi16((wv), _mm512_loadu_si512((const void *)(xp))))
#endif

/* out lane p = the sum of the 16 lanes of acc[p] (avx512_math.h's hsum16 on int32). */
static inline VI hsum(const VI acc[16]) {
    VI t[8], u[4];
    for (int i = 0; i < 8; ++i)
        t[i] = _mm512_add_epi32(_mm512_unpacklo_epi32(acc[2 * i], acc[2 * i + 1]),
                                _mm512_unpackhi_epi32(acc[2 * i], acc[2 * i + 1]));
    for (int i = 0; i < 4; ++i)
        u[i] = _mm512_add_epi32(_mm512_unpacklo_epi64(t[2 * i], t[2 * i + 1]), _mm512_unpackhi_epi64(t[2 * i], t[2 * i + 1]));
    const VI w01 = _mm512_add_epi32(_mm512_shuffle_i32x4(u[0], u[1], 0x44), _mm512_shuffle_i32x4(u[0], u[1], 0xEE));
    const VI w23 = _mm512_add_epi32(_mm512_shuffle_i32x4(u[2], u[3], 0x44), _mm512_shuffle_i32x4(u[2], u[3], 0xEE));
    return _mm512_add_epi32(_mm512_shuffle_i32x4(w01, w23, 0x88), _mm512_shuffle_i32x4(w01, w23, 0xDD));
}
#elif defined(__AVX2__)
#define LANES 8
typedef __m256i VI;
typedef __m256 VF;
#define VI_ZERO() _mm256_setzero_si256()
#define VI_ADD(a, b) _mm256_add_epi32((a), (b))
#define VI_SUB(a, b) _mm256_sub_epi32((a), (b))
#define VI_LOAD(p) _mm256_loadu_si256((const __m256i *)(p))
#define VI_STORE(p, v) _mm256_storeu_si256((__m256i *)(p), (v))
#define TO_F(v) _mm256_cvtepi32_ps(v)
#define F_MUL(a, b) _mm256_mul_ps((a), (b))
#define F_ADD(a, b) _mm256_add_ps((a), (b))
#define F_LOAD(p) _mm256_loadu_ps(p)
#define F_SET1(s) _mm256_set1_ps(s)
#define F_STORE(p, v) _mm256_storeu_ps((p), (v))
#ifdef __AVXVNNI__
#define ISA "avx-vnni"
#define SHIFTED 1
typedef uint8_t XT;
#define STEP 32
#define WLOAD(p) _mm256_loadu_si256((const __m256i *)(p))
#define DOT(acc, wv, xp) _mm256_dpbusd_avx_epi32((acc), _mm256_loadu_si256((const __m256i *)(xp)), (wv))
#else
#define ISA "avx2"
#define SHIFTED 0
typedef int16_t XT;
#define STEP 16
#define WLOAD(p) _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(p)))
#define DOT(acc, wv, xp) _mm256_add_epi32((acc), _mm256_madd_epi16((wv), _mm256_loadu_si256((const __m256i *)(xp))))
#endif

static inline VI hsum(const VI acc[8]) {
    const VI s0123 = _mm256_hadd_epi32(_mm256_hadd_epi32(acc[0], acc[1]), _mm256_hadd_epi32(acc[2], acc[3]));
    const VI s4567 = _mm256_hadd_epi32(_mm256_hadd_epi32(acc[4], acc[5]), _mm256_hadd_epi32(acc[6], acc[7]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(s0123, s4567, 0x20), _mm256_permute2x128_si256(s0123, s4567, 0x31));
}
#endif

#ifdef LANES
#include "bf16_store.h"
#include "int8_rows_quant.h"

#define FEW_ROWS 8        /* up to this many rows, one block: each weight vector serves them all */
#define BLOCK_ROWS 4      /* beyond: blocks of 4 rows x BLOCK_OUTS outputs at a time, */
#define BLOCK_OUTS (LANES == 16 ? 4 : 2) /* 16 (8) sums in registers, of 32 (16) */
#define CHUNK_ROWS 64     /* rows whose quantized copy stays in L2 while the weight is walked */
#define PARALLEL_MIN 65536 /* quantize on the calling thread below this many elements */

const char *int8_rows_isa(void) { return ISA; }

/* What to do with a row's LANES int32 sums. */
typedef struct {
    int kind; /* 0: int32 sums, 1: float32, 2: bfloat16 */
    void *y;
    int64_t ys;
    const float *x_scale, *w_scale, *bias;
} Epi;

static inline void epilogue(const Epi *e, int64_t r, int64_t o0, VI sums) {
    if (e->kind == 0) {
        VI_STORE((int32_t *)e->y + r * e->ys + o0, sums);
        return;
    }
    VF f = F_MUL(F_MUL(TO_F(sums), F_SET1(e->x_scale[r])), F_LOAD(e->w_scale + o0));
    if (e->bias) f = F_ADD(f, F_LOAD(e->bias + o0));
    if (e->kind == 1) {
        F_STORE((float *)e->y + r * e->ys + o0, f);
        return;
    }
    store_bf16((uint16_t *)e->y + r * e->ys + o0, f);
}

/* One tile of LANES outputs (from o0) for ROWS rows (from r0) of the prepared x: OB weight rows
 * at a time, each read as one stream, every vector loaded multiplied into every row's sums; KU
 * accumulators per row and output keep independent chains in flight at few rows. */
#define TILE(ROWS, KU, OB)                                                                   \
    do {                                                                                     \
        VI part[ROWS][LANES];                                                                \
        const XT *xb = xq + r0 * in;                                                         \
        for (int o = 0; o < LANES; o += OB) {                                                \
            const int8_t *wr = w + (o0 + o) * in;                                            \
            VI acc[KU][OB][ROWS];                                                            \
            for (int u = 0; u < KU; ++u)                                                     \
                for (int b = 0; b < OB; ++b)                                                 \
                    for (int r = 0; r < ROWS; ++r) acc[u][b][r] = VI_ZERO();                 \
            int64_t i = 0;                                                                   \
            for (; i + KU * STEP <= in; i += KU * STEP)                                      \
                for (int u = 0; u < KU; ++u)                                                 \
                    for (int b = 0; b < OB; ++b) {                                           \
                        const VI wv = WLOAD(wr + b * in + i + u * STEP);                     \
                        for (int r = 0; r < ROWS; ++r)                                       \
                            acc[u][b][r] = DOT(acc[u][b][r], wv, xb + r * in + i + u * STEP); \
                    }                                                                        \
            for (; i < in; i += STEP)                                                        \
                for (int b = 0; b < OB; ++b) {                                               \
                    const VI wv = WLOAD(wr + b * in + i);                                    \
                    for (int r = 0; r < ROWS; ++r) acc[0][b][r] = DOT(acc[0][b][r], wv, xb + r * in + i); \
                }                                                                            \
            for (int b = 0; b < OB; ++b)                                                     \
                for (int r = 0; r < ROWS; ++r) {                                             \
                    for (int u = 1; u < KU; ++u) acc[0][b][r] = VI_ADD(acc[0][b][r], acc[u][b][r]); \
                    part[r][o + b] = acc[0][b][r];                                           \
                }                                                                            \
        }                                                                                    \
        for (int r = 0; r < ROWS; ++r) {                                                     \
            VI s = hsum(part[r]);                                                            \
            if (SHIFTED) s = VI_SUB(s, VI_LOAD(comp + o0));                                  \
            epilogue(e, r0 + r, o0, s);                                                      \
        }                                                                                    \
    } while (0)

/* All outputs of the tile at o0 for rows [r_begin, r_end). */
static void tile_rows(const XT *xq, int64_t r_begin, int64_t r_end, int64_t in, const int8_t *w,
                      const int32_t *comp, int64_t o0, const Epi *e) {
    (void)comp;
    const int64_t n = r_end - r_begin;
    if (n <= FEW_ROWS) {
        const int64_t r0 = r_begin;
        switch (n) {
        case 1: TILE(1, 4, 1); break;
        case 2: TILE(2, 4, 1); break;
        case 3: TILE(3, 2, 1); break;
        case 4: TILE(4, 2, 1); break;
        case 5: TILE(5, 1, 1); break;
        case 6: TILE(6, 1, 1); break;
        case 7: TILE(7, 1, 1); break;
        default: TILE(8, 1, 1); break;
        }
        return;
    }
    for (int64_t r0 = r_begin; r0 < r_end; r0 += BLOCK_ROWS) {
        switch (r_end - r0 < BLOCK_ROWS ? r_end - r0 : BLOCK_ROWS) {
        case 1: TILE(1, 1, BLOCK_OUTS); break;
        case 2: TILE(2, 1, BLOCK_OUTS); break;
        case 3: TILE(3, 1, BLOCK_OUTS); break;
        default: TILE(BLOCK_ROWS, 1, BLOCK_OUTS); break;
        }
    }
}

/* The products of the prepared rows xq [rows, in] by w: chunks of CHUNK_ROWS rows (their copy
 * stays in L2), within a chunk every tile of outputs, tiles shared out by OpenMP. */
static void products(const XT *xq, int64_t rows, int64_t in, const int8_t *w, const int32_t *comp,
                     int64_t out, const Epi *e, int64_t threads) {
    const int64_t tiles = out / LANES, chunks = (rows + CHUNK_ROWS - 1) / CHUNK_ROWS;
#pragma omp parallel for collapse(2) schedule(static) num_threads(threads) if (threads > 1)
    for (int64_t c = 0; c < chunks; ++c)
        for (int64_t t = 0; t < tiles; ++t) {
            const int64_t r_end = (c + 1) * CHUNK_ROWS < rows ? (c + 1) * CHUNK_ROWS : rows;
            tile_rows(xq, c * CHUNK_ROWS, r_end, in, w, comp, t * LANES, e);
        }
}

static int bad_shape(int64_t rows, int64_t in, int64_t out) {
    return rows < 1 || in < 64 || in % 64 || in >= 65536 || out < 16 || out % 16;
}

/* The exact int32 sums s[r, o] = sum_i q[r, i] * w[o, i] of given int8 rows (the tests' entry). */
int int8_rows_sums(const int8_t *q, int64_t rows, int64_t in, const int8_t *w, const int32_t *comp,
                   int32_t *s, int64_t out, int64_t threads) {
    if (bad_shape(rows, in, out)) return 1;
    XT *xq = malloc(sizeof(XT) * rows * in);
    if (!xq) return 2;
    for (int64_t k = 0; k < rows * in; ++k) xq[k] = (XT)(SHIFTED ? q[k] + 128 : q[k]);
    const Epi e = {0, s, out, 0, 0, 0};
    products(xq, rows, in, w, comp, out, &e, threads);
    free(xq);
    return 0;
}

/* The W8A8 product of float rows: quantized here (x_scale [rows] written for the caller), then
 * multiplied and scaled into y, of x's dtype (bfloat16 rounded to nearest even, as torch's cast). */
#define LINEAR(NAME, T, QUANT, KIND)                                                          \
    int NAME(const T *x, int64_t xs, int64_t rows, int64_t in, const int8_t *w, const int32_t *comp, \
             const float *w_scale, const float *bias, float *x_scale, T *y, int64_t ys, int64_t out, \
             int64_t threads) {                                                               \
        if (bad_shape(rows, in, out)) return 1;                                               \
        XT *xq = malloc(sizeof(XT) * rows * in);                                              \
        if (!xq) return 2;                                                                    \
        _Pragma("omp parallel for schedule(static) num_threads(threads) if (threads > 1 && rows * in >= PARALLEL_MIN)") \
        for (int64_t r = 0; r < rows; ++r) QUANT(x + r * xs, in, xq + r * in, x_scale + r);   \
        const Epi e = {KIND, y, ys, x_scale, w_scale, bias};                                  \
        products(xq, rows, in, w, comp, out, &e, threads);                                    \
        free(xq);                                                                             \
        return 0;                                                                             \
    }

LINEAR(int8_linear_f32, float, quant_prep_f32, 1)
LINEAR(int8_linear_bf16, uint16_t, quant_prep_bf16, 2)

/* Around torch._int_mm at many rows: the rows quantized to int8 in one pass, and the int32 sums
 * scaled into y in one pass (the eager ops took a dozen). */
#define QUANTIZE(NAME, T, QUANT)                                                              \
    int NAME(const T *x, int64_t xs, int64_t rows, int64_t in, int8_t *q, float *x_scale, int64_t threads) { \
        if (rows < 1 || in % 64) return 1;                                                    \
        _Pragma("omp parallel for schedule(static) num_threads(threads) if (threads > 1 && rows * in >= PARALLEL_MIN)") \
        for (int64_t r = 0; r < rows; ++r) QUANT(x + r * xs, in, q + r * in, x_scale + r);    \
        return 0;                                                                             \
    }
QUANTIZE(int8_quantize_f32, float, quant_i8_f32)
QUANTIZE(int8_quantize_bf16, uint16_t, quant_i8_bf16)

#define SCALE(NAME, T, KIND)                                                                  \
    int NAME(const int32_t *s, int64_t rows, int64_t out, const float *x_scale, const float *w_scale, \
             const float *bias, T *y, int64_t ys, int64_t threads) {                          \
        if (rows < 1 || out % 16) return 1;                                                   \
        const Epi e = {KIND, y, ys, x_scale, w_scale, bias};                                  \
        _Pragma("omp parallel for schedule(static) num_threads(threads) if (threads > 1 && rows * out >= PARALLEL_MIN)") \
        for (int64_t r = 0; r < rows; ++r)                                                    \
            for (int64_t o = 0; o < out; o += LANES) epilogue(&e, r, o, VI_LOAD(s + r * out + o)); \
        return 0;                                                                             \
    }
SCALE(int8_scale_f32, float, 1)
SCALE(int8_scale_bf16, uint16_t, 2)
#endif
