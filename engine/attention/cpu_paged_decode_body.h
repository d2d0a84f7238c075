/* The body of cpu_paged_decode.c's kernel, included once per instance: the includer defines
 * KV (the cache's element type), QT (the queries' and outputs' type, read by Q_LOAD and written
 * by Q_STORE), WIDEN(src, n, buf) (n elements at src as float32: src itself, or buf once
 * filled), LOAD16(src) (16 cache elements as a float32 vector, for the AVX-512 path), NAME(f)
 * (the instance's suffix) and, optionally, QK_DPBF16(q, k) (scores by bf16 dot products). */
/* One (sequence, KV head) item. Inlined with constant group and head_dim below, so the compiler
 * unrolls the dot products and keeps the group's queries and accumulators in registers. Positions
 * are walked block by block (no division per position); scores are exponentiated by a loop the
 * compiler vectorizes (fast_exp). */
static inline void NAME(decode_item)(const float *restrict qi, const KV *restrict kbase, const KV *restrict vbase,
                                     const int32_t *restrict table, int64_t len, int64_t lo, const int64_t group,
                                     int64_t block_size, const int64_t head_dim, float scale, float *restrict oi,
                                     float *restrict scores, float *restrict maxes, float *restrict sums,
                                     float *restrict widened) {
    (void)widened; /* unused where KV is float */
    memset(oi, 0, sizeof(float) * group * head_dim);
    if (len <= 0) return;
    const int64_t base = lo / block_size * block_size; /* blocks before the window are not read */
    for (int64_t j = 0; j < group; ++j) maxes[j] = -INFINITY;
    for (int64_t start = base; start < len; start += block_size) {
        const int64_t count = len - start < block_size ? len - start : block_size;
        const float *kb = WIDEN(kbase + (int64_t)table[start / block_size] * block_size * head_dim, count * head_dim,
                                widened);
        for (int64_t p = 0; p < count; ++p) {
            if (start + p < lo) { /* before the sliding window: weight 0 */
                for (int64_t j = 0; j < group; ++j) scores[j * len + start + p] = -INFINITY;
                continue;
            }
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
        for (int64_t pos = base; pos < len; ++pos) {
            s[pos] = fast_exp(s[pos] - m);
            sum += s[pos];
        }
        sums[j] = sum;
    }
    for (int64_t start = base; start < len; start += block_size) {
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

#ifdef __AVX512F__
/* The same item for head_dim 64 with AVX-512 intrinsics. Scores: 16 positions at a time, each
 * position's 64-wide dot left as a vector of 16 partial sums and the 16 vectors reduced together
 * (hsum16), instead of one horizontal reduction per position and query head; the group's outputs
 * stay in registers through the weighted sum of values. group <= 4 (a constant where inlined). */
static inline void NAME(decode_item_d64)(const float *restrict qi, const KV *restrict kbase, const KV *restrict vbase,
                                         const int32_t *restrict table, int64_t len, int64_t lo, const int64_t group,
                                         int64_t block_size, float scale, float *restrict oi,
                                         float *restrict scores, float *restrict sums, float *restrict widened) {
    (void)widened;
    if (len <= 0) {
        memset(oi, 0, sizeof(float) * group * 64);
        return;
    }
    __m512 q[4][4];
    for (int64_t j = 0; j < group; ++j)
        for (int c = 0; c < 4; ++c) q[j][c] = _mm512_loadu_ps(qi + j * 64 + 16 * c);
#ifdef QK_DPBF16
    __m512bh qb[4][2]; /* a bfloat16 model's queries hold bfloat16 values: narrowing them is exact */
    for (int64_t j = 0; j < group; ++j)
        qb[j][0] = _mm512_cvtne2ps_pbh(q[j][1], q[j][0]), qb[j][1] = _mm512_cvtne2ps_pbh(q[j][3], q[j][2]);
#endif
    const __m512 vscale = _mm512_set1_ps(scale);
    const int64_t block_bytes = block_size * 64 * (int64_t)sizeof(KV);
    const int64_t base = lo / block_size * block_size, b0 = base / block_size; /* the window's first block */
    for (int64_t b = 0; b < 2 && base + b * block_size < len; ++b)
        prefetch_block(kbase + (int64_t)table[b0 + b] * block_size * 64, block_bytes);
    for (int64_t start = base; start < len; start += block_size) {
        const int64_t count = len - start < block_size ? len - start : block_size;
        if (start + 2 * block_size < len)
            prefetch_block(kbase + (int64_t)table[start / block_size + 2] * block_size * 64, block_bytes);
        else if (start + block_size >= len) /* the last key block: ask for the first value blocks */
            for (int64_t b = 0; b < 2 && base + b * block_size < len; ++b)
                prefetch_block(vbase + (int64_t)table[b0 + b] * block_size * 64, block_bytes);
#ifdef QK_DPBF16
        const KV *kb = kbase + (int64_t)table[start / block_size] * block_size * 64;
#else
        const float *kb = WIDEN(kbase + (int64_t)table[start / block_size] * block_size * 64, count * 64, widened);
#endif
        for (int64_t p0 = 0; p0 < count; p0 += 16) {
            const int64_t n = count - p0 < 16 ? count - p0 : 16;
            for (int64_t j = 0; j < group; ++j) {
                /* All 16 rows are read even past `count` (still inside the block, since block_size
                 * is a multiple of 16): a row's garbage stays in its own lane, which is not stored. */
                __m512 acc[16];
                for (int p = 0; p < 16; ++p) {
#ifdef QK_DPBF16
                    acc[p] = QK_DPBF16(qb[j], kb + (p0 + p) * 64);
#else
                    const float *kt = kb + (p0 + p) * 64;
                    __m512 a = _mm512_mul_ps(q[j][0], _mm512_loadu_ps(kt));
                    a = _mm512_fmadd_ps(q[j][1], _mm512_loadu_ps(kt + 16), a);
                    a = _mm512_fmadd_ps(q[j][2], _mm512_loadu_ps(kt + 32), a);
                    acc[p] = _mm512_fmadd_ps(q[j][3], _mm512_loadu_ps(kt + 48), a);
#endif
                }
                _mm512_mask_storeu_ps(scores + j * len + start + p0, (__mmask16)((1u << n) - 1u),
                                      _mm512_mul_ps(hsum16(acc), vscale));
            }
        }
    }
    for (int64_t j = 0; j < group; ++j) /* positions before the sliding window: weight 0 */
        for (int64_t pos = base; pos < lo; ++pos) scores[j * len + pos] = -INFINITY;
    for (int64_t j = 0; j < group; ++j) {
        float *s = scores + j * len;
        __m512 vmax = _mm512_set1_ps(-INFINITY);
        int64_t pos = base;
        for (; pos + 16 <= len; pos += 16) vmax = _mm512_max_ps(vmax, _mm512_loadu_ps(s + pos));
        float m = _mm512_reduce_max_ps(vmax);
        for (; pos < len; ++pos) m = s[pos] > m ? s[pos] : m;
        const __m512 vm = _mm512_set1_ps(m);
        __m512 vsum = _mm512_setzero_ps();
        for (pos = base; pos < len; pos += 16) {
            const __mmask16 live = len - pos >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (len - pos)) - 1u);
            const __m512 e = fast_exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(live, s + pos), vm));
            _mm512_mask_storeu_ps(s + pos, live, e);
            vsum = _mm512_add_ps(vsum, _mm512_maskz_mov_ps(live, e));
        }
        sums[j] = _mm512_reduce_add_ps(vsum);
    }
    __m512 o[4][4]; /* only now live: with q and the 16 score accumulators they would not fit in registers */
    for (int64_t j = 0; j < group; ++j)
        for (int c = 0; c < 4; ++c) o[j][c] = _mm512_setzero_ps();
    for (int64_t start = base; start < len; start += block_size) {
        const int64_t count = len - start < block_size ? len - start : block_size;
        if (start + 2 * block_size < len)
            prefetch_block(vbase + (int64_t)table[start / block_size + 2] * block_size * 64, block_bytes);
        const KV *vb = vbase + (int64_t)table[start / block_size] * block_size * 64;
        for (int64_t p = 0; p < count; ++p) {
            const KV *vt = vb + p * 64; /* each value row is read once: widened as it is loaded */
            const __m512 v0 = LOAD16(vt), v1 = LOAD16(vt + 16), v2 = LOAD16(vt + 32), v3 = LOAD16(vt + 48);
            for (int64_t j = 0; j < group; ++j) {
                const __m512 w = _mm512_set1_ps(scores[j * len + start + p]);
                o[j][0] = _mm512_fmadd_ps(w, v0, o[j][0]);
                o[j][1] = _mm512_fmadd_ps(w, v1, o[j][1]);
                o[j][2] = _mm512_fmadd_ps(w, v2, o[j][2]);
                o[j][3] = _mm512_fmadd_ps(w, v3, o[j][3]);
            }
        }
    }
    for (int64_t j = 0; j < group; ++j) {
        const __m512 inv = _mm512_set1_ps(1.0f / sums[j]);
        for (int c = 0; c < 4; ++c) _mm512_storeu_ps(oi + j * 64 + 16 * c, _mm512_mul_ps(o[j][c], inv));
    }
}
#endif

