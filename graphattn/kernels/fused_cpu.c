/* Fused CPU kernel of the blocked backend: one chunk of query rows, forward or backward, fp32.
 *
 * Same tiles as the eager path (blocked_tiles.py), fused per block of rows: the score block
 * [m, K] stays in this thread's cache while the label terms are added, the softmax is taken and
 * the matmuls read it back. K = na + nb + 1 columns: key set A (the band window of a long block,
 * or every global key), key set B (the chunk's global or long keys), and the sink column (score 0
 * plus its label term: 0 for a row with no allowed key, -inf elsewhere). A's window may reach
 * past its keys (the band at the sequence's ends): those columns get score 0 and the labels mark
 * them masked. Labels come in two forms: one per column for A and the sink (`dense`), and runs
 * of equal labels for B, whose rows (a long token against every global, a global against every
 * long token) mostly hold a label or two: a run adds one table value to a stretch of scores, and
 * its gradient is the stretch's sum. Matmuls are the BLAS sgemm that PyTorch links (column-major, so a row-major
 * [m, n] tile is an [n, m] column-major one). Threads come from the caller (one chunk per call).
 *
 * Built at first use by fused_cpu.py with the machine's C compiler; nothing here is Python.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

extern void sgemm_(const char *ta, const char *tb, const int *m, const int *n, const int *k, const float *alpha,
                   const float *a, const int *lda, const float *b, const int *ldb, const float *beta, float *c,
                   const int *ldc);

/* Row-major C[m, n] = alpha * op(A) op(B) + beta * C, with leading dimensions (row strides). */
static void gemm(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                 const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
    if (m <= 0 || n <= 0) return;
    /* column-major C^T[n, m] = op(B)^T op(A)^T */
    const char tb = trans_b ? 'T' : 'N', ta = trans_a ? 'T' : 'N';
    const int im = (int)n, in = (int)m, ik = (int)k, ia = (int)lda, ib = (int)ldb, ic = (int)ldc;
    sgemm_(&tb, &ta, &im, &in, &ik, &alpha, b, &ib, a, &ia, &beta, c, &ic);
}

/* What one call needs; pointers already point at the chunk's first row (query side) or at key
 * row 0 (key sides), the head stride given separately. Mirrored by fused_cpu.Chunk. */
typedef struct {
    int64_t heads, rows, valid_rows, block, dim; /* rows of the chunk; only the first valid_rows exist */
    float scale;
    const float *q;   /* [BH, *, dim], stride q_bh */
    int64_t q_bh;
    const float *ka, *va; /* key set A [BH, a_rows, dim]; block at chunk row i sees rows a_start + a_step * i + c */
    int64_t a_bh, a_rows, a_start, a_step, na;
    const float *kb, *vb; /* key set B [BH, >= nb, dim], already at its first key */
    int64_t b_bh, nb;
    const void *dense; /* [B, rows, na + 1] labels (columns of the table) of A and the sink, int8/16/32 */
    int64_t dense_bytes, dense_batch;
    const int64_t *run_ptr; /* [B * rows + 1]: row (b, r)'s runs over B are run_ptr[b*rows + r] ..< the next */
    const int32_t *run_start, *run_label; /* per run: its first column of B (the first run starts at 0) and label */
    const float *table; /* [BH, *, table_width] label terms of each query row */
    int64_t table_bh, table_width;
    float *out; /* forward: [BH, *, dim]; backward: d_q */
    int64_t out_bh;
    /* backward only */
    const float *d_out; /* [BH, *, dim] */
    int64_t d_out_bh;
    float *d_ka, *d_va, *d_kb, *d_vb; /* accumulators laid out as ka/va/kb/vb */
    float *d_table;                    /* laid out as table */
} Chunk;

static inline int64_t label_at(const void *label, int64_t bytes, int64_t c) {
    switch (bytes) {
        case 1: return ((const int8_t *)label)[c];
        case 2: return ((const int16_t *)label)[c];
        default: return ((const int32_t *)label)[c];
    }
}

