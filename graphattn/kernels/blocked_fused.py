"""The blocked backend's passes on the fused CPU kernel (fused_cpu.c), chunk by chunk.

Same chunks, label indices, tables and worker threads as the PyTorch passes in blocked.py; each
chunk is one call of the C kernel, which releases the GIL (ctypes does), so the workers run in
parallel. Used for fp32 tiles on CPU when the kernel could be built (fused_cpu.available()).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch

from graphattn.kernels import fused_cpu
from graphattn.kernels.blocked_modes import run_tasks
from graphattn.kernels.blocked_tiles import (
    CallTensors,
    GlobalChunk,
    LongChunk,
    Scratches,
    chunk_tasks,
    global_chunk_keys,
    long_chunk_keys,
    query_outputs,
)

# The chunk budget of plans that will run fused (blocked.plan's tile_elements, all heads): the
# kernel holds one head's block of rows at a time, so this bounds only the chunk's label index;
# 4x the PyTorch path's budget gives fewer, larger tasks and larger global blocks (1.2x faster at L = 4096).
TILE_ELEMENTS = 1 << 23
# Rows of a global block: as many as GLOBAL_TILE_BYTES of scores hold, 16 to 128. The block's
# rows are the inner size of its dK and dV matmuls, so more rows make them faster: 128 rows ran
# the global side's forward+backward 1.2-1.3x faster than 16 (a 256 KiB tile) at L = 4096, and
# 16 MiB gives 128 rows up to 32K keys.
GLOBAL_TILE_BYTES = 1 << 24
MAX_GLOBAL_BLOCK = 128


def usable(device: torch.device, dtype: torch.dtype) -> bool:
    """fp32 tiles on CPU, with the kernel built (fp64 and bf16 tiles take the PyTorch path)."""
    return device.type == "cpu" and dtype == torch.float32 and fused_cpu.available()


def likely(device: torch.device, dtype: torch.dtype | None) -> bool:
    """Whether a plan's calls will run fused, as far as the plan can tell (bf16 and fp16 inputs
    compute in fp32 when they need gradients)."""
    computes_fp32 = dtype in (None, torch.float32, torch.bfloat16, torch.float16)
    return device.type == "cpu" and computes_fp32 and fused_cpu.available()


def why_not(device: torch.device, dtype: torch.dtype) -> str:
    if device.type != "cpu" or dtype != torch.float32:
        return f"it runs fp32 tiles on CPU, and these are {dtype} on {device}"
    return fused_cpu.why_not()


def _global_block(width: int) -> int:
    return max(16, min(MAX_GLOBAL_BLOCK, GLOBAL_TILE_BYTES // (4 * width)))


@dataclass
class _Call:
    """One chunk as the kernel sees it: its description, first query row and second key set."""

    described: fused_cpu.Chunk
    side: str  # "long" or "global" queries
    start: int
    keys: slice
    vocab: int
    labels: fused_cpu.Labels  # held here: `described` points into it

    def run(self, kernel, *args) -> None:
        try:
            kernel(self.described, *args)
        except fused_cpu.LabelOutsideTable:
            raise ValueError(
                f"relative attention ids must lie in [0, {self.vocab}) (the relative vocabulary), but one of "
                f"the {self.side} queries from row {self.start} (an id of theirs) lies outside it"
            ) from None


class _Chunks:
    """The kernel's view of each chunk of one call: the chunk's label index comes from the
    plan's cache or is built into the worker's scratch; `out` is the forward's output or the
    backward's query gradient."""

    def __init__(self, lay: CallTensors, long_out: torch.Tensor, global_out: torch.Tensor):
        self.lay, self.long_out, self.global_out = lay, long_out, global_out
        self.t_long, self.t_global = lay.t_long.flatten(0, 1), lay.t_global.flatten(0, 1)  # [BH, rows, V+2]

    def _labels(self, key: tuple, na: int, build) -> fused_cpu.Labels:
        """The chunk's labels from the plan's cache, or built from its gather index (build())
        and offered to the cache."""
        cache = self.lay.index_cache
        labels = cache.get(key)
        if labels is None:
            labels = fused_cpu.Labels.of(build().index, na, cache.dtype)
            cache.keep_form(key, labels.nbytes, lambda: labels)
        return labels

    def long(self, first: int, last: int, scratch: Scratches) -> _Call:
        """Block b's keys are its band window, rows b*w - r .. b*w + w + r of the long keys."""
        lay, geo = self.lay, self.lay.geo
        keys, start = long_chunk_keys(lay, first), first * geo.block
        build = partial(LongChunk, lay, first, last, scratch, index_only=True)
        labels = self._labels(("fused long", first), geo.window, build)
        described = fused_cpu.chunk(
            heads=geo.heads,
            rows=(last - first) * geo.block,
            valid_rows=min(last * geo.block, geo.num_long) - start,
            block=geo.block,
            scale=geo.scale,
            q=lay.lq[:, start:],
            keys_a=(lay.lk, lay.lv),
            a_start=start - geo.radius,
            a_step=1,
            na=geo.window,
            keys_b=(lay.gk[:, keys], lay.gv[:, keys]),
            labels=labels,
            table=self.t_long[:, start:],
            out=self.long_out[:, start:],
        )
        return _Call(described, "long", start, keys, geo.vocab, labels)

    def global_(self, start: int, stop: int, scratch: Scratches) -> _Call:
        """Every block sees every global key, then the chunk's long keys."""
        lay, geo = self.lay, self.lay.geo
        keys = global_chunk_keys(lay, start)
        build = partial(GlobalChunk, lay, start, stop, scratch, index_only=True)
        labels = self._labels(("fused global", start), geo.num_global_keys, build)
        described = fused_cpu.chunk(
            heads=geo.heads,
            rows=stop - start,
            valid_rows=stop - start,
            block=min(stop - start, _global_block(geo.num_global_keys + keys.stop - keys.start + 1)),
            scale=geo.scale,
            q=lay.gq[:, start:],
            keys_a=(lay.gk, lay.gv),
            a_start=0,
            a_step=0,
            na=geo.num_global_keys,
            keys_b=(lay.lk[:, keys], lay.lv[:, keys]),
            labels=labels,
            table=self.t_global[:, start:],
            out=self.global_out[:, start:],
        )
        return _Call(described, "global", start, keys, geo.vocab, labels)


