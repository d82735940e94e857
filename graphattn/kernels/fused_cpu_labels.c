/* The fused CPU kernel's label helpers: one pass of C where torch took a dozen ops per chunk,
 * each with a temporary of the block's size. From dense side inputs (blocked_sources.DenseSource)
 * a pair's label is its id where the mask is nonzero, else `vocab` (masked); from the compact
 * structure the l2g and g2l labels arrive as runs over whole rows (structure_runs), which each
 * chunk takes its rows and keys of. The plan's helpers (band, extents) run on the calling thread;
 * every chunk's labels are made in one call (graphattn_chunk_labels) on the kernel's OpenMP
 * threads. Built into the same library as fused_cpu.c.
 */
#include <stdint.h>
#include <string.h>
#ifdef __AVX512F__
#include <immintrin.h>
#endif

static inline int32_t label_of(const int32_t *mask, const int32_t *ids, int64_t c, int32_t vocab) {
    return mask[c] ? ids[c] : vocab;
}

static inline void store_label(void *out, int64_t bytes, int64_t at, int32_t label) {
    if (bytes == 1)
        ((int8_t *)out)[at] = (int8_t)label;
    else if (bytes == 2)
        ((int16_t *)out)[at] = (int16_t)label;
    else
        ((int32_t *)out)[at] = label;
}

/* The runs of equal labels along one row of m columns: the first `room` get their first column
 * and label written to start / label; returns how many there are, *some whether one of them is
 * not masked. */
static int64_t row_runs(const int32_t *mr, const int32_t *ir, int64_t m, int32_t vocab, int32_t *start,
                        int32_t *label, int64_t room, int *some) {
    int64_t runs = 0;
    *some = 0;
#define EMIT(COLUMN)                                                  \
    do {                                                              \
        const int32_t now_ = label_of(mr, ir, (COLUMN), vocab);       \
        if (runs < room) start[runs] = (int32_t)(COLUMN), label[runs] = now_; \
        ++runs, *some |= now_ != vocab;                               \
    } while (0)
    if (m > 0) EMIT(0);
    int64_t c = 1;
#ifdef __AVX512F__
    const __m512i masked = _mm512_set1_epi32(vocab);
    for (; c + 16 <= m; c += 16) { /* columns c .. c + 15 against their left neighbours */
        const __m512i mk = _mm512_loadu_si512(mr + c), before_mk = _mm512_loadu_si512(mr + c - 1);
        const __m512i now = _mm512_mask_loadu_epi32(masked, _mm512_test_epi32_mask(mk, mk), ir + c);
        const __m512i before =
            _mm512_mask_loadu_epi32(masked, _mm512_test_epi32_mask(before_mk, before_mk), ir + c - 1);
        for (__mmask16 change = _mm512_cmpneq_epi32_mask(now, before); change; change &= change - 1)
            EMIT(c + __builtin_ctz(change));
    }
#endif
    for (; c < m; ++c)
        if (label_of(mr, ir, c, vocab) != label_of(mr, ir, c - 1, vocab)) EMIT(c);
#undef EMIT
    return runs;
}

/* One chunk's labels as the kernel reads them (fused_cpu.Labels). Mirrored by
 * fused_cpu_labels.ChunkLabels. */
typedef struct {
    const int32_t *b_mask, *b_ids; /* key set B: row r of batch b at b * b_batch + r * b_row, m columns */
    int64_t b_batch, b_row, m;
    /* or, without b_mask, B's runs over whole rows (CSR over batch * whole_rows rows, whole_keys
     * keys each), of which the chunk takes rows row0 .. and keys key0 .. key0 + m */
    const int64_t *whole_ptr;
    const int32_t *whole_start, *whole_label;
    int64_t whole_rows, whole_keys, row0, key0;
    const int32_t *a_mask, *a_ids; /* without a_empty: key set A's rows, their labels to a_out [batch, rows, na] */
    int64_t a_batch, a_row, na;
    void *a_out;
    const uint8_t *a_empty; /* or the rows with no allowed A key (A's labels made), row r of batch b at */
    int64_t a_empty_batch;  /* b * a_empty_batch + r (the band's) */
    int64_t batch, rows, valid_rows; /* rows from valid_rows on exist for the kernel's blocks only */
    int64_t *run_ptr;                /* [batch * rows + 1] */
    int32_t *start, *label;          /* [run_ptr[batch * rows]], written by the second pass */
    void *sink;                      /* [batch, rows] */
} ChunkLabels;

/* Row r of batch b's runs over the chunk's keys, taken from the whole row's: the runs that reach
 * into [key0, key0 + m), the first starting at 0. */
static int64_t runs_within(const ChunkLabels *c, int64_t b, int64_t r, int32_t vocab, int32_t *start, int32_t *label,
                           int64_t room, int *some) {
    const int64_t row = b * c->whole_rows + c->row0 + r, lo = c->key0, hi = c->key0 + c->m;
    const int64_t first = c->whole_ptr[row], last = c->whole_ptr[row + 1];
    int64_t runs = 0;
    *some = 0;
    for (int64_t j = first; j < last && c->m > 0; ++j) {
        const int64_t from = c->whole_start[j], to = j + 1 < last ? c->whole_start[j + 1] : c->whole_keys;
        if (to <= lo || from >= hi) continue;
        if (runs < room) start[runs] = (int32_t)((from > lo ? from : lo) - lo), label[runs] = c->whole_label[j];
        ++runs, *some |= c->whole_label[j] != vocab;
    }
    return runs;
}

