/* Paged prefill attention for AVX-512 CPUs, head_dim 64: the prompt tokens of a step against
 * their sequences' cached context and themselves (causal), keys and values read in place from the
 * block pool through the block table.
 *
 * Why not the decode kernel per token: that reads and widens each key block once per prompt
 * token. Here a work item is (sequence, KV head, tile of 16 prompt tokens): each key/value block
 * is widened once and used by the 16 tokens x all query heads of the group, as small products
 * with the 16 tokens in the vector lanes. Queries and outputs are held transposed
 * ([head_dim][16 tokens]), so the online softmax (running max and sum per token, flash style)
 * works lane-wise with no horizontal sums, and the causal mask is one compare per position.
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

#ifdef __AVX512F__
#include <immintrin.h>

#include "../native/avx512_math.h"

#define HD 64
#define TILE 16
#define MAX_GROUP 8

/* A block's 16 rows as float32: a float32 cache is read in place, a bfloat16 one widened into buf. */
static inline const float *widen_f32(const float *src, float *buf) {
    (void)buf;
    return src;
}

static inline const float *widen_bf16(const uint16_t *src, float *buf) {
    for (int e = 0; e < TILE * HD; e += 16)
        _mm512_storeu_ps(buf + e, _mm512_castsi512_ps(_mm512_slli_epi32(
                                      _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(src + e))), 16)));
    return buf;
}

/* One item: tokens t0 .. t0 + n - 1 of a chunk (positions pos0 + i), one KV head's group of g
 * query heads. qt/ot: [g][HD][TILE] scratch; kw/vw: [TILE][HD] room for a widened block. */
#define ITEM_BODY(KV, WIDEN)                                                                                      \
    const __m512 lane = _mm512_set_ps(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);                   \
    __m512 m[MAX_GROUP], l[MAX_GROUP];                                                                        \
    for (int h = 0; h < g; ++h) {                                                                             \
        m[h] = _mm512_set1_ps(-INFINITY), l[h] = _mm512_setzero_ps();                                         \
        for (int d = 0; d < HD; ++d) _mm512_storeu_ps(ot + (h * HD + d) * TILE, _mm512_setzero_ps());          \
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
            __m512 s[TILE];                                                                                   \
            for (int p = 0; p < TILE; ++p) s[p] = _mm512_setzero_ps();                                        \
            for (int d = 0; d < HD; ++d) {                                                                    \
                const __m512 qv = _mm512_loadu_ps(qh + d * TILE);                                             \
                for (int p = 0; p < TILE; ++p) s[p] = _mm512_fmadd_ps(qv, _mm512_set1_ps(kb[p * HD + d]), s[p]); \
            }                                                                                                 \
            __m512 mx = m[h];                                                                                 \
            for (int p = 0; p < TILE; ++p) {                                                                  \
                if (p >= np)                                                                                  \
                    s[p] = _mm512_set1_ps(-INFINITY);                                                         \
                else {                                                                                        \
                    if (diagonal) /* token i sees position p0 + p iff p0 + p <= pos0 + i */                   \
                        s[p] = _mm512_mask_mov_ps(s[p], _mm512_cmp_ps_mask(lane, _mm512_set1_ps((float)(p0 + p - pos0)), \
                                                                           _CMP_LT_OQ), _mm512_set1_ps(-INFINITY)); \
                    if (band + p < TILE) /* ... and p0 + p > pos0 + i - window: lanes from band + p on are out */ \
                        s[p] = _mm512_mask_mov_ps(s[p], _mm512_cmp_ps_mask(lane, _mm512_set1_ps((float)(band + p)), \
                                                                           _CMP_GE_OQ), _mm512_set1_ps(-INFINITY)); \
                }                                                                                             \
                mx = _mm512_max_ps(mx, s[p]);                                                                 \
            }                                                                                                 \
            const __m512 alpha = fast_exp16(_mm512_sub_ps(m[h], mx));                                              \
            __m512 sum = _mm512_mul_ps(l[h], alpha);                                                          \
            for (int p = 0; p < np; ++p) {                                                                    \
                s[p] = fast_exp16(_mm512_sub_ps(s[p], mx));                                                        \
                sum = _mm512_add_ps(sum, s[p]);                                                               \
            }                                                                                                 \
            m[h] = mx, l[h] = sum;                                                                            \
            float *oh = ot + h * HD * TILE;                                                                   \
            for (int d = 0; d < HD; ++d) {                                                                    \
                __m512 acc = _mm512_mul_ps(_mm512_loadu_ps(oh + d * TILE), alpha);                            \
                for (int p = 0; p < np; ++p) acc = _mm512_fmadd_ps(s[p], _mm512_set1_ps(vb[p * HD + d]), acc); \
                _mm512_storeu_ps(oh + d * TILE, acc);                                                         \
            }                                                                                                 \
        }                                                                                                     \
    }                                                                                                         \
    for (int h = 0; h < g; ++h) { /* 1 / l, for the transposed store */                                       \
        const __m512 inv = _mm512_div_ps(_mm512_set1_ps(1.0f), l[h]);                                         \
        for (int d = 0; d < HD; ++d)                                                                          \
            _mm512_storeu_ps(ot + (h * HD + d) * TILE, _mm512_mul_ps(_mm512_loadu_ps(ot + (h * HD + d) * TILE), inv)); \
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

#define F32_ID(x) (x)
PREFILL(paged_prefill_f32, float, float, F32_ID, F32_ID, widen_f32)
PREFILL(paged_prefill_bf16, uint16_t, float, F32_ID, F32_ID, widen_bf16)
PREFILL(paged_prefill_bf16q, uint16_t, uint16_t, bf16_to_f32, f32_to_bf16, widen_bf16)
#endif
