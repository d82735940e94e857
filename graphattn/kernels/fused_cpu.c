/* Fused CPU kernel of the blocked backend: one chunk of query rows, forward or backward, fp32.
 *
 * Same tiles as the eager path (blocked_tiles.py), fused per block of rows: the score block
 * [m, K] stays in this thread's cache while the label terms are added, the softmax is taken and
 * the matmuls read it back. K = na + nb + 1 columns: key set A (the band window of a long block,
 * or every global key), key set B (the chunk's global or long keys), and the sink column (score 0
 * plus its label term: 0 for a row with no allowed key, -inf elsewhere). A's window may reach
 * past its keys (the band at the sequence's ends): those columns get score 0 and the labels mark
 * them masked. Labels come in three forms: one per column for A (`dense`), one per row for the
 * sink, and runs of equal labels for B, whose rows (a long token against every global, a global
 * against every long token) mostly hold a label or two: a run adds one table value to a stretch
 * of scores, and its gradient is the stretch's sum. A label selects a column of the row's label
 * table, which each block computes from the relative key table and bias (label_table). Key set B
 * is read in pieces with an online softmax (first_piece). Matmuls are the BLAS sgemm that PyTorch
 * links (column-major, so a row-major [m, n] tile is an [n, m] column-major one). A pass runs
 * all its chunks in one call (graphattn_forward_all, graphattn_backward_all) on PyTorch's own
 * OpenMP threads.
 *
 * Built at first use by fused_cpu.py with the machine's C compiler; nothing here is Python.
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

extern void sgemm_(const char *ta, const char *tb, const int *m, const int *n, const int *k, const float *alpha,
                   const float *a, const int *lda, const float *b, const int *ldb, const float *beta, float *c,
                   const int *ldc);

/* MKL's threads for this thread's calls: its C name (the lowercase symbol is the Fortran one,
 * which takes a pointer); weak, so another BLAS, which lacks it, is left as it is. A
 * forked child has none of its parent's OpenMP threads, and an MKL sgemm that opens a team there
 * waits for them forever: MKL's AMD path did so on 40-row blocks. A pass on the calling thread
 * makes the BLAS sequential for its calls when told it runs in such a child; elsewhere MKL keeps
 * PyTorch's threads there (a pass of one chunk ran 1.7x faster with them). */
extern int MKL_Set_Num_Threads_Local(int) __attribute__((weak));

static int sequential_blas_begin(int64_t sequential) {
    return sequential && MKL_Set_Num_Threads_Local ? MKL_Set_Num_Threads_Local(1) : -1;
}

static void sequential_blas_end(int saved) {
    if (saved >= 0) MKL_Set_Num_Threads_Local(saved); /* 0: back to the global setting */
}

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
    int64_t a_parts; /* a band's blocks take A in this many sub-blocks of rows (see Part); 1 otherwise */
    const float *kb, *vb; /* key set B [BH, >= nb, dim], already at its first key */
    int64_t b_bh, nb;
    const void *dense; /* [B, rows, na] labels (columns of the table) of A, int8/16/32, rows contiguous */
    int64_t dense_bytes, dense_batch;
    const void *sink; /* [B, rows] the sink's label, typed as dense: V (score -inf) or V + 1 (0, a row with no key) */
    const int64_t *run_ptr; /* [B * rows + 1]: row (b, r)'s runs over B are run_ptr[b*rows + r] ..< the next */
    const int32_t *run_start, *run_label; /* per run: its first column of B (the first run starts at 0) and label */
    const float *rel_key;  /* [V, heads, dim]: label v's key vector for head h at (v * heads + h) * dim */
    const float *rel_bias; /* [V, heads] or NULL */
    int64_t vocab;         /* V: a row's label table has V + 2 columns, V being -inf (masked) and V + 1 zero */
    float *out; /* forward: [BH, *, dim]; backward: d_q */
    int64_t out_bh;
    int64_t key_block; /* B's keys per piece (>= 1) */
    float *stats;      /* [BH, *, 2] each query row's max score and the log of its softmax sum:
                          written forward (if not NULL), read backward */
    int64_t stats_bh;
    /* backward only */
    const float *d_out; /* [BH, *, dim] */
    int64_t d_out_bh;
    const float *o; /* the forward's output, laid out as out */
    int64_t o_bh;
    float *d_ka, *d_va, *d_kb, *d_vb; /* accumulators laid out as ka/va/kb/vb */
    float *d_rel_key, *d_rel_bias;     /* accumulators laid out as rel_key and rel_bias (NULL: no bias) */
} Chunk;

