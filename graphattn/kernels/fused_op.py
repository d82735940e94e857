"""The fused CPU kernel's passes as PyTorch operators: `graphattn::fused_forward` and
`graphattn::fused_backward`, defined and implemented in C++ (kernels/cpu/fused.cpp, loaded by
fused_cpu.py), with their fake implementations and autograd formula registered here, so that
torch.compile(fullgraph=True) and torch.export see one operator where the blocked backend runs
fused, and torch.library.opcheck can test it.

Only tensors, ints and floats cross the operator boundary: the states [BH, n, d], the relative
key tables [V, H, d] and biases [V, H] of each query side, the plan's chunk table and each
chunk's labels (blocked_fused.FusedChunks, made once per plan), the heads, the softmax scale and
the worker count (0: torch.get_num_threads()). The C++ side checks every chunk against the
tensors it reads before the kernel runs. The forward returns each side's output and each query
row's softmax statistics (max score, log of its sum), which the backward recomputes
probabilities from (flash attention's); a side with no chunks comes out as zeros.

This module imports nothing of graphattn's: fused_cpu registers the fake
implementations and the autograd formula (`register`) right after it loads the operators.
"""

import torch
from torch import Tensor


def _fake_forward(
    gq, gk, gv, lq, lk, lv, long_key, long_bias, global_key, global_bias, table, labels, heads, scale, workers
):
    bh = lq.shape[0]
    return (
        gq.new_empty(gq.shape),
        lq.new_empty(lq.shape),
        gq.new_empty(bh, gq.shape[1], 2),
        lq.new_empty(bh, lq.shape[1], 2),
    )


def _fake_backward(gq, gk, gv, lq, lk, lv, long_key, long_bias, global_key, global_bias, *rest):
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


_REGISTERED: list[bool] = []


def register() -> None:
    """The operators' fake implementations and the forward's autograd formula (the backward
    operator), once the operators exist (torch.library wants them defined first)."""
    if not _REGISTERED:
        torch.library.register_fake("graphattn::fused_forward", _fake_forward)
        torch.library.register_fake("graphattn::fused_backward", _fake_backward)
        torch.library.register_autograd("graphattn::fused_forward", _backward, setup_context=_setup_context)
        _REGISTERED.append(True)


def attention(
    states: list[Tensor],
    tables: list[Tensor | None],
    table: Tensor,
    labels: list[Tensor],
    heads: int,
    scale: float,
    workers: int,
) -> tuple[Tensor, Tensor]:
    """The blocked backend on the fused operator: states [B, H, n, d] (fp32, contiguous), the
    (key table, bias) of the long and then the global queries, the plan's chunk table and labels
    (blocked_fused.FusedChunks); (global_out, long_out) [B, H, n, d]."""
    bh = states[0].shape[0] * heads
    flat = [x.reshape(bh, x.shape[2], x.shape[3]) for x in states]
    global_out, long_out, _, _ = torch.ops.graphattn.fused_forward(*flat, *tables, table, labels, heads, scale, workers)
    return global_out.view(states[0].shape), long_out.view(states[3].shape)
