/* The body of cpu_paged_decode.c's kernel, included once per KV element type: the includer defines
 * KV (the element type), LOAD(x) (widen one element to float) and NAME(f) (the instance's suffix). */
/* One (sequence, KV head) item. Inlined with a constant head_dim below, so the compiler
 * unrolls the dot products and keeps the group's queries in registers. */
static inline void NAME(decode_item)(const float *qi, const KV *kbase, const KV *vbase, const int32_t *table,
                               int64_t len, int64_t group, int64_t block_size, const int64_t head_dim,
                               float scale, float *oi, float *scores, float *maxes, float *sums) {
    memset(oi, 0, sizeof(float) * group * head_dim);
    if (len <= 0) return;
    for (int64_t j = 0; j < group; ++j) maxes[j] = -INFINITY;
    for (int64_t pos = 0; pos < len; ++pos) {
        const KV *kt = kbase + ((int64_t)table[pos / block_size] * block_size + pos % block_size) * head_dim;
        for (int64_t j = 0; j < group; ++j) {
            const float *qj = qi + j * head_dim;
            float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
            for (int64_t d = 0; d < head_dim; ++d) dot += qj[d] * LOAD(kt[d]);
            dot *= scale;
            scores[j * len + pos] = dot;
            if (dot > maxes[j]) maxes[j] = dot;
        }
    }
    for (int64_t j = 0; j < group; ++j) {
        float sum = 0.0f, m = maxes[j];
        float *s = scores + j * len;
        for (int64_t pos = 0; pos < len; ++pos) {
            s[pos] = expf(s[pos] - m);
            sum += s[pos];
        }
        sums[j] = sum;
    }
    for (int64_t pos = 0; pos < len; ++pos) {
        const KV *vt = vbase + ((int64_t)table[pos / block_size] * block_size + pos % block_size) * head_dim;
        for (int64_t j = 0; j < group; ++j) {
            const float p = scores[j * len + pos];
            float *oj = oi + j * head_dim;
#pragma omp simd
            for (int64_t d = 0; d < head_dim; ++d) oj[d] += p * LOAD(vt[d]);
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
                     float scale, int64_t begin, int64_t end) {
    const int64_t group = num_heads / num_kv_heads;
    const int64_t head_stride = num_blocks * block_size * head_dim;
    int64_t max_len = 1;
    for (int64_t item = begin; item < end; ++item) {
        int64_t len = seq_lens[item / num_kv_heads];
        if (len > max_len) max_len = len;
    }
    float *scores = malloc(sizeof(float) * group * max_len);
    float *maxes = malloc(sizeof(float) * group);
    float *sums = malloc(sizeof(float) * group);
    if (!scores || !maxes || !sums) {
        free(scores), free(maxes), free(sums);
        return -1;
    }
    for (int64_t item = begin; item < end; ++item) {
        const int64_t i = item / num_kv_heads, kh = item % num_kv_heads;
        const float *qi = q + (i * num_heads + kh * group) * head_dim;
        float *oi = out + (i * num_heads + kh * group) * head_dim;
        const int32_t *table = tables + i * table_stride;
        const KV *kb = k + kh * head_stride, *vb = v + kh * head_stride;
        const int64_t len = seq_lens[i];
        /* a block id outside the pool would read out of bounds: refuse (sequence i + 1) */
        for (int64_t b = 0; b < (len + block_size - 1) / block_size; ++b) {
            if (table[b] < 0 || table[b] >= num_blocks) {
                free(scores), free(maxes), free(sums);
                return (int)(i + 1);
            }
        }
        if (head_dim == 64)
            NAME(decode_item)(qi, kb, vb, table, len, group, block_size, 64, scale, oi, scores, maxes, sums);
        else if (head_dim == 128)
            NAME(decode_item)(qi, kb, vb, table, len, group, block_size, 128, scale, oi, scores, maxes, sums);
        else
            NAME(decode_item)(qi, kb, vb, table, len, group, block_size, head_dim, scale, oi, scores, maxes, sums);
    }
    free(scores), free(maxes), free(sums);
    return 0;
}
