/* The passes of one chunk (forward_chunk, backward_chunk) over its blocks of rows; see kernel.h. */
#pragma once

#include "kernel.h"

namespace graphattn_cpu {

/* One row's labels: A's, the sink's and its runs over B; `next` is the first run that a pass
 * over B's blocks has not finished. */
typedef struct {
    const char *dense;
    int64_t sink;
    const int32_t *start, *label;
    int64_t runs, next;
} RowLabels;

static RowLabels row_labels(const Chunk *ch, int64_t b, int64_t row) {
    RowLabels l;
    const int64_t at = b * ch->rows + row;
    l.dense = (const char *)ch->dense + (b * ch->dense_batch + row * ch->na) * ch->dense_bytes;
    l.sink = label_at(ch->sink, ch->dense_bytes, at);
    l.start = ch->run_start + ch->run_ptr[at];
    l.label = ch->run_label + ch->run_ptr[at];
    l.runs = ch->run_ptr[at + 1] - ch->run_ptr[at];
    l.next = 0;
    return l;
}

static inline int64_t run_stop(const RowLabels *l, int64_t j, int64_t nb) {
    return j + 1 < l->runs ? l->start[j + 1] : nb;
}

/* The next piece of a row's runs inside B's columns [c0, end): columns [*lo, *hi) take table
 * column *label. Returns 0 when the block has no more. Moves l->next: callers pass a copy. A run
 * with a label outside the table, or not inside [0, nb) in order, sets *bad and is not read. */
static int next_piece(RowLabels *l, int64_t c0, int64_t end, int64_t nb, int64_t width, int64_t *lo, int64_t *hi,
                      int32_t *label, int *bad) {
    while (l->next < l->runs) {
        const int64_t j = l->next++, first = l->start[j], stop = run_stop(l, j, nb);
        if ((uint32_t)l->label[j] >= (uint64_t)width || first < 0 || stop > nb || first > stop) {
            *bad = 1;
            continue;
        }
        if (first >= end) return 0;
        *lo = first > c0 ? first : c0;
        *hi = stop < end ? stop : end;
        *label = l->label[j];
        if (*hi > *lo) return 1;
    }
    return 0;
}

/* After a block of B ends at column `end`: skip the runs that ended in it. */
static void finish_runs(RowLabels *labels, int64_t m, int64_t end, int64_t nb) {
    for (int64_t r = 0; r < m; ++r) {
        RowLabels *l = labels + r;
        while (l->next < l->runs && run_stop(l, l->next, nb) <= end) ++l->next;
    }
}

/* s[c - c0] += t[label] over B's columns [c0, c0 + n); returns their max. */
static float add_runs(float *s, RowLabels l, int64_t c0, int64_t n, int64_t nb, const float *t, int64_t width,
                      int *bad) {
    float mx = -__builtin_inff();
    int64_t lo, hi;
    int32_t label;
    while (next_piece(&l, c0, c0 + n, nb, width, &lo, &hi, &label, bad)) {
        const float piece = add_const(s + lo - c0, hi - lo, t[label]);
        mx = piece > mx ? piece : mx;
    }
    return mx;
}

/* dt[label] += the sum of ds[c - c0] over each run's piece in B's columns [c0, c0 + n). */
static void scatter_runs(float *dt, const float *ds, RowLabels l, int64_t c0, int64_t n, int64_t nb, int64_t width,
                         int *bad) {
    int64_t lo, hi;
    int32_t label;
    while (next_piece(&l, c0, c0 + n, nb, width, &lo, &hi, &label, bad)) {
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int64_t c = lo; c < hi; ++c) sum += ds[c - c0];
        dt[label] += sum;
    }
}

/* The columns [lo, hi) of key set A that exist for the block at chunk row i. */
typedef struct {
    int64_t start, lo, hi;
} Window;

static Window window_of(const Chunk *ch, int64_t i) {
    Window w;
    w.start = ch->a_start + ch->a_step * i;
    w.lo = w.start < 0 ? -w.start : 0;
    w.hi = ch->a_rows - w.start < ch->na ? ch->a_rows - w.start : ch->na;
    if (w.hi < w.lo) w.hi = w.lo;
    return w;
}

