/* Fused element-wise steps of a Llama decoder layer for the CPU, float32 and bfloat16.
 *
 * Each one replaces a chain of eager torch ops (one pass over memory and one dispatch each)
 * with one pass: residual add + RMSNorm, rotary embedding of q and k in place, and the write
 * of a step's keys and values into the paged pool. Rounding follows the torch formulation
 * they replace (engine/models/fused.py) step for step: in bfloat16 every intermediate the
 * torch code holds in bfloat16 is rounded here too, and the library is built without FMA
 * contraction so float32 products and sums round as torch's do. Only the order of the
 * RMSNorm sum differs.
 *
 * Rows are shared out by OpenMP loops on torch's own threads (see engine/native).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

/* Below this many elements a step runs on the calling thread only. */
#define PARALLEL_MIN 32768

static inline float bf16_load(uint16_t x) {
    union { uint32_t u; float f; } v = {(uint32_t)x << 16};
    return v.f;
}

/* Round to nearest even, as torch does when it narrows float32 to bfloat16. */
static inline uint16_t bf16_store(float f) {
    union { float f; uint32_t u; } v = {f};
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40u); /* quiet NaN */
    return (uint16_t)((v.u + 0x7fffu + ((v.u >> 16) & 1u)) >> 16);
}

#define T float
#define LOAD(x) (x)
#define STORE(x) (x)
#define ROUND(x) (x)
#define NAME(f) f##_f32
#include "fused_ops_body.h"
#undef T
#undef LOAD
#undef STORE
#undef ROUND
#undef NAME

#define T uint16_t
#define LOAD(x) bf16_load(x)
#define STORE(x) bf16_store(x)
#define ROUND(x) bf16_load(bf16_store(x))
#define NAME(f) f##_bf16
#include "fused_ops_body.h"
