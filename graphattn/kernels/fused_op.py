"""The fused CPU kernel's passes as PyTorch operators: `graphattn::fused_forward` and
`graphattn::fused_backward` (torch.library), with fake implementations and a registered autograd
formula, so that torch.compile(fullgraph=True) and torch.export see one operator where the
blocked backend runs fused, and torch.library.opcheck can test it.

Only tensors, ints and floats cross the operator boundary: the states [BH, n, d], the relative
key tables [V, H, d] and biases [V, H] of each query side, the plan's chunk table and each
chunk's labels (blocked_fused.FusedChunks, made once per plan), the heads, the softmax scale and
the worker count (0: torch.get_num_threads()). Every chunk is checked against the tensors it
reads before the kernel runs (fused_cpu.chunk). The forward returns each side's output and each
query row's softmax statistics (max score, log of its sum), which the backward recomputes
probabilities from (flash attention's); a side with no chunks comes out as zeros.
"""

import torch
from torch import Tensor

from graphattn.kernels import blocked_fused, fused_cpu
from graphattn.kernels.blocked_fused import GLOBAL, LABEL_TENSORS, LONG, LONG_SCORE_COST
from graphattn.kernels.blocked_modes import deal

_STATES = ("gq", "gk", "gv", "lq", "lk", "lv")


def _workers(workers: int, chunks: int) -> int:
    return max(1, min(workers if workers > 0 else torch.get_num_threads(), max(chunks, 1)))


def _rows_of(table: Tensor) -> list[list[int]]:
    """The chunk table's rows. It is a CPU tensor the plan made, read through numpy: no device
    to synchronise with (the layer loop's checks refuse Tensor.tolist, which on a GPU would)."""
    if table.device.type != "cpu" or table.dtype != torch.int64 or table.dim() != 2:
        raise ValueError(f"fused CPU kernel: the chunk table must be a 2-d CPU int64 tensor, got {table.dtype}")
    if table.shape[1] != len(blocked_fused.COLUMNS):
        raise ValueError(f"fused CPU kernel: the chunk table must have {len(blocked_fused.COLUMNS)} columns")
    return table.numpy().tolist()


def _describe(table, labels, states, tables, heads, scale, outs, stats):
    """The kernel's chunk descriptions, the rows of the table (each checked by fused_cpu.chunk),
    with what the errors and the backward need: (side, start, key slice, vocab) per chunk."""
    gq, gk, gv, lq, lk, lv = states
    described, where = [], []
    rows = _rows_of(table)
    if len(labels) != LABEL_TENSORS * len(rows):
        raise ValueError(f"fused CPU kernel: {len(rows)} chunks need {LABEL_TENSORS * len(rows)} label tensors")
    for i, row in enumerate(rows):
        side, start, count, valid, block, a_start, a_step, na, a_parts, lo, hi, key_block = row
        if side not in (LONG, GLOBAL) or not 0 <= lo <= hi or a_step not in (0, 1) or start < 0:
            raise ValueError(f"fused CPU kernel: chunk {i} of the table is not one the plan makes: {row}")
        long = side == LONG
        q, keys_a, keys_b = (lq, (lk, lv), (gk, gv)) if long else (gq, (gk, gv), (lk, lv))
        if a_step == 0 and (a_start != 0 or na > keys_a[0].shape[1]) or hi > keys_b[0].shape[1]:
            raise ValueError(f"fused CPU kernel: chunk {i} reaches keys past its key sets: {row}")
        out, stat = (outs[0], stats[0]) if long else (outs[1], stats[1])
        described.append(
            fused_cpu.chunk(
                heads=heads,
                rows=count,
                valid_rows=valid,
                block=block,
                scale=scale,
                q=q[:, start:],
                keys_a=keys_a,
                a_start=a_start,
                a_step=a_step,
                na=na,
                a_parts=a_parts,
                keys_b=(keys_b[0][:, lo:hi], keys_b[1][:, lo:hi]),
                labels=fused_cpu.Labels(*labels[i * LABEL_TENSORS : (i + 1) * LABEL_TENSORS]),
                tables=tables[0] if long else tables[1],
                out=out[:, start:],
                stats=stat[:, start:],
                key_block=key_block,
            )
        )
        where.append((long, start, slice(lo, hi), count * (na + hi - lo) * (LONG_SCORE_COST if long else 1)))
    return described, where


