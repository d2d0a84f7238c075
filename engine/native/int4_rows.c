/* Products of rows with a 4-bit weight, dequantised in registers: y[r, o] = sum_i x[r, i] * w[o, i],
 * w[o, i] = u[o, i] * s[o, i / 32] + z[o, i / 32] (u the unsigned 4-bit value, 0..15).
 *
 * Why: a decode step's products stream their weight; at 4 bits it is a quarter of float32's bytes.
 * torch's int4 kernel takes 16-bit rows and scales only at speed, which rounds a float32 model's
 * activations; here the weight is built in float32 registers with one FMA of the stored float32
 * scale and offset (bit for bit QuantWeight.dequantize() where u * s is exact, as in every GGUF
 * 4-bit type: engine/quant/int4_kernel.py) and multiplied into float32 sums.
 *
 * Layout (int4_pack writes it, from u [out, in] bytes): each output row is a run of 64-column
 * blocks of 32 bytes, read as 16 (AVX-512) or 8 (AVX2) lanes; nibble j of lane k holds column
 * 16j + k (AVX-512: lanes of 16 bits, 4 nibbles) or 8j + k (AVX2: lanes of 32 bits, 8 nibbles),
 * so shifting lane-wise yields consecutive columns. sz [out, in / 32, 2]: float32 (s, z) per 32.
 * AVX-512 maps the 16 codes to weights with one permute from a per-group table of 16 floats
 * (the same FMA, once per group); AVX2 converts each code to float and applies the FMA.
 *
 * x [rows, in] float32 (row stride xs) or bfloat16 (widened once); y [rows, out] (row stride ys),
 * float32, or bfloat16 rounded to nearest even once. Any rows >= 1, taken 8 at a time; in % 64
 * == 0 and out % OUT_TILE == 0 (the caller checks, a call outside returns 1). Outputs are shared
 * out a tile at a time by an OpenMP loop on torch's threads (engine/native explains why).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"

#define CHUNK 8 /* rows per pass over a tile's weights */

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>

#ifdef __AVX512F__
#include "avx512_math.h"
#define LANES 16
#define OUT_TILE 16
typedef __m512 vf;
#define ZERO() _mm512_setzero_ps()
#define ADD(a, b) _mm512_add_ps((a), (b))
#define FMA(a, b, c) _mm512_fmadd_ps((a), (b), (c))
#define LOADX(p) _mm512_loadu_ps(p)
#define STORE(p, v) _mm512_storeu_ps((p), (v))
#define HSUM(parts) hsum16(parts)
/* A block's state: its lanes, and the two groups' tables of the 16 weights a code can stand for. */
typedef struct { __m512i v; __m512 t[2]; } block_t;

static inline block_t load_block(const uint8_t *p, const float *sz) {
    const __m512 codes = _mm512_set_ps(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    block_t b;
    b.v = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    b.t[0] = _mm512_fmadd_ps(codes, _mm512_set1_ps(sz[0]), _mm512_set1_ps(sz[1]));
    b.t[1] = _mm512_fmadd_ps(codes, _mm512_set1_ps(sz[2]), _mm512_set1_ps(sz[3]));
    return b;
}
/* The weights of columns 16j..16j+15 of the block (permutexvar reads the low 4 bits of each lane). */
#define WEIGHTS(b, j) _mm512_permutexvar_ps((j) ? _mm512_srli_epi32((b).v, 4 * (j)) : (b).v, (b).t[(j) >> 1])
#else
#include "avx2_math.h"
#define LANES 8
#define OUT_TILE 8
typedef __m256 vf;
#define ZERO() _mm256_setzero_ps()
#define ADD(a, b) _mm256_add_ps((a), (b))
#define FMA(a, b, c) _mm256_fmadd_ps((a), (b), (c))
#define LOADX(p) _mm256_loadu_ps(p)
#define STORE(p, v) _mm256_storeu_ps((p), (v))
#define HSUM(parts) hsum8(parts)
typedef struct { __m256i v; __m256 s[2], z[2]; } block_t;

static inline block_t load_block(const uint8_t *p, const float *sz) {
    block_t b;
    b.v = _mm256_loadu_si256((const __m256i *)p);
    for (int g = 0; g < 2; ++g) {
        b.s[g] = _mm256_set1_ps(sz[2 * g]);
        b.z[g] = _mm256_set1_ps(sz[2 * g + 1]);
    }
    return b;
}
/* The weights of columns 8j..8j+7 of the block: code to float, then the group's FMA. */
#define WEIGHTS(b, j)                                                                                 \
    _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32((b).v, 4 * (j)),           \
                                                        _mm256_set1_epi32(15))),                      \
                    (b).s[(j) >> 2], (b).z[(j) >> 2])
