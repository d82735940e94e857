"""Triton backend of global-local (ETC) attention: fused forward and backward kernels.

    e_ij = (q_i . k_j + q_i . a^K[label_ij]) * scale + b[label_ij],   -inf where the mask is 0

with two softmaxes: a global query over [g2g row ; g2l row], a long query over [l2g row ; l2l
window]. Fully masked rows give zeros. Softmax statistics are fp32 for fp32, fp16 and bf16.

The label term enters as a per-query table qab = scale * q a^K^T + b ([B, H, n, V], one small
einsum per query kind, so autograd carries its gradient to q, a^K and b) that the kernels
gather by label id. The kernels (triton_forward.py, triton_backward.py) see only q, k, v, qab
and pre-masked label tables; the block tables that let programs skip empty tiles come from
triton_blocks.py and can be built ahead of time (`g2l_key_blocks`).

Supported head dims: 16, 32, 64, 128. Runs on CUDA tensors, or on CPU tensors under
TRITON_INTERPRET=1 (how the tests check it).
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from graphattn.contract import SideInputs
from graphattn.errors import BatchError
from graphattn.kernels.triton_backward import backward
from graphattn.kernels.triton_blocks import (
    AttentionPlan,
    BlockSizes,
    KeyBlocks,
    default_block_sizes,
    g2l_key_blocks,
    interpreter_active,
    make_plan,
    nonempty_key_blocks,
)
from graphattn.kernels.request import PlanRequest
from graphattn.kernels.triton_forward import forward

__all__ = ["attention", "plan", "run", "g2l_key_blocks", "nonempty_key_blocks", "KeyBlocks", "BlockSizes", "SUPPORTED_HEAD_DIMS"]

SUPPORTED_HEAD_DIMS = (16, 32, 64, 128)
SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _check_states(states: dict[str, torch.Tensor]) -> tuple[int, int, int, int, int]:
    """(B, H, G, L, d) of the six [B, H, n, d] states, or a BatchError naming the odd one."""
    first = states["global_q"]
    if first.dim() != 4:
        raise BatchError(f"expected [B, H, G, d], got shape {tuple(first.shape)}", path=("global_q",))
    batch, heads, _, head_dim = first.shape
    lengths = {}
    for name, tensor in states.items():
        if tensor.dim() != 4 or (tensor.shape[0], tensor.shape[1], tensor.shape[3]) != (batch, heads, head_dim):
            raise BatchError(f"expected [{batch}, {heads}, n, {head_dim}] like global_q, got {tuple(tensor.shape)}", path=(name,))
        if tensor.dtype != first.dtype:
            raise BatchError(f"dtype {tensor.dtype} differs from global_q's {first.dtype}", path=(name,))
        if tensor.device != first.device:
            raise BatchError(f"device {tensor.device} differs from global_q's {first.device}", path=(name,))
        lengths.setdefault("global_q" if name == "global_q" else name.split("_")[0], set()).add(tensor.shape[2])
    for kind, sizes in lengths.items():
        if len(sizes) != 1:
            raise BatchError(f"{kind} q, k and v have different lengths {sorted(sizes)}", path=(f"{kind}_q",))
    if lengths["global_q"] != lengths["global"] and min(lengths["global_q"]) > min(lengths["global"]):
        raise BatchError(f"global_q has more rows than global_k / global_v {sorted(lengths['global'])}", path=("global_q",))
    if head_dim not in SUPPORTED_HEAD_DIMS:
        raise BatchError(f"head dim {head_dim} is not supported by the triton kernels; use one of {SUPPORTED_HEAD_DIMS}", path=("global_q",))
    if first.dtype not in SUPPORTED_DTYPES:
        raise BatchError(f"dtype {first.dtype} is not supported; use float32, float16 or bfloat16", path=("global_q",))
    if first.device.type != "cuda" and not interpreter_active():
        raise BatchError(
            f"the triton backend runs on CUDA tensors (or on CPU with TRITON_INTERPRET=1 set before triton is imported); got {first.device}",
            path=("global_q",),
        )
    return batch, heads, lengths["global_q"].pop(), lengths["long"].pop(), head_dim


def _check_side_shapes(side: SideInputs, batch: int, n_global: int, n_long: int, n_keys: int | None = None) -> None:
    """Shapes of the eight side inputs against the states (no device sync)."""
    radius = side.local_radius
    n_keys = n_global if n_keys is None else n_keys
    expected = {
        "l2l": (batch, n_long, 2 * radius + 1),
        "g2g": (batch, n_global, n_keys),
        "l2g": (batch, n_long, n_keys),
        "g2l": (batch, n_global, n_long),
    }
    for prefix, shape in expected.items():
        for suffix in ("att_mask", "relative_att_ids"):
            name = f"{prefix}_{suffix}"
            tensor = getattr(side, name)
            if not isinstance(tensor, torch.Tensor) or tuple(tensor.shape) != shape:
                got = tuple(tensor.shape) if hasattr(tensor, "shape") else type(tensor).__name__
                raise BatchError(f"expected a torch tensor of shape {shape}, got {got}", path=("side", name))


def _check_side_labels(side: SideInputs, n_labels: int) -> None:
    """Every label id a mask lets through indexes the table (one device sync for all four)."""
    prefixes = ("l2l", "g2g", "l2g", "g2l")
    outside = []
    for prefix in prefixes:
        ids = getattr(side, f"{prefix}_relative_att_ids")
        outside.append(((ids < 0) | (ids >= n_labels)) & (getattr(side, f"{prefix}_att_mask") != 0))
    flags = torch.stack([o.any() for o in outside]).tolist()
    for prefix, bad_ids, flag in zip(prefixes, outside, flags):
        if flag:
            bad = getattr(side, f"{prefix}_relative_att_ids")[bad_ids][0].item()
            raise BatchError(f"label id {bad} is outside the relative key table of {n_labels} labels", path=("side", f"{prefix}_relative_att_ids"))


def _check_tables(rel_key_table: torch.Tensor, rel_bias_table: torch.Tensor | None, heads: int, head_dim: int) -> int:
    if rel_key_table.dim() != 3 or tuple(rel_key_table.shape[1:]) != (heads, head_dim):
        raise BatchError(f"expected a^K of shape [V, {heads}, {head_dim}], got {tuple(rel_key_table.shape)}", path=("rel_key_table",))
    n_labels = rel_key_table.shape[0]
    if rel_bias_table is not None and tuple(rel_bias_table.shape) != (n_labels, heads):
        raise BatchError(f"expected a bias of shape [{n_labels}, {heads}], got {tuple(rel_bias_table.shape)}", path=("rel_bias_table",))
    return n_labels


def _label_scores(q: torch.Tensor, rel_key_table: torch.Tensor, rel_bias_table: torch.Tensor | None, scale: float) -> torch.Tensor:
    """qab[b, h, i, v] = scale * q_i . a^K[v, h] + b[v, h], fp32: the label term for every label at
    once (ETC appendix A), so the kernels gather instead of building a^K per pair. Autocast is
    off here: it would run the einsum in half precision."""
    with torch.autocast(device_type=q.device.type, enabled=False):
        table = torch.einsum("bhnd,vhd->bhnv", q.float(), rel_key_table.float()) * scale
        if rel_bias_table is not None:
            table = table + rel_bias_table.float().t()[None, :, None, :]
    return table.contiguous()


class _GlobalLocalAttention(torch.autograd.Function):
    """Fused kernels for both query kinds; saves q, k, v, qab, o and lse, nothing per pair."""

    @staticmethod
    def forward(ctx, global_q, global_k, global_v, long_q, long_k, long_v, qab_global, qab_long, plan: AttentionPlan, scale: float):
        states = {"q_g": global_q, "k_g": global_k, "v_g": global_v, "q_l": long_q, "k_l": long_k, "v_l": long_v,
                  "qab_g": qab_global, "qab_l": qab_long}
        out = forward(states, plan, scale)
        ctx.save_for_backward(*states.values(), *out.values())
        ctx.names = (*states, *out)
        ctx.plan, ctx.scale = plan, scale
        return out["o_g"], out["o_l"]

    @staticmethod
    @once_differentiable
    def backward(ctx, d_global_out, d_long_out):
        saved = dict(zip(ctx.names, ctx.saved_tensors))
        saved["do_g"], saved["do_l"] = d_global_out.contiguous(), d_long_out.contiguous()
        g = backward(saved, ctx.plan, ctx.scale)
        return g["dq_g"], g["dk_g"], g["dv_g"], g["dq_l"], g["dk_l"], g["dv_l"], g["dqab_g"], g["dqab_l"], None, None


def check_states(states: dict[str, torch.Tensor]) -> None:
    """What the kernels need of the states beyond the general checks: head dim, dtype, device."""
    _check_states(states)


def plan(request: PlanRequest) -> AttentionPlan:
    """Masked label tables and block lists of a batch (labels were range-checked by the caller).

    Options: `block_sizes` (BlockSizes) overrides the tiles; `g2l_key_blocks` is a precomputed
    `g2l_key_blocks(side.g2l_att_mask)` for those tiles."""
    options = dict(request.options)
    sizes = options.pop("block_sizes", None) or default_block_sizes()
    blocks = options.pop("g2l_key_blocks", None)
    if options:
        raise TypeError(f"unknown triton-backend options: {', '.join(sorted(options))}")
    return make_plan(request.dense_side(), request.vocab_size, sizes, blocks)


def run(plan: AttentionPlan, states, rel_key_table: torch.Tensor, rel_bias_table: torch.Tensor | None, scale: float):
    """One layer's attention through the fused kernels; differentiable in every tensor."""
    global_q, long_q = states[0], states[3]
    qab_global = _label_scores(global_q, rel_key_table, rel_bias_table, scale)
    qab_long = _label_scores(long_q, rel_key_table, rel_bias_table, scale)
    states = [t.contiguous() for t in states]
    return _GlobalLocalAttention.apply(*states, qab_global, qab_long, plan, float(scale))