/* Key set B is read in pieces of key_block keys (flash attention's online softmax), so a
 * piece's scores stay in cache however many keys B has. The first piece shares the score rows
 * with A and the sink, [m, na + kb + 1] with kb = min(nb, key_block); later ones reuse its B
 * columns. */
static int64_t first_piece(const Chunk *ch) {
    return ch->nb < ch->key_block ? ch->nb : ch->key_block;
}

/* One block of rows of one head: its rows, A's window, and where its operands start. */
typedef struct {
    int64_t b, h, i, m, width, n_a; /* width: the score rows' stride; n_a: A's keys in the window */
    int64_t part_rows;              /* rows of each sub-block for A (Part) */
    Window win;
    const float *q, *ka, *va, *kb, *vb;
    float *out, *table; /* table: the rows' label terms [m, V + 2], see label_table */
} Block;

static Block block_of(const Chunk *ch, int64_t bh, int64_t i, float *table) {
    Block k;
    const int64_t left = ch->valid_rows - i, d = ch->dim;
    k.b = bh / ch->heads, k.h = bh % ch->heads, k.i = i, k.m = left < ch->block ? left : ch->block;
    k.width = ch->na + first_piece(ch) + 1;
    k.win = window_of(ch, i);
    k.n_a = k.win.hi - k.win.lo;
    k.part_rows = (k.m + ch->a_parts - 1) / ch->a_parts;
    k.q = ch->q + bh * ch->q_bh + i * d;
    k.ka = ch->ka + bh * ch->a_bh + (k.win.start + k.win.lo) * d;
    k.va = ch->va + bh * ch->a_bh + (k.win.start + k.win.lo) * d;
    k.kb = ch->kb + bh * ch->b_bh, k.vb = ch->vb + bh * ch->b_bh;
    k.out = ch->out + bh * ch->out_bh + i * d;
    k.table = table;
    return k;
}

/* A band's blocks (a_step 1) take key set A in sub-blocks of rows: row a of a block may only see
 * columns a .. a + na - block of its window, so the sub-block of rows [r0, r1) needs columns
 * [r0, r1 + na - block) only. Two halves score 17% fewer A pairs at w = r (8% less matmul time
 * measured at w = r = 84, d = 64, where smaller matmuls run slower) and skip the other columns'
 * labels and exponentials: those scores are -inf, their probabilities never read. */
typedef struct {
    int64_t r0, r1, c0, c1;
} Part;

static Part part_of(const Chunk *ch, const Block *k, int64_t p) {
    Part q;
    q.r0 = p * k->part_rows;
    q.r1 = q.r0 + k->part_rows < k->m ? q.r0 + k->part_rows : k->m;
    q.c0 = k->win.lo, q.c1 = k->win.hi;
    if (ch->a_parts > 1) {
        const int64_t lo = q.r0, hi = q.r1 + ch->na - ch->block;
        q.c0 = lo > q.c0 ? lo : q.c0;
        q.c1 = hi < q.c1 ? hi : q.c1;
    }
    if (q.c1 < q.c0) q.c1 = q.c0;
    return q;
}

static Part part_of_row(const Chunk *ch, const Block *k, int64_t r) {
    return part_of(ch, k, r / k->part_rows);
}

/* The block's label terms, T[r, v] = scale q_r . a^K_v + b_v (one product with the head's
 * [V, d] key table), then -inf in column V (masked pairs) and 0 in V + 1 (an empty row's sink). */
static void label_table(const Chunk *ch, const Block *k) {
    const int64_t v_count = ch->vocab, tw = table_width(ch), heads = ch->heads, d = ch->dim;
    gemm(0, 1, k->m, v_count, d, ch->scale, k->q, d, ch->rel_key + k->h * d, heads * d, 0.0f, k->table, tw);
    for (int64_t r = 0; r < k->m; ++r) {
        float *row = k->table + r * tw;
        if (ch->rel_bias)
            for (int64_t v = 0; v < v_count; ++v) row[v] += ch->rel_bias[v * heads + k->h];
        row[v_count] = -__builtin_inff(), row[v_count + 1] = 0.0f;
    }
}