#define LOG2E 1.44269504088896341f
#define EXP_LOW -87.0f /* below this e^x is 0 here (masked scores are -inf) */
/* Cephes' polynomial for e^r on [-ln2/2, ln2/2], and ln2 split in two for the reduction. */
#define LN2_HI 0.693359375f
#define LN2_LO -2.12194440e-4f
#define EXP_POLY(P, R, MUL_ADD)                    \
    P = MUL_ADD(P, R, CONST(1.3981999507e-3f));    \
    P = MUL_ADD(P, R, CONST(8.3334519073e-3f));    \
    P = MUL_ADD(P, R, CONST(4.1665795894e-2f));    \
    P = MUL_ADD(P, R, CONST(1.6666665459e-1f));    \
    P = MUL_ADD(P, R, CONST(5.0000001201e-1f));

#ifdef __AVX512F__
#include <immintrin.h>
#define CONST(x) _mm512_set1_ps(x)
/* e^x in 16 lanes, ~1 ulp; 0 below EXP_LOW. */
static inline __m512 exp16(__m512 x) {
    const __mmask16 zero = _mm512_cmp_ps_mask(x, CONST(EXP_LOW), _CMP_LT_OQ);
    x = _mm512_max_ps(x, CONST(EXP_LOW));
    const __m512 n = _mm512_roundscale_ps(_mm512_fmadd_ps(x, CONST(LOG2E), CONST(0.5f)),
                                          _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    const __m512 r = _mm512_fnmadd_ps(n, CONST(LN2_LO), _mm512_fnmadd_ps(n, CONST(LN2_HI), x));
    __m512 p = CONST(1.9875691500e-4f);
    EXP_POLY(p, r, _mm512_fmadd_ps)
    p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, CONST(1.0f)));
    return _mm512_maskz_mov_ps((__mmask16)~zero, _mm512_scalef_ps(p, n));
}

static inline __mmask16 tail_mask(int64_t left) {
    return left >= 16 ? (__mmask16)0xFFFF : left <= 0 ? (__mmask16)0 : (__mmask16)((1u << left) - 1);
}

/* 16 labels as int32 lanes, from an index of `bytes` bytes per label. */
static inline __m512i labels16(const char *label, int64_t bytes, __mmask16 m) {
    switch (bytes) {
        case 1: return _mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, label));
        case 2: return _mm512_cvtepi16_epi32(_mm256_maskz_loadu_epi16(m, label));
        default: return _mm512_maskz_loadu_epi32(m, label);
    }
}

/* The table of one row held in four registers (labels < 64): a lookup is two two-register
 * permutes and a blend, several times faster than a gather. */
typedef struct {
    __m512 t0, t1, t2, t3;
} Table64;

static inline Table64 table64(const float *t, int64_t width) {
    Table64 r;
    r.t0 = _mm512_maskz_loadu_ps(tail_mask(width), t);
    r.t1 = _mm512_maskz_loadu_ps(tail_mask(width - 16), t + 16);
    r.t2 = _mm512_maskz_loadu_ps(tail_mask(width - 32), t + 32);
    r.t3 = _mm512_maskz_loadu_ps(tail_mask(width - 48), t + 48);
    return r;
}

static inline __m512 lookup64(const Table64 *t, __m512i at) {
    const __m512 low = _mm512_permutex2var_ps(t->t0, at, t->t1), high = _mm512_permutex2var_ps(t->t2, at, t->t3);
    return _mm512_mask_blend_ps(_mm512_test_epi32_mask(at, _mm512_set1_epi32(32)), low, high);
}

/* s[c] += t[label[c]] for a table of `width` columns; returns the row's max. Labels outside
 * the table (negative ones too, compared unsigned) are not read and set *bad. */
