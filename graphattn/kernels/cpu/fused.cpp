/* The fused CPU kernel's passes as PyTorch operators: graphattn::fused_forward and
 * graphattn::fused_backward (their fake implementations and autograd formula are registered from
 * Python, fused_op.py). Every chunk of a pass is described from the operators' tensors (the
 * plan's chunk table, its labels, the states and tables), each shape, dtype, device and bound
 * checked by TORCH_CHECK before the kernel reads anything, then all chunks run in one call on
 * PyTorch's intra-op threads (at::parallel_for).
 *
 * Threads: the forward's chunks are taken, the costliest first, by up to `workers` threads as
 * they come (no chunk writes another's rows: any schedule gives the same bits). The backward's
 * chunks are dealt to `workers` lists by cost (deal), each list accumulating the key sides'
 * gradients into its own buffers, summed in list order at the end: the same bits whatever the
 * threads. A process forked after this library was loaded (a DataLoader worker, a pre-fork
 * server) runs every pass on its calling thread with plain products (kernel.h's forked_child).
 */
#include <torch/library.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <numeric>
#include <string>
#include <vector>

#include "passes.h"

namespace graphattn_cpu {
namespace {

constexpr int64_t LONG = 0, GLOBAL = 1, COLUMNS = 12, LABEL_TENSORS = 5;
constexpr double LONG_SCORE_COST = 1.12; /* blocked_fused.LONG_SCORE_COST */
std::string shape(const at::Tensor &t) { return c10::str(t.sizes()); }

/* A state [BH, n, d]: CPU fp32, contiguous (made so: a view is copied). */
at::Tensor state(const char *name, const at::Tensor &t, int64_t bh, int64_t dim) {
    TORCH_CHECK_VALUE(t.device().is_cpu() && t.scalar_type() == at::kFloat, "fused CPU kernel: ", name,
                      " must be a CPU float32 tensor, got ", t.scalar_type(), " on ", t.device());
    TORCH_CHECK_VALUE(t.dim() == 3 && t.size(0) == bh && t.size(2) == dim, "fused CPU kernel: ", name, " must be [",
                      bh, ", n, ", dim, "], got ", shape(t));
    return t.contiguous();
}

/* A table: CPU fp32 of `sizes`, contiguous. */
at::Tensor table_of(const char *name, const at::Tensor &t, at::IntArrayRef sizes) {
    TORCH_CHECK_VALUE(t.device().is_cpu() && t.scalar_type() == at::kFloat && t.sizes() == sizes,
                      "fused CPU kernel: the ", name, " must be CPU float32 ", c10::str(sizes), ", got ",
                      t.scalar_type(), " ", shape(t), " on ", t.device());
    return t.contiguous();
}

/* The last element t may reach lies inside its storage. */
void check_reach(const char *name, const at::Tensor &t) {
    if (t.numel() == 0) return;
    int64_t reach = t.storage_offset() + 1;
    for (int64_t i = 0; i < t.dim(); ++i) {
        TORCH_CHECK_VALUE(t.stride(i) >= 0, "fused CPU kernel: ", name, " has a negative stride");
        reach += (t.size(i) - 1) * t.stride(i);
    }
    TORCH_CHECK_VALUE(reach * static_cast<int64_t>(t.element_size()) <= static_cast<int64_t>(t.storage().nbytes()),
                      "fused CPU kernel: ", name, " reaches past its storage");
}

int64_t label_bytes(const at::Tensor &t) {
    switch (t.scalar_type()) {
        case at::kChar: return 1;
        case at::kShort: return 2;
        case at::kInt: return 4;
        default: TORCH_CHECK_VALUE(false, "fused CPU kernel: labels must be int8, int16 or int32, got ", t.scalar_type());
    }
}

bool contiguous_of(const at::Tensor &t, at::ScalarType type, int64_t numel) {
    return t.device().is_cpu() && t.scalar_type() == type && t.is_contiguous() && t.numel() == numel;
}

/* One chunk's labels (fused_cpu.Labels: dense, sink, run_ptr, run_start, run_label) checked
 * against what the kernel reads of them; the run pointers are read to check that they stay in
 * their runs (the kernel trusts them). */
void check_labels(const at::Tensor *l, int64_t batch, int64_t rows, int64_t na, int64_t i) {
    const at::Tensor &dense = l[0], &sink = l[1], &run_ptr = l[2], &run_start = l[3], &run_label = l[4];
    TORCH_CHECK_VALUE(dense.device().is_cpu(), "fused CPU kernel: chunk ", i, "'s labels must be on the CPU");
    label_bytes(dense);
    TORCH_CHECK_VALUE(dense.dim() == 3 && dense.size(0) == batch && dense.size(1) == rows && dense.size(2) == na &&
                          (rows * na == 0 || (dense.stride(2) == 1 && dense.stride(1) == na)),
                      "fused CPU kernel: chunk ", i, "'s labels of key set A must be [", batch, ", ", rows, ", ", na,
                      "] with contiguous rows, got ", shape(dense));
    check_reach("key set A's labels", dense);
    TORCH_CHECK_VALUE(contiguous_of(sink, dense.scalar_type(), batch * rows) && sink.dim() == 2,
                      "fused CPU kernel: chunk ", i, "'s sink labels must be contiguous ", dense.scalar_type(), " [",
                      batch, ", ", rows, "], got ", sink.scalar_type(), " ", shape(sink));
    TORCH_CHECK_VALUE(contiguous_of(run_ptr, at::kLong, batch * rows + 1), "fused CPU kernel: chunk ", i,
                      "'s run_ptr must be contiguous int64 of ", batch * rows + 1, ", got ", run_ptr.scalar_type(),
                      " of ", run_ptr.numel());
    const int64_t runs = run_start.numel();
    TORCH_CHECK_VALUE(contiguous_of(run_start, at::kInt, runs) && contiguous_of(run_label, at::kInt, runs),
                      "fused CPU kernel: chunk ", i, "'s run_start and run_label must be contiguous CPU int32 of one "
                      "length, got ", run_start.scalar_type(), " of ", runs, " and ", run_label.scalar_type(), " of ",
                      run_label.numel());
    const int64_t *p = run_ptr.data_ptr<int64_t>();
    bool ordered = p[0] == 0;
    for (int64_t r = 0; r < batch * rows && ordered; ++r) ordered = p[r] <= p[r + 1];
    TORCH_CHECK_VALUE(ordered && p[batch * rows] <= runs, "fused CPU kernel: chunk ", i,
                      "'s run_ptr must rise from 0 to at most its ", runs, " runs");
}

/* Where a chunk lies, for the errors, the backward and the deal. */
struct Where {
    bool is_long;
    int64_t start, lo, hi;
    double cost;
};

struct Pass {
    at::Tensor gq, gk, gv, lq, lk, lv, long_key, long_bias, global_key, global_bias;
    int64_t bh, dim, heads;
    std::vector<Chunk> chunks;
    std::vector<Where> where;
    std::vector<at::Tensor> labels; /* kept alive with the chunks that point into them */
};

/* The operators' inputs checked and made contiguous, and every chunk of the table described,
 * its output rows in outs[LONG], outs[GLOBAL] and their statistics in stats[...]. */
Pass describe(const at::Tensor *states, const at::Tensor &long_key, const c10::optional<at::Tensor> &long_bias,
              const at::Tensor &global_key, const c10::optional<at::Tensor> &global_bias, const at::Tensor &table,
              at::TensorList labels, int64_t heads, double scale) {
    Pass p;
    TORCH_CHECK_VALUE(states[0].dim() == 3, "fused CPU kernel: gq must be [BH, n, d], got ", shape(states[0]));
    p.bh = states[0].size(0), p.dim = states[0].size(2), p.heads = heads;
    TORCH_CHECK_VALUE(heads >= 1 && p.bh % heads == 0, "fused CPU kernel: ", heads, " heads do not divide ", p.bh,
                      " rows of heads x batch");
    const char *names[6] = {"gq", "gk", "gv", "lq", "lk", "lv"};
    at::Tensor *made[6] = {&p.gq, &p.gk, &p.gv, &p.lq, &p.lk, &p.lv};
    for (int j = 0; j < 6; ++j) *made[j] = state(names[j], states[j], p.bh, p.dim);
    TORCH_CHECK_VALUE(p.gk.sizes() == p.gv.sizes() && p.lk.sizes() == p.lv.sizes(),
                      "fused CPU kernel: keys and values of a key set must share their shapes");
    TORCH_CHECK_VALUE(long_key.dim() == 3 && global_key.dim() == 3, "fused CPU kernel: the relative key tables must "
                      "be [V, heads, d]");
    p.long_key = table_of("long relative key table", long_key, {long_key.size(0), heads, p.dim});
    p.global_key = table_of("global relative key table", global_key, {global_key.size(0), heads, p.dim});
    if (long_bias) p.long_bias = table_of("long relative bias table", *long_bias, {long_key.size(0), heads});
    if (global_bias) p.global_bias = table_of("global relative bias table", *global_bias, {global_key.size(0), heads});
    TORCH_CHECK_VALUE(table.device().is_cpu() && table.scalar_type() == at::kLong && table.dim() == 2 &&
                          table.size(1) == COLUMNS,
                      "fused CPU kernel: the chunk table must be a 2-d CPU int64 tensor of ", COLUMNS,
                      " columns, got ", table.scalar_type(), " ", shape(table));
    const at::Tensor rows = table.contiguous();
    const int64_t n = rows.size(0), batch = p.bh / heads;
    TORCH_CHECK_VALUE(static_cast<int64_t>(labels.size()) == LABEL_TENSORS * n, "fused CPU kernel: ", n,
                      " chunks need ", LABEL_TENSORS * n, " label tensors, got ", labels.size());
    p.labels = labels.vec();
    const int64_t *row = rows.data_ptr<int64_t>();
    for (int64_t i = 0; i < n; ++i, row += COLUMNS) {
        const int64_t side = row[0], start = row[1], count = row[2], valid = row[3], block = row[4];
        const int64_t a_start = row[5], a_step = row[6], na = row[7], a_parts = row[8], lo = row[9], hi = row[10];
        const int64_t key_block = row[11];
        const bool is_long = side == LONG;
        const at::Tensor &q = is_long ? p.lq : p.gq, &ka = is_long ? p.lk : p.gk, &va = is_long ? p.lv : p.gv;
        const at::Tensor &kb = is_long ? p.gk : p.lk, &vb = is_long ? p.gv : p.lv;
        const at::Tensor &key = is_long ? p.long_key : p.global_key, &bias = is_long ? p.long_bias : p.global_bias;
        TORCH_CHECK_VALUE((side == LONG || side == GLOBAL) && start >= 0 && 0 <= lo && lo <= hi &&
                              (a_step == 0 || a_step == 1) && 1 <= block && block <= count && na >= 0 && 0 <= valid &&
                              valid <= count && key_block >= 1,
                          "fused CPU kernel: chunk ", i, " of the table is not one the plan makes: ",
                          c10::IntArrayRef(row, COLUMNS));
        TORCH_CHECK_VALUE(start + valid <= q.size(1) && hi <= kb.size(1) && (a_step == 1 || na <= ka.size(1)),
                          "fused CPU kernel: chunk ", i, " reaches rows or keys past its tensors: ",
                          c10::IntArrayRef(row, COLUMNS));
        TORCH_CHECK_VALUE(a_parts == 1 || (a_step == 1 && 1 <= a_parts && a_parts <= block), "fused CPU kernel: ",
                          "a band may take key set A in 1 ..= block (", block, ") parts, got ", a_parts);
        const at::Tensor *l = p.labels.data() + i * LABEL_TENSORS;
        check_labels(l, batch, count, na, i);
        Chunk c{};
        c.heads = heads, c.rows = count, c.valid_rows = valid, c.block = block, c.dim = p.dim;
        c.scale = static_cast<float>(scale);
        c.q = q.data_ptr<float>() + start * p.dim, c.q_bh = q.stride(0);
        c.ka = ka.data_ptr<float>(), c.va = va.data_ptr<float>(), c.a_bh = ka.stride(0), c.a_rows = ka.size(1);
        c.a_start = a_start, c.a_step = a_step, c.na = na, c.a_parts = a_parts;
        c.kb = kb.data_ptr<float>() + lo * p.dim, c.vb = vb.data_ptr<float>() + lo * p.dim;
        c.b_bh = kb.stride(0), c.nb = hi - lo;
        c.dense = l[0].data_ptr(), c.dense_bytes = label_bytes(l[0]), c.dense_batch = l[0].stride(0);
        c.sink = l[1].data_ptr(), c.run_ptr = l[2].data_ptr<int64_t>();
        c.run_start = l[3].data_ptr<int32_t>(), c.run_label = l[4].data_ptr<int32_t>();
        c.rel_key = key.data_ptr<float>(), c.rel_bias = bias.defined() ? bias.data_ptr<float>() : nullptr;
        c.vocab = key.size(0), c.key_block = key_block;
        p.chunks.push_back(c);
        p.where.push_back({is_long, start, lo, hi, count * (na + hi - lo) * (is_long ? LONG_SCORE_COST : 1.0)});
    }
    return p;
}

/* (long, global) [BH, n, width] tensors: empty for a side with chunks (they write every row),
 * zeros for one without (the query side not asked for). */
std::pair<at::Tensor, at::Tensor> outputs(const Pass &p, int64_t width) {
    bool has[2] = {false, false};
    for (const Where &w : p.where) has[w.is_long ? 0 : 1] = true;
    const auto make = [&](bool chunks, int64_t n) {
        return chunks ? at::empty({p.bh, n, width}, p.lq.options()) : at::zeros({p.bh, n, width}, p.lq.options());
    };
    return {make(has[0], p.lq.size(1)), make(has[1], p.gq.size(1))};
}

/* Point each chunk at its side's output (or the query gradient) and statistics rows. */
void point_outputs(Pass &p, const at::Tensor *outs, const at::Tensor *stats) {
    for (size_t i = 0; i < p.chunks.size(); ++i) {
        const int side = p.where[i].is_long ? 0 : 1;
        const int64_t start = p.where[i].start;
        p.chunks[i].out = outs[side].data_ptr<float>() + start * p.dim, p.chunks[i].out_bh = outs[side].stride(0);
        p.chunks[i].stats = stats[side].data_ptr<float>() + 2 * start, p.chunks[i].stats_bh = stats[side].stride(0);
    }
}

int64_t threads_for(int64_t workers, int64_t tasks) {
    plain_products = forked_child();
    if (plain_products) return 1;
    const int64_t asked = workers > 0 ? workers : at::get_num_threads();
    return std::max<int64_t>(1, std::min(asked, std::max<int64_t>(tasks, 1)));
}

/* The first failure (lowest chunk number) of a pass, shared by its threads. */
struct Failure {
    std::mutex lock;
    int code = 0;
    int64_t chunk = -1;
    void note(int got, int64_t at) {
        if (!got) return;
        std::lock_guard<std::mutex> held(lock);
        if (!code || at < chunk) code = got, chunk = at;
    }
};

void raise_for(const Pass &p, const Failure &failed) {
    TORCH_CHECK(failed.code != 1, "graphattn: the fused CPU kernel could not allocate its score block");
    if (failed.code == 2) {
        const Where &w = p.where[failed.chunk];
        TORCH_CHECK_VALUE(false, "relative attention ids must lie in [0, ", p.long_key.size(0),
                          ") (the relative vocabulary), but one of the ", w.is_long ? "long" : "global",
                          " queries from row ", w.start, " (an id of theirs) lies outside it");
    }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> fused_forward(
    const at::Tensor &gq, const at::Tensor &gk, const at::Tensor &gv, const at::Tensor &lq, const at::Tensor &lk,
    const at::Tensor &lv, const at::Tensor &long_key, const c10::optional<at::Tensor> &long_bias,
    const at::Tensor &global_key, const c10::optional<at::Tensor> &global_bias, const at::Tensor &table,
    at::TensorList labels, int64_t heads, double scale, int64_t workers) {
    const at::Tensor states[6] = {gq, gk, gv, lq, lk, lv};
    Pass p = describe(states, long_key, long_bias, global_key, global_bias, table, labels, heads, scale);
    const auto [long_out, global_out] = outputs(p, p.dim);
    const auto [long_stats, global_stats] = outputs(p, 2);
    const at::Tensor outs[2] = {long_out, global_out}, stats[2] = {long_stats, global_stats};
    point_outputs(p, outs, stats);
    const int64_t n = static_cast<int64_t>(p.chunks.size());
    std::vector<int64_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return p.where[a].cost > p.where[b].cost; });
    Failure failed;
    std::atomic<int64_t> next{0};
    const auto take = [&](int64_t, int64_t) { /* chunks as they come, the costliest first */
        c10::InferenceMode views; /* gemm's operand views: no version counters */
        for (int64_t j = next++; j < n; j = next++) failed.note(forward_chunk(&p.chunks[order[j]], p.bh), order[j]);
    };
    const int64_t threads = threads_for(workers, n);
    if (threads > 1)
        at::parallel_for(0, threads, 1, take);
    else
        take(0, 1);
    raise_for(p, failed);
    return {global_out, long_out, global_stats, long_stats};
}

/* Task numbers per worker: the costliest first, each to the worker with the least so far (ties
 * to the lowest), each worker's in the order dealt: a fixed deal. */
std::vector<std::vector<int64_t>> deal(const std::vector<Where> &where, int64_t workers) {
    std::vector<std::vector<int64_t>> parts(workers);
    std::vector<double> loads(workers, 0.0);
    std::vector<int64_t> order(where.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return where[a].cost > where[b].cost; });
    for (int64_t task : order) {
        const int64_t w = std::min_element(loads.begin(), loads.end()) - loads.begin();
        parts[w].push_back(task);
        loads[w] += where[task].cost;
    }
    return parts;
}

