/* The body of cpu_paged_decode.c's kernel, included once per KV element type: the includer defines
 * KV (the element type), WIDEN(src, n, buf) (n elements at src as float32: src itself, or buf once
 * filled) and NAME(f) (the instance's suffix). */
/* One (sequence, KV head) item. Inlined with constant group and head_dim below, so the compiler
 * unrolls the dot products and keeps the group's queries and accumulators in registers. Positions
 * are walked block by block (no division per position); scores are exponentiated by a loop the
 * compiler vectorizes (fast_exp). */
static inline void NAME(decode_item)(const float *restrict qi, const KV *restrict kbase, const KV *restrict vbase,
                                     const int32_t *restrict table, int64_t len, const int64_t group,
                                     int64_t block_size, const int64_t head_dim, float scale, float *restrict oi,
                                     float *restrict scores, float *restrict maxes, float *restrict sums,
                                     float *restrict widened) {
    (void)widened; /* unused where KV is float */
    memset(oi, 0, sizeof(float) * group * head_dim);
    if (len <= 0) return;
    for (int64_t j = 0; j < group; ++j) maxes[j] = -INFINITY;
    for (int64_t start = 0; start < len; start += block_size) {
        const int64_t count = len - start < block_size ? len - start : block_size;
        const float *kb = WIDEN(kbase + (int64_t)table[start / block_size] * block_size * head_dim, count * head_dim,
                                widened);
        for (int64_t p = 0; p < count; ++p) {
            const float *kt = kb + p * head_dim;
            for (int64_t j = 0; j < group; ++j) {
                const float *qj = qi + j * head_dim;
                float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
                for (int64_t d = 0; d < head_dim; ++d) dot += qj[d] * kt[d];
                dot *= scale;
                scores[j * len + start + p] = dot;
                if (dot > maxes[j]) maxes[j] = dot;
            }
        }
    }
    for (int64_t j = 0; j < group; ++j) {
        float sum = 0.0f;
        const float m = maxes[j];
        float *s = scores + j * len;
#pragma omp simd reduction(+ : sum)
        for (int64_t pos = 0; pos < len; ++pos) {
            s[pos] = fast_exp(s[pos] - m);
            sum += s[pos];
        }
        sums[j] = sum;
    }
    for (int64_t start = 0; start < len; start += block_size) {
        const int64_t count = len - start < block_size ? len - start : block_size;
        const float *vb = WIDEN(vbase + (int64_t)table[start / block_size] * block_size * head_dim, count * head_dim,
                                widened);
        for (int64_t p = 0; p < count; ++p) {
            const float *vt = vb + p * head_dim;
            for (int64_t j = 0; j < group; ++j) {
                const float w = scores[j * len + start + p];
                float *oj = oi + j * head_dim;
#pragma omp simd
                for (int64_t d = 0; d < head_dim; ++d) oj[d] += w * vt[d];
            }
        }
    }
    for (int64_t j = 0; j < group; ++j) {
        const float inv = 1.0f / sums[j];
        float *oj = oi + j * head_dim;
#pragma omp simd
        for (int64_t d = 0; d < head_dim; ++d) oj[d] *= inv;
    }
}

int NAME(paged_decode)(const float *q, const KV *k, const KV *v, const int32_t *tables,
                     int64_t table_stride, const int32_t *seq_lens, float *out, int64_t num_heads,
                     int64_t num_kv_heads, int64_t num_blocks, int64_t block_size, int64_t head_dim,
                     float scale, int64_t num_seqs, int64_t num_threads) {
    const int64_t group = num_heads / num_kv_heads;
    const int64_t head_stride = num_blocks * block_size * head_dim;
    const int64_t items = num_seqs * num_kv_heads;
    int64_t max_len = 1;
    for (int64_t i = 0; i < num_seqs; ++i) {
        const int64_t len = seq_lens[i];
        if (len > max_len) max_len = len;
        /* a block id outside the pool would read out of bounds: refuse (sequence i + 1) */
        for (int64_t b = 0; b < (len + block_size - 1) / block_size; ++b)
            if (tables[i * table_stride + b] < 0 || tables[i * table_stride + b] >= num_blocks) return (int)(i + 1);
    }
    int failed = 0;
    /* One team on torch's OpenMP threads (see engine/native); each thread owns its scratch. */
#pragma omp parallel num_threads(num_threads) if (num_threads > 1 && items > 1)
    {
        float *scores = malloc(sizeof(float) * group * max_len);
        float *maxes = malloc(sizeof(float) * group);
        float *sums = malloc(sizeof(float) * group);
        float *widened = malloc(sizeof(float) * block_size * head_dim);
        if (!scores || !maxes || !sums || !widened) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t item = 0; item < items; ++item) {
            if (!scores || !maxes || !sums || !widened) continue;
            const int64_t i = item / num_kv_heads, kh = item % num_kv_heads;
            const float *qi = q + (i * num_heads + kh * group) * head_dim;
            float *oi = out + (i * num_heads + kh * group) * head_dim;
            const int32_t *table = tables + i * table_stride;
            const KV *kb = k + kh * head_stride, *vb = v + kh * head_stride;
            const int64_t len = seq_lens[i];
            if (head_dim == 64 && group == 3) /* SmolLM2, Llama-3 8B/70B... */
                NAME(decode_item)(qi, kb, vb, table, len, 3, block_size, 64, scale, oi, scores, maxes, sums, widened);
            else if (head_dim == 64 && group == 4)
                NAME(decode_item)(qi, kb, vb, table, len, 4, block_size, 64, scale, oi, scores, maxes, sums, widened);
            else if (head_dim == 128 && group == 4)
                NAME(decode_item)(qi, kb, vb, table, len, 4, block_size, 128, scale, oi, scores, maxes, sums, widened);
            else if (head_dim == 64)
                NAME(decode_item)(qi, kb, vb, table, len, group, block_size, 64, scale, oi, scores, maxes, sums, widened);
            else if (head_dim == 128)
                NAME(decode_item)(qi, kb, vb, table, len, group, block_size, 128, scale, oi, scores, maxes, sums, widened);
            else
                NAME(decode_item)(qi, kb, vb, table, len, group, block_size, head_dim, scale, oi, scores, maxes,
                                  sums, widened);
        }
        free(scores), free(maxes), free(sums), free(widened);
    }
    return failed ? -1 : 0;
}
