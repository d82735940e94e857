/* The blocked backend's fused CPU kernel, one chunk of query rows at a time, forward or backward,
 * fp32 (included by fused.cpp; see there for the operators).
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
 * is read in pieces with an online softmax (first_piece). Matmuls are ATen's (gemm below).
 */
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/ops/addmm_cpu_dispatch.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <atomic>

namespace graphattn_cpu {

/* A process forked from the one that loaded this library (a DataLoader worker, a pre-fork
 * server): the parent's OpenMP threads do not exist there, and a parallel region, PyTorch's or
 * its BLAS's, waits for them forever (PyTorch's own multi-threaded ops hang there too). Told by
 * the process id, not by a fork hook. */
static const pid_t LOADED_BY = getpid();

static inline bool forked_child() { return getpid() != LOADED_BY; }

/* Whether this process's passes take plain products: set by each operator call (the same value
 * in every call of a process), read by gemm without a system call. */
static std::atomic<bool> plain_products{false};

/* The plain product, for a forked child: it opens no thread team (see gemm). */
static void plain_gemm(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                       int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
    for (int64_t i = 0; i < m; ++i) {
        float *row = c + i * ldc;
        for (int64_t j = 0; j < n; ++j) row[j] = beta == 0.0f ? 0.0f : beta * row[j];
        if (!trans_b) {
            for (int64_t p = 0; p < k; ++p) {
                const float av = alpha * (trans_a ? a[p * lda + i] : a[i * lda + p]);
                const float *bp = b + p * ldb;
#pragma omp simd
                for (int64_t j = 0; j < n; ++j) row[j] += av * bp[j];
            }
        } else {
            for (int64_t j = 0; j < n; ++j) {
                float sum = 0.0f;
                const float *bj = b + j * ldb;
                if (!trans_a) {
                    const float *ai = a + i * lda;
#pragma omp simd reduction(+ : sum)
                    for (int64_t p = 0; p < k; ++p) sum += ai[p] * bj[p];
                } else {
                    for (int64_t p = 0; p < k; ++p) sum += a[p * lda + i] * bj[p];
                }
                row[j] += alpha * sum;
            }
        }
    }
}

/* Row-major C[m, n] = alpha * op(A) op(B) + beta * C, with leading dimensions (row strides):
 * ATen's CPU addmm (its BLAS: MKL, OpenBLAS or its own) on views of the operands, called
 * directly (no dispatcher, no autograd). Inside a parallel region its BLAS runs on the calling
 * thread; outside one, on PyTorch's intra-op threads. In a forked child the plain product: the
 * BLAS would open a team of the parent's threads there (MKL's does on 40-row blocks). */
static void gemm(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                 const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
    if (m <= 0 || n <= 0) return;
    if (k <= 0 || plain_products.load(std::memory_order_relaxed))
        return plain_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    const auto f32 = at::TensorOptions().dtype(at::kFloat);
    float *pa = const_cast<float *>(a), *pb = const_cast<float *>(b);
    const at::Tensor ta = trans_a ? at::from_blob(pa, {m, k}, {1, lda}, f32) : at::from_blob(pa, {m, k}, {lda, 1}, f32);
    const at::Tensor tb = trans_b ? at::from_blob(pb, {k, n}, {1, ldb}, f32) : at::from_blob(pb, {k, n}, {ldb, 1}, f32);
    at::Tensor tc = at::from_blob(c, {m, n}, {ldc, 1}, f32); /* views made in inference mode (see fused.cpp) */
    at::cpu::addmm_out(tc, tc, ta, tb, beta, alpha); /* beta 0: C is not read */
}

/* What one call needs; pointers already point at the chunk's first row (query side) or at key
 * row 0 (key sides), the head stride given separately. Filled by fused.cpp from the operators' tensors. */
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
    const Table64 table = small ? table64(t, width) : Table64{};
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
    static void scatter_##TYPE(float *__restrict__ dt, float *__restrict__ lanes, const TYPE *__restrict__ label,         \
                               const float *__restrict__ ds, int64_t k, int64_t width) {                         \
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

}  // namespace graphattn_cpu