/* The label terms' gradient dT [m, V + 2] (its last two columns are constants) back to the
 * query rows (into d_q, already holding the block's other terms) and to this worker's tables. */
static void label_table_grad(const Chunk *ch, const Block *k, const float *dt, float *d_q) {
    const int64_t v_count = ch->vocab, tw = table_width(ch), heads = ch->heads, d = ch->dim;
    gemm(0, 0, k->m, d, v_count, ch->scale, dt, tw, ch->rel_key + k->h * d, heads * d, 1.0f, d_q, d);
    gemm(1, 0, v_count, d, k->m, ch->scale, dt, tw, k->q, d, 1.0f, ch->d_rel_key + k->h * d, heads * d);
    if (ch->d_rel_bias)
        for (int64_t r = 0; r < k->m; ++r)
            for (int64_t v = 0; v < v_count; ++v) ch->d_rel_bias[v * heads + k->h] += dt[r * tw + v];
}

/* Scores of the block's rows against A, B's first piece and the sink, label terms added, into
 * s [m, width]; mx[r] gets each row's max. A's columns outside a row's part (Part) are not
 * computed (their labels mask them): -inf. */
static void first_scores(const Chunk *ch, const Block *k, RowLabels *labels, float *s, float *mx, int *bad) {
    const int64_t d = ch->dim, na = ch->na, kb = first_piece(ch), tw = table_width(ch), sink = k->width - 1;
    for (int64_t p = 0; p * k->part_rows < k->m; ++p) {
        const Part q = part_of(ch, k, p);
        const float *keys = k->ka + (q.c0 - k->win.lo) * d;
        gemm(0, 1, q.r1 - q.r0, q.c1 - q.c0, d, ch->scale, k->q + q.r0 * d, d, keys, d, 0.0f, s + q.r0 * k->width + q.c0,
             k->width);
    }
    gemm(0, 1, k->m, kb, d, ch->scale, k->q, d, k->kb, d, 0.0f, s + na, k->width);
    for (int64_t r = 0; r < k->m; ++r) {
        float *row = s + r * k->width;
        const float *t = k->table + r * tw;
        const Part q = part_of_row(ch, k, r);
        for (int64_t c = 0; c < q.c0; ++c) row[c] = -__builtin_inff();
        for (int64_t c = q.c1; c < na; ++c) row[c] = -__builtin_inff();
        row[sink] = 0.0f;
        labels[r] = row_labels(ch, k->b, k->i + r);
        const char *dense = labels[r].dense + q.c0 * ch->dense_bytes;
        const float top_a = add_labels(row + q.c0, dense, ch->dense_bytes, t, tw, q.c1 - q.c0, bad);
        const float top_b = add_runs(row + na, labels[r], 0, kb, ch->nb, t, tw, bad);
        const uint64_t sink_label = (uint64_t)labels[r].sink;
        if (sink_label < (uint64_t)tw)
            row[sink] += t[sink_label];
        else
            *bad = 1, row[sink] = -__builtin_inff();
        const float top = top_a > top_b ? top_a : top_b;
        mx[r] = row[sink] > top ? row[sink] : top;
    }
}

/* Scores against B's keys [c0, c0 + n), label terms added, into the B columns of s; top[r] gets
 * each row's max over them. */
static void later_scores(const Chunk *ch, const Block *k, RowLabels *labels, int64_t c0, int64_t n, float *s,
                         float *top, int *bad) {
    const int64_t d = ch->dim, tw = table_width(ch);
    gemm(0, 1, k->m, n, d, ch->scale, k->q, d, k->kb + c0 * d, d, 0.0f, s + ch->na, k->width);
    for (int64_t r = 0; r < k->m; ++r)
        top[r] = add_runs(s + r * k->width + ch->na, labels[r], c0, n, ch->nb, k->table + r * tw, tw, bad);
}

/* The max to subtract before e^x: a row with no allowed key yet (max -inf) subtracts 0, so its
 * e^-inf stay 0 instead of becoming NaN. */
