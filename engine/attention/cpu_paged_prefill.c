/* Paged prefill attention for AVX-512 and AVX2 CPUs, head_dim 64: the prompt tokens of a step against
 * their sequences' cached context and themselves (causal), keys and values read in place from the
 * block pool through the block table.
 *
 * Why not the decode kernel per token: that reads and widens each key block once per prompt
 * token. Here a work item is (sequence, KV head, tile of TILE prompt tokens): each key/value block
 * is widened once and used by the TILE tokens x all query heads of the group, as small products
 * with the tokens in the vector lanes (TILE 16 with AVX-512, 8 with AVX2: one vector). Queries
 * and outputs are held transposed ([head_dim][TILE tokens]), so the online softmax (running max
 * and sum per token, flash style) works lane-wise with no horizontal sums, and the causal mask
 * is one compare per position. The body is written once over the vector macros below.
 *
 * Layout (the torch backend's): k, v [num_kv_heads, num_blocks, block_size, 64], contiguous; q
 * [T, num_heads, 64] with row stride q_stride; out [T, num_heads, 64] contiguous (q's dtype).
 * Sequences first_seq .. num_seqs - 1 are prompt chunks: tokens query_start[s] .. query_start[s+1]
 * at positions context_lens[s] + j. float32 math; scores scaled before the max. With a sliding
 * window (window < the context; pass a huge one for none) token j sees only the last `window`
 * positions up to its own, and blocks wholly before its tile's window are not read.
 * Returns 0, -1 (scratch allocation failed) or 1 + the sequence whose table leaves the pool.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "../native/bf16.h"

#if defined(__AVX512F__)
#include <immintrin.h>

#include "../native/avx512_math.h"

#define TILE 16
typedef __m512 vec;
#define VZERO() _mm512_setzero_ps()
#define VSET1(x) _mm512_set1_ps(x)
#define VLOAD(p) _mm512_loadu_ps(p)
#define VSTORE(p, v) _mm512_storeu_ps((p), (v))
#define VFMA(a, b, c) _mm512_fmadd_ps((a), (b), (c))
#define VADD(a, b) _mm512_add_ps((a), (b))
#define VSUB(a, b) _mm512_sub_ps((a), (b))
#define VMUL(a, b) _mm512_mul_ps((a), (b))
#define VDIV(a, b) _mm512_div_ps((a), (b))
#define VMAX(a, b) _mm512_max_ps((a), (b))
#define VEXP(x) fast_exp16(x)
#define LANES() _mm512_set_ps(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0)
/* s with -inf in the lanes where lane CMP x */
#define VMASK_INF(s, lane, x, CMP) _mm512_mask_mov_ps((s), _mm512_cmp_ps_mask((lane), (x), CMP), _mm512_set1_ps(-INFINITY))
/* TILE bfloat16 values widened to float32 */
#define VWIDEN_BF16(p) _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(p))), 16))
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

#include "../native/avx2_math.h"

#define TILE 8
typedef __m256 vec;
#define VZERO() _mm256_setzero_ps()
#define VSET1(x) _mm256_set1_ps(x)
#define VLOAD(p) _mm256_loadu_ps(p)
#define VSTORE(p, v) _mm256_storeu_ps((p), (v))
#define VFMA(a, b, c) _mm256_fmadd_ps((a), (b), (c))
#define VADD(a, b) _mm256_add_ps((a), (b))
#define VSUB(a, b) _mm256_sub_ps((a), (b))
#define VMUL(a, b) _mm256_mul_ps((a), (b))
#define VDIV(a, b) _mm256_div_ps((a), (b))
#define VMAX(a, b) _mm256_max_ps((a), (b))
#define VEXP(x) fast_exp8(x)
#define LANES() _mm256_set_ps(7, 6, 5, 4, 3, 2, 1, 0)
#define VMASK_INF(s, lane, x, CMP) _mm256_blendv_ps((s), _mm256_set1_ps(-INFINITY), _mm256_cmp_ps((lane), (x), CMP))
#define VWIDEN_BF16(p) _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p))), 16))
#endif

#ifdef TILE
#define HD 64
#define MAX_GROUP 8

/* A block's TILE rows as float32: a float32 cache is read in place, a bfloat16 one widened into buf. */
static inline const float *widen_f32(const float *src, float *buf) {
    (void)buf;
    return src;
}

static inline const float *widen_bf16(const uint16_t *src, float *buf) {
    for (int e = 0; e < TILE * HD; e += TILE) VSTORE(buf + e, VWIDEN_BF16(src + e));
    return buf;
}

/* One item: tokens t0 .. t0 + n - 1 of a chunk (positions pos0 + i), one KV head's group of g
 * query heads. qt/ot: [g][HD][TILE] scratch; kw/vw: [TILE][HD] room for a widened block. */
