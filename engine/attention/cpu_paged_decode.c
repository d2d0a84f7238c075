/* Paged decode attention for the CPU (float32 or bfloat16 KV, float32 math): one query token per sequence against its
 * keys and values, read in place from the block pool through the block table.
 *
 * Layout (the torch backend's): k, v are [num_kv_heads, num_blocks, block_size, head_dim],
 * contiguous; q and out are [n, num_heads, head_dim], contiguous; tables is [n, stride] int32.
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

/* bfloat16 is the top half of a float32: widening is a shift. */
static inline float bf16_to_f32(uint16_t x) {
    union { uint32_t u; float f; } v = {(uint32_t)x << 16};
    return v.f;
}

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

/* The kernel is written once and instantiated per KV element type. */
#define KV float
#define WIDEN(src, n, buf) (src)
#define NAME(f) f##_f32
#include "cpu_paged_decode_body.h"

#undef KV
#undef WIDEN
#undef NAME
#define KV uint16_t
#define WIDEN(src, n, buf) widen_bf16((src), (n), (buf))
#define NAME(f) f##_bf16
#include "cpu_paged_decode_body.h"
