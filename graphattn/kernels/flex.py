"""Global-local attention through torch's FlexAttention, over the concatenated [global; long] sequence.

One softmax per row of the concatenated sequence is exactly ETC's pair of fused softmaxes: a
global query's row is [g2g ; g2l] and a long query's row is [l2g ; l2l window]. The mask_mod and
score_mod read the four side-input blocks by region, so nothing [G+L, G+L] is materialized; the
BlockMask (which key blocks each query block may skip) is built separately by `prepare` so that
a benchmark can time it apart. torch.compile is used when it works, else eager with a warning.

FlexAttention has no backward on CPU (torch raises); use the blocked backend to train on CPU.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Callable

import torch

from graphattn.contract import SideInputs

try:
    from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention
except ImportError:  # torch without FlexAttention
    flex_attention = None

_compiled: Callable | None = None
_compile_failed = False


def available() -> bool:
    return flex_attention is not None


def supports_head_dim(dim: int) -> bool:
    """FlexAttention's kernels tile the head dim: powers of two from 16 (CPU and CUDA)."""
    return dim >= 16 and dim & (dim - 1) == 0


@dataclass
class FlexPlan:
    """What depends only on the side inputs: the BlockMask and the region lookups."""

    block_mask: "BlockMask"
    label_of: Callable  # (b, q_idx, kv_idx) -> label id, for score_mod
    num_global: int
    num_long: int


def _region_lookups(side: SideInputs, num_global: int, num_long: int):
    """mask_mod and label function over the concatenated sequence, indexing the side inputs."""
    radius = side.local_radius
    g2g_m, g2l_m, l2g_m, l2l_m = (getattr(side, f"{n}_att_mask") for n in ("g2g", "g2l", "l2g", "l2l"))
    g2g_i, g2l_i, l2g_i, l2l_i = (getattr(side, f"{n}_relative_att_ids") for n in ("g2g", "g2l", "l2g", "l2l"))
    last_global = max(num_global - 1, 0)
    has_global = num_global > 0

    def split(q_idx, kv_idx):
        q_global, k_global = q_idx < num_global, kv_idx < num_global
        qg, kg = q_idx.clamp(max=last_global), kv_idx.clamp(max=last_global)
        ql, kl = (q_idx - num_global).clamp(min=0), (kv_idx - num_global).clamp(min=0)
        column = kl - ql + radius
        in_window = (column >= 0) & (column <= 2 * radius)
        return q_global, k_global, qg, kg, ql, kl, column.clamp(0, 2 * radius), in_window

    def by_region(tensors, b, q_idx, kv_idx, long_long_extra=None):
        g2g, g2l, l2g, l2l = tensors
        q_global, k_global, qg, kg, ql, kl, column, in_window = split(q_idx, kv_idx)
        local = l2l[b, ql, column]
        if long_long_extra is not None:
            local = long_long_extra(local, in_window)
        if not has_global:
            return local
        from_global = torch.where(k_global, g2g[b, qg, kg], g2l[b, qg, kl])
        from_long = torch.where(k_global, l2g[b, ql, kg], local)
        return torch.where(q_global, from_global, from_long)

    def mask_mod(b, h, q_idx, kv_idx):
        value = by_region((g2g_m, g2l_m, l2g_m, l2l_m), b, q_idx, kv_idx, lambda local, inside: torch.where(inside, local, 0))
        return value != 0

    def label_of(b, q_idx, kv_idx):
        return by_region((g2g_i, g2l_i, l2g_i, l2l_i), b, q_idx, kv_idx)

    return mask_mod, label_of


def prepare(side: SideInputs, num_global: int, num_long: int, *, compile_mask: bool = True) -> FlexPlan:
    """Build the BlockMask from the side inputs (the per-batch cost FlexAttention adds)."""
    if not available():
        raise RuntimeError("this torch has no torch.nn.attention.flex_attention; use backend='blocked'")
    side = side.map(lambda t: t.long())  # index math in int64, as the generated kernels expect
    mask_mod, label_of = _region_lookups(side, num_global, num_long)
    size = num_global + num_long
    batch = side.l2l_att_mask.shape[0]
    device = side.l2l_att_mask.device
    try:
        block_mask = create_block_mask(mask_mod, batch, None, size, size, device=device, _compile=compile_mask)
    except Exception as err:  # noqa: BLE001 - any compile failure falls back to the eager build
        if not compile_mask:
            raise
        warnings.warn(f"compiled BlockMask build failed ({type(err).__name__}: {err}); building it eagerly", stacklevel=2)
        block_mask = create_block_mask(mask_mod, batch, None, size, size, device=device, _compile=False)
    return FlexPlan(block_mask, label_of, num_global, num_long)


def _run_flex(q, k, v, score_mod, block_mask, scale, compiled: bool):
    """Compiled FlexAttention when possible; eager (slow, but correct) with a warning otherwise."""
    global _compiled, _compile_failed
    if compiled and not _compile_failed:
        try:
            if _compiled is None:
                _compiled = torch.compile(flex_attention, dynamic=False)
            return _compiled(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale)
        except Exception as err:  # noqa: BLE001 - the documented fallback
            _compile_failed = True
            warnings.warn(f"torch.compile of flex_attention failed ({type(err).__name__}: {err}); running FlexAttention eagerly", stacklevel=3)
    with warnings.catch_warnings():  # torch's advice to compile: the caller chose eager, or we warned
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale)


def attention(
    global_q: torch.Tensor,
    global_k: torch.Tensor,
    global_v: torch.Tensor,
    long_q: torch.Tensor,
    long_k: torch.Tensor,
    long_v: torch.Tensor,
    side: SideInputs,
    rel_key_table: torch.Tensor,
    rel_bias_table: torch.Tensor | None,
    scale: float,
    *,
    plan: FlexPlan | None = None,
    compiled: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Global-local attention by FlexAttention; returns (global_out [B,H,G,d], long_out [B,H,L,d]).

    `plan` (from `prepare`) reuses a BlockMask; `compiled=False` runs FlexAttention eagerly.
    """
    from graphattn.kernels.blocked import label_tables

    num_global, num_long = global_q.shape[2], long_q.shape[2]
    states = (global_q, global_k, global_v, long_q, long_k, long_v)
    on_cpu = long_q.device.type == "cpu"
    params = [*states, rel_key_table] + ([rel_bias_table] if rel_bias_table is not None else [])
    if on_cpu and torch.is_grad_enabled() and any(t.requires_grad for t in params):
        raise RuntimeError("FlexAttention has no backward on CPU; use backend='blocked' (the CPU default) to train")
    if plan is None:
        plan = prepare(side, num_global, num_long, compile_mask=compiled)
    out_dtype = long_q.dtype
    if on_cpu:
        states = tuple(t.float() for t in states)  # CPU flex kernels: fp32
    q, k, v = (torch.cat([states[i], states[i + 3]], dim=2) for i in range(3))
    stat_dtype = torch.promote_types(q.dtype, torch.float32)
    table = label_tables(q.to(stat_dtype), rel_key_table.to(stat_dtype), None if rel_bias_table is None else rel_bias_table.to(stat_dtype), scale)
    label_of = plan.label_of

    def score_mod(score, b, h, q_idx, kv_idx):
        return score + table[b, h, q_idx, label_of(b, q_idx, kv_idx)]

    out = _run_flex(q, k, v, score_mod, plan.block_mask, scale, compiled).to(out_dtype)
    return out[:, :, :num_global], out[:, :, num_global:]
