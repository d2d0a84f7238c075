/* Products of a few rows with a weight read in place: y[r, o] = sum_i x[r, i] * w[o, i].
 *
 * Why: a decode step in a batch job's tail carries 1-8 rows, so each product only streams its
 * weight, and oneDNN's packed product streams it at well under what the cores can read (AMD
 * EPYC Zen 5, 2 cores: bfloat16 at about 28 GB/s, JSON from bench/probe_products.py, where a
 * plain C read loop reached about 40 GB/s in a throwaway probe; this kernel about 37). Here each thread walks one contiguous range of weight rows in
 * order, and every weight vector loaded serves all rows of x, which stay in L1.
 *
 * Layout: w [out, in] row-major (torch's Linear weight, contiguous), x [rows, in] with row
 * stride xs, y [rows, out] with row stride ys. float32 accumulation; a bfloat16 result is
 * rounded to nearest even once. AVX-512 (float32; bfloat16 with avx512_bf16), or AVX2 with FMA
 * (float32, tiles of 8 outputs): the caller checks the CPU flags, 1 <= rows <= MAX_ROWS,
 * in % 32 == 0 and out % 16 == 0. Outputs are shared out 16 at a time by an OpenMP
 * loop on torch's threads (engine/native explains why that holds).
 */
#include <stdint.h>

#define MAX_ROWS 8

#if defined(__AVX512F__)
#include <immintrin.h>

#include "avx512_math.h"

#define OUT_TILE 16 /* outputs per tile: one vector of sums */
typedef __m512 vacc;
#define ACC_ZERO() _mm512_setzero_ps()
#define ACC_ADD(a, b) _mm512_add_ps((a), (b))
#define HSUM(parts) hsum16(parts)
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#include "avx2_math.h"

#define OUT_TILE 8
typedef __m256 vacc;
#define ACC_ZERO() _mm256_setzero_ps()
#define ACC_ADD(a, b) _mm256_add_ps((a), (b))
#define HSUM(parts) hsum8(parts)

#endif

#ifdef OUT_TILE
/* One tile of OUT_TILE outputs for ROWS rows. Each weight row is read as one linear stream, every
 * vector loaded once and multiplied into every row's accumulators; KU accumulators per row keep
 * independent chains in flight (one chain per row ran latency-bound, and interleaving several
 * weight rows instead broke the stream: both about 35 GB/s). The tile's partial-sum vectors of
 * a row are then reduced together (HSUM). LOADW/LOADX/STEP/STORE are the dtype's. */
#define TILE(ROWS, KU)                                                                  \
    do {                                                                                \
        vacc part[ROWS][OUT_TILE];                                                      \
        for (int o = 0; o < OUT_TILE; ++o) {                                            \
            const WT *wr = w + (tile * OUT_TILE + o) * in;                              \
            vacc acc[KU][ROWS];                                                         \
            for (int u = 0; u < KU; ++u)                                                \
                for (int r = 0; r < ROWS; ++r) acc[u][r] = ACC_ZERO();                  \
            int64_t i = 0;                                                              \
            for (; i + KU * WIDTH <= in; i += KU * WIDTH)                               \
                for (int u = 0; u < KU; ++u) {                                          \
                    const VT wv = LOADW(wr + i + u * WIDTH);                            \
                    for (int r = 0; r < ROWS; ++r)                                      \
                        acc[u][r] = STEP(acc[u][r], wv, LOADX(x + r * xs + i + u * WIDTH)); \
                }                                                                       \
            for (; i < in; i += WIDTH) {                                                \
                const VT wv = LOADW(wr + i);                                            \
                for (int r = 0; r < ROWS; ++r) acc[0][r] = STEP(acc[0][r], wv, LOADX(x + r * xs + i)); \
            }                                                                           \
            for (int r = 0; r < ROWS; ++r) {                                            \
                for (int u = 1; u < KU; ++u) acc[0][r] = ACC_ADD(acc[0][r], acc[u][r]); \
                part[r][o] = acc[0][r];                                                 \
            }                                                                           \
        }                                                                               \
        for (int r = 0; r < ROWS; ++r) STORE(y + r * ys + tile * OUT_TILE, HSUM(part[r])); \
    } while (0)

#define DISPATCH                                                                        \
    _Pragma("omp parallel for schedule(static) num_threads(threads) if (threads > 1)")  \
    for (int64_t tile = 0; tile < out / OUT_TILE; ++tile) {                             \
        switch (rows) {                                                                 \
        case 1: TILE(1, 4); break;                                                      \
        case 2: TILE(2, 4); break;                                                      \
        case 3: TILE(3, 2); break;                                                      \
        case 4: TILE(4, 2); break;                                                      \
        case 5: TILE(5, 1); break;                                                      \
        case 6: TILE(6, 1); break;                                                      \
        case 7: TILE(7, 1); break;                                                      \
        default: TILE(8, 1); break;                                                     \
        }                                                                               \
    }

int few_rows_f32(const float *x, int64_t xs, const float *w, float *y, int64_t ys, int64_t rows, int64_t in,
                 int64_t out, int64_t threads) {
    if (rows < 1 || rows > MAX_ROWS || in % 32 || out % 16) return 1;
#define WT float
#ifdef __AVX512F__
#define VT __m512
#define WIDTH 16
#define LOADW(p) _mm512_loadu_ps(p)
#define LOADX(p) _mm512_loadu_ps(p)
#define STEP(acc, wv, xv) _mm512_fmadd_ps((wv), (xv), (acc))
#define STORE(p, v) _mm512_storeu_ps((p), (v))
#else
#define VT __m256
#define WIDTH 8
#define LOADW(p) _mm256_loadu_ps(p)
#define LOADX(p) _mm256_loadu_ps(p)
#define STEP(acc, wv, xv) _mm256_fmadd_ps((wv), (xv), (acc))
#define STORE(p, v) _mm256_storeu_ps((p), (v))
#endif
    DISPATCH
#undef WT
#undef VT
#undef WIDTH
#undef LOADW
#undef LOADX
#undef STEP
#undef STORE
    return 0;
}

#if defined(__AVX512F__) && defined(__AVX512BF16__)
static inline void store_bf16x16(uint16_t *p, __m512 v) {
    /* round to nearest even, as f32_to_bf16 (and torch) does */
    _mm256_storeu_si256((__m256i *)p, (__m256i)_mm512_cvtneps_pbh(v));
}

int few_rows_bf16(const uint16_t *x, int64_t xs, const uint16_t *w, uint16_t *y, int64_t ys, int64_t rows,
                  int64_t in, int64_t out, int64_t threads) {
    if (rows < 1 || rows > MAX_ROWS || in % 32 || out % 16) return 1;
#define WT uint16_t
#define VT __m512bh
#define WIDTH 32
#define LOADW(p) ((__m512bh)_mm512_loadu_si512((const void *)(p)))
#define LOADX(p) ((__m512bh)_mm512_loadu_si512((const void *)(p)))
#define STEP(acc, wv, xv) _mm512_dpbf16_ps((acc), (wv), (xv))
#define STORE(p, v) store_bf16x16((p), (v))
    DISPATCH
    return 0;
}
#endif
#endif