static float add_labels(float *s, const void *label, int64_t bytes, const float *t, int64_t width, int64_t k,
                        int *bad) {
    __m512 mx = CONST(-__builtin_inff());
    const __m512i limit = _mm512_set1_epi32((int)width);
    __mmask16 outside = 0;
    const int small = width <= 64;
    const Table64 table = small ? table64(t, width) : (Table64){0};
    for (int64_t c = 0; c < k; c += 16) {
        const __mmask16 m = tail_mask(k - c);
        const __m512i at = labels16((const char *)label + c * bytes, bytes, m);
        const __mmask16 out = _mm512_mask_cmpge_epu32_mask(m, at, limit);
        outside |= out;
        const __m512 term = small ? lookup64(&table, at) : _mm512_mask_i32gather_ps(CONST(0.0f), m & ~out, at, t, 4);
        const __m512 v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, s + c), term);
        _mm512_mask_storeu_ps(s + c, m, v);
        mx = _mm512_mask_max_ps(mx, m, mx, v);
    }
    *bad |= outside != 0;
    return _mm512_reduce_max_ps(mx);
}

/* s[c] += t[label] over each run [start, next start or k); returns the max. Runs with a label
 * outside the table or columns outside [0, k) are skipped and set *bad. */
static float add_runs(float *s, int64_t k, const int32_t *start, const int32_t *label, int64_t runs, const float *t,
                      int64_t width, int *bad) {
    __m512 mx = CONST(-__builtin_inff());
    for (int64_t j = 0; j < runs; ++j) {
        const int64_t lo = start[j], hi = j + 1 < runs ? start[j + 1] : k;
        if ((uint32_t)label[j] >= (uint64_t)width || lo < 0 || hi > k || lo > hi) {
            *bad = 1;
            continue;
        }
        const __m512 term = CONST(t[label[j]]);
        for (int64_t c = lo; c < hi; c += 16) {
            const __mmask16 m = tail_mask(hi - c);
            const __m512 v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, s + c), term);
            _mm512_mask_storeu_ps(s + c, m, v);
            mx = _mm512_mask_max_ps(mx, m, mx, v);
        }
    }
    return _mm512_reduce_max_ps(mx);
}

/* s[c] = e^(s[c] - mx); returns their sum. */
static float exp_row(float *s, float mx, int64_t k) {
    __m512 sum = CONST(0.0f);
    for (int64_t c = 0; c < k; c += 16) {
        const __mmask16 m = tail_mask(k - c);
        const __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, s + c), CONST(mx)));
        _mm512_mask_storeu_ps(s + c, m, e);
        sum = _mm512_mask_add_ps(sum, m, sum, e);
    }
    return _mm512_reduce_add_ps(sum);
}
#undef CONST
#else
#define CONST(x) (x)
#define MUL_ADD_SCALAR(a, b, c) ((a) * (b) + (c))

static inline float exp1(float x) {
    if (x < EXP_LOW) return 0.0f;
    const float n = __builtin_floorf(x * LOG2E + 0.5f);
    const float r = x - n * LN2_HI - n * LN2_LO;
    float p = 1.9875691500e-4f;
    EXP_POLY(p, r, MUL_ADD_SCALAR)
    return __builtin_ldexpf(p * r * r + r + 1.0f, (int)n);
}

static float add_labels(float *s, const void *label, int64_t bytes, const float *t, int64_t width, int64_t k,
                        int *bad) {
    float mx = -__builtin_inff();
    for (int64_t c = 0; c < k; ++c) {
        const uint64_t at = (uint64_t)label_at(label, bytes, c);
        if (at >= (uint64_t)width) {
            *bad = 1;
            continue;
        }
        s[c] += t[at];
        mx = s[c] > mx ? s[c] : mx;
    }
    return mx;
}

static float add_runs(float *s, int64_t k, const int32_t *start, const int32_t *label, int64_t runs, const float *t,
                      int64_t width, int *bad) {
    float mx = -__builtin_inff();
    for (int64_t j = 0; j < runs; ++j) {
        const int64_t lo = start[j], hi = j + 1 < runs ? start[j + 1] : k;
        if ((uint32_t)label[j] >= (uint64_t)width || lo < 0 || hi > k || lo > hi) {
            *bad = 1;
            continue;
        }
        for (int64_t c = lo; c < hi; ++c) {
            s[c] += t[label[j]];
            mx = s[c] > mx ? s[c] : mx;
        }
    }
    return mx;
}

static float exp_row(float *s, float mx, int64_t k) {
    float sum = 0.0f;
    for (int64_t c = 0; c < k; ++c) sum += (s[c] = exp1(s[c] - mx));
    return sum;
}
#undef CONST
#endif

