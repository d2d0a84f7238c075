/* Paged decode attention for the CPU (float32 or bfloat16 KV, float32 math): one query token per sequence against its
 * keys and values, read in place from the block pool through the block table.
 *
 * Layout (the torch backend's): k, v are [num_kv_heads, num_blocks, block_size, head_dim],
 * contiguous; q and out are [n, num_heads, head_dim], contiguous; tables is [n, stride] int32.
 *
 * A work item is one (sequence, KV head) pair: its keys and values are read once for all
 * the query heads of its group (grouped-query attention). Items [begin, end) are done by one
 * call; the caller splits the items across threads (ctypes releases the GIL), so no OpenMP
 * runtime is needed beside torch's. Built with -fopenmp-simd for the `omp simd` loops only.
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

/* The kernel is written once and instantiated per KV element type. */
#define KV float
#define LOAD(x) (x)
#define NAME(f) f##_f32
#include "cpu_paged_decode_body.h"

#undef KV
#undef LOAD
#undef NAME
#define KV uint16_t
#define LOAD(x) bf16_to_f32(x)
#define NAME(f) f##_bf16
#include "cpu_paged_decode_body.h"
