"""Global-local attention through torch's FlexAttention, over the concatenated [global; long] sequence.

One softmax per row of the concatenated sequence is exactly ETC's pair of fused softmaxes: a
global query's row is [g2g ; g2l] and a long query's row is [l2g ; l2l window]. The mask_mod and
score_mod read the four side-input blocks by region, so nothing [G+L, G+L] is materialized.

The BlockMask (which key blocks each query block skips, and which it may take whole without
evaluating mask_mod) is built once per batch from the structure graphattn already knows
(`structure.region_tiles`: document and segment ranges, owner spans per level, the band, link
tiles), in O(blocks + L + G + E), and handed to `BlockMask.from_kv_blocks`; dense side inputs
are reduced per block instead. `create_block_mask`, which evaluates mask_mod on every pair, is
kept as `block_mask_from_mask_mod` for comparison (benchmarks/attention.py times both).

Global queries and keys are padded to a multiple of the block size (the padding rows and
columns are masked), so that no block straddles the global/long boundary. torch.compile is used
when it works, else eager with a one-line warning. FlexAttention has no backward on CPU (torch
raises); use the blocked backend to train on CPU.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch

from graphattn.compact import CompactBatch
from graphattn.contract import SideInputs
from graphattn.kernels.request import PlanRequest, direct_request
from graphattn.kernels.structure import RegionTiles, dense_region_tiles, region_tiles

try:
    from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention
except ImportError:  # torch without FlexAttention
    flex_attention = None

BLOCK = 128  # FlexAttention's default sparse block
NATIVE_COMPACT = False  # mask_mod and score_mod read the dense tensors (derived once per batch)

_compiled: Callable | None = None
_compile_failed = False


def available() -> bool:
    return flex_attention is not None


def supports_head_dim(dim: int) -> bool:
    """FlexAttention's kernels tile the head dim: powers of two from 16 (CPU and CUDA)."""
    return dim >= 16 and dim & (dim - 1) == 0