#endif

#define STEPS (64 / LANES) /* weight vectors per 64-column block */
#include "bf16_store.h"

int int4_lanes(void) { return LANES; }

/* u [out, in] (values 0..15, one a byte) -> packed [out, in / 2] in the kernel's block layout. */
int int4_pack(const uint8_t *u, int64_t out, int64_t in, uint8_t *packed) {
    if (in % 64) return 1;
    const int width = 64 / LANES; /* nibbles per lane */
    for (int64_t o = 0; o < out; ++o)
        for (int64_t b = 0; b < in / 64; ++b) {
            const uint8_t *src = u + o * in + b * 64;
            uint8_t *dst = packed + o * (in / 2) + b * 32;
            memset(dst, 0, 32);
            for (int k = 0; k < LANES; ++k)
                for (int j = 0; j < width; ++j) {
                    const int bit = k * width * 4 + j * 4; /* lane k's bits, little-endian */
                    dst[bit / 8] |= (uint8_t)((src[j * LANES + k] & 15) << (bit % 8));
                }
        }
    return 0;
}

/* w [out, in]: the weight every product here multiplies by (for products of many rows), float32
 * (int4_dequant), or rounded to bfloat16 as torch rounds it (int4_dequant_bf16), written once
 * instead of float32 then cast. */
#define DEQUANT(NAME, T, PUT)                                                                         \
    int NAME(const uint8_t *packed, const float *sz, T *w, int64_t out, int64_t in, int64_t threads) { \
        if (in % 64) return 1;                                                                        \
        _Pragma("omp parallel for schedule(static) num_threads(threads) if (threads > 1)")            \
        for (int64_t o = 0; o < out; ++o)                                                             \
            for (int64_t b = 0; b < in / 64; ++b) {                                                   \
                const block_t blk = load_block(packed + o * (in / 2) + b * 32, sz + o * (in / 16) + b * 4); \
                T *dst = w + o * in + b * 64;                                                         \
                for (int j = 0; j < STEPS; ++j) PUT(dst + j * LANES, WEIGHTS(blk, j));                \
            }                                                                                         \
        return 0;                                                                                     \
    }
DEQUANT(int4_dequant, float, STORE)
DEQUANT(int4_dequant_bf16, uint16_t, store_bf16)

/* Rows r0 .. r0 + ROWS - 1 of one tile of OUT_TILE outputs, NO outputs at a time (each x vector
 * loaded then feeds NO weight vectors: at 8 rows one output per pass ran at about a third of the
 * FMA peak). KU accumulators per row and output keep independent FMA chains in flight where rows
 * are few (one weight vector feeds every row). */