/* dt[label[c]] += ds[c], through LANES private copies of the row's table when it is narrow:
 * column c adds to copy c % LANES, so neighbouring columns with one label (most of an l2g row)
 * add to different addresses instead of waiting on each other; the copies are summed at the end.
 * One loop per index type keeps the inner loop free of branches. */
#define LANES 8
#define SCATTER_LABELS(TYPE)                                                                                  \
    static void scatter_##TYPE(float *restrict dt, float *restrict lanes, const TYPE *restrict label,         \
                               const float *restrict ds, int64_t k, int64_t width) {                         \
        if (!lanes) {                                                                                         \
            for (int64_t c = 0; c < k; ++c) dt[label[c]] += ds[c];                                            \
            return;                                                                                           \
        }                                                                                                     \
        int64_t c = 0;                                                                                        \
        for (; c + LANES <= k; c += LANES)                                                                    \
            for (int64_t j = 0; j < LANES; ++j) lanes[j * width + label[c + j]] += ds[c + j];                \
        for (; c < k; ++c) lanes[label[c]] += ds[c];                                                          \
    }
SCATTER_LABELS(int8_t)
SCATTER_LABELS(int16_t)
SCATTER_LABELS(int32_t)

/* Tables wider than this take the plain scatter (zeroing the copies would cost more). */
#define MAX_LANED_WIDTH 512

/* `lanes`: LANES * width floats of scratch, or NULL for the plain scatter. */
static void scatter_labels(float *dt, const void *label, int64_t bytes, const float *ds, int64_t k, int64_t width,
                           float *lanes) {
    if (width > MAX_LANED_WIDTH) lanes = NULL;
    if (lanes) memset(lanes, 0, sizeof(float) * width * LANES);
    switch (bytes) {
        case 1: scatter_int8_t(dt, lanes, (const int8_t *)label, ds, k, width); break;
        case 2: scatter_int16_t(dt, lanes, (const int16_t *)label, ds, k, width); break;
        default: scatter_int32_t(dt, lanes, (const int32_t *)label, ds, k, width);
    }
    if (lanes)
        for (int64_t j = 0; j < LANES; ++j)
            for (int64_t v = 0; v < width; ++v) dt[v] += lanes[j * width + v];
}

/* dt[label] += the sum of ds over each run (add_runs checked the runs). */
static void scatter_runs(float *dt, const float *ds, int64_t k, const int32_t *start, const int32_t *label,
                         int64_t runs) {
    for (int64_t j = 0; j < runs; ++j) {
        const int64_t lo = start[j], hi = j + 1 < runs ? start[j + 1] : k;
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int64_t c = lo; c < hi; ++c) sum += ds[c];
        dt[label[j]] += sum;
    }
}

/* One row's labels: its dense part (A, then the sink) and its runs over B. */
typedef struct {
    const char *dense;
    const int32_t *start, *label;
    int64_t runs;
} RowLabels;