static inline float shift(float mx) {
    return mx == -__builtin_inff() ? 0.0f : mx;
}

/* One call's scratch: score rows (and their gradients), label tables (and theirs), three floats
 * per row, run cursors. */
typedef struct {
    float *s, *ds, *table, *d_table, *mx, *sum, *top, *lanes;
    RowLabels *labels;
} Scratch;

static int scratch_of(const Chunk *ch, Scratch *w, int backward) {
    const int64_t m = ch->block, tile = m * (ch->na + first_piece(ch) + 1), tables = m * table_width(ch);
    const int64_t twice = backward ? 2 : 1;
    const int64_t floats = (tile + tables) * twice + 3 * m + (backward ? LANES * MAX_LANED_WIDTH : 0);
    w->s = static_cast<float *>(malloc(sizeof(float) * floats));
    w->labels = static_cast<RowLabels *>(malloc(sizeof(RowLabels) * m));
    if (!w->s || !w->labels) {
        free(w->s), free(w->labels);
        return 1;
    }
    w->ds = backward ? w->s + tile : NULL;
    w->table = w->s + tile * twice;
    w->d_table = backward ? w->table + tables : NULL;
    w->mx = w->table + tables * twice;
    w->sum = w->mx + m, w->top = w->sum + m;
    w->lanes = backward ? w->top + m : NULL;
    return 0;
}

static int release(Scratch *w, int code) {
    free(w->s), free(w->labels);
    return code;
}

/* Both passes return 0, 1 when scratch memory could not be allocated, or 2 when a label lies
 * outside its row's table (the caller's ids are wrong; nothing outside the table was touched).
 * The forward keeps each row's max and log sum in stats (when given), which the backward reads. */
static int forward_chunk(const Chunk *ch, int64_t bh_count) {
    const int64_t d = ch->dim, na = ch->na, nb = ch->nb, kb = first_piece(ch);
    Scratch w;
    if (scratch_of(ch, &w, 0)) return 1;
    int bad = 0;
    for (int64_t bh = 0; bh < bh_count && !bad; ++bh) {
        for (int64_t i = 0; i < ch->valid_rows && !bad; i += ch->block) {
            const Block k = block_of(ch, bh, i, w.table);
            const int64_t m = k.m;
            label_table(ch, &k);
            first_scores(ch, &k, w.labels, w.s, w.mx, &bad);
            for (int64_t r = 0; r < m; ++r) {
                float *row = w.s + r * k.width;
                const Part q = part_of_row(ch, &k, r);
                w.sum[r] = exp_row(row + q.c0, shift(w.mx[r]), 0.0f, q.c1 - q.c0);
                w.sum[r] += exp_row(row + na, shift(w.mx[r]), 0.0f, k.width - na);
            }
            for (int64_t p = 0; p * k.part_rows < m; ++p) {
                const Part q = part_of(ch, &k, p);
                float *out = k.out + q.r0 * d;
                gemm(0, 0, q.r1 - q.r0, d, q.c1 - q.c0, 1.0f, w.s + q.r0 * k.width + q.c0, k.width,
                     k.va + (q.c0 - k.win.lo) * d, d, 0.0f, out, d);
                if (q.c1 <= q.c0) memset(out, 0, (q.r1 - q.r0) * d * sizeof(float)); /* no A keys: skipped above */
            }
            gemm(0, 0, m, d, kb, 1.0f, w.s + na, k.width, k.vb, d, 1.0f, k.out, d);
            for (int64_t c0 = kb; c0 < nb; c0 += kb) {
                const int64_t n = nb - c0 < kb ? nb - c0 : kb;
                finish_runs(w.labels, m, c0, nb);
                later_scores(ch, &k, w.labels, c0, n, w.s, w.top, &bad);
                for (int64_t r = 0; r < m; ++r) {
                    if (w.top[r] > w.mx[r]) { /* a new max: rescale what was summed so far */
                        const float alpha = expf(w.mx[r] - w.top[r]);
                        w.sum[r] *= alpha;
                        for (int64_t c = 0; c < d; ++c) k.out[r * d + c] *= alpha;
                        w.mx[r] = w.top[r];
                    }
                    w.sum[r] += exp_row(w.s + r * k.width + na, shift(w.mx[r]), 0.0f, n);
                }
                gemm(0, 0, m, d, n, 1.0f, w.s + na, k.width, k.vb + c0 * d, d, 1.0f, k.out, d);
            }
            for (int64_t r = 0; r < m; ++r) { /* the sink keeps every row's sum positive */
                const float inv = 1.0f / w.sum[r];
                for (int64_t c = 0; c < d; ++c) k.out[r * d + c] *= inv;
                if (ch->stats) {
                    float *kept = ch->stats + bh * ch->stats_bh + 2 * (i + r);
                    kept[0] = w.mx[r], kept[1] = logf(w.sum[r]);
                }
            }
        }
    }
    return release(&w, bad ? 2 : 0);
}

