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

#include "bf16.h"

/* Below this many elements a step runs on the calling thread only. */
#define PARALLEL_MIN 32768


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
#define LOAD(x) bf16_to_f32(x)
#define STORE(x) f32_to_bf16(x)
#define ROUND(x) bf16_to_f32(f32_to_bf16(x))
#define NAME(f) f##_bf16
#include "fused_ops_body.h"
