/* bfloat16 <-> float32 for the C kernels (engine/native/fused_ops.c, engine/attention/cpu_paged_decode.c):
 * one definition of the rounding, so every kernel narrows exactly as torch does. */
#ifndef TOKENMILL_BF16_H
#define TOKENMILL_BF16_H
#include <stdint.h>

/* bfloat16 is the top half of a float32: widening is a shift. */
static inline float bf16_to_f32(uint16_t x) {
    union { uint32_t u; float f; } v = {(uint32_t)x << 16};
    return v.f;
}

/* Round to nearest even, as torch does when it narrows float32 to bfloat16. */
static inline uint16_t f32_to_bf16(float f) {
    union { float f; uint32_t u; } v = {f};
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40u); /* quiet NaN */
    return (uint16_t)((v.u + 0x7fffu + ((v.u >> 16) & 1u)) >> 16);
}
#endif
