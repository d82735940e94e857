"""Attention prepared once per batch, run by every layer.

An encoder calls attention once per layer with one batch's side inputs. Everything that depends
only on them is done here, once: validation (shapes, label ranges: the checks that read tensor
values, i.e. host-device synchronisations on a GPU), the move to the device, and the backend's
plan (the Triton block lists, FlexAttention's BlockMask, the blocked backend's key spans).
`PreparedAttention.attend` then checks only shapes, dtypes and devices (Python metadata, no
synchronisation) and runs the kernels.

    attention = prepare_attention(batch.compact or batch.side, num_heads=12, head_dim=64, vocab_size=32)
    for layer in layers:
        global_out, long_out = attention.attend(global_q, global_k, global_v, long_q, long_k, long_v, a_k, b)

Keys and values may differ per attention kind (`l2g_k`, `g2l_k`, ... of `attend`) and each query
side may have its own relative tables (`global_tables`), which is how etcmodel's unshared
projections run; shared ones are passed once and cost nothing extra.

The structure is given either as the eight dense side inputs (`SideInputs`, torch or numpy) or
as a batch's compact form (`graphattn.compact.CompactBatch`), which no backend expands to
[L, G] tensors unless it has to (the dense oracle, and FlexAttention's mask_mod).

Global key slots past the global queries are keys only (`num_global_keys > num_global`): the
side inputs are then g2g [B, G, G_keys], l2g [B, L, G_keys], g2l [B, G, L], global_k / global_v
have G_keys rows and global_q has G. Nothing is computed for the extra slots' queries (the
compressive memories of graphattn.patterns enter this way).
"""

from __future__ import annotations

import importlib
import math
from types import ModuleType
from typing import Any

import torch

from graphattn.compact import CompactBatch
from graphattn.contract import SideInputs
from graphattn.errors import BatchError
from graphattn.kernels import blocked, dense, flex
from graphattn.kernels.request import AttentionShape, PlanRequest
from graphattn.kernels.validate import (
    as_torch_side,
    check_compact,
    check_head_dim,
    check_label_ids,
    check_side,
    check_states,
    check_tables,
)

BACKENDS = ("auto", "dense", "blocked", "flex", "triton")

__all__ = [
    "BACKENDS",
    "AttentionShape",
    "PlanRequest",
    "PreparedAttention",
    "prepare_attention",
    "resolve_backend",
    "triton_available",
]


def _triton_module() -> ModuleType:
    """The Triton backend, imported on first use so that CPU-only installs never need triton."""
    try:
        return importlib.import_module("graphattn.kernels.triton.attention")
    except ImportError as err:
        raise RuntimeError(
            f"backend='triton' needs triton and graphattn.kernels.triton.attention ({err}); use backend='blocked' on "
            "machines without it"
        ) from err


def triton_available() -> bool:
    try:
        _triton_module()
    except RuntimeError:
        return False
    return True


def resolve_backend(backend: str, device: torch.device, dtype: torch.dtype | None = None) -> str:
    """'auto' -> 'triton' on CUDA when triton imports, else 'blocked'; on CUDA, fp32 states
    without TF32 (which the Triton kernels refuse) go to FlexAttention, or 'blocked' without it."""
    if backend not in BACKENDS:
        raise BatchError(
            f"unknown attention backend {backend!r}; expected one of {', '.join(BACKENDS)}", path=("backend",)
        )
    if backend != "auto":
        return backend
    if device.type != "cuda" or not triton_available():
        return "blocked"
    from graphattn.kernels.triton.config import launches_without_refusal

    if launches_without_refusal(dtype):
        return "triton"
    return "flex" if flex.available() else "blocked"


def backend_module(name: str) -> ModuleType:
    if name == "triton":
        return _triton_module()  # looked up at call time, so that a test can stand in a fake module
    return {"dense": dense, "blocked": blocked, "flex": flex}[name]


def _head_dim_predicate(module: ModuleType):
    """A backend may export supports_head_dim(d) -> bool or SUPPORTED_HEAD_DIMS."""
    if hasattr(module, "supports_head_dim"):
        return module.supports_head_dim
    if hasattr(module, "SUPPORTED_HEAD_DIMS"):
        return lambda d: d in module.SUPPORTED_HEAD_DIMS
    return None


