"""The host side of the Triton kernels: every launch's (kernel, grid, args, constants), built from
one place, and the forward and backward passes that run them.

The backward has one kernel per concern and no atomics.

Flash-style: the forward saved only outputs and each row's softmax statistics (max m and log2 of
the sum l); probabilities are recomputed tile by tile as p = exp2((s - m) * log2(e) - l), and
with delta_i = o_i . do_i (PyTorch), ds = p * (dp - delta).

Every key receives gradient from two query kinds (a long key from its window's long queries and
from the global queries whose g2l row reaches it; a global key from the long queries via l2g and
the global queries via g2g), so the work is split by owner and every output is written once by
the one program that owns it:

- `_dq_kernel` (`dq.py`; query owner; walks keys exactly as the forward does) writes dq and the label
  gradient d(qab)[i, v] = sum over keys j with label v of ds_ij, accumulated for its rows in a
  [rows, V] register tile (`accumulate_label_grads`) and stored once at the end.
- `_dkdv_kernel` (`dkdv.py`; key owner) walks the query tiles that reach its key tile, in two phases:
  long keys: global queries (per-key-tile g2l table) then the local band; global keys: long
  queries (per-key-tile l2g table) then all global queries. It writes dk and dv once.

Without atomics the gradients are deterministic: two backward passes are bitwise equal. Each
kernel covers both kinds in one launch, long-running global tiles first; the backward recomputes
q.k twice (once per kernel), as FlashAttention-2 does. d a^K and d b follow from d(qab) through
PyTorch autograd (qab = scale * q a^K^T + b is an einsum).
"""

from __future__ import annotations

import torch
import triton

from graphattn.kernels.triton.blocks import interpreter_active
from graphattn.kernels.triton.config import launch
from graphattn.kernels.triton.dkdv import _dkdv_kernel
from graphattn.kernels.triton.dq import _dq_kernel
from graphattn.kernels.triton.forward import _forward_kernel


def dot_options(dtype: torch.dtype) -> dict:
    """Compile-time switches for `_dot`: fp32 runs on TF32 tensor cores when the user allowed
    TF32 (torch.backends.cuda.matmul.allow_tf32), else as IEEE fp32 on the FMA units (the
    smaller tiles of `config.py` keep that variant free of spills); bf16 is upcast under the
    interpreter only."""
    allow_tf32 = torch.backends.cuda.matmul.allow_tf32
    precision = "tf32" if dtype != torch.float32 or allow_tf32 else "ieee"
    return {"UPCAST": interpreter_active() and dtype == torch.bfloat16, "PRECISION": precision}


def program_count(n_global_tiles: int, n_long_tiles: int, batch_heads: int) -> int:
    """Programs of a launch that covers every global tile and every long tile of every head."""
    return (n_global_tiles + n_long_tiles) * batch_heads


# The kernels' arguments, in their order: each kernel's own tensors per kind (global _g, then
# long _l), then what every kernel takes alike (`_shared`).
FORWARD_ROWS = ("q", "o", "stats", "qab")
QUERY_ROWS = ("q", "do", "stats", "delta", "qab")
DQ_ROWS = (*QUERY_ROWS, "dq", "dqab")
KEY_ROWS = ("k", "v")
DKDV_ROWS = ("k", "v", "dk", "dv")


def _tensors(t: dict, names: tuple[str, ...], *kinds: str) -> list:
    return [t[f"{name}_{kind}"] for kind in kinds for name in names]


def _grid(plan, tiles, n_global_rows: int, batch: int, heads: int) -> tuple[int]:
    """One program per tile of `n_global_rows` global rows or of the long rows, per (batch, head)."""
    n_long_tiles = triton.cdiv(plan.n_long, tiles.long_rows)
    return (program_count(triton.cdiv(n_global_rows, tiles.global_rows), n_long_tiles, batch * heads),)


def _shared(plan, lists: dict, order: tuple[str, str], batch: int, heads: int, scale: float) -> tuple:
    """What every kernel takes after its own tensors: the dense label tables, the two tile lists
    (counts, indices) in `order`, the compact structure, then the sizes and the scale."""
    return (
        *plan.tables,
        *(array for name in order for array in (lists[name].counts, lists[name].indices)),
        *plan.structure_tensors,
        plan.n_global,
        plan.n_global_keys,
        plan.n_long,
        batch,
        heads,
        *plan.structure_sizes,
        plan.n_labels,
        plan.radius,
        scale,
    )


def forward_launch(t: dict, plan, scale: float, batch: int, heads: int, head_dim: int, dtype: torch.dtype):
    """(kernel, grid, args, constants) of the forward launch. `t` maps q_g, o_g, stats_g, qab_g,
    q_l, o_l, stats_l, qab_l, k_g, v_g, k_l, v_l to tensors (or, for a compile-only check, to
    their dtypes)."""
    grid = _grid(plan, plan.tiles.forward, plan.n_global, batch, heads)
    args = (
        *_tensors(t, FORWARD_ROWS, "g", "l"),
        *_tensors(t, KEY_ROWS, "g", "l"),
        *_shared(plan, plan.forward_lists, ("g2l", "l2g"), batch, heads, scale),
    )
    return _forward_kernel, grid, args, {**plan.kernel_constants("forward", head_dim, dtype), **dot_options(dtype)}