#define TILE(ROWS, KU, NO)                                                                     \
    do {                                                                                       \
        vf part[ROWS][OUT_TILE];                                                               \
        for (int o = 0; o < OUT_TILE; o += NO) {                                               \
            const int64_t row = tile * OUT_TILE + o;                                           \
            vf acc[NO][KU][ROWS];                                                              \
            for (int n = 0; n < NO; ++n)                                                       \
                for (int u = 0; u < KU; ++u)                                                   \
                    for (int r = 0; r < ROWS; ++r) acc[n][u][r] = ZERO();                      \
            for (int64_t b = 0; b < in / 64; ++b) {                                            \
                block_t blk[NO];                                                               \
                for (int n = 0; n < NO; ++n)                                                   \
                    blk[n] = load_block(packed + (row + n) * (in / 2) + b * 32, sz + (row + n) * (in / 16) + b * 4); \
                for (int j = 0; j < STEPS; ++j) {                                              \
                    vf wv[NO];                                                                 \
                    for (int n = 0; n < NO; ++n) wv[n] = WEIGHTS(blk[n], j);                   \
                    for (int r = 0; r < ROWS; ++r) {                                           \
                        const vf xv = LOADX(xr + r * xs + b * 64 + j * LANES);                 \
                        for (int n = 0; n < NO; ++n)                                           \
                            acc[n][j % KU][r] = FMA(wv[n], xv, acc[n][j % KU][r]);             \
                    }                                                                          \
                }                                                                              \
            }                                                                                  \
            for (int n = 0; n < NO; ++n)                                                       \
                for (int r = 0; r < ROWS; ++r) {                                               \
                    for (int u = 1; u < KU; ++u) acc[n][0][r] = ADD(acc[n][0][r], acc[n][u][r]); \
                    part[r][o + n] = acc[n][0][r];                                             \
                }                                                                              \
        }                                                                                      \
        for (int r = 0; r < ROWS; ++r) STORE(yt + r * OUT_TILE, HSUM(part[r]));                \
    } while (0)

#ifdef __AVX512F__
#define PAIR 2 /* 32 vector registers: 2 outputs x 8 rows of sums fit */
#else
#define PAIR 1 /* 16: they do not */
#endif

/* y rows (float32, or bfloat16 where y16) of x (float32, row stride xs) times the packed weight. */
static void product(const float *x, int64_t xs, const uint8_t *packed, const float *sz, float *y, uint16_t *y16,
                    int64_t ys, int64_t rows, int64_t in, int64_t out, int64_t threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
    for (int64_t tile = 0; tile < out / OUT_TILE; ++tile) {
        float yt[CHUNK * OUT_TILE];
        for (int64_t r0 = 0; r0 < rows; r0 += CHUNK) {
            const float *xr = x + r0 * xs;
            const int64_t n = rows - r0 < CHUNK ? rows - r0 : CHUNK;
            switch (n) {
            case 1: TILE(1, 4, 1); break;
            case 2: TILE(2, 4, 1); break;
            case 3: TILE(3, 2, PAIR); break;
            case 4: TILE(4, 2, PAIR); break;
            case 5: TILE(5, 1, PAIR); break;
            case 6: TILE(6, 1, PAIR); break;
            case 7: TILE(7, 1, PAIR); break;
            default: TILE(8, 1, PAIR); break;
            }
            for (int64_t r = 0; r < n; ++r) {
                const int64_t at = (r0 + r) * ys + tile * OUT_TILE; /* OUT_TILE == LANES: one vector */
                if (y16) store_bf16(y16 + at, LOADX(yt + r * OUT_TILE));
                else STORE(y + at, LOADX(yt + r * OUT_TILE));
            }
        }
    }
}

int int4_rows_f32(const float *x, int64_t xs, const uint8_t *packed, const float *sz, float *y, int64_t ys,
                  int64_t rows, int64_t in, int64_t out, int64_t threads) {
    if (rows < 1 || in % 64 || out % OUT_TILE) return 1;
    product(x, xs, packed, sz, y, NULL, ys, rows, in, out, threads);
    return 0;
}

int int4_rows_bf16(const uint16_t *x, int64_t xs, const uint8_t *packed, const float *sz, uint16_t *y, int64_t ys,
                   int64_t rows, int64_t in, int64_t out, int64_t threads) {
    if (rows < 1 || in % 64 || out % OUT_TILE) return 1;
    float *wide = malloc((size_t)(rows * in) * sizeof(float));
    if (wide == NULL) return 2;
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t i = 0; i < in; ++i) wide[r * in + i] = bf16_to_f32(x[r * xs + i]);
    product(wide, in, packed, sz, NULL, y, ys, rows, in, out, threads);
    free(wide);
    return 0;
}
#endif
