/* Paged decode attention for the CPU (float32 or bfloat16 KV, float32 math): one query token per sequence against its
 * keys and values, read in place from the block pool through the block table.
 *
 * Layout (the torch backend's): k, v are [num_kv_heads, num_blocks, block_size, head_dim],
 * contiguous; q is [n, num_heads, head_dim] with any row stride, out the same shape, contiguous;
 * tables is [n, stride] int32.
 *
 * A work item is one (sequence, KV head) pair: its keys and values are read once for all
 * the query heads of its group (grouped-query attention). Items are shared out by an OpenMP
 * loop that runs on torch's own OpenMP threads (engine/native explains why that holds), so
 * no second thread pool competes with torch's for the cores.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../native/bf16.h"


/* exp(x) for x <= 0 (scores minus their maximum) in plain arithmetic the compiler vectorizes
 * (glibc's expf is a scalar call): x = i ln2 + r, |r| <= ln2 / 2, and e^r by its degree-6
 * Taylor polynomial (relative error under 2e-7); results below e^-87 flush to 0. */
static inline float fast_exp(float x) {
    x = x < -87.0f ? -87.0f : x;
    const float i = __builtin_floorf(x * 1.44269504088896341f + 0.5f);
    const float r = (x - i * 0.693145751953125f) - i * 1.42860682030941723e-6f;
    float p = 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    union { int32_t n; float f; } two_i = {((int32_t)i + 127) << 23};
    return x <= -87.0f ? 0.0f : p * two_i.f;
}

/* One block of bfloat16 keys or values widened to float32 in one vectorized pass, so the dot
 * products and sums run on float32 rows in L1 (widening each element inside those loops ran
 * slower than reading twice the bytes of a float32 cache). */
static inline const float *widen_bf16(const uint16_t *restrict src, int64_t n, float *restrict dst) {
#pragma omp simd
    for (int64_t e = 0; e < n; ++e) dst[e] = bf16_to_f32(src[e]);
    return dst;
}

#ifdef __AVX512F__
#include <immintrin.h>

#include "../native/avx512_math.h"
#endif

/* Ask for the next block's cache lines while this one is computed: blocks sit anywhere in the
 * pool, so the hardware prefetcher cannot guess the next one. */
static inline void prefetch_block(const void *p, int64_t bytes) {
    for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch((const char *)p + b, 0, 3);
}

/* The kernel is written once and instantiated three times: float32 cache; bfloat16 cache with
 * float32 queries; bfloat16 cache with bfloat16 queries and outputs. */
#define KV float
#define QT float
#define Q_LOAD(x) (x)
#define Q_STORE(x) (x)
#define WIDEN(src, n, buf) (src)
#define LOAD16(src) _mm512_loadu_ps(src)
#define NAME(f) f##_f32
#include "cpu_paged_decode_body.h"

#undef KV
#undef WIDEN
#undef LOAD16
#undef NAME
#define KV uint16_t
#define WIDEN(src, n, buf) widen_bf16((src), (n), (buf))
#define LOAD16(src) _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(src))), 16))
#define NAME(f) f##_bf16
#include "cpu_paged_decode_body.h"

/* bfloat16 queries in, bfloat16 outputs out (a bfloat16 model's step, no float32 copies). */
#undef QT
#undef Q_LOAD
#undef Q_STORE
#define QT uint16_t
#define Q_LOAD(x) bf16_to_f32(x)
#define Q_STORE(x) f32_to_bf16(x)
#undef NAME
#define NAME(f) f##_bf16q
#ifdef __AVX512BF16__
/* Scores of bfloat16 keys by the CPU's bfloat16 dot product (pairs multiplied exactly and summed
 * in float32), the keys read as stored instead of widened first. Only for queries that are
 * bfloat16 values (paged_decode_bf16q), i.e. a bfloat16 model's. */
static inline __m512 qk_dpbf16(const __m512bh q[2], const uint16_t *k) {
    const __m512bh k0 = (__m512bh)_mm512_loadu_si512(k), k1 = (__m512bh)_mm512_loadu_si512(k + 32);
    return _mm512_dpbf16_ps(_mm512_dpbf16_ps(_mm512_setzero_ps(), q[0], k0), q[1], k1);
}
#define QK_DPBF16(q, k) qk_dpbf16((q), (k))
#endif
#include "cpu_paged_decode_body.h"