#define ITEM_BODY(KV, WIDEN)                                                                                      \
    const vec lane = LANES();                                                                                \
    vec m[MAX_GROUP], l[MAX_GROUP];                                                                             \
    for (int h = 0; h < g; ++h) {                                                                             \
        m[h] = VSET1(-INFINITY), l[h] = VZERO();                                                               \
        for (int d = 0; d < HD; ++d) VSTORE(ot + (h * HD + d) * TILE, VZERO());                                \
    }                                                                                                         \
    const int64_t last = pos0 + n - 1; /* the last position any token of the tile sees */                     \
    /* the first position token 0 sees (sliding window), from the start of its 16-position tile */            \
    const int64_t first = pos0 - window + 1 > 0 ? (pos0 - window + 1) / TILE * TILE : 0;                      \
    for (int64_t p0 = first; p0 <= last; p0 += TILE) {                                                        \
        const int64_t blk = table[p0 / block_size];                                                           \
        const int64_t at = (blk * block_size + p0 % block_size) * HD;                                         \
        const float *kb = WIDEN((const KV *)kbase + at, kw);                                                  \
        const float *vb = WIDEN((const KV *)vbase + at, vw);                                                  \
        const int np = last - p0 + 1 < TILE ? (int)(last - p0 + 1) : TILE;                                     \
        const int diagonal = p0 + TILE - 1 > pos0; /* some position here is after some token */              \
        const int64_t band = p0 - pos0 + window; /* token i sees position p0 + p only if i < band + p */      \
        for (int h = 0; h < g; ++h) {                                                                         \
            const float *qh = qt + h * HD * TILE;                                                             \
            vec s[TILE];                                                                                      \
            for (int p = 0; p < TILE; ++p) s[p] = VZERO();                                                    \
            for (int d = 0; d < HD; ++d) {                                                                    \
                const vec qv = VLOAD(qh + d * TILE);                                                          \
                for (int p = 0; p < TILE; ++p) s[p] = VFMA(qv, VSET1(kb[p * HD + d]), s[p]);                    \
            }                                                                                                 \
            vec mx = m[h];                                                                                    \
            for (int p = 0; p < TILE; ++p) {                                                                  \
                if (p >= np)                                                                                  \
                    s[p] = VSET1(-INFINITY);                                                                  \
                else {                                                                                        \
                    if (diagonal) /* token i sees position p0 + p iff p0 + p <= pos0 + i */                   \
                        s[p] = VMASK_INF(s[p], lane, VSET1((float)(p0 + p - pos0)), _CMP_LT_OQ);        \
                    if (band + p < TILE) /* ... and p0 + p > pos0 + i - window: lanes from band + p on are out */ \
                        s[p] = VMASK_INF(s[p], lane, VSET1((float)(band + p)), _CMP_GE_OQ);             \
                }                                                                                             \
                mx = VMAX(mx, s[p]);                                                                          \
            }                                                                                                 \
            const vec alpha = VEXP(VSUB(m[h], mx));                                                             \
            vec sum = VMUL(l[h], alpha);                                                                      \
            for (int p = 0; p < np; ++p) {                                                                    \
                s[p] = VEXP(VSUB(s[p], mx));                                                                       \
                sum = VADD(sum, s[p]);                                                                        \
            }                                                                                                 \
            m[h] = mx, l[h] = sum;                                                                            \
            float *oh = ot + h * HD * TILE;                                                                   \
            for (int d = 0; d < HD; ++d) {                                                                    \
                vec acc = VMUL(VLOAD(oh + d * TILE), alpha);                                                  \
                for (int p = 0; p < np; ++p) acc = VFMA(s[p], VSET1(vb[p * HD + d]), acc);                     \
                VSTORE(oh + d * TILE, acc);                                                                   \
            }                                                                                                 \
        }                                                                                                     \
    }                                                                                                         \
    for (int h = 0; h < g; ++h) { /* 1 / l, for the transposed store */                                       \
        const vec inv = VDIV(VSET1(1.0f), l[h]);                                                              \
        for (int d = 0; d < HD; ++d)                                                                          \
            VSTORE(ot + (h * HD + d) * TILE, VMUL(VLOAD(ot + (h * HD + d) * TILE), inv));                     \
    }

