"""Input checks for `global_local_attention`, run before any kernel.

A shape mistake inside a kernel surfaces as an index error deep in gather or a Triton launch;
here it becomes a `BatchError` that names the tensor, its shape and what was expected.
"""

from __future__ import annotations

import numpy as np
import torch

from graphattn.contract import SIDE_INPUT_NAMES, SideInputs
from graphattn.errors import BatchError

STATE_NAMES = ("global_q", "global_k", "global_v", "long_q", "long_k", "long_v")


def _shape(t: torch.Tensor) -> str:
    return "[" + ", ".join(str(s) for s in t.shape) + "]"


def _fail(name: str, message: str) -> None:
    raise BatchError(message, path=(name,))


def as_torch_side(side: SideInputs, device: torch.device) -> SideInputs:
    """Side inputs as torch tensors on `device` (numpy arrays and other devices are accepted)."""
    if not isinstance(side, SideInputs):
        raise BatchError(f"side must be a graphattn SideInputs, got {type(side).__name__}", path=("side",))

    def convert(name: str, x) -> torch.Tensor:
        if isinstance(x, np.ndarray):
            x = torch.from_numpy(np.ascontiguousarray(x))
        if not isinstance(x, torch.Tensor):
            _fail(f"side.{name}", f"expected a tensor or numpy array, got {type(x).__name__}")
        return x.to(device)

    return SideInputs(**{name: convert(name, getattr(side, name)) for name in SIDE_INPUT_NAMES})