/* Row r of batch b's runs over key set B, from the dense block or the whole rows' runs. */
static int64_t b_runs(const ChunkLabels *c, int64_t b, int64_t r, int32_t vocab, int32_t *start, int32_t *label,
                      int64_t room, int *some) {
    if (c->m <= 0) return *some = 0, 0; /* no keys (an empty tensor may have no address) */
    if (!c->b_mask) return runs_within(c, b, r, vocab, start, label, room, some);
    const int64_t at = b * c->b_batch + r * c->b_row;
    return row_runs(c->b_mask + at, c->b_ids + at, c->m, vocab, start, label, room, some);
}

/* First pass (fill 0): A's labels, each row's sink label (vocab, or vocab + 1 for a row with no
 * allowed key) and the run counts as run_ptr; second pass (fill 1): the runs themselves. */
static void chunk_labels(const ChunkLabels *c, int32_t vocab, int64_t bytes, int fill) {
    if (!fill) c->run_ptr[0] = 0;
    for (int64_t b = 0; b < c->batch; ++b)
        for (int64_t r = 0; r < c->rows; ++r) {
            const int64_t at = b * c->rows + r;
            if (r >= c->valid_rows) {
                if (!fill) c->run_ptr[at + 1] = c->run_ptr[at], store_label(c->sink, bytes, at, vocab + 1);
                continue;
            }
            int some;
            if (fill) {
                const int64_t first = c->run_ptr[at];
                b_runs(c, b, r, vocab, c->start + first, c->label + first, c->run_ptr[at + 1] - first, &some);
                continue;
            }
            c->run_ptr[at + 1] = c->run_ptr[at] + b_runs(c, b, r, vocab, NULL, NULL, 0, &some);
            int a_none = 1;
            if (c->a_empty) {
                a_none = c->a_empty[b * c->a_empty_batch + r];
            } else {
                const int64_t from = b * c->a_batch + r * c->a_row;
                for (int64_t j = 0; j < c->na; ++j) {
                    const int32_t now = label_of(c->a_mask + from, c->a_ids + from, j, vocab);
                    store_label(c->a_out, bytes, at * c->na + j, now);
                    a_none &= now == vocab;
                }
            }
            store_label(c->sink, bytes, at, vocab + (a_none && !some));
        }
}

/* Both passes of every chunk, the chunks shared among `threads` OpenMP threads (no region for
 * one: see fused_cpu.c's graphattn_backward_all). */
void graphattn_chunk_labels(const ChunkLabels *chunks, int64_t n, int64_t threads, int32_t vocab, int64_t bytes,
                            int fill) {
    if (threads <= 1) {
        for (int64_t i = 0; i < n; ++i) chunk_labels(chunks + i, vocab, bytes, fill);
        return;
    }
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
    for (int64_t i = 0; i < n; ++i) chunk_labels(chunks + i, vocab, bytes, fill);
}

/* The band's labels as the kernel's long blocks read them (blocked_tiles.local_index): from the
 * [B, length, src_width] l2l rows (columns col0 .. col0 + 2r are offsets -r .. r), rows of
 * window = w + 2r labels per query row, [B, nb * w, window], `bytes` bytes a label: row i =
 * blk * w + a sees keys blk * w - r + c, so offset j lands in column a + j; every other column,
 * keys outside [0, length) and rows past length are `vocab`. empty[b * nb * w + i] is 1 for a
 * row without an allowed key. */
void graphattn_dense_band(const int32_t *mask, const int32_t *ids, int64_t batch, int64_t length, int64_t src_width,
                          int64_t col0, int64_t r, int64_t w, int64_t nb, int32_t vocab, void *out, int64_t bytes,
                          uint8_t *empty) {
    const int64_t window = w + 2 * r, rows = nb * w;
    for (int64_t b = 0; b < batch; ++b)
        for (int64_t i = 0; i < rows; ++i) {
            const int64_t row = b * rows + i, a = i % w, at = row * window;
            const int64_t source = (b * length + i) * src_width + col0;
            int none = 1;
            if (bytes == 1 && vocab == (int8_t)vocab)
                memset((int8_t *)out + at, vocab, window);
            else
                for (int64_t c = 0; c < window; ++c) store_label(out, bytes, at + c, vocab);
            for (int64_t j = 0; j <= 2 * r && i < length; ++j) {
                const int64_t key = i - r + j;
                if (key >= 0 && key < length && mask[source + j]) store_label(out, bytes, at + a + j, ids[source + j]), none = 0;
            }
            empty[row] = (uint8_t)none;
        }
}

/* Per row of a [rows, m] mask (rows `row_stride` apart): its first nonzero column and one past
 * its last, or m and 0 for a row with none. Scanned from both ends, so a row allowed at its
 * ends (a soft mask) costs two reads. */
void graphattn_dense_extents(const int32_t *mask, int64_t rows, int64_t m, int64_t row_stride, int32_t *first,
                             int32_t *last) {
    for (int64_t r = 0; r < rows; ++r) {
        const int32_t *mr = mask + r * row_stride;
        int64_t lo = 0, hi = m;
        while (lo < m && !mr[lo]) ++lo;
        while (hi > lo && !mr[hi - 1]) --hi;
        first[r] = (int32_t)(lo < m ? lo : m), last[r] = (int32_t)(lo < m ? hi : 0);
    }
}
