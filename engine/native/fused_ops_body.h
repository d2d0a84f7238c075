/* The body of fused_ops.c, included once per element type: the includer defines T (the element
 * type), LOAD(x) (widen to float), STORE(x) (narrow a float to T), ROUND(x) (a float rounded to
 * T's precision, as a float) and NAME(f) (the instance's suffix). */

/* out = weight * norm(x) per row; with add, first residual = residual + x (in place) and the
 * norm is taken of the new residual. x and out rows are `stride` elements apart. */
static void NAME(norm_rows)(const T *x, T *residual, const T *weight, T *out, int64_t rows, int64_t hidden,
                            int64_t stride, float eps, int add, int64_t threads) {
#pragma omp parallel for num_threads(threads) if (threads > 1 && rows * hidden >= PARALLEL_MIN)
    for (int64_t t = 0; t < rows; ++t) {
        const T *xr = x + t * stride;
        T *rr = add ? residual + t * hidden : NULL;
        T *orow = out + t * stride;
        float sum = 0.0f;
        if (add) {
#pragma omp simd reduction(+ : sum)
            for (int64_t d = 0; d < hidden; ++d) {
                const float r = ROUND(LOAD(rr[d]) + LOAD(xr[d]));
                rr[d] = STORE(r);
                sum += r * r;
            }
        } else {
#pragma omp simd reduction(+ : sum)
            for (int64_t d = 0; d < hidden; ++d) {
                const float r = LOAD(xr[d]);
                sum += r * r;
            }
        }
        const T *src = add ? rr : xr;
        const float inv = 1.0f / sqrtf(sum / (float)hidden + eps);
#pragma omp simd
        for (int64_t d = 0; d < hidden; ++d) orow[d] = STORE(LOAD(weight[d]) * ROUND(LOAD(src[d]) * inv));
    }
}

void NAME(rms_norm)(const T *x, const T *weight, T *out, int64_t rows, int64_t hidden, float eps,
                    int64_t threads) {
    NAME(norm_rows)(x, NULL, weight, out, rows, hidden, hidden, eps, 0, threads);
}

void NAME(add_rms_norm)(const T *x, T *residual, const T *weight, T *out, int64_t rows, int64_t hidden, float eps,
                        int64_t threads) {
    NAME(norm_rows)(x, residual, weight, out, rows, hidden, hidden, eps, 1, threads);
}

/* Rotary embedding (rotate-half form) of the q and k heads of a fused qkv row, in place:
 * x * cos + cat(-x2, x1) * sin, cos/sin from float32 tables [positions, head_dim] rounded to T. */
void NAME(rotary)(T *qkv, const float *cos_table, const float *sin_table, const int64_t *positions, int64_t rows,
                  int64_t row_stride, int64_t num_heads, int64_t head_dim, int64_t threads) {
    const int64_t half = head_dim / 2;
#pragma omp parallel for num_threads(threads) if (threads > 1 && rows * num_heads * head_dim >= PARALLEL_MIN)
    for (int64_t t = 0; t < rows; ++t) {
        const float *c = cos_table + positions[t] * head_dim, *s = sin_table + positions[t] * head_dim;
        float cr[512], sr[512], x[512];
        for (int64_t d = 0; d < head_dim; ++d) cr[d] = ROUND(c[d]), sr[d] = ROUND(s[d]);
        for (int64_t h = 0; h < num_heads; ++h) {
            T *xh = qkv + t * row_stride + h * head_dim;
            for (int64_t d = 0; d < head_dim; ++d) x[d] = LOAD(xh[d]);
#pragma omp simd
            for (int64_t d = 0; d < half; ++d)
                xh[d] = STORE(ROUND(x[d] * cr[d]) + ROUND(-x[d + half] * sr[d]));
#pragma omp simd
            for (int64_t d = half; d < head_dim; ++d)
                xh[d] = STORE(ROUND(x[d] * cr[d]) + ROUND(x[d - half] * sr[d]));
        }
    }
}

/* Copy a step's keys and values (rows `src_stride` elements apart, num_kv_heads x head_dim each)
 * to their slots of a pool laid out [num_kv_heads, pool_slots, head_dim]; a negative slot writes
 * nothing. Returns 0, or row + 1 of the first slot past the pool (then nothing is written). */
int NAME(write_kv)(const T *k, const T *v, int64_t src_stride, T *k_cache, T *v_cache, const int64_t *slots,
                   int64_t rows, int64_t num_kv_heads, int64_t head_dim, int64_t pool_slots, int64_t threads) {
    for (int64_t t = 0; t < rows; ++t)
        if (slots[t] >= pool_slots) return (int)(t + 1);
#pragma omp parallel for num_threads(threads) if (threads > 1 && rows * num_kv_heads * head_dim >= PARALLEL_MIN)
    for (int64_t t = 0; t < rows; ++t) {
        const int64_t slot = slots[t];
        if (slot < 0) continue;
        for (int64_t h = 0; h < num_kv_heads; ++h) {
            const int64_t dst = (h * pool_slots + slot) * head_dim;
            memcpy(k_cache + dst, k + t * src_stride + h * head_dim, sizeof(T) * head_dim);
            memcpy(v_cache + dst, v + t * src_stride + h * head_dim, sizeof(T) * head_dim);
        }
    }
    return 0;
}