def _padded(n: int) -> int:
    return -(-n // BLOCK) * BLOCK


@dataclass
class FlexPlan:
    """What depends only on the side inputs: the BlockMask and the region lookups."""

    block_mask: BlockMask
    label_of: Callable  # (b, q_idx, kv_idx) -> label id, for score_mod
    num_global: int  # global queries (before padding)
    num_global_keys: int
    num_long: int
    padded_global: int  # rows of the padded global queries
    padded_global_keys: int
    compiled: bool = True  # torch.compile flex_attention (eager when that fails)


def _region_lookups(side: SideInputs, num_global: int, padded_global: int, padded_keys: int):
    """mask_mod and label function over the padded concatenated sequences, indexing the side inputs."""
    radius = side.local_radius
    num_keys = side.g2g_att_mask.shape[-1]
    g2g_m, g2l_m, l2g_m, l2l_m = (getattr(side, f"{n}_att_mask") for n in ("g2g", "g2l", "l2g", "l2l"))
    g2g_i, g2l_i, l2g_i, l2l_i = (getattr(side, f"{n}_relative_att_ids") for n in ("g2g", "g2l", "l2g", "l2l"))
    has_global = padded_global > 0 or padded_keys > 0

    def split(q_idx, kv_idx):
        q_global, k_global = q_idx < padded_global, kv_idx < padded_keys
        qg, kg = q_idx.clamp(max=max(num_global - 1, 0)), kv_idx.clamp(max=max(num_keys - 1, 0))
        ql, kl = (q_idx - padded_global).clamp(min=0), (kv_idx - padded_keys).clamp(min=0)
        column = kl - ql + radius
        in_window = (column >= 0) & (column <= 2 * radius)
        real = ~(q_global & (q_idx >= num_global)) & ~(k_global & (kv_idx >= num_keys))  # padding rows / columns
        return q_global, k_global, qg, kg, ql, kl, column.clamp(0, 2 * radius), in_window, real

    def by_region(tensors, b, q_idx, kv_idx, masks: bool):
        g2g, g2l, l2g, l2l = tensors
        q_global, k_global, qg, kg, ql, kl, column, in_window, real = split(q_idx, kv_idx)
        local = l2l[b, ql, column]
        if masks:
            local = torch.where(in_window, local, 0)
        if not has_global:
            return local
        from_global = torch.where(k_global, g2g[b, qg, kg], g2l[b, qg, kl]) if num_global else local
        from_long = torch.where(k_global, l2g[b, ql, kg], local) if num_keys else local
        value = torch.where(q_global, from_global, from_long)
        return torch.where(real, value, 0) if masks else value

    def mask_mod(b, h, q_idx, kv_idx):
        return by_region((g2g_m, g2l_m, l2g_m, l2l_m), b, q_idx, kv_idx, True) != 0

    def label_of(b, q_idx, kv_idx):
        return by_region((g2g_i, g2l_i, l2g_i, l2l_i), b, q_idx, kv_idx, False)

    return mask_mod, label_of


def _band_tiles(l2l_mask: torch.Tensor, num_long: int) -> RegionTiles:
    """Block any/full of the band of a dense [B, L, 2r+1] mask, by scattering its O(L r) entries."""
    batch, length, width = l2l_mask.shape
    radius = (width - 1) // 2
    tiles = -(-num_long // BLOCK)
    query = torch.arange(length, device=l2l_mask.device)[:, None]
    key = query + torch.arange(-radius, radius + 1, device=l2l_mask.device)[None, :]
    allowed = (l2l_mask != 0) & (key >= 0) & (key < num_long)
    cell = (query // BLOCK * tiles + key.clamp(0, max(num_long - 1, 0)) // BLOCK).expand(batch, -1, -1)
    counts = torch.zeros(batch, tiles * tiles, dtype=torch.int32, device=l2l_mask.device)
    counts.scatter_add_(1, cell.reshape(batch, -1), allowed.reshape(batch, -1).to(torch.int32))
    counts = counts.view(batch, tiles, tiles)
    sizes = (torch.arange(tiles, device=counts.device) * BLOCK + BLOCK).clamp(max=num_long) - torch.arange(
        tiles, device=counts.device
    ) * BLOCK
    return RegionTiles(counts > 0, counts == sizes[:, None] * sizes[None, :])


def _dense_tiles(side: SideInputs, num_long: int) -> dict[str, RegionTiles]:
    return {
        "l2l": _band_tiles(side.l2l_att_mask, num_long),
        "l2g": dense_region_tiles(side.l2g_att_mask, BLOCK, BLOCK),
        "g2l": dense_region_tiles(side.g2l_att_mask, BLOCK, BLOCK),
        "g2g": dense_region_tiles(side.g2g_att_mask, BLOCK, BLOCK),
    }


def _ordered(tiles: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(counts [B, 1, nq] int32, indices [B, 1, nq, nk] int32): the set key blocks first, ascending."""
    counts = tiles.sum(-1, dtype=torch.int32)
    order = torch.sort((~tiles).to(torch.uint8), dim=-1, stable=True).indices.to(torch.int32)
    return counts[:, None].contiguous(), order[:, None].contiguous()


def block_mask_from_structure(
    structure: SideInputs | CompactBatch,
    num_global: int,
    num_global_keys: int,
    num_long: int,
    mask_mod: Callable | None = None,
) -> BlockMask:
    """The BlockMask of the padded [global; long] sequences from per-region tile tables."""
    if isinstance(structure, CompactBatch):
        tiles = {region: region_tiles(structure, region, BLOCK, BLOCK) for region in ("l2l", "l2g", "g2l", "g2g")}
    else:
        tiles = _dense_tiles(structure, num_long)
    # Rows: global query blocks then long; columns: global key blocks then long (empty parts have 0 blocks).
    rows = [[tiles["g2g"], tiles["g2l"]], [tiles["l2g"], tiles["l2l"]]]
    any_ = torch.cat([torch.cat([t.any for t in row], dim=2) for row in rows], dim=1)
    full = torch.cat([torch.cat([t.full for t in row], dim=2) for row in rows], dim=1)
    partial_counts, partial_index = _ordered(any_ & ~full)
    full_counts, full_index = _ordered(full)
    lengths = (_padded(num_global) + num_long, _padded(num_global_keys) + num_long)
    return BlockMask.from_kv_blocks(
        partial_counts, partial_index, full_counts, full_index, BLOCK_SIZE=BLOCK, mask_mod=mask_mod, seq_lengths=lengths
    )


def block_mask_from_mask_mod(side: SideInputs, num_global: int, num_long: int, *, compiled: bool = True) -> BlockMask:
    """torch's `create_block_mask`: mask_mod evaluated over every (query, key) pair (compiled when it
    can be; on failure eager, with a one-line warning). For comparison with the structure build."""
    side = side.map(lambda t: t.long())  # index math in int64, as the generated kernels expect
    num_keys = side.g2g_att_mask.shape[-1]
    mask_mod, _ = _region_lookups(side, num_global, _padded(num_global), _padded(num_keys))
    sizes = (_padded(num_global) + num_long, _padded(num_keys) + num_long)
    batch, device = side.l2l_att_mask.shape[0], side.l2l_att_mask.device
    if compiled:
        try:
            return torch.compile(create_block_mask)(mask_mod, batch, None, *sizes, device=device)
        except Exception as err:  # noqa: BLE001 - any compile failure falls back to the eager build
            _warn_once(
                f"compiled create_block_mask failed ({type(err).__name__}: {_first_line(err)}); building it eagerly"
            )
    return create_block_mask(mask_mod, batch, None, *sizes, device=device)


_warned: set[str] = set()


def _first_line(err: Exception) -> str:
    lines = [line for line in str(err).splitlines() if line.strip()]
    return lines[0][:200] if lines else ""


def _warn_once(message: str) -> None:
    """One line per distinct failure: inductor's compiler errors run to a thousand lines."""
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def _flex_plan(
    side: SideInputs,
    structure: SideInputs | CompactBatch,
    num_global: int,
    num_long: int,
    block_mask: str = "structure",
) -> FlexPlan:
    if not available():
        raise RuntimeError("this torch has no torch.nn.attention.flex_attention; use backend='blocked'")
    side = side.map(lambda t: t.long())  # index math in int64, as the generated kernels expect
    num_keys = side.g2g_att_mask.shape[-1]
    padded, padded_keys = _padded(num_global), _padded(num_keys)
    mask_mod, label_of = _region_lookups(side, num_global, padded, padded_keys)
    if block_mask == "structure":
        mask = block_mask_from_structure(structure, num_global, num_keys, num_long, mask_mod)
    elif block_mask == "mask_mod":
        mask = block_mask_from_mask_mod(side, num_global, num_long)
    else:
        raise ValueError(f"block_mask must be 'structure' or 'mask_mod', got {block_mask!r}")
    return FlexPlan(mask, label_of, num_global, num_keys, num_long, padded, padded_keys)


def plan(request: PlanRequest) -> FlexPlan:
    """The BlockMask (from the compact structure when given, else from the dense masks) and lookups.

    Options: `compiled` (default True: torch.compile flex_attention), `block_mask` ("structure",
    the default, or "mask_mod": torch's create_block_mask, for comparison)."""
    options = dict(request.options)
    compiled = options.pop("compiled", True)
    build = options.pop("block_mask", "structure")
    if options:
        raise TypeError(f"unknown flex-backend options: {', '.join(sorted(options))}")
    structure = request.compact if request.compact is not None else request.dense_side()
    flex_plan = _flex_plan(request.dense_side(), structure, request.shape.num_global, request.shape.num_long, build)
    flex_plan.compiled = compiled
    return flex_plan


def prepare(side: SideInputs, num_global: int, num_long: int) -> FlexPlan:
    """The plan of dense side inputs (tests and benchmarks that call `attention` directly)."""
    return _flex_plan(side, side, num_global, num_long)


def _run_flex(q, k, v, score_mod, block_mask, scale, compiled: bool):
    """Compiled FlexAttention when possible; eager (slow, but correct) with a one-line warning otherwise."""
    global _compiled, _compile_failed
    if compiled and not _compile_failed:
        try:
            if _compiled is None:
                _compiled = torch.compile(flex_attention, dynamic=False)
            return _compiled(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale)
        except Exception as err:  # noqa: BLE001 - the documented fallback
            _compile_failed = True
            _warn_once(
                f"torch.compile of flex_attention failed ({type(err).__name__}: {_first_line(err)}); running "
                "FlexAttention eagerly"
            )
    with warnings.catch_warnings():  # torch's advice to compile: the caller chose eager, or we warned
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale)


def _pad_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    return torch.nn.functional.pad(x, (0, 0, 0, rows - x.shape[2]))


def run(
    plan: FlexPlan,
    states,
    rel_key_table: torch.Tensor,
    rel_bias_table: torch.Tensor | None,
    scale: float,
    *,
    compiled: bool | None = None,
    global_tables: tuple[torch.Tensor, torch.Tensor | None] | None = None,
):
    """`global_tables` = (a^K, b) of the global queries when they have their own."""
    from graphattn.kernels.blocked import label_tables

    global_q, global_k, global_v, long_q, long_k, long_v = states
    compiled = plan.compiled if compiled is None else compiled
    on_cpu = long_q.device.type == "cpu"
    global_key_table, global_bias_table = global_tables or (rel_key_table, rel_bias_table)
    tables = (rel_key_table, rel_bias_table, global_key_table, global_bias_table)
    params = [*states, *(t for t in tables if t is not None)]
    if on_cpu and torch.is_grad_enabled() and any(t.requires_grad for t in params):
        raise RuntimeError("FlexAttention has no backward on CPU; use backend='blocked' (the CPU default) to train")
    out_dtype = long_q.dtype
    if on_cpu:
        states = tuple(t.float() for t in states)  # CPU flex kernels: fp32
    q = torch.cat([_pad_rows(states[0], plan.padded_global), states[3]], dim=2)
    k, v = (torch.cat([_pad_rows(states[i], plan.padded_global_keys), states[i + 3]], dim=2) for i in (1, 2))
    stat_dtype = torch.promote_types(q.dtype, torch.float32)

    def side_table(rows: torch.Tensor, key_table: torch.Tensor, bias_table: torch.Tensor | None) -> torch.Tensor:
        bias = None if bias_table is None else bias_table.to(stat_dtype)
        return label_tables(rows.to(stat_dtype), key_table.to(stat_dtype), bias, scale)

    padded = plan.padded_global
    table = torch.cat(
        [side_table(q[:, :, :padded], global_key_table, global_bias_table), side_table(q[:, :, padded:], *tables[:2])],
        dim=2,
    )
    label_of = plan.label_of

    def score_mod(score, b, h, q_idx, kv_idx):
        return score + table[b, h, q_idx, label_of(b, q_idx, kv_idx)]

    out = _run_flex(q, k, v, score_mod, plan.block_mask, scale, compiled).to(out_dtype)
    return out[:, :, : plan.num_global], out[:, :, plan.padded_global :]


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
    if plan is None:
        request = direct_request(side, global_q, global_k, long_q, rel_key_table)
        plan = prepare(request.dense_side(), request.shape.num_global, request.shape.num_long)
    states = (global_q, global_k, global_v, long_q, long_k, long_v)
    return run(plan, states, rel_key_table, rel_bias_table, scale, compiled=compiled)