static inline int64_t table_width(const Chunk *ch) {
    return ch->vocab + 2;
}

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

/* s[c] += term over c < n; returns the new values' max. */
static float add_const(float *s, int64_t n, float term) {
    __m512 mx = CONST(-__builtin_inff());
    const __m512 add = CONST(term);
    for (int64_t c = 0; c < n; c += 16) {
        const __mmask16 m = tail_mask(n - c);
        const __m512 v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, s + c), add);
        _mm512_mask_storeu_ps(s + c, m, v);
        mx = _mm512_mask_max_ps(mx, m, mx, v);
    }
    return _mm512_reduce_max_ps(mx);
}

/* s[c] = e^((s[c] - mx) - log_sum); returns their sum. Two subtractions: next to a max of
 * -1e34, mx + log_sum would round log_sum away. */
static float exp_row(float *s, float mx, float log_sum, int64_t k) {
    __m512 sum = CONST(0.0f);
    for (int64_t c = 0; c < k; c += 16) {
        const __mmask16 m = tail_mask(k - c);
        const __m512 x = _mm512_sub_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, s + c), CONST(mx)), CONST(log_sum));
        const __m512 e = exp16(x);
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

static float add_const(float *s, int64_t n, float term) {
    float mx = -__builtin_inff();
    for (int64_t c = 0; c < n; ++c) {
        s[c] += term;
        mx = s[c] > mx ? s[c] : mx;
    }
    return mx;
}

static float exp_row(float *s, float mx, float log_sum, int64_t k) {
    float sum = 0.0f;
    for (int64_t c = 0; c < k; ++c) sum += (s[c] = exp1((s[c] - mx) - log_sum));
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
    w->s = malloc(sizeof(float) * floats);
    w->labels = malloc(sizeof(RowLabels) * m);
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

/* Worker w's part of the backward: zero its accumulators, then run its chunks in order, stopping
 * at the first that fails; returns that one's code, its number in *failed. */
static int run_worker(const Chunk *chunks, const int64_t *task_ptr, const int64_t *tasks, int64_t w, int64_t bh_count,
                      float *const *acc, const int64_t *acc_len, int64_t n_acc, int64_t *failed) {
    for (int64_t j = 0; j < n_acc; ++j)
        if (acc[w * n_acc + j]) memset(acc[w * n_acc + j], 0, acc_len[j] * sizeof(float));
    for (int64_t i = task_ptr[w]; i < task_ptr[w + 1]; ++i) {
        const int code = backward_chunk(chunks + tasks[i], bh_count);
        if (code) return *failed = tasks[i], code;
    }
    return 0;
}

/* Share `part` of `parts` of every accumulator: the other workers' added into worker 0's, in
 * worker order. */
static void sum_share(float *const *acc, const int64_t *acc_len, int64_t n_acc, int64_t workers, int64_t part,
                      int64_t parts) {
    for (int64_t j = 0; j < n_acc; ++j) {
        float *into = acc[j];
        if (!into) continue;
        const int64_t share = (acc_len[j] + parts - 1) / parts, lo = part * share;
        const int64_t hi = lo + share < acc_len[j] ? lo + share : acc_len[j];
        for (int64_t w = 1; w < workers; ++w) {
            const float *from = acc[w * n_acc + j];
#pragma omp simd
            for (int64_t e = lo; e < hi; ++e) into[e] += from[e];
        }
    }
}

/* The forward of every chunk, the costliest first, on OpenMP threads (see graphattn_backward_all).
 * No chunk writes another's rows, so the threads take chunks as they come and any schedule gives
 * the same bits: a thread slowed by other work on its core simply takes fewer. With one thread
 * asked no region is opened (see graphattn_backward_all).
 * Returns 0, or the code of the lowest-numbered failing chunk, whose number goes to *failed. */
int graphattn_forward_all(const Chunk *chunks, const int64_t *order, int64_t n, int64_t threads_asked,
                          int64_t bh_count, int64_t *failed, int64_t sequential_blas) {
    int code = 0;
    *failed = -1;
    if (threads_asked <= 1) {
        const int saved = sequential_blas_begin(sequential_blas);
        for (int64_t i = 0; i < n; ++i) {
            const int got = forward_chunk(chunks + order[i], bh_count);
            if (got && (!code || order[i] < *failed)) code = got, *failed = order[i];
        }
        sequential_blas_end(saved);
        return code;
    }
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads_asked)
    for (int64_t i = 0; i < n; ++i) {
        const int got = forward_chunk(chunks + order[i], bh_count);
        if (got) {
#pragma omp critical(graphattn_forward_failed)
            if (!code || order[i] < *failed) code = got, *failed = order[i];
        }
    }
    return code;
}

