/* The fused CPU kernel's labels, as operators (graphattn::chunk_labels, dense_band,
 * dense_extents; called by fused_cpu_labels.py when a plan is made): one pass of C++ where torch
 * took a dozen ops per chunk, each with a temporary of the block's size. From dense side inputs
 * (blocked_sources.DenseSource) a pair's label is its id where the mask is nonzero, else `vocab`
 * (masked); from the compact structure the l2g and g2l labels arrive as runs over whole rows
 * (structure_runs), which each chunk takes its rows and keys of. Every chunk's labels are made in
 * one call on PyTorch's intra-op threads. Every tensor is checked (TORCH_CHECK) before it is read.
 */
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <stdint.h>
#include <string.h>
#include <torch/library.h>
#include <unistd.h>

#include <atomic>
#include <vector>
#ifdef __AVX512F__
#include <immintrin.h>
#endif

namespace graphattn_labels {
namespace {

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

/* One chunk's labels as the kernel reads them (fused_cpu.Labels), filled by chunk_labels below. */
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

/* The band's labels as the kernel's long blocks read them (blocked_tiles.local_index): from the
 * [B, length, src_width] l2l rows (columns col0 .. col0 + 2r are offsets -r .. r), rows of
 * window = w + 2r labels per query row, [B, nb * w, window], `bytes` bytes a label: row i =
 * blk * w + a sees keys blk * w - r + c, so offset j lands in column a + j; every other column,
 * keys outside [0, length) and rows past length are `vocab`. empty[b * nb * w + i] is 1 for a
 * row without an allowed key. */
static void dense_band_rows(const int32_t *mask, const int32_t *ids, int64_t batch, int64_t length, int64_t src_width,
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
static void dense_extents_rows(const int32_t *mask, int64_t rows, int64_t m, int64_t row_stride, int32_t *first,
                             int32_t *last) {
    for (int64_t r = 0; r < rows; ++r) {
        const int32_t *mr = mask + r * row_stride;
        int64_t lo = 0, hi = m;
        while (lo < m && !mr[lo]) ++lo;
        while (hi > lo && !mr[hi - 1]) --hi;
        first[r] = (int32_t)(lo < m ? lo : m), last[r] = (int32_t)(lo < m ? hi : 0);
    }
}

const pid_t LOADED_BY = getpid(); /* a forked child runs on its calling thread (see fused.cpp) */

int64_t bytes_of(at::ScalarType type) {
    switch (type) {
        case at::kChar: return 1;
        case at::kShort: return 2;
        case at::kInt: return 4;
        default: TORCH_CHECK_VALUE(false, "graphattn labels: the label dtype must be int8, int16 or int32, got ", type);
    }
}

/* A [batch, >= rows, >= cols] CPU int32 (or `type`) block whose last dim is contiguous and whose
 * reach lies in its storage. */
void check_block(const char *name, const at::Tensor &t, int64_t batch, int64_t rows, int64_t cols,
                 at::ScalarType type = at::kInt) {
    TORCH_CHECK_VALUE(t.device().is_cpu() && t.scalar_type() == type && t.dim() == 3 && t.size(0) == batch &&
                          t.size(1) >= rows && t.size(2) >= cols && (t.numel() == 0 || t.stride(2) == 1),
                      "graphattn labels: ", name, " must be a CPU ", type, " [", batch, ", >= ", rows, ", >= ", cols,
                      "] block with contiguous rows, got ", t.scalar_type(), " ", c10::str(t.sizes()));
    if (t.numel() == 0) return;
    int64_t reach = t.storage_offset() + 1;
    for (int64_t i = 0; i < 3; ++i) {
        TORCH_CHECK_VALUE(t.stride(i) >= 0, "graphattn labels: ", name, " has a negative stride");
        reach += (t.size(i) - 1) * t.stride(i);
    }
    TORCH_CHECK_VALUE(reach * static_cast<int64_t>(t.element_size()) <= static_cast<int64_t>(t.storage().nbytes()),
                      "graphattn labels: ", name, " reaches past its storage");
}

void same_layout(const char *name, const at::Tensor &a, const at::Tensor &b) {
    TORCH_CHECK_VALUE(a.sizes() == b.sizes() && a.strides() == b.strides(), "graphattn labels: ", name,
                      "'s mask and ids must share their shape and strides");
}

constexpr int64_t GEOMETRY = 7; /* per block: rows, valid_rows, key0, key1, row0, whole_rows, whole_keys */

std::vector<at::Tensor> chunk_labels_op(const c10::List<c10::optional<at::Tensor>> &b_mask,
                                        const c10::List<c10::optional<at::Tensor>> &b_ids,
                                        const c10::List<c10::optional<at::Tensor>> &a_mask,
                                        const c10::List<c10::optional<at::Tensor>> &a_ids,
                                        const c10::List<c10::optional<at::Tensor>> &a_empty,
                                        const c10::List<c10::optional<at::Tensor>> &whole_ptr,
                                        const c10::List<c10::optional<at::Tensor>> &whole_start,
                                        const c10::List<c10::optional<at::Tensor>> &whole_label,
                                        at::IntArrayRef geometry, int64_t batch, int64_t vocab,
                                        at::ScalarType dtype, int64_t workers) {
    const int64_t n = static_cast<int64_t>(b_mask.size()), bytes = bytes_of(dtype);
    for (const auto *list : {&b_ids, &a_mask, &a_ids, &a_empty, &whole_ptr, &whole_start, &whole_label})
        TORCH_CHECK_VALUE(static_cast<int64_t>(list->size()) == n, "graphattn labels: every list needs ", n,
                          " entries, one per chunk");
    TORCH_CHECK_VALUE(static_cast<int64_t>(geometry.size()) == GEOMETRY * n && batch >= 0 && vocab >= 0 &&
                          vocab + 1 < (int64_t{1} << (8 * bytes - 1)),
                      "graphattn labels: ", n, " chunks need ", GEOMETRY * n, " geometry numbers and a vocabulary "
                      "that ", dtype, " holds with its two extra labels");
    std::vector<ChunkLabels> chunks(n);
    std::vector<at::Tensor> made;
    std::vector<at::Tensor> kept; /* the inputs the descriptions point into */
    const auto opts = at::TensorOptions().dtype(dtype);
    for (int64_t i = 0; i < n; ++i) {
        const int64_t *g = geometry.data() + i * GEOMETRY;
        const int64_t rows = g[0], valid = g[1], key0 = g[2], key1 = g[3], row0 = g[4], whole_rows = g[5];
        TORCH_CHECK_VALUE(0 <= valid && valid <= rows && 0 <= key0 && key0 <= key1 && row0 >= 0,
                          "graphattn labels: chunk ", i, "'s geometry is not one a plan makes: ", at::IntArrayRef(g, GEOMETRY));
        ChunkLabels c{};
        c.m = key1 - key0, c.key0 = key0, c.row0 = row0, c.batch = batch, c.rows = rows, c.valid_rows = valid;
        const c10::optional<at::Tensor> bm = b_mask[i], wp = whole_ptr[i];
        if (bm) {
            const at::Tensor mask = *bm, ids = b_ids[i].value_or(at::Tensor());
            TORCH_CHECK_VALUE(ids.defined(), "graphattn labels: chunk ", i, "'s key set B has a mask but no ids");
            check_block("key set B's mask", mask, batch, valid, c.m), same_layout("key set B", mask, ids);
            c.b_mask = mask.data_ptr<int32_t>(), c.b_ids = ids.data_ptr<int32_t>();
            c.b_batch = mask.stride(0), c.b_row = mask.stride(1);
            kept.insert(kept.end(), {mask, ids});
        } else {
            TORCH_CHECK_VALUE(wp && whole_start[i] && whole_label[i], "graphattn labels: chunk ", i,
                              "'s key set B needs a mask and ids or runs over whole rows");
            const at::Tensor ptr = *wp, start = *whole_start[i], label = *whole_label[i];
            const int64_t runs = start.numel();
            TORCH_CHECK_VALUE(ptr.device().is_cpu() && ptr.scalar_type() == at::kLong && ptr.is_contiguous() &&
                                  ptr.numel() == batch * whole_rows + 1 && row0 + valid <= whole_rows,
                              "graphattn labels: chunk ", i, "'s whole-row run pointer must be contiguous int64 of ",
                              batch * whole_rows + 1, " covering rows ", row0, " ..< ", row0 + valid);
            for (const at::Tensor &t : {start, label})
                TORCH_CHECK_VALUE(t.device().is_cpu() && t.scalar_type() == at::kInt && t.is_contiguous() &&
                                      t.numel() == runs,
                                  "graphattn labels: chunk ", i, "'s whole-row runs must be contiguous int32 of one length");
            const int64_t *p = ptr.data_ptr<int64_t>();
            bool ordered = p[0] == 0;
            for (int64_t r = 0; r < batch * whole_rows && ordered; ++r) ordered = p[r] <= p[r + 1];
            TORCH_CHECK_VALUE(ordered && p[batch * whole_rows] <= runs, "graphattn labels: chunk ", i,
                              "'s whole-row run pointer must rise from 0 to at most its ", runs, " runs");
            c.whole_ptr = p, c.whole_start = start.data_ptr<int32_t>(), c.whole_label = label.data_ptr<int32_t>();
            c.whole_rows = whole_rows, c.whole_keys = g[6];
            kept.insert(kept.end(), {ptr, start, label});
        }
        at::Tensor a_out = at::empty({0}, opts);
        if (a_mask[i]) {
            const at::Tensor mask = *a_mask[i], ids = a_ids[i].value_or(at::Tensor());
            TORCH_CHECK_VALUE(ids.defined() && mask.dim() == 3, "graphattn labels: chunk ", i,
                              "'s key set A needs a [B, rows, na] mask and its ids");
            check_block("key set A's mask", mask, batch, valid, 0), same_layout("key set A", mask, ids);
            c.a_mask = mask.data_ptr<int32_t>(), c.a_ids = ids.data_ptr<int32_t>();
            c.a_batch = mask.stride(0), c.a_row = mask.stride(1), c.na = mask.size(2);
            a_out = at::empty({batch, rows, c.na}, opts);
            c.a_out = a_out.data_ptr();
            kept.insert(kept.end(), {mask, ids});
        } else if (a_empty[i]) {
            const at::Tensor empty = *a_empty[i];
            TORCH_CHECK_VALUE(empty.device().is_cpu() && empty.scalar_type() == at::kBool && empty.dim() == 2 &&
                                  empty.size(0) == batch && empty.size(1) >= valid &&
                                  (empty.numel() == 0 || empty.stride(1) == 1),
                              "graphattn labels: chunk ", i, "'s empty rows must be CPU bool [", batch, ", >= ", valid,
                              "] with contiguous rows");
            check_block("key set A's empty rows", empty.unsqueeze(2), batch, valid, 0, at::kBool);
            c.a_empty = reinterpret_cast<const uint8_t *>(empty.data_ptr<bool>()), c.a_empty_batch = empty.stride(0);
            kept.push_back(empty);
        }
        const at::Tensor sink = at::empty({batch, rows}, opts);
        const at::Tensor run_ptr = at::empty({batch * rows + 1}, at::TensorOptions().dtype(at::kLong));
        c.sink = sink.data_ptr(), c.run_ptr = run_ptr.data_ptr<int64_t>();
        made.insert(made.end(), {a_out, sink, run_ptr, at::Tensor(), at::Tensor()});
        chunks[i] = c;
    }
    const int64_t asked = workers > 0 ? workers : at::get_num_threads();
    const int64_t threads = getpid() != LOADED_BY ? 1 : std::max<int64_t>(1, std::min(asked, n));
    const auto both = [&](int fill) {
        std::atomic<int64_t> next{0};
        const auto take = [&](int64_t, int64_t) {
            for (int64_t j = next++; j < n; j = next++) chunk_labels(&chunks[j], static_cast<int32_t>(vocab), bytes, fill);
        };
        if (threads > 1)
            at::parallel_for(0, threads, 1, take);
        else
            take(0, 1);
    };
    both(0); /* A's labels, the sinks and each row's count of runs */
    for (int64_t i = 0; i < n; ++i) {
        const int64_t runs = chunks[i].run_ptr[batch * chunks[i].rows];
        const auto int32 = at::TensorOptions().dtype(at::kInt);
        made[i * 5 + 3] = at::empty({runs}, int32), made[i * 5 + 4] = at::empty({runs}, int32);
        chunks[i].start = made[i * 5 + 3].data_ptr<int32_t>(), chunks[i].label = made[i * 5 + 4].data_ptr<int32_t>();
    }
    both(1); /* the runs */
    return made;
}

std::tuple<at::Tensor, at::Tensor> dense_band(const at::Tensor &mask, const at::Tensor &ids, int64_t col0,
                                              int64_t radius, int64_t block, int64_t blocks, int64_t vocab,
                                              at::ScalarType dtype) {
    const int64_t bytes = bytes_of(dtype);
    TORCH_CHECK_VALUE(mask.dim() == 3 && mask.is_contiguous() && ids.is_contiguous(),
                      "graphattn labels: the band's mask and ids must be contiguous [B, L, width]");
    const int64_t batch = mask.size(0), length = mask.size(1), width = mask.size(2);
    check_block("the band's mask", mask, batch, length, width), same_layout("the band", mask, ids);
    TORCH_CHECK_VALUE(radius >= 0 && block >= 1 && blocks >= 0 && col0 >= 0 && col0 + 2 * radius < width &&
                          vocab >= 0 && vocab < (int64_t{1} << (8 * bytes - 1)),
                      "graphattn labels: a band of radius ", radius, " from column ", col0, " does not fit rows of ",
                      width, ", or vocabulary ", vocab, " does not fit ", dtype);
    const int64_t window = block + 2 * radius;
    at::Tensor index = at::empty({batch, blocks, block, window}, at::TensorOptions().dtype(dtype));
    at::Tensor empty = at::empty({batch, blocks * block}, at::TensorOptions().dtype(at::kBool));
    dense_band_rows(mask.data_ptr<int32_t>(), ids.data_ptr<int32_t>(), batch, length, width, col0, radius, block,
                    blocks, static_cast<int32_t>(vocab), index.data_ptr(), bytes,
                    reinterpret_cast<uint8_t *>(empty.data_ptr<bool>()));
    return {index, empty};
}

std::tuple<at::Tensor, at::Tensor> dense_extents(const at::Tensor &mask) {
    TORCH_CHECK_VALUE(mask.dim() == 3, "graphattn labels: the mask must be [B, n, m], got ", c10::str(mask.sizes()));
    const int64_t batch = mask.size(0), rows = mask.size(1), m = mask.size(2);
    check_block("the mask", mask, batch, rows, m);
    const auto int32 = at::TensorOptions().dtype(at::kInt);
    at::Tensor first = at::empty({batch, rows}, int32), last = at::empty({batch, rows}, int32);
    for (int64_t b = 0; b < batch && rows * m > 0; ++b)
        dense_extents_rows(mask.data_ptr<int32_t>() + b * mask.stride(0), rows, m, mask.stride(1),
                           first.data_ptr<int32_t>() + b * rows, last.data_ptr<int32_t>() + b * rows);
    if (m == 0) first.fill_(0), last.fill_(0);
    return {first, last};
}

}  // namespace
}  // namespace graphattn_labels

TORCH_LIBRARY_FRAGMENT(graphattn, m) {
    m.def(
        "chunk_labels(Tensor?[] b_mask, Tensor?[] b_ids, Tensor?[] a_mask, Tensor?[] a_ids, Tensor?[] a_empty, "
        "Tensor?[] whole_ptr, Tensor?[] whole_start, Tensor?[] whole_label, int[] geometry, int batch, int vocab, "
        "ScalarType dtype, int workers) -> Tensor[]",
        &graphattn_labels::chunk_labels_op);
    m.def(
        "dense_band(Tensor mask, Tensor ids, int col0, int radius, int block, int blocks, int vocab, "
        "ScalarType dtype) -> (Tensor, Tensor)",
        &graphattn_labels::dense_band);
    m.def("dense_extents(Tensor mask) -> (Tensor, Tensor)", &graphattn_labels::dense_extents);
}