/* dS = P (dP - D) over n columns of a row, in place of dP (D: the row's sum of P dP). */
static void score_grad(const float *p, float *dp, int64_t n, float dot) {
#pragma omp simd
    for (int64_t c = 0; c < n; ++c) dp[c] = p[c] * (dp[c] - dot);
}

static float dot_product(const float *a, const float *b, int64_t n) {
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t c = 0; c < n; ++c) sum += a[c] * b[c];
    return sum;
}

/* The backward recomputes each piece's probabilities from the forward's statistics, so the
 * pieces of B are independent: P = e^((S - max) - log sum), and dS = P (dP - D) with D =
 * rowsum(P dP) = rowsum(dO . O). Rows of one piece take the first form, as the softmax's own
 * gradient does: a row with one key then gets dS = 0 exactly; longer rows need the second. */
static int backward_chunk(const Chunk *ch, int64_t bh_count) {
    const int64_t d = ch->dim, na = ch->na, nb = ch->nb, kb = first_piece(ch), tw = table_width(ch);
    const int one_piece = nb <= kb;
    Scratch w;
    if (scratch_of(ch, &w, 1)) return 1;
    int bad = 0;
    for (int64_t bh = 0; bh < bh_count && !bad; ++bh) {
        for (int64_t i = 0; i < ch->valid_rows && !bad; i += ch->block) {
            const Block k = block_of(ch, bh, i, w.table);
            const int64_t m = k.m, width = k.width;
            const int64_t a_off = bh * ch->a_bh + (k.win.start + k.win.lo) * d, b_off = bh * ch->b_bh;
            const float *g = ch->d_out + bh * ch->d_out_bh + i * d, *o = ch->o + bh * ch->o_bh + i * d;
            const float *kept = ch->stats + bh * ch->stats_bh + 2 * i; /* row r: max, log sum */
            float *d_q = k.out, *dt = w.d_table, *dot = w.sum;
            for (int64_t r = 0; r < m && !one_piece; ++r) dot[r] = dot_product(g + r * d, o + r * d, d);
            /* A, B's first piece and the sink */
            label_table(ch, &k);
            memset(dt, 0, m * tw * sizeof(float));
            first_scores(ch, &k, w.labels, w.s, w.mx, &bad);
            if (bad) break; /* the scatters below trust the dense labels */
            for (int64_t r = 0; r < m; ++r) {
                const Part q = part_of_row(ch, &k, r);
                exp_row(w.s + r * width + q.c0, kept[2 * r], kept[2 * r + 1], q.c1 - q.c0);
                exp_row(w.s + r * width + na, kept[2 * r], kept[2 * r + 1], width - na);
                w.ds[r * width + width - 1] = 0.0f; /* the sink has no value */
            }
            for (int64_t p = 0; p * k.part_rows < m; ++p) { /* dP and dV of A, part by part */
                const Part q = part_of(ch, &k, p);
                const int64_t rows = q.r1 - q.r0, cols = q.c1 - q.c0, from = (q.c0 - k.win.lo) * d;
                gemm(0, 1, rows, cols, d, 1.0f, g + q.r0 * d, d, k.va + from, d, 0.0f, w.ds + q.r0 * width + q.c0, width);
                gemm(1, 0, cols, d, rows, 1.0f, w.s + q.r0 * width + q.c0, width, g + q.r0 * d, d, 1.0f,
                     ch->d_va + a_off + from, d);
            }
            gemm(0, 1, m, kb, d, 1.0f, g, d, k.vb, d, 0.0f, w.ds + na, width);
            gemm(1, 0, kb, d, m, 1.0f, w.s + na, width, g, d, 1.0f, ch->d_vb + b_off, d);
            for (int64_t r = 0; r < m; ++r) {
                const Part q = part_of_row(ch, &k, r);
                const float *p_r = w.s + r * width;
                float *dp = w.ds + r * width, *dt_r = dt + r * tw;
                if (one_piece)
                    dot[r] = dot_product(p_r + q.c0, dp + q.c0, q.c1 - q.c0) + dot_product(p_r + na, dp + na, width - na);
                score_grad(p_r + q.c0, dp + q.c0, q.c1 - q.c0, dot[r]);
                score_grad(p_r + na, dp + na, width - na, dot[r]);
                const char *dense = w.labels[r].dense + q.c0 * ch->dense_bytes;
                scatter_labels(dt_r, dense, ch->dense_bytes, dp + q.c0, q.c1 - q.c0, tw, w.lanes);
                scatter_runs(dt_r, dp + na, w.labels[r], 0, kb, nb, tw, &bad);
                dt_r[w.labels[r].sink] += dp[width - 1];
            }
            for (int64_t p = 0; p * k.part_rows < m; ++p) { /* dQ and dK of A, part by part */
                const Part q = part_of(ch, &k, p);
                const int64_t rows = q.r1 - q.r0, cols = q.c1 - q.c0, from = (q.c0 - k.win.lo) * d;
                const float *ds = w.ds + q.r0 * width + q.c0;
                if (cols > 0)
                    gemm(0, 0, rows, d, cols, ch->scale, ds, width, k.ka + from, d, 0.0f, d_q + q.r0 * d, d);
                else
                    memset(d_q + q.r0 * d, 0, rows * d * sizeof(float));
                gemm(1, 0, cols, d, rows, ch->scale, ds, width, k.q + q.r0 * d, d, 1.0f, ch->d_ka + a_off + from, d);
            }
            gemm(0, 0, m, d, kb, ch->scale, w.ds + na, width, k.kb, d, 1.0f, d_q, d);
            gemm(1, 0, kb, d, m, ch->scale, w.ds + na, width, k.q, d, 1.0f, ch->d_kb + b_off, d);
            /* B's later pieces */
            for (int64_t c0 = kb; c0 < nb && !bad; c0 += kb) {
                const int64_t n = nb - c0 < kb ? nb - c0 : kb, at = b_off + c0 * d;
                finish_runs(w.labels, m, c0, nb);
                later_scores(ch, &k, w.labels, c0, n, w.s, w.top, &bad);
                for (int64_t r = 0; r < m; ++r) exp_row(w.s + r * width + na, kept[2 * r], kept[2 * r + 1], n);
                gemm(0, 1, m, n, d, 1.0f, g, d, k.vb + c0 * d, d, 0.0f, w.ds + na, width);
                gemm(1, 0, n, d, m, 1.0f, w.s + na, width, g, d, 1.0f, ch->d_vb + at, d);
                for (int64_t r = 0; r < m; ++r) {
                    float *dp = w.ds + r * width + na;
                    score_grad(w.s + r * width + na, dp, n, dot[r]);
                    scatter_runs(dt + r * tw, dp, w.labels[r], c0, n, nb, tw, &bad);
                }
                gemm(0, 0, m, d, n, ch->scale, w.ds + na, width, k.kb + c0 * d, d, 1.0f, d_q, d);
                gemm(1, 0, n, d, m, ch->scale, w.ds + na, width, k.q, d, 1.0f, ch->d_kb + at, d);
            }
            label_table_grad(ch, &k, dt, d_q);
        }
    }
    return release(&w, bad ? 2 : 0);
}

}  // namespace graphattn_cpu