/* The backward of every chunk: worker w runs chunks tasks[task_ptr[w] ..< task_ptr[w + 1]] in
 * that order, accumulating the key sides' gradients into its own buffers acc[w * n_acc + j]
 * (acc_len[j] floats each; NULL for none), which it zeroes first; at the end they are summed
 * into worker 0's in worker order, so the deal is fixed and gradients repeat bit for bit.
 * `threads` (at most workers) are asked for; a runtime that gives fewer has each thread run
 * several workers' lists, so the result does not depend on the threads. With one thread asked
 * no region is opened at all: BLAS may then use PyTorch's threads itself (inside an inactive
 * region it would start a nested team on every call). The workers are OpenMP threads, the same
 * runtime and pool as PyTorch's intra-op threads: after PyTorch's own ops they are still awake,
 * where threads of our own had to wait for a core those spun on; and inside the region BLAS runs
 * single-threaded. Returns 0, or the code of the lowest-numbered chunk among each worker's first
 * failure (the same chunk whatever the threads), whose number goes to *failed. */
int graphattn_backward_all(const Chunk *chunks, const int64_t *task_ptr, const int64_t *tasks, int64_t workers,
                           int64_t threads_asked, int64_t bh_count, float *const *acc, const int64_t *acc_len,
                           int64_t n_acc, int64_t *failed, int64_t sequential_blas) {
    int code = 0;
    *failed = -1;
    if (threads_asked <= 1) {
        const int saved = sequential_blas_begin(sequential_blas);
        for (int64_t w = 0; w < workers; ++w) {
            int64_t at = -1;
            const int got = run_worker(chunks, task_ptr, tasks, w, bh_count, acc, acc_len, n_acc, &at);
            if (got && (!code || at < *failed)) code = got, *failed = at;
        }
        sequential_blas_end(saved);
        sum_share(acc, acc_len, n_acc, workers, 0, 1);
        return code;
    }
#pragma omp parallel num_threads(threads_asked)
    {
        const int64_t t = omp_get_thread_num(), threads = omp_get_num_threads();
        for (int64_t w = t; w < workers; w += threads) {
            int64_t at = -1;
            const int got = run_worker(chunks, task_ptr, tasks, w, bh_count, acc, acc_len, n_acc, &at);
#pragma omp critical(graphattn_backward_failed)
            if (got && (!code || at < *failed)) code = got, *failed = at;
        }
#pragma omp barrier
        sum_share(acc, acc_len, n_acc, workers, t, threads);
    }
    return code;
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