def forward(lay: CallTensors, workers: int, queries: str = "both") -> tuple[torch.Tensor, torch.Tensor]:
    geo = lay.geo
    bh = geo.bh
    global_out, long_out = query_outputs(lay, queries)
    chunks = _Chunks(lay, long_out, global_out)

    def long_task(first: int, last: int, scratch: Scratches) -> None:
        chunks.long(first, last, scratch).run(fused_cpu.forward, bh)

    def global_task(start: int, stop: int, scratch: Scratches) -> None:
        chunks.global_(start, stop, scratch).run(fused_cpu.forward, bh)

    run_tasks(chunk_tasks(geo, queries, long_task, global_task), lambda: Scratches(lay.lq), workers)
    return global_out, long_out


class _Grads:
    """One worker's scratch and key/value gradient accumulators (laid out as the keys)."""

    def __init__(self, lay: CallTensors):
        self.scratch = Scratches(lay.lq)
        self.d_gk, self.d_gv, self.d_lk, self.d_lv = map(torch.zeros_like, (lay.gk, lay.gv, lay.lk, lay.lv))


def backward(lay: CallTensors, grad_global: torch.Tensor, grad_long: torch.Tensor, workers: int, queries: str = "both"):
    """Gradients of (gq, gk, gv, lq, lk, lv, t_global, t_long), as blocked._backward returns them."""
    geo = lay.geo
    bh, d = geo.bh, lay.dim
    grad_long = grad_long.reshape(bh, geo.num_long, d)
    grad_global = grad_global.reshape(bh, geo.num_global, d)
    d_lq, d_gq = torch.zeros_like(lay.lq), torch.zeros_like(lay.gq)  # rows belong to one chunk each
    d_t_long, d_t_global = torch.zeros_like(lay.t_long), torch.zeros_like(lay.t_global)
    chunks = _Chunks(lay, d_lq, d_gq)
    flat_long, flat_global = d_t_long.flatten(0, 1), d_t_global.flatten(0, 1)

    def long_task(first: int, last: int, acc: _Grads) -> None:
        call = chunks.long(first, last, acc.scratch)
        s, keys = call.start, call.keys
        d_keys_b = (acc.d_gk[:, keys], acc.d_gv[:, keys])
        call.run(fused_cpu.backward, bh, grad_long[:, s:], (acc.d_lk, acc.d_lv), d_keys_b, flat_long[:, s:])

    def global_task(start: int, stop: int, acc: _Grads) -> None:
        call = chunks.global_(start, stop, acc.scratch)
        d_keys_b = (acc.d_lk[:, call.keys], acc.d_lv[:, call.keys])
        d_keys_a = (acc.d_gk, acc.d_gv)
        call.run(fused_cpu.backward, bh, grad_global[:, start:], d_keys_a, d_keys_b, flat_global[:, start:])

    accs = run_tasks(chunk_tasks(geo, queries, long_task, global_task), lambda: _Grads(lay), workers)
    first = accs[0]
    for acc in accs[1:]:  # summed in the first worker's memory, in a fixed order
        for name in ("d_gk", "d_gv", "d_lk", "d_lv"):
            getattr(first, name).add_(getattr(acc, name))
    d_t_long, d_t_global = geo.fold_lanes(d_t_long[:, :, : geo.num_long]), geo.fold_lanes(d_t_global)
    return d_gq, first.d_gk, first.d_gv, d_lq, first.d_lk, first.d_lv, d_t_global, d_t_long