def forward(states: dict[str, torch.Tensor], plan, scale: float) -> dict[str, torch.Tensor]:
    """Outputs o_g, o_l ([B, H, n, d]) and softmax statistics stats_g, stats_l ([B, H, n, 2]: each
    row's max score and log2 of its sum of exp(score - max); +inf for rows with no key).

    `states` maps q_g, k_g, v_g, q_l, k_l, v_l (contiguous [B, H, n, d]) and qab_g, qab_l
    ([B, H, n, V] fp32) to tensors; g = global, l = long; `plan` is the batch's AttentionPlan.
    """
    q_g, q_l = states["q_g"], states["q_l"]
    batch, heads, _, head_dim = q_l.shape
    out = {"o_g": torch.empty_like(q_g), "o_l": torch.empty_like(q_l)}
    for kind, q in (("g", q_g), ("l", q_l)):
        out[f"stats_{kind}"] = torch.empty((*q.shape[:3], 2), dtype=torch.float32, device=q.device)
    launch(*forward_launch({**states, **out}, plan, scale, batch, heads, head_dim, q_l.dtype))
    return out


def _delta(out: torch.Tensor, d_out: torch.Tensor) -> torch.Tensor:
    """delta_i = o_i . do_i in fp32, the softmax-backward correction of each query row."""
    return (out.float() * d_out.float()).sum(-1).contiguous()


def dq_launch(
    t: dict,
    plan,
    scale: float,
    batch: int,
    heads: int,
    head_dim: int,
    dtype: torch.dtype,
    write: tuple[bool, bool] = (True, True),
):
    """(kernel, grid, args, constants) of a dq launch writing (dq, label gradients) as `write`
    says; `t` as in `forward_launch`, plus do_*, delta_*, dq_* and dqab_*."""
    grid = _grid(plan, plan.tiles.dq, plan.n_global, batch, heads)
    args = (
        *_tensors(t, DQ_ROWS, "g", "l"),
        *_tensors(t, KEY_ROWS, "g", "l"),
        *_shared(plan, plan.dq_lists, ("g2l", "l2g"), batch, heads, scale),
    )
    constants = {
        **plan.kernel_constants("dq", head_dim, dtype),
        **dot_options(dtype),
        "WRITE_DQ": write[0],
        "WRITE_LABEL_GRADS": write[1],
    }
    return _dq_kernel, grid, args, constants


def dq_launches(t: dict, plan, scale: float, batch: int, heads: int, head_dim: int, dtype: torch.dtype) -> list:
    """The dq launches of a plan: one writing both, or (dq, label gradients) apart."""
    if plan.tiles.dq.split_label_grads:
        return [
            dq_launch(t, plan, scale, batch, heads, head_dim, dtype, (True, False)),
            dq_launch(t, plan, scale, batch, heads, head_dim, dtype, (False, True)),
        ]
    return [dq_launch(t, plan, scale, batch, heads, head_dim, dtype)]


def dkdv_launch(t: dict, plan, scale: float, batch: int, heads: int, head_dim: int, dtype: torch.dtype):
    """(kernel, grid, args, constants) of the dk/dv launch; `t` as in `dq_launch`, plus dk_*, dv_*."""
    grid = _grid(plan, plan.tiles.dkdv, plan.n_global_keys, batch, heads)
    args = (
        *_tensors(t, DKDV_ROWS, "g", "l"),
        *_tensors(t, QUERY_ROWS, "g", "l"),
        *_shared(plan, plan.dkdv_lists, ("l2g", "g2l"), batch, heads, scale),
    )
    return _dkdv_kernel, grid, args, {**plan.kernel_constants("dkdv", head_dim, dtype), **dot_options(dtype)}


def backward(saved: dict[str, torch.Tensor], plan, scale: float) -> dict[str, torch.Tensor]:
    """Gradients dq/dk/dv_{g,l} ([B, H, n, d]) and dqab_{g,l} ([B, H, n, V] fp32).

    `saved` holds q, k, v, qab, o, stats and the incoming do for both kinds (suffix _g / _l).
    """
    batch, heads, _, head_dim = saved["q_l"].shape
    dtype = saved["q_l"].dtype
    grads = {f"d{name}_{kind}": torch.empty_like(saved[f"{name}_{kind}"]) for name in "qkv" for kind in "gl"}
    for kind in "gl":
        grads[f"dqab_{kind}"] = torch.empty_like(saved[f"qab_{kind}"])
        saved[f"delta_{kind}"] = _delta(saved[f"o_{kind}"], saved[f"do_{kind}"])
    tensors = {**saved, **grads}
    for dq in dq_launches(tensors, plan, scale, batch, heads, head_dim, dtype):
        launch(*dq)
    launch(*dkdv_launch(tensors, plan, scale, batch, heads, head_dim, dtype))
    return grads
