/* The fused CPU kernel's helpers for dense side inputs (blocked_sources.DenseSource): one pass
 * of C over [rows, keys] int32 mask and id rows where torch took a dozen ops, each with a
 * temporary of the block's size; and single-threaded, so a first layer's plan leaves no
 * OpenMP team spinning while the kernel's workers start. A pair's label is its id where the
 * mask is nonzero, else `vocab` (masked). Built into the same library as fused_cpu.c.
 */
#include <stdint.h>
#include <string.h>
#ifdef __AVX512F__
#include <immintrin.h>
#endif

static inline int32_t label_of(const int32_t *mask, const int32_t *ids, int64_t c, int32_t vocab) {
    return mask[c] ? ids[c] : vocab;
}

/* Runs of equal labels along each row of a [rows, m] block (rows `row_stride` apart): counts[r]
 * gets row r's number of runs, allowed[r] whether one of them is not masked, and start / label
 * each run's first column and label, row by row, as far as `capacity` reaches. Returns the
 * number of runs: when it exceeds capacity, the caller calls again with room for them all. */
int64_t graphattn_dense_runs(const int32_t *mask, const int32_t *ids, int64_t rows, int64_t m, int64_t row_stride,
                             int32_t vocab, int64_t *counts, uint8_t *allowed, int32_t *start, int32_t *label,
                             int64_t capacity) {
    int64_t total = 0;
    for (int64_t r = 0; r < rows; ++r) {
        const int32_t *mr = mask + r * row_stride, *ir = ids + r * row_stride;
        const int64_t first = total;
        int some = 0;
#define EMIT(COLUMN)                                                       \
    do {                                                                   \
        const int32_t now_ = label_of(mr, ir, (COLUMN), vocab);            \
        if (total < capacity) start[total] = (int32_t)(COLUMN), label[total] = now_; \
        ++total, some |= now_ != vocab;                                    \
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
        counts[r] = total - first;
        allowed[r] = (uint8_t)some;
    }
    return total;
}

/* The band's labels as the kernel's long blocks read them (blocked_tiles.local_index): from the
 * [B, length, src_width] l2l rows (columns col0 .. col0 + 2r are offsets -r .. r), rows of
 * window = w + 2r labels per query row, [B, nb * w, window], `bytes` bytes a label: row i =
 * blk * w + a sees keys blk * w - r + c, so offset j lands in column a + j; every other column,
 * keys outside [0, length) and rows past length are `vocab`. empty[b * nb * w + i] is 1 for a
 * row without an allowed key. */
static inline void store_label(void *out, int64_t bytes, int64_t at, int32_t label) {
    if (bytes == 1)
        ((int8_t *)out)[at] = (int8_t)label;
    else if (bytes == 2)
        ((int16_t *)out)[at] = (int16_t)label;
    else
        ((int32_t *)out)[at] = label;
}

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