/* q: token i's heads start at q + i * q_stride (a view of the fused qkv projection); out: [n,
 * num_heads, head_dim], contiguous, in q's element type QT (rounded once from float32). */
int NAME(paged_decode)(const QT *q, int64_t q_stride, const KV *k, const KV *v, const int32_t *tables,
                     int64_t table_stride, const int32_t *seq_lens, QT *out, int64_t num_heads,
                     int64_t num_kv_heads, int64_t num_blocks, int64_t block_size, int64_t head_dim,
                     float scale, int64_t num_seqs, int64_t num_threads, int64_t window) {
    const int64_t group = num_heads / num_kv_heads;
    const int64_t head_stride = num_blocks * block_size * head_dim;
    const int64_t items = num_seqs * num_kv_heads;
    int64_t max_len = 1;
    for (int64_t i = 0; i < num_seqs; ++i) {
        const int64_t len = seq_lens[i];
        if (len > max_len) max_len = len;
        /* a block id outside the pool would read out of bounds: refuse (sequence i + 1); blocks
         * wholly before a sliding window are never read */
        const int64_t first = window > 0 && len > window ? (len - window) / block_size : 0;
        for (int64_t b = first; b < (len + block_size - 1) / block_size; ++b)
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
        float *qi = malloc(sizeof(float) * group * head_dim), *oi = malloc(sizeof(float) * group * head_dim);
        if (!scores || !maxes || !sums || !widened || !qi || !oi) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t item = 0; item < items; ++item) {
            if (!scores || !maxes || !sums || !widened || !qi || !oi) continue;
            const int64_t i = item / num_kv_heads, kh = item % num_kv_heads;
            const QT *qsrc = q + i * q_stride + kh * group * head_dim;
            QT *odst = out + (i * num_heads + kh * group) * head_dim;
            for (int64_t e = 0; e < group * head_dim; ++e) qi[e] = Q_LOAD(qsrc[e]);
            const int32_t *table = tables + i * table_stride;
            const KV *kb = k + kh * head_stride, *vb = v + kh * head_stride;
            const int64_t len = seq_lens[i], lo = window > 0 && len > window ? len - window : 0;
#ifdef __AVX512F__
            if (head_dim == 64 && group == 3 && block_size % 16 == 0) /* SmolLM2 */
                NAME(decode_item_d64)(qi, kb, vb, table, len, lo, 3, block_size, scale, oi, scores, sums, widened);
            else if (head_dim == 64 && group <= 4 && block_size % 16 == 0)
                NAME(decode_item_d64)(qi, kb, vb, table, len, lo, group, block_size, scale, oi, scores, sums, widened);
            else
#endif
            if (head_dim == 64 && group == 3)
                NAME(decode_item)(qi, kb, vb, table, len, lo, 3, block_size, 64, scale, oi, scores, maxes, sums, widened);
            else if (head_dim == 64 && group == 4)
                NAME(decode_item)(qi, kb, vb, table, len, lo, 4, block_size, 64, scale, oi, scores, maxes, sums, widened);
            else if (head_dim == 128 && group == 4)
                NAME(decode_item)(qi, kb, vb, table, len, lo, 4, block_size, 128, scale, oi, scores, maxes, sums, widened);
            else if (head_dim == 64)
                NAME(decode_item)(qi, kb, vb, table, len, lo, group, block_size, 64, scale, oi, scores, maxes, sums, widened);
            else if (head_dim == 128)
                NAME(decode_item)(qi, kb, vb, table, len, lo, group, block_size, 128, scale, oi, scores, maxes, sums, widened);
            else
                NAME(decode_item)(qi, kb, vb, table, len, lo, group, block_size, head_dim, scale, oi, scores, maxes,
                                  sums, widened);
            for (int64_t e = 0; e < group * head_dim; ++e) odst[e] = Q_STORE(oi[e]);
        }
        free(scores), free(maxes), free(sums), free(widened), free(qi), free(oi);
    }
    return failed ? -1 : 0;
}