/* The backward's accumulators of workers 1, 2, ... (worker 0's become the gradients), kept
 * between calls up to KEPT_BYTES: memory the process has not touched costs a page fault per
 * 4 KiB on first write (fresh buffers ran a backward 5-10% slower at L = 2048). A call that finds
 * them taken by another uses fresh ones. */
constexpr int64_t KEPT_BYTES = int64_t{256} << 20;
std::mutex kept_lock;
at::Tensor kept;

void release_workspace() {
    std::lock_guard<std::mutex> held(kept_lock);
    kept = at::Tensor();
}

std::vector<at::Tensor> fused_backward(
    const at::Tensor &gq, const at::Tensor &gk, const at::Tensor &gv, const at::Tensor &lq, const at::Tensor &lk,
    const at::Tensor &lv, const at::Tensor &long_key, const c10::optional<at::Tensor> &long_bias,
    const at::Tensor &global_key, const c10::optional<at::Tensor> &global_bias, const at::Tensor &table,
    at::TensorList labels, int64_t heads, double scale, int64_t workers, const at::Tensor &global_out,
    const at::Tensor &long_out, const at::Tensor &global_stats, const at::Tensor &long_stats,
    const at::Tensor &grad_global, const at::Tensor &grad_long) {
    const at::Tensor states[6] = {gq, gk, gv, lq, lk, lv};
    Pass p = describe(states, long_key, long_bias, global_key, global_bias, table, labels, heads, scale);
    const at::Tensor o[2] = {state("long_out", long_out, p.bh, p.dim), state("global_out", global_out, p.bh, p.dim)};
    const at::Tensor g[2] = {state("grad_long", grad_long, p.bh, p.dim),
                             state("grad_global", grad_global, p.bh, p.dim)};
    TORCH_CHECK_VALUE(o[0].size(1) == p.lq.size(1) && g[0].size(1) == p.lq.size(1) && o[1].size(1) == p.gq.size(1) &&
                          g[1].size(1) == p.gq.size(1),
                      "fused CPU kernel: the outputs and their gradients must be laid out as the queries");
    const at::Tensor stats[2] = {state("long_stats", long_stats, p.bh, 2), state("global_stats", global_stats, p.bh, 2)};
    TORCH_CHECK_VALUE(stats[0].size(1) == p.lq.size(1) && stats[1].size(1) == p.gq.size(1),
                      "fused CPU kernel: the statistics must have a row per query");
    const auto [d_lq, d_gq] = outputs(p, p.dim);
    const at::Tensor d_q[2] = {d_lq, d_gq};
    point_outputs(p, d_q, stats);
    for (size_t i = 0; i < p.chunks.size(); ++i) {
        const int side = p.where[i].is_long ? 0 : 1;
        const int64_t start = p.where[i].start;
        Chunk &c = p.chunks[i];
        c.o = o[side].data_ptr<float>() + start * p.dim, c.o_bh = o[side].stride(0);
        c.d_out = g[side].data_ptr<float>() + start * p.dim, c.d_out_bh = g[side].stride(0);
    }
    /* Accumulators per worker, laid out as: gk, gv, lk, lv, long key, long bias, global key, global bias. */
    const at::Tensor like[8] = {p.gk, p.gv, p.lk, p.lv, p.long_key, p.long_bias, p.global_key, p.global_bias};
    int64_t total = 0;
    for (const at::Tensor &t : like) total += t.defined() ? t.numel() : 0;
    const auto parts = deal(p.where, threads_for(workers, static_cast<int64_t>(p.chunks.size())));
    const int64_t count = static_cast<int64_t>(parts.size());
    std::vector<at::Tensor> first;
    for (const at::Tensor &t : like) first.push_back(t.defined() ? at::empty_like(t) : at::Tensor());
    std::unique_lock<std::mutex> own(kept_lock, std::try_to_lock);
    const int64_t extra = (count - 1) * total;
    at::Tensor storage;
    if (own.owns_lock() && extra * 4 <= KEPT_BYTES) {
        if (!kept.defined() || kept.numel() < extra) kept = at::empty({extra}, p.lq.options());
        storage = kept;
    } else {
        own = std::unique_lock<std::mutex>();
        storage = at::empty({extra}, p.lq.options());
    }
    std::vector<float *> acc(count * 8, nullptr);
    std::vector<int64_t> acc_len(8, 0);
    for (int64_t w = 0, at = 0; w < count; ++w)
        for (int j = 0; j < 8; ++j) {
            if (!like[j].defined()) continue;
            acc_len[j] = like[j].numel();
            acc[w * 8 + j] = w == 0 ? first[j].data_ptr<float>() : storage.data_ptr<float>() + at;
            at += w == 0 ? 0 : acc_len[j];
        }
    Failure failed;
    const auto run_worker = [&](int64_t w) {
        c10::InferenceMode views; /* gemm's operand views: no version counters */
        float *const *a = acc.data() + w * 8;
        for (int j = 0; j < 8; ++j)
            if (a[j]) memset(a[j], 0, acc_len[j] * sizeof(float));
        for (int64_t i : parts[w]) {
            Chunk c = p.chunks[i];
            const bool is_long = p.where[i].is_long;
            const int64_t b_at = p.where[i].lo * p.dim;
            c.d_ka = a[is_long ? 2 : 0], c.d_va = a[is_long ? 3 : 1];
            c.d_kb = a[is_long ? 0 : 2] + b_at, c.d_vb = a[is_long ? 1 : 3] + b_at;
            c.d_rel_key = a[is_long ? 4 : 6], c.d_rel_bias = a[is_long ? 5 : 7];
            const int got = backward_chunk(&c, p.bh);
            if (got) return failed.note(got, i);
        }
    };
    /* Share `part` of `shares` of every accumulator: the other workers' added into worker 0's, in worker order. */
    const auto sum_share = [&](int64_t part, int64_t shares) {
        for (int j = 0; j < 8; ++j) {
            float *into = acc[j];
            if (!into) continue;
            const int64_t share = (acc_len[j] + shares - 1) / shares, lo = part * share;
            const int64_t hi = std::min(lo + share, acc_len[j]);
            for (int64_t w = 1; w < count; ++w) {
                const float *from = acc[w * 8 + j];
#pragma omp simd
                for (int64_t e = lo; e < hi; ++e) into[e] += from[e];
            }
        }
    };
    if (count > 1) {
        at::parallel_for(0, count, 1, [&](int64_t lo, int64_t hi) {
            for (int64_t w = lo; w < hi; ++w) run_worker(w);
        });
        const int64_t shares = std::min<int64_t>(count, at::get_num_threads());
        at::parallel_for(0, shares, 1, [&](int64_t lo, int64_t hi) {
            for (int64_t s = lo; s < hi; ++s) sum_share(s, shares);
        });
    } else {
        run_worker(0);
    }
    raise_for(p, failed);
    const auto grad = [&](int j) { return first[j].defined() ? first[j] : at::empty({0}, p.lq.options()); };
    return {d_gq, grad(0), grad(1), d_lq, grad(2), grad(3), grad(4), grad(5), grad(6), grad(7)};
}

}  // namespace
}  // namespace graphattn_cpu