#define PREFILL(NAME, KV, QT, Q_LOAD, Q_STORE, WIDEN)                                                             \
    int NAME(const QT *q, int64_t q_stride, const KV *k, const KV *v, const int32_t *tables, int64_t table_stride,  \
             const int32_t *query_start, const int32_t *context_lens, int64_t first_seq, int64_t num_seqs, QT *out, \
             int64_t num_heads, int64_t num_kv_heads, int64_t num_blocks, int64_t block_size, float scale,         \
             int64_t num_threads, int64_t window) {                                                               \
        const int64_t g = num_heads / num_kv_heads;                                                               \
        if (g > MAX_GROUP || g * num_kv_heads != num_heads || block_size % TILE) return -2;                       \
        int64_t tiles = 0;                                                                                        \
        for (int64_t s = first_seq; s < num_seqs; ++s) {                                                          \
            const int64_t len = context_lens[s] + query_start[s + 1] - query_start[s];                            \
            const int64_t seen = context_lens[s] - window + 1; /* blocks before the window are not read */        \
            for (int64_t b = seen > 0 ? seen / block_size : 0; b < (len + block_size - 1) / block_size; ++b)      \
                if (tables[s * table_stride + b] < 0 || tables[s * table_stride + b] >= num_blocks) return (int)(s + 1); \
            tiles += (query_start[s + 1] - query_start[s] + TILE - 1) / TILE;                                     \
        }                                                                                                         \
        int64_t *item_seq = malloc(sizeof(int64_t) * (tiles + 1)), *item_t0 = malloc(sizeof(int64_t) * (tiles + 1)); \
        if (!item_seq || !item_t0) return free(item_seq), free(item_t0), -1;                                      \
        int64_t at = 0;                                                                                           \
        for (int64_t s = first_seq; s < num_seqs; ++s)                                                            \
            for (int64_t t0 = 0; t0 < query_start[s + 1] - query_start[s]; t0 += TILE) item_seq[at] = s, item_t0[at++] = t0; \
        const int64_t items = tiles * num_kv_heads, head_stride = num_blocks * block_size * HD;                   \
        int failed = 0;                                                                                           \
        _Pragma("omp parallel num_threads(num_threads) if (num_threads > 1 && items > 1)") {                     \
            float *qt = aligned_alloc(64, sizeof(float) * (MAX_GROUP * HD * TILE * 2 + TILE * HD * 2));            \
            if (!qt) {                                                                                            \
                _Pragma("omp atomic write") failed = 1;                                                           \
            }                                                                                                     \
            float *ot = qt + MAX_GROUP * HD * TILE, *kw = ot + MAX_GROUP * HD * TILE, *vw = kw + TILE * HD;        \
            _Pragma("omp for schedule(dynamic, 1)") for (int64_t it = 0; it < items; ++it) {                      \
                if (!qt) continue;                                                                                \
                const int64_t s = item_seq[it / num_kv_heads], t0 = item_t0[it / num_kv_heads];                   \
                const int64_t kh = it % num_kv_heads, qlen = query_start[s + 1] - query_start[s];                 \
                const int n = qlen - t0 < TILE ? (int)(qlen - t0) : TILE;                                        \
                const int64_t tok0 = query_start[s] + t0, pos0 = context_lens[s] + t0;                            \
                for (int h = 0; h < g; ++h) /* queries, scaled, transposed: qt[h][d][i] */                       \
                    for (int i = 0; i < TILE; ++i)                                                                \
                        for (int d = 0; d < HD; ++d)                                                              \
                            qt[(h * HD + d) * TILE + i] =                                                         \
                                i < n ? Q_LOAD(q[(tok0 + i) * q_stride + (kh * g + h) * HD + d]) * scale : 0.0f;  \
                const int32_t *table = tables + s * table_stride;                                                 \
                const KV *kbase = k + kh * head_stride, *vbase = v + kh * head_stride;                            \
                ITEM_BODY(KV, WIDEN)                                                                              \
                for (int i = 0; i < n; ++i)                                                                       \
                    for (int h = 0; h < g; ++h)                                                                   \
                        for (int d = 0; d < HD; ++d)                                                              \
                            out[((tok0 + i) * num_heads + kh * g + h) * HD + d] = Q_STORE(ot[(h * HD + d) * TILE + i]); \
            }                                                                                                     \
            free(qt);                                                                                             \
        }                                                                                                         \
        free(item_seq), free(item_t0);                                                                            \
        return failed ? -1 : 0;                                                                                   \
    }

/* Tokens per tile: 16 with AVX-512, 8 with AVX2 (the caller's choice of where to use the kernel). */
int paged_prefill_tile(void) { return TILE; }

#define F32_ID(x) (x)
PREFILL(paged_prefill_f32, float, float, F32_ID, F32_ID, widen_f32)
PREFILL(paged_prefill_bf16, uint16_t, float, F32_ID, F32_ID, widen_bf16)
PREFILL(paged_prefill_bf16q, uint16_t, uint16_t, bf16_to_f32, f32_to_bf16, widen_bf16)
#endif