def check_states(states: dict[str, torch.Tensor]) -> tuple[int, int, int, int, int, int]:
    """Check q/k/v of both sequences; returns (B, H, G, G_keys, L, d).

    global_k / global_v may have more rows than global_q (G_keys >= G): the extra global slots
    are keys only. Per-kind keys and values (l2g_*: global tokens, g2l_*: long tokens) may be
    given too."""
    for name, t in states.items():
        if not isinstance(t, torch.Tensor):
            _fail(name, f"expected a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            _fail(name, f"expected [batch, heads, length, head_dim], got shape {_shape(t)}")
        if not t.is_floating_point():
            _fail(name, f"expected a floating dtype, got {t.dtype}")
    glob, long = states["global_q"], states["long_q"]
    batch, heads, num_global, dim = glob.shape
    num_keys = states["global_k"].shape[2]
    num_long = long.shape[2]
    if num_keys < num_global:
        _fail(
            "global_k",
            f"has {num_keys} rows but global_q has {num_global}: every global query is also a key (extra key rows are "
            "allowed)",
        )
    for name, t in states.items():
        length = num_long if name.startswith(("long", "g2l")) else num_global if name == "global_q" else num_keys
        expected = (batch, heads, length, dim)
        if tuple(t.shape) != expected:
            _fail(
                name,
                f"shape {_shape(t)} disagrees with global_q {_shape(glob)} / long_q {_shape(long)}: expected "
                f"[{', '.join(map(str, expected))}]",
            )
        if t.dtype != glob.dtype:
            _fail(name, f"dtype {t.dtype} differs from global_q's {glob.dtype}; cast all states to one dtype")
        if t.device != glob.device:
            _fail(name, f"on {t.device} but global_q is on {glob.device}")
    if num_long == 0:
        _fail("long_q", "the long sequence is empty (length 0); every instance needs at least one long token")
    if dim == 0:
        _fail("global_q", "head_dim is 0")
    return batch, heads, num_global, num_keys, num_long, dim


def check_side(
    side: SideInputs,
    batch: int,
    num_global: int,
    num_long: int,
    local_radius: int | None,
    num_global_keys: int | None = None,
) -> int:
    """Check the eight side inputs against the states; returns the radius."""
    num_keys = num_global if num_global_keys is None else num_global_keys
    width = side.l2l_att_mask.shape[-1] if side.l2l_att_mask.dim() == 3 else -1
    if width < 1 or width % 2 == 0:
        _fail(
            "side.l2l_att_mask",
            f"expected [batch, long_length, 2r+1] with an odd last dim, got {_shape(side.l2l_att_mask)}",
        )
    radius = (width - 1) // 2
    if local_radius is not None and local_radius != radius:
        _fail(
            "side.l2l_att_mask",
            f"last dim {width} means local radius {radius}, but the model's local_radius is {local_radius} (expected "
            f"last dim {2 * local_radius + 1})",
        )
    expected = {
        "l2l": (batch, num_long, width),
        "g2g": (batch, num_global, num_keys),
        "l2g": (batch, num_long, num_keys),
        "g2l": (batch, num_global, num_long),
    }
    for name in SIDE_INPUT_NAMES:
        t = getattr(side, name)
        shape = expected[name[:3]]
        if tuple(t.shape) != shape:
            _fail(
                f"side.{name}",
                f"shape {_shape(t)} disagrees with the states (batch {batch}, global {num_global}, long {num_long}): "
                f"expected [{', '.join(map(str, shape))}]",
            )
        if t.is_floating_point() or t.is_complex():
            _fail(f"side.{name}", f"expected an integer (or bool mask) dtype, got {t.dtype}")
    return radius


def check_tables(
    rel_key_table: torch.Tensor,
    rel_bias_table: torch.Tensor | None,
    heads: int,
    dim: int,
    device: torch.device,
    vocab: int | None = None,
    names: tuple[str, str] = ("rel_key_table", "rel_bias_table"),
) -> int:
    """Check a^K [V, H, d] and b [V, H]; returns V (which must equal `vocab` when given: the size
    the label ids were checked against). Tables may be in a wider float dtype than the states
    (fp32 parameters under autocast); kernels compute their terms in fp32. `names` name the two
    tables in errors (a global query side's pair has its own)."""
    key_name, bias_name = names
    if (
        not isinstance(rel_key_table, torch.Tensor)
        or rel_key_table.dim() != 3
        or tuple(rel_key_table.shape[1:]) != (heads, dim)
    ):
        shape = _shape(rel_key_table) if isinstance(rel_key_table, torch.Tensor) else type(rel_key_table).__name__
        _fail(key_name, f"expected [vocab, heads={heads}, head_dim={dim}], got {shape}")
    if vocab is not None and rel_key_table.shape[0] != vocab:
        _fail(
            key_name,
            f"has {rel_key_table.shape[0]} rows but the attention was prepared for a relative vocabulary of {vocab}",
        )
    vocab = rel_key_table.shape[0]
    if vocab == 0:
        _fail(key_name, "the relative vocabulary is empty (V = 0)")
    if not rel_key_table.is_floating_point():
        _fail(key_name, f"expected a floating dtype, got {rel_key_table.dtype}")
    if rel_key_table.device != device:
        _fail(key_name, f"on {rel_key_table.device} but the states are on {device}")
    if rel_bias_table is not None:
        if not isinstance(rel_bias_table, torch.Tensor) or tuple(rel_bias_table.shape) != (vocab, heads):
            shape = (
                _shape(rel_bias_table) if isinstance(rel_bias_table, torch.Tensor) else type(rel_bias_table).__name__
            )
            _fail(bias_name, f"expected [vocab={vocab}, heads={heads}], got {shape}")
        if not rel_bias_table.is_floating_point():
            _fail(bias_name, f"expected a floating dtype, got {rel_bias_table.dtype}")
        if rel_bias_table.device != device:
            _fail(bias_name, f"on {rel_bias_table.device} but the states are on {device}")
    return vocab


def check_label_ids(side: SideInputs, vocab: int) -> None:
    """Every relative id must index the table (masked pairs too: kernels gather them all)."""
    for name in SIDE_INPUT_NAMES:
        if not name.endswith("relative_att_ids"):
            continue
        ids = getattr(side, name)
        if ids.numel() == 0:
            continue
        low, high = (int(x) for x in torch.aminmax(ids))
        if low < 0 or high >= vocab:
            bad = low if low < 0 else high
            where = torch.nonzero((ids < 0) | (ids >= vocab))[0].tolist()
            _fail(
                f"side.{name}",
                f"label id {bad} at index {where} is outside the relative vocabulary of {vocab} (rel_key_table has "
                f"{vocab} rows)",
            )


def check_compact(compact, vocab: int) -> None:
    """A torch CompactBatch: consistent shapes, and every label it can produce inside the table."""
    batch, length, num_global = compact.batch_size, compact.long_length, compact.global_length
    expected = {
        "owners": (batch, compact.owners.shape[1], length),
        "long_segment": (batch, length),
        "long_hard_l2g": (batch, length),
        "global_segment": (batch, num_global),
        "global_blockable": (batch, num_global),
        "global_hard_g2l": (batch, num_global),
        "link_offsets": (batch, length + 1),
        "edge_offsets": (batch, num_global + 1),
    }
    for name, shape in expected.items():
        if tuple(getattr(compact, name).shape) != shape:
            _fail(
                f"compact.{name}",
                f"shape {_shape(getattr(compact, name))} disagrees with long_doc / global_doc: expected {list(shape)}",
            )
    if length == 0:
        _fail("compact.long_doc", "the long sequence is empty (length 0); every instance needs at least one long token")
    for name, limit in (
        ("owners", num_global),
        ("link_long", length),
        ("link_global", num_global),
        ("edge_src", num_global),
        ("edge_dst", num_global),
    ):
        values = getattr(compact, name)
        if values.numel():
            low, high = (int(x) for x in torch.aminmax(values))
            if low < (-1 if name == "owners" else 0) or high >= limit:
                _fail(f"compact.{name}", f"index {low if low < 0 else high} is outside [0, {limit})")
    labels = [compact.belongs, 2 * compact.max_distance] + (
        [compact.cross_segment_label] if compact.cross_segment_label >= 0 else []
    )
    for name in ("link_label", "edge_label"):
        values = getattr(compact, name)
        if values.numel():
            labels += [int(x) for x in torch.aminmax(values)]
    bad = [x for x in labels if x < 0 or x >= vocab]
    if bad:
        _fail(
            "compact",
            f"label id {bad[0]} is outside the relative vocabulary of {vocab} (rel_key_table has {vocab} rows)",
        )


def check_head_dim(backend: str, dim: int, supported) -> None:
    """`supported` is a predicate from the backend (None: any head dim)."""
    if supported is not None and not supported(dim):
        _fail("global_q", f"head_dim {dim} is not supported by the {backend!r} backend")