def _raise_for(where, failed: int | None, vocab: int) -> None:
    """A chunk's label outside its table, in the call's terms."""
    if failed is not None:
        long, start, _, _ = where[failed]
        raise ValueError(
            f"relative attention ids must lie in [0, {vocab}) (the relative vocabulary), but one of "
            f"the {'long' if long else 'global'} queries from row {start} (an id of theirs) lies outside it"
        )


def _outputs(table: Tensor, gq: Tensor, lq: Tensor, width: int | None = None) -> tuple[Tensor, Tensor]:
    """(long, global) outputs (or, given `width`, [BH, n, width] statistics): zeros for a side
    without chunks (the query side not asked for)."""
    sides = {row[0] for row in _rows_of(table)}
    long = (lq.new_empty if LONG in sides else lq.new_zeros)(*lq.shape[:2], width or lq.shape[2])
    return long, (gq.new_empty if GLOBAL in sides else gq.new_zeros)(*gq.shape[:2], width or gq.shape[2])


@torch.library.custom_op("graphattn::fused_forward", mutates_args=(), device_types="cpu")
def fused_forward(
    gq: Tensor,
    gk: Tensor,
    gv: Tensor,
    lq: Tensor,
    lk: Tensor,
    lv: Tensor,
    long_key: Tensor,
    long_bias: Tensor | None,
    global_key: Tensor,
    global_bias: Tensor | None,
    table: Tensor,
    labels: list[Tensor],
    heads: int,
    scale: float,
    workers: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(global_out [BH, G, d], long_out [BH, L, d], global_stats [BH, G, 2], long_stats [BH, L, 2])."""
    states = (gq, gk, gv, lq, lk, lv)
    long_out, global_out = _outputs(table, gq, lq)
    stats = _outputs(table, gq, lq, 2)
    tables = ((long_key, long_bias), (global_key, global_bias))
    described, where = _describe(table, labels, states, tables, heads, scale, (long_out, global_out), stats)
    costliest_first = sorted(range(len(described)), key=lambda i: -where[i][3])
    failed = fused_cpu.forward_all(described, costliest_first, _workers(workers, len(described)), lq.shape[0])
    _raise_for(where, failed, long_key.shape[0])
    return global_out, long_out, stats[1], stats[0]


@fused_forward.register_fake
def _(gq, gk, gv, lq, lk, lv, long_key, long_bias, global_key, global_bias, table, labels, heads, scale, workers):
    bh = lq.shape[0]
    return (
        gq.new_empty(gq.shape),
        lq.new_empty(lq.shape),
        gq.new_empty(bh, gq.shape[1], 2),
        lq.new_empty(bh, lq.shape[1], 2),
    )


class _Grads:
    """One worker's gradient accumulators of the keys, values and tables (laid out as they are;
    left as they come: the kernel zeroes them in the worker's own thread), new tensors or views
    of a flat fp32 `storage` (the workspace's)."""

    def __init__(self, like: list[Tensor | None], storage: Tensor | None = None):
        at, grads = 0, []
        for t in like:
            if t is None:
                grads.append(None)
            elif storage is None:
                grads.append(torch.empty_like(t))
            else:
                grads.append(storage[at : at + t.numel()].view(t.shape))
                at += t.numel()
        self.flat = grads  # in `like`'s order, as the kernel takes them
        self.d_gk, self.d_gv, self.d_lk, self.d_lv = grads[:4]
        self.d_long, self.d_global = tuple(grads[4:6]), tuple(grads[6:])


@torch.library.custom_op("graphattn::fused_backward", mutates_args=(), device_types="cpu")
def fused_backward(
    gq: Tensor,
    gk: Tensor,
    gv: Tensor,
    lq: Tensor,
    lk: Tensor,
    lv: Tensor,
    long_key: Tensor,
    long_bias: Tensor | None,
    global_key: Tensor,
    global_bias: Tensor | None,
    table: Tensor,
    labels: list[Tensor],
    heads: int,
    scale: float,
    workers: int,
    global_out: Tensor,
    long_out: Tensor,
    global_stats: Tensor,
    long_stats: Tensor,
    grad_global: Tensor,
    grad_long: Tensor,
) -> list[Tensor]:
    """Gradients of (gq, gk, gv, lq, lk, lv, long key table, long bias, global key table, global
    bias); a bias that is None gets an empty tensor. Each worker accumulates the key sides' into
    its own buffers, dealt a fixed share of the chunks by cost, summed in worker order by the
    kernel: results repeat bit for bit."""
    states = (gq, gk, gv, lq, lk, lv)
    d_lq, d_gq = _outputs(table, gq, lq)  # written by the chunks, as the forward's outputs
    tables = ((long_key, long_bias), (global_key, global_bias))
    described, where = _describe(table, labels, states, tables, heads, scale, (d_lq, d_gq), (long_stats, global_stats))
    parts = deal([w[3] for w in where], _workers(workers, len(described)))
    like = [gk, gv, lk, lv, long_key, long_bias, global_key, global_bias]
    grad_global, grad_long = grad_global.contiguous(), grad_long.contiguous()
    with blocked_fused._WORKSPACE.buffers(len(parts) - 1, sum(t.numel() for t in like if t is not None)) as kept:
        accs = [_Grads(like), *(_Grads(like, storage) for storage in kept)]
        for acc, part in zip(accs, parts):
            for i in part:
                long, s, keys, _ = where[i]
                if long:
                    into = ((acc.d_lk, acc.d_lv), (acc.d_gk[:, keys], acc.d_gv[:, keys]), acc.d_long)
                    given = (long_out[:, s:], grad_long[:, s:])
                else:
                    into = ((acc.d_gk, acc.d_gv), (acc.d_lk[:, keys], acc.d_lv[:, keys]), acc.d_global)
                    given = (global_out[:, s:], grad_global[:, s:])
                fused_cpu.prepare_backward(described[i], *given, *into)
        failed = fused_cpu.backward_all(described, parts, lq.shape[0], [acc.flat for acc in accs])
    _raise_for(where, failed, long_key.shape[0])
    first = accs[0]
    grads = [d_gq, first.d_gk, first.d_gv, d_lq, first.d_lk, first.d_lv, *first.d_long, *first.d_global]
    return [long_key.new_empty(0) if g is None else g for g in grads]


@fused_backward.register_fake
def _(gq, gk, gv, lq, lk, lv, long_key, long_bias, global_key, global_bias, *rest):
    inputs = (gq, gk, gv, lq, lk, lv, long_key, long_bias, global_key, global_bias)
    return [long_key.new_empty(0) if t is None else torch.empty_like(t) for t in inputs]


def _setup_context(ctx, inputs, output) -> None:
    *tensors, table, labels, heads, scale, workers = inputs
    ctx.save_for_backward(*tensors, table, *output, *labels)
    ctx.heads, ctx.scale, ctx.workers = heads, scale, workers
    ctx.has_bias = (tensors[7] is not None, tensors[9] is not None)


def _backward(ctx, grad_global, grad_long, _grad_global_stats, _grad_long_stats):
    saved = ctx.saved_tensors
    tensors, table, outputs, labels = saved[:10], saved[10], saved[11:15], list(saved[15:])
    grads = torch.ops.graphattn.fused_backward(
        *tensors, table, labels, ctx.heads, ctx.scale, ctx.workers, *outputs, grad_global, grad_long
    )
    grads = list(grads)
    for at, has in zip((7, 9), ctx.has_bias):
        if not has:
            grads[at] = None
    return (*grads, None, [None] * len(labels), None, None, None)


torch.library.register_autograd("graphattn::fused_forward", _backward, setup_context=_setup_context)


def attention(
    states: list[Tensor],
    tables: list[Tensor | None],
    chunks: "blocked_fused.FusedChunks",
    batch: int,
    heads: int,
    scale: float,
    workers: int,
) -> tuple[Tensor, Tensor]:
    """The blocked backend on the fused operator: states [B, H, n, d] (fp32, contiguous) and the
    (key table, bias) of the long and then the global queries; (global_out, long_out) [B, H, n, d]."""
    bh = batch * heads
    flat = [x.reshape(bh, x.shape[2], x.shape[3]) for x in states]
    global_out, long_out, _, _ = torch.ops.graphattn.fused_forward(
        *flat, *tables, chunks.table, chunks.labels, heads, scale, workers
    )
    return global_out.view(states[0].shape), long_out.view(states[3].shape)