static RowLabels row_labels(const Chunk *ch, int64_t b, int64_t row) {
    RowLabels l;
    const int64_t at = b * ch->rows + row;
    l.dense = (const char *)ch->dense + (b * ch->dense_batch + row * (ch->na + 1)) * ch->dense_bytes;
    l.start = ch->run_start + ch->run_ptr[at];
    l.label = ch->run_label + ch->run_ptr[at];
    l.runs = ch->run_ptr[at + 1] - ch->run_ptr[at];
    return l;
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

/* The scores of block rows i..i+m-1 of head bh into s [m, K], labels added and softmax taken:
 * s holds probabilities afterwards (normalized: the backward needs them so; the forward keeps
 * them unnormalized and scales its d outputs instead, so `inv` gets 1/sum per row). Returns 1
 * when a label lies outside the table (nothing outside it was read), else 0. */
static int probabilities(const Chunk *ch, int64_t bh, int64_t i, int64_t m, const Window *win, float *s, float *inv,
                         int normalize) {
    const int64_t d = ch->dim, na = ch->na, nb = ch->nb, width = na + nb + 1;
    const float *q = ch->q + bh * ch->q_bh + i * d;
    int bad = 0;
    for (int64_t r = 0; r < m; ++r) {
        float *row = s + r * width;
        if (win->lo > 0) memset(row, 0, win->lo * sizeof(float));
        if (win->hi < na) memset(row + win->hi, 0, (na - win->hi) * sizeof(float));
        row[width - 1] = 0.0f;
    }
    gemm(0, 1, m, win->hi - win->lo, d, ch->scale, q, d, ch->ka + bh * ch->a_bh + (win->start + win->lo) * d, d, 0.0f,
         s + win->lo, width);
    gemm(0, 1, m, nb, d, ch->scale, q, d, ch->kb + bh * ch->b_bh, d, 0.0f, s + na, width);
    const int64_t b = bh / ch->heads, tw = ch->table_width;
    for (int64_t r = 0; r < m; ++r) {
        float *row = s + r * width;
        const float *t = ch->table + bh * ch->table_bh + (i + r) * tw;
        const RowLabels l = row_labels(ch, b, i + r);
        float mx = add_labels(row, l.dense, ch->dense_bytes, t, tw, na, &bad);
        const float mb = add_runs(row + na, nb, l.start, l.label, l.runs, t, tw, &bad);
        const uint64_t sink = (uint64_t)label_at(l.dense, ch->dense_bytes, na);
        if (sink >= (uint64_t)tw) {
            bad = 1;
            continue;
        }
        row[width - 1] += t[sink];
        mx = mb > mx ? mb : mx;
        mx = row[width - 1] > mx ? row[width - 1] : mx;
        const float sum = exp_row(row, mx, width); /* the sink keeps every row finite */
        inv[r] = 1.0f / sum;
        if (normalize)
            for (int64_t c = 0; c < width; ++c) row[c] *= inv[r];
    }
    return bad;
}

static int64_t block_rows(const Chunk *ch, int64_t i) {
    const int64_t left = ch->valid_rows - i;
    return left < ch->block ? left : ch->block;
}

/* Both passes return 0, 1 when scratch memory could not be allocated, or 2 when a label lies
 * outside its row's table (the caller's ids are wrong; nothing outside the table was touched). */
int graphattn_forward(const Chunk *ch, int64_t bh_count) {
    const int64_t d = ch->dim, na = ch->na, nb = ch->nb, width = na + nb + 1;
    float *s = malloc(sizeof(float) * (ch->block * width + ch->block));
    if (!s) return 1;
    float *inv = s + ch->block * width;
    for (int64_t bh = 0; bh < bh_count; ++bh) {
        for (int64_t i = 0; i < ch->valid_rows; i += ch->block) {
            const int64_t m = block_rows(ch, i);
            const Window win = window_of(ch, i);
            if (probabilities(ch, bh, i, m, &win, s, inv, 0)) {
                free(s);
                return 2;
            }
            float *out = ch->out + bh * ch->out_bh + i * d;
            gemm(0, 0, m, d, win.hi - win.lo, 1.0f, s + win.lo, width,
                 ch->va + bh * ch->a_bh + (win.start + win.lo) * d, d, 0.0f, out, d);
            if (win.hi <= win.lo) memset(out, 0, m * d * sizeof(float)); /* no A keys: beta 0 above was skipped */
            gemm(0, 0, m, d, nb, 1.0f, s + na, width, ch->vb + bh * ch->b_bh, d, 1.0f, out, d);
            for (int64_t r = 0; r < m; ++r)
                for (int64_t c = 0; c < d; ++c) out[r * d + c] *= inv[r];
        }
    }
    free(s);
    return 0;
}

int graphattn_backward(const Chunk *ch, int64_t bh_count) {
    const int64_t d = ch->dim, na = ch->na, nb = ch->nb, width = na + nb + 1;
    float *s = malloc(sizeof(float) * (2 * ch->block * width + ch->block + LANES * MAX_LANED_WIDTH));
    if (!s) return 1;
    float *ds = s + ch->block * width, *inv = ds + ch->block * width, *lanes = inv + ch->block;
    for (int64_t bh = 0; bh < bh_count; ++bh) {
        for (int64_t i = 0; i < ch->valid_rows; i += ch->block) {
            const int64_t m = block_rows(ch, i);
            const Window win = window_of(ch, i);
            const int64_t a_off = bh * ch->a_bh + (win.start + win.lo) * d, b_off = bh * ch->b_bh;
            const int64_t n_a = win.hi - win.lo;
            const float *q = ch->q + bh * ch->q_bh + i * d, *g = ch->d_out + bh * ch->d_out_bh + i * d;
            if (probabilities(ch, bh, i, m, &win, s, inv, 1)) {
                free(s);
                return 2;
            }
            /* dP = dO V^T; columns with no value (outside the window, the sink) stay 0 */
            memset(ds, 0, m * width * sizeof(float));
            gemm(0, 1, m, n_a, d, 1.0f, g, d, ch->va + a_off, d, 0.0f, ds + win.lo, width);
            gemm(0, 1, m, nb, d, 1.0f, g, d, ch->vb + b_off, d, 0.0f, ds + na, width);
            /* dV += P^T dO */
            gemm(1, 0, n_a, d, m, 1.0f, s + win.lo, width, g, d, 1.0f, ch->d_va + a_off, d);
            gemm(1, 0, nb, d, m, 1.0f, s + na, width, g, d, 1.0f, ch->d_vb + b_off, d);
            /* dS = P (dP - rowsum(P dP)); its label terms go back to the table */
            const int64_t b = bh / ch->heads, tw = ch->table_width;
            for (int64_t r = 0; r < m; ++r) {
                const float *p = s + r * width;
                float *dp = ds + r * width, dot = 0.0f;
#pragma omp simd reduction(+ : dot)
                for (int64_t c = 0; c < width; ++c) dot += p[c] * dp[c];
                for (int64_t c = 0; c < width; ++c) dp[c] = p[c] * (dp[c] - dot);
                float *dt = ch->d_table + bh * ch->table_bh + (i + r) * tw;
                const RowLabels l = row_labels(ch, b, i + r);
                scatter_labels(dt, l.dense, ch->dense_bytes, dp, na, tw, lanes);
                scatter_runs(dt, dp + na, nb, l.start, l.label, l.runs);
                dt[label_at(l.dense, ch->dense_bytes, na)] += dp[width - 1];
            }
            /* dQ = scale dS K, dK += scale dS^T Q */
            float *d_q = ch->out + bh * ch->out_bh + i * d;
            if (n_a > 0)
                gemm(0, 0, m, d, n_a, ch->scale, ds + win.lo, width, ch->ka + a_off, d, 0.0f, d_q, d);
            else
                memset(d_q, 0, m * d * sizeof(float));
            gemm(0, 0, m, d, nb, ch->scale, ds + na, width, ch->kb + b_off, d, 1.0f, d_q, d);
            gemm(1, 0, n_a, d, m, ch->scale, ds + win.lo, width, q, d, 1.0f, ch->d_ka + a_off, d);
            gemm(1, 0, nb, d, m, ch->scale, ds + na, width, q, d, 1.0f, ch->d_kb + b_off, d);
        }
    }
    free(s);
    return 0;
}

/* 0 when sgemm_ takes 32-bit integers and computes what this file expects (an ILP64 BLAS, or
 * another argument order, gives another answer): fused_cpu.py checks it once at load. */
int graphattn_self_check(void) {
    const float a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {1, 0, -1, 2, 1, 0}; /* A [2, 3], B [3, 2] row-major */
    float c[4] = {0, 0, 0, 0};
    gemm(0, 0, 2, 2, 3, 1.0f, a, 3, b, 2, 0.0f, c, 2);
    const float expected[4] = {1 * 1 + 2 * -1 + 3 * 1, 1 * 0 + 2 * 2 + 3 * 0, 4 * 1 + 5 * -1 + 6 * 1, 4 * 0 + 5 * 2 + 6 * 0};
    for (int i = 0; i < 4; ++i)
        if (c[i] != expected[i]) return 1;
    return 0;
}