@torch.compiler.disable  # opaque Triton launches: a compiled model calls them eagerly
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
    g2l_key_blocks: KeyBlocks | None = None,
    *,
    block_sizes: BlockSizes | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Global-local attention through the fused Triton kernels, checked, planned and run in one call.

    States are [B, H, n, d] (G global, L long tokens), `side` the batched torch side inputs,
    `rel_key_table` a^K [V, H, d], `rel_bias_table` b [V, H] or None. `g2l_key_blocks` is an
    optional precomputed `g2l_key_blocks(side.g2l_att_mask)`; `block_sizes` overrides the tile
    sizes (tests use it to cross tile edges with few tokens). Returns (global_out, long_out).
    A model that calls attention once per layer should use `graphattn.kernels.prepare_attention`,
    which builds the plan once per batch.
    """
    states = {"global_q": global_q, "global_k": global_k, "global_v": global_v, "long_q": long_q, "long_k": long_k, "long_v": long_v}
    batch, heads, n_global, n_long, head_dim = _check_states(states)
    n_labels = _check_tables(rel_key_table, rel_bias_table, heads, head_dim)
    _check_side_shapes(side, batch, n_global, n_long, global_k.shape[2])
    _check_side_labels(side, n_labels)
    plan_ = make_plan(side.map(lambda t: t.to(global_q.device)), n_labels, block_sizes or default_block_sizes(), g2l_key_blocks)
    return run(plan_, tuple(states.values()), rel_key_table, rel_bias_table, scale)