class PreparedAttention:
    """One batch's validated structure and the backend's plan; `attend` runs a layer's attention."""

    def __init__(self, backend: str, module: ModuleType, request: PlanRequest, plan: Any):
        self.backend, self._module, self._plan = backend, module, plan
        self.shape, self.num_heads, self.head_dim, self.vocab_size = (
            request.shape,
            request.num_heads,
            request.head_dim,
            request.vocab_size,
        )
        self.device = request.device
        self.side, self.compact = request.side, request.compact

    def __repr__(self) -> str:
        s = self.shape
        form = "compact" if self.compact is not None else "dense"
        return (
            f"PreparedAttention(backend={self.backend!r}, B={s.batch}, G={s.num_global}, G_keys={s.num_global_keys}, "
            f"L={s.num_long}, r={s.local_radius}, heads={self.num_heads}, d={self.head_dim}, V={self.vocab_size}, "
            f"{form})"
        )

    @property
    def plan(self) -> Any:
        return self._plan

    def attend(
        self,
        global_q: torch.Tensor,
        global_k: torch.Tensor,
        global_v: torch.Tensor,
        long_q: torch.Tensor,
        long_k: torch.Tensor,
        long_v: torch.Tensor,
        rel_key_table: torch.Tensor,
        rel_bias_table: torch.Tensor | None = None,
        scale: float | None = None,
        *,
        l2g_k: torch.Tensor | None = None,
        l2g_v: torch.Tensor | None = None,
        g2l_k: torch.Tensor | None = None,
        g2l_v: torch.Tensor | None = None,
        global_tables: tuple[torch.Tensor, torch.Tensor | None] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(global_out [B, H, G, d], long_out [B, H, L, d]). Checks shapes, dtypes and devices
        against the prepared batch (no tensor values are read) and runs the backend.

        Keys and values per attention kind: `global_k`/`global_v` are the global tokens as global
        queries see them (g2g), `long_k`/`long_v` the long tokens as long queries see them (l2l);
        `l2g_k`/`l2g_v` (global tokens seen by long queries) default to g2g's and `g2l_k`/`g2l_v`
        (long tokens seen by global queries) to l2l's. Tables per query side: (`rel_key_table`,
        `rel_bias_table`) for long queries, `global_tables` = (a^K, b) for global queries
        (default: the long queries' pair). Defaults and aliases (the same tensor object) cost
        nothing; distinct per-kind keys run the backend once per query side (see `_run_sides`)."""
        l2g_k, l2g_v = global_k if l2g_k is None else l2g_k, global_v if l2g_v is None else l2g_v
        g2l_k, g2l_v = long_k if g2l_k is None else g2l_k, long_v if g2l_v is None else g2l_v
        states = dict(
            global_q=global_q, global_k=global_k, global_v=global_v, long_q=long_q, long_k=long_k, long_v=long_v
        )
        per_kind = dict(l2g_k=l2g_k, l2g_v=l2g_v, g2l_k=g2l_k, g2l_v=g2l_v)
        self.check({**states, **per_kind})
        check_tables(
            rel_key_table, rel_bias_table, self.num_heads, self.head_dim, global_q.device, vocab=self.vocab_size
        )
        if global_tables is not None:
            global_key_table, global_bias_table = global_tables
            if global_key_table is rel_key_table and global_bias_table is rel_bias_table:
                global_tables = None
            else:
                check_tables(
                    global_key_table,
                    global_bias_table,
                    self.num_heads,
                    self.head_dim,
                    global_q.device,
                    vocab=self.vocab_size,
                    names=("global_rel_key_table", "global_rel_bias_table"),
                )
        scale = 1.0 / math.sqrt(self.head_dim) if scale is None else float(scale)
        tables = (rel_key_table, rel_bias_table, global_tables)
        if all(per_kind[f"l2g_{x}"] is states[f"global_{x}"] for x in "kv") and all(
            per_kind[f"g2l_{x}"] is states[f"long_{x}"] for x in "kv"
        ):
            return _run(self._module, self._plan, tuple(states.values()), tables, scale, "both")
        global_side = (global_q, global_k, global_v, long_q, g2l_k, g2l_v)
        long_side = (global_q, l2g_k, l2g_v, long_q, long_k, long_v)
        global_out, _ = _run(self._module, self._plan, global_side, tables, scale, "global")
        _, long_out = _run(self._module, self._plan, long_side, tables, scale, "long")
        return global_out, long_out

    def check(self, states: dict[str, torch.Tensor]) -> None:
        """States against the prepared batch: shapes, one dtype, the prepared device."""
        global_q = states["global_q"]
        batch, heads, num_global, num_global_keys, num_long, dim = check_states(states)
        s = self.shape
        got = (batch, heads, num_global, num_global_keys, num_long, dim)
        expected = (s.batch, self.num_heads, s.num_global, s.num_global_keys, s.num_long, self.head_dim)
        if got != expected:
            names = ("batch", "heads", "global queries", "global keys", "long", "head_dim")
            diff = ", ".join(f"{n} {g} (prepared {e})" for n, g, e in zip(names, got, expected) if g != e)
            raise BatchError(
                f"the states do not fit the prepared attention: {diff}; prepare again for this batch",
                path=("global_q",),
            )
        if global_q.device != self.device:
            raise BatchError(
                f"the states are on {global_q.device} but the attention was prepared on {self.device}",
                path=("global_q",),
            )
        if hasattr(self._module, "check_states"):
            self._module.check_states(states)


@torch.compiler.disable  # data-dependent chunking and custom kernels: torch.compile runs around it
def _run(module: ModuleType, plan: Any, states: tuple, tables: tuple, scale: float, queries: str):
    """One backend call. Extra arguments go only to a backend that needs them: per-side tables
    when the global queries have their own, and `queries` ("global" or "long": the side whose
    output is kept) when the call is one of a pair. A backend whose `run` has no `queries`
    computes both sides and the caller drops one."""
    rel_key_table, rel_bias_table, global_tables = tables
    options: dict[str, Any] = {}
    if global_tables is not None:
        options["global_tables"] = global_tables
    if queries != "both" and getattr(module, "QUERY_SIDES", False):
        options["queries"] = queries
    with torch.autocast(device_type=states[0].device.type, enabled=False):  # kernels pick their own precision
        return module.run(plan, states, rel_key_table, rel_bias_table, scale, **options)


def _structure_shape(structure: SideInputs | CompactBatch, local_radius: int | None) -> AttentionShape:
    if isinstance(structure, CompactBatch):
        if local_radius is not None and local_radius != structure.local_radius:
            raise BatchError(
                f"the compact batch has local radius {structure.local_radius}, but the model's local_radius is "
                f"{local_radius}",
                path=("compact", "local_radius"),
            )
        g = structure.global_length
        return AttentionShape(structure.batch_size, g, g, structure.long_length, structure.local_radius)
    g2g, l2l = structure.g2g_att_mask, structure.l2l_att_mask
    if getattr(g2g, "ndim", 0) != 3 or getattr(l2l, "ndim", 0) != 3:
        shapes = {name: list(getattr(structure, name).shape) for name in ("g2g_att_mask", "l2l_att_mask")}
        raise BatchError(f"expected batched side inputs ([B, ...]), got {shapes}", path=("side",))
    return AttentionShape(l2l.shape[0], g2g.shape[1], g2g.shape[2], l2l.shape[1], (l2l.shape[2] - 1) // 2)


@torch.compiler.disable  # reads tensor values (label ranges): run before the compiled layers
def prepare_attention(
    structure: SideInputs | CompactBatch,
    *,
    num_heads: int,
    head_dim: int,
    vocab_size: int,
    backend: str = "auto",
    device: torch.device | str | None = None,
    local_radius: int | None = None,
    dtype: torch.dtype | None = None,
    **options: Any,
) -> PreparedAttention:
    """Validate a batch's structure once and build the backend's plan.

    `structure`: batched `SideInputs` (torch or numpy) or a `CompactBatch`. `vocab_size` is the
    number of rows of the relative key table every layer will pass; `local_radius`, when given,
    must match the structure's. `device` defaults to the structure's; `dtype` is the states'
    expected dtype (the Triton tiles depend on it; another dtype still works). `options` go to the
    backend's plan (blocked: block_size, tile_elements, workers; triton: block_sizes,
    g2l_key_blocks; flex: compiled).
    """
    if not isinstance(structure, (SideInputs, CompactBatch)):
        raise BatchError(
            f"side must be a graphattn SideInputs or CompactBatch, got {type(structure).__name__}", path=("side",)
        )
    if device is None:
        first = structure.long_doc if isinstance(structure, CompactBatch) else structure.l2l_att_mask
        device = first.device if isinstance(first, torch.Tensor) else torch.device("cpu")
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    name = resolve_backend(backend, device, dtype)
    module = backend_module(name)
    check_head_dim(name, head_dim, _head_dim_predicate(module))
    shape = _structure_shape(structure, local_radius)
    if isinstance(structure, CompactBatch):
        compact = structure.to_torch().map(lambda t: t.to(device))
        check_compact(compact, vocab_size)
        side = None
    else:
        compact = None
        side = as_torch_side(structure, device)
        check_side(side, shape.batch, shape.num_global, shape.num_long, local_radius, shape.num_global_keys)
        check_label_ids(side, vocab_size)
    request = PlanRequest(shape, num_heads, head_dim, vocab_size, device, side, compact, dict(options), dtype)
    if not getattr(module, "NATIVE_COMPACT", False):
        request.dense_side()
    return PreparedAttention(name, module, request, module.plan(request))
