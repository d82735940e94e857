"""Triton backend of global-local (ETC) attention: fused forward and backward kernels.

    e_ij = (q_i . k_j + q_i . a^K[label_ij]) * scale + b[label_ij],   -inf where the mask is 0

with two softmaxes: a global query over [g2g row ; g2l row], a long query over [l2g row ; l2l
window]. Fully masked rows give zeros. Softmax statistics are fp32 for fp32, fp16 and bf16.

The label term enters as a per-query table qab = scale * q a^K^T + b ([B, H, n, V], one small
einsum per query kind, so autograd carries its gradient to q, a^K and b) that the kernels
gather by label id. The kernels (forward.py, dq.py, dkdv.py, launched from launches.py) derive
labels and masks in registers from the batch's compact structure, or read pre-masked dense tables
when only dense side inputs were given (labels.py); the block tables that let programs skip empty
tiles come from blocks.py. Tiles per GPU architecture, and what is refused before launch, are in
config.py.

Supported head dims: 16, 32, 64, 128; at most 128 relative labels. Runs on CUDA tensors (compute
capability 8.0 or newer), or on CPU tensors under TRITON_INTERPRET=1 (how the tests check it).
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from graphattn.compact import CompactBatch
from graphattn.contract import SideInputs
from graphattn.errors import BatchError
from graphattn.kernels.request import PlanRequest
from graphattn.kernels.triton.blocks import (
    AttentionPlan,
    BlockSizes,
    KeyBlocks,
    TileConfig,
    default_block_sizes,
    g2l_key_blocks,
    interpreter_active,
    make_plan,
    make_structured_plan,
    nonempty_key_blocks,
)
from graphattn.kernels.triton.config import (
    SUPPORTED_HEAD_DIMS,
    SharedMemoryExceeded,
    check_shared_memory,
    tile_candidates,
)
from graphattn.kernels.triton.launches import backward, dkdv_launch, dq_launches, forward, forward_launch

__all__ = [
    "attention",
    "plan",
    "run",
    "g2l_key_blocks",
    "nonempty_key_blocks",
    "KeyBlocks",
    "BlockSizes",
    "SUPPORTED_HEAD_DIMS",
]

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
NATIVE_COMPACT = True  # labels and masks come from the CompactBatch in registers
MAX_LABELS = 128  # dq keeps a [rows, labels] register tile of label gradients


def _check_states(states: dict[str, torch.Tensor]) -> tuple[int, int, int, int, int]:
    """(B, H, G, L, d) of the six [B, H, n, d] states, or a BatchError naming the odd one."""
    first = states["global_q"]
    if first.dim() != 4:
        raise BatchError(f"expected [B, H, G, d], got shape {tuple(first.shape)}", path=("global_q",))
    batch, heads, _, head_dim = first.shape
    lengths = {}
    for name, tensor in states.items():
        if tensor.dim() != 4 or (tensor.shape[0], tensor.shape[1], tensor.shape[3]) != (batch, heads, head_dim):
            raise BatchError(
                f"expected [{batch}, {heads}, n, {head_dim}] like global_q, got {tuple(tensor.shape)}", path=(name,)
            )
        if tensor.dtype != first.dtype:
            raise BatchError(f"dtype {tensor.dtype} differs from global_q's {first.dtype}", path=(name,))
        if tensor.device != first.device:
            raise BatchError(f"device {tensor.device} differs from global_q's {first.device}", path=(name,))
        lengths.setdefault("global_q" if name == "global_q" else name.split("_")[0], set()).add(tensor.shape[2])
    for kind, sizes in lengths.items():
        if len(sizes) != 1:
            raise BatchError(f"{kind} q, k and v have different lengths {sorted(sizes)}", path=(f"{kind}_q",))
    if lengths["global_q"] != lengths["global"] and min(lengths["global_q"]) > min(lengths["global"]):
        raise BatchError(
            f"global_q has more rows than global_k / global_v {sorted(lengths['global'])}", path=("global_q",)
        )
    if head_dim not in SUPPORTED_HEAD_DIMS:
        raise BatchError(
            f"head dim {head_dim} is not supported by the triton kernels; use one of {SUPPORTED_HEAD_DIMS}",
            path=("global_q",),
        )
    if first.dtype not in SUPPORTED_DTYPES:
        raise BatchError(f"dtype {first.dtype} is not supported; use float32, float16 or bfloat16", path=("global_q",))
    if first.device.type != "cuda" and not interpreter_active():
        raise BatchError(
            "the triton backend runs on CUDA tensors (or on CPU with TRITON_INTERPRET=1 set before triton is "
            f"imported); got {first.device}",
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
            raise BatchError(
                f"label id {bad} is outside the relative key table of {n_labels} labels",
                path=("side", f"{prefix}_relative_att_ids"),
            )


def _check_tables(rel_key_table: torch.Tensor, rel_bias_table: torch.Tensor | None, heads: int, head_dim: int) -> int:
    if rel_key_table.dim() != 3 or tuple(rel_key_table.shape[1:]) != (heads, head_dim):
        raise BatchError(
            f"expected a^K of shape [V, {heads}, {head_dim}], got {tuple(rel_key_table.shape)}", path=("rel_key_table",)
        )
    n_labels = rel_key_table.shape[0]
    if rel_bias_table is not None and tuple(rel_bias_table.shape) != (n_labels, heads):
        raise BatchError(
            f"expected a bias of shape [{n_labels}, {heads}], got {tuple(rel_bias_table.shape)}",
            path=("rel_bias_table",),
        )
    return n_labels


def _label_scores(
    q: torch.Tensor, rel_key_table: torch.Tensor, rel_bias_table: torch.Tensor | None, scale: float
) -> torch.Tensor:
    """qab[b, h, i, v] = scale * q_i . a^K[v, h] + b[v, h], fp32: the label term for every label at
    once (ETC appendix A), so the kernels gather instead of building a^K per pair. Autocast is
    off here: it would run the einsum in half precision."""
    with torch.autocast(device_type=q.device.type, enabled=False):
        table = torch.einsum("bhnd,vhd->bhnv", q.float(), rel_key_table.float()) * scale
        if rel_bias_table is not None:
            table = table + rel_bias_table.float().t()[None, :, None, :]
    return table.contiguous()


class _GlobalLocalAttention(torch.autograd.Function):
    """Fused kernels for both query kinds; saves q, k, v, qab, o and the row statistics, nothing per pair."""

    @staticmethod
    def forward(
        ctx,
        global_q,
        global_k,
        global_v,
        long_q,
        long_k,
        long_v,
        qab_global,
        qab_long,
        plan: AttentionPlan,
        scale: float,
    ):
        states = {
            "q_g": global_q,
            "k_g": global_k,
            "v_g": global_v,
            "q_l": long_q,
            "k_l": long_k,
            "v_l": long_v,
            "qab_g": qab_global,
            "qab_l": qab_long,
        }
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


class TritonPlan:
    """A batch's structure for the Triton kernels, and an AttentionPlan per tile configuration.

    The tiles depend on the GPU, the head dim and the states' precision, which a layer's call
    reveals; the plan for the expected ones is built when the batch is prepared, another (a
    different dtype, or a candidate a GPU's shared memory forced) when first needed, without a
    host-device synchronisation."""

    def __init__(
        self,
        structure: SideInputs | CompactBatch,
        n_labels: int,
        device: torch.device,
        sizes: BlockSizes | TileConfig | None = None,
        g2l_blocks: KeyBlocks | None = None,
    ):
        if n_labels > MAX_LABELS:
            raise BatchError(
                f"the triton kernels take at most {MAX_LABELS} relative labels, this model has {n_labels}; "
                "use attention_backend='flex' or 'blocked'",
                path=("rel_key_table",),
            )
        self.structure, self.n_labels, self.device = structure, n_labels, device
        self.sizes, self.g2l_blocks = sizes, g2l_blocks
        self._plans: dict[TileConfig, AttentionPlan] = {}
        self._chosen: dict[tuple, AttentionPlan] = {}

    def _build(self, tiles: TileConfig) -> AttentionPlan:
        if tiles not in self._plans:
            if isinstance(self.structure, CompactBatch):
                self._plans[tiles] = make_structured_plan(self.structure, self.n_labels, tiles)
            else:
                self._plans[tiles] = make_plan(self.structure, self.n_labels, tiles, self.g2l_blocks)
        return self._plans[tiles]

    def for_states(self, dtype: torch.dtype, head_dim: int) -> AttentionPlan:
        """The plan whose tiles launch on this device for states of `dtype` and `head_dim`."""
        key = (dtype, head_dim)
        if key in self._chosen:
            return self._chosen[key]
        if self.sizes is not None or self.device.type != "cuda":
            sizes = self.sizes or default_block_sizes()
            chosen = self._build(sizes if isinstance(sizes, TileConfig) else TileConfig.uniform(sizes))
        else:
            chosen = self._first_that_fits(tile_candidates(self.device, head_dim, dtype), dtype, head_dim)
        self._chosen[key] = chosen
        return chosen

    def _first_that_fits(self, candidates: list[TileConfig], dtype: torch.dtype, head_dim: int) -> AttentionPlan:
        """The first candidate whose three kernels compile within the GPU's shared memory."""
        error = None
        for tiles in candidates:
            plan = self._build(tiles)
            try:
                _check_kernels(plan, dtype, head_dim, self.device)
                return plan
            except SharedMemoryExceeded as err:
                error = err
        raise error


def _check_kernels(plan: AttentionPlan, dtype: torch.dtype, head_dim: int, device: torch.device) -> None:
    """Compile-only check of forward, dq and dk/dv before anything runs (dtypes for tensors)."""
    f32 = torch.float32
    t = {f"{name}_{kind}": dtype for name in ("q", "k", "v", "o", "do", "dq", "dk", "dv") for kind in "gl"}
    t.update({f"{name}_{kind}": f32 for name in ("qab", "dqab", "stats", "delta") for kind in "gl"})
    launches = [
        forward_launch(t, plan, 1.0, 1, 1, head_dim, dtype),
        *dq_launches(t, plan, 1.0, 1, 1, head_dim, dtype),
        dkdv_launch(t, plan, 1.0, 1, 1, head_dim, dtype),
    ]
    for kernel, grid, args, constants in launches:
        check_shared_memory(kernel, grid, args, constants, device)


def plan(request: PlanRequest) -> TritonPlan:
    """The batch's Triton plan (labels were range-checked by the caller); the compact structure
    is read natively. Options: `block_sizes` (BlockSizes or TileConfig) overrides the tiles;
    `g2l_key_blocks` is a precomputed `g2l_key_blocks(side.g2l_att_mask)` for those tiles
    (dense side inputs only). The plan for the request's expected dtype (default bf16) is built now."""
    options = dict(request.options)
    sizes = options.pop("block_sizes", None)
    blocks = options.pop("g2l_key_blocks", None)
    dtype = request.dtype or torch.bfloat16
    if options:
        raise TypeError(f"unknown triton-backend options: {', '.join(sorted(options))}")
    structure = request.compact if request.side is None else request.side
    triton_plan = TritonPlan(structure, request.vocab_size, request.device, sizes, blocks)
    if request.head_dim in SUPPORTED_HEAD_DIMS:
        triton_plan.for_states(dtype, request.head_dim)
    return triton_plan


def run(
    plan: TritonPlan | AttentionPlan,
    states,
    rel_key_table: torch.Tensor,
    rel_bias_table: torch.Tensor | None,
    scale: float,
    *,
    global_tables: tuple[torch.Tensor, torch.Tensor | None] | None = None,
):
    """One layer's attention through the fused kernels; differentiable in every tensor.
    `global_tables` = (a^K, b) of the global queries when they have their own."""
    global_q, long_q = states[0], states[3]
    if isinstance(plan, TritonPlan):
        plan = plan.for_states(long_q.dtype, long_q.shape[-1])
    qab_global = _label_scores(global_q, *(global_tables or (rel_key_table, rel_bias_table)), scale)
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
    block_sizes: BlockSizes | TileConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Global-local attention through the fused Triton kernels, checked, planned and run in one call.

    States are [B, H, n, d] (G global, L long tokens), `side` the batched torch side inputs,
    `rel_key_table` a^K [V, H, d], `rel_bias_table` b [V, H] or None. `g2l_key_blocks` is an
    optional precomputed `g2l_key_blocks(side.g2l_att_mask)`; `block_sizes` overrides the tile
    sizes (tests use it to cross tile edges with few tokens). Returns (global_out, long_out).
    A model that calls attention once per layer should use `graphattn.kernels.prepare_attention`,
    which builds the plan once per batch.
    """
    states = {
        "global_q": global_q,
        "global_k": global_k,
        "global_v": global_v,
        "long_q": long_q,
        "long_k": long_k,
        "long_v": long_v,
    }
    batch, heads, n_global, n_long, head_dim = _check_states(states)
    n_labels = _check_tables(rel_key_table, rel_bias_table, heads, head_dim)
    _check_side_shapes(side, batch, n_global, n_long, global_k.shape[2])
    _check_side_labels(side, n_labels)
    triton_plan = TritonPlan(
        side.map(lambda t: t.to(global_q.device)), n_labels, global_q.device, block_sizes, g2l_key_blocks
    )
    return run(triton_plan, tuple(states.values()), rel_key_table, rel_bias_table, scale)