TORCH_LIBRARY(graphattn, m) {
    m.set_python_module("graphattn.kernels.fused_op"); /* its fake implementations and autograd */
    m.def(
        "fused_forward(Tensor gq, Tensor gk, Tensor gv, Tensor lq, Tensor lk, Tensor lv, Tensor long_key, "
        "Tensor? long_bias, Tensor global_key, Tensor? global_bias, Tensor table, Tensor[] labels, int heads, "
        "float scale, int workers) -> (Tensor, Tensor, Tensor, Tensor)");
    m.def(
        "fused_backward(Tensor gq, Tensor gk, Tensor gv, Tensor lq, Tensor lk, Tensor lv, Tensor long_key, "
        "Tensor? long_bias, Tensor global_key, Tensor? global_bias, Tensor table, Tensor[] labels, int heads, "
        "float scale, int workers, Tensor global_out, Tensor long_out, Tensor global_stats, Tensor long_stats, "
        "Tensor grad_global, Tensor grad_long) -> Tensor[]");
    m.def("release_workspace() -> ()", &graphattn_cpu::release_workspace);
}

TORCH_LIBRARY_IMPL(graphattn, CPU, m) {
    m.impl("fused_forward", &graphattn_cpu::fused_forward);
    m.impl("fused_backward", &graphattn_cpu::fused_backward);
}
