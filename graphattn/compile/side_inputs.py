"""ETC-compatible side inputs: the eight attention masks and relative-label tensors.

`side_inputs` and `fixed_block_side_inputs` take and return what etcmodel's
`make_global_local_transformer_side_inputs` and `make_fixed_block_side_inputs` do, value for
value, so that users can check one against the other. Both are assembled from the small
building blocks below (the label ids from `graphattn.labels`, the window and segment arrays from
`graphattn.compact`, re-exported here), which the graph compiler reuses with its own labels:

    example_ids_from_breakpoints   breakpoints (1 = last token of a packed document) -> ids
    relative_position_ids          key - query distance -> clipped relative id (0 | 1..k | k+1..2k)
    window_view                    per-token values seen through the local window [.., L, 2r+1]
    l2l_window                     local mask and relative ids [.., L, 2r+1]
    same_segment                   1 where query and key carry the same segment id [.., Q, K]
    owner_labels                   belongs / does-not-belong between long tokens and globals
    restrict_to_owner              hard masks in place, with ETC's ignore_hard_* row exceptions
    allocate_side_inputs           the eight output arrays as views of one buffer (fewer page faults)

Conventions (docs/DESIGN.md §3): masks are 1 = may attend; a packed document and the padding
after the last breakpoint are each one "example", and nothing attends across examples (so
padding attends to padding, as in the reference); l2l column c is key i + c - r, and keys
outside [0, L) are masked; l2g/g2l ids are 2k+1 (does not belong) and 2k+2 (belongs). Hard
masks change masks, never ids. With relative_pos_max_distance 0 the reference returns no
relative ids, and so does this module (the four id fields are None).

Everything is int32 numpy arithmetic with broadcasting; the only Python loops run per batch
row. The entry points accept numpy arrays, lists or torch tensors, batched [B, ...] or
single [...] (no batch dim), and return the kind they were given.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from graphattn.compact import SideInputError, _flat_view, allocate_side_inputs, l2l_window, same_segment
from graphattn.compact import window_view as window_view  # re-exported (a building block, see above)
from graphattn.contract import SideInputs
from graphattn.labels import (
    belongs_id,
    does_not_belong_id,
    full_relative_ids,
)
from graphattn.labels import relative_position_ids as relative_position_ids  # re-exported (a building block)


# -- building blocks --------------------------------------------------------------------------
def example_ids_from_breakpoints(breakpoints: Any) -> np.ndarray:
    """Example ids from end-of-document breakpoints: the count of breakpoints at or after a token.

    Documents are numbered from the end (the last packed document is 1) and the padding after
    the last breakpoint gets 0, so padding is an example of its own, as in the reference.
    """
    flipped = np.flip(np.asarray(breakpoints, dtype=np.int32), axis=-1)
    return np.flip(np.cumsum(flipped, axis=-1, dtype=np.int32), axis=-1)


def owner_labels(
    owner: Any,
    global_length: int,
    *,
    belongs: int = 1,
    does_not_belong: int = 0,
    global_major: bool = False,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Belongs / does-not-belong between each long token and each global position.

    `owner[..., l]` is the global position that owns long token l; values outside
    [0, global_length) own nothing. Returns [.., L, G] (l2g layout) or, with `global_major`,
    [.., G, L] (g2l layout, built directly rather than transposed, which would cost a copy).
    With belongs=1 / does_not_belong=0 it is the hard mask's one-hot.
    """
    owner = np.asarray(owner, dtype=np.int32)
    *batch, long_length = owner.shape
    rows = owner.reshape(int(np.prod(batch, dtype=np.int64)), long_length)
    shape = (rows.shape[0], global_length, long_length) if global_major else (rows.shape[0], long_length, global_length)
    if out is None:
        out = np.empty((*batch, *shape[1:]), dtype=np.int32)
    flat = _flat_view(out, shape, "out")
    flat.fill(does_not_belong)
    b, l = np.nonzero((rows >= 0) & (rows < global_length))
    g = rows[b, l]
    if global_major:
        flat[b, g, l] = belongs
    else:
        flat[b, l, g] = belongs
    return out


def restrict_to_owner(mask: np.ndarray, owner: Any, exempt: Any = None, *, global_major: bool = False) -> np.ndarray:
    """Apply a hard mask in place: keep only each long token's entry at its owner.

    `mask` is [.., L, G] (hard l2g) or, with `global_major`, [.., G, L] (hard g2l); `owner` is
    [.., L] as in `owner_labels`. Rows whose `exempt` flag is 1 ([.., L] for l2g, [.., G] for
    g2l) keep all their entries: ETC's ignore_hard_* exception for CLS, question or candidate
    tokens. Equal to ``mask * (owner one-hot OR exempt row)``, without building the one-hot.
    """
    owner = np.asarray(owner, dtype=np.int32)
    rows = owner.reshape(int(np.prod(owner.shape[:-1], dtype=np.int64)), owner.shape[-1])
    global_length = mask.shape[-2] if global_major else mask.shape[-1]
    flat = _flat_view(mask, (rows.shape[0], *mask.shape[-2:]), "mask")
    b, l = np.nonzero((rows >= 0) & (rows < global_length))
    g = rows[b, l]
    at_owner = (b, g, l) if global_major else (b, l, g)
    kept = flat[at_owner]
    if exempt is None:
        flat.fill(0)
    else:
        flat[np.asarray(exempt).reshape(flat.shape[:2]) != 1] = 0
    flat[at_owner] = kept
    return mask


# -- argument checking and array kinds ---------------------------------------------------------
def _check_int(value: Any, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise SideInputError(f"{name} must be an integer, got {type(value).__name__}")
    if value < minimum:
        kind = "positive" if minimum == 1 else "non-negative"
        raise SideInputError(f"{name} must be {kind}, got {value}")
    return int(value)


def _as_int32(value: Any, name: str) -> np.ndarray:
    if hasattr(value, "detach") and hasattr(value, "cpu"):  # torch
        value = value.detach().cpu().numpy()
    array = np.asarray(value)
    integral = np.issubdtype(array.dtype, np.integer) or array.dtype == np.bool_
    if array.dtype == object or not (integral or array.size == 0):  # `[[]]` arrives as float64
        raise SideInputError(f"{name} must hold integers, got dtype {array.dtype}")
    return array.astype(np.int32, copy=False)


def _check_zero_one(array: np.ndarray, name: str) -> None:
    if np.any((array != 0) & (array != 1)):
        bad = tuple(int(i) for i in np.argwhere((array != 0) & (array != 1))[0])
        raise SideInputError(f"{name} must hold only 0 and 1, found {int(array[bad])} at index {list(bad)}")


def _check_shape(array: np.ndarray, name: str, shape: tuple[int, ...], like: str) -> None:
    if array.shape != shape:
        raise SideInputError(f"{name} has shape {list(array.shape)} but {like} has {list(shape)}; they must match")


def _torch_device(*values: Any) -> Any:
    """The device of the first torch tensor among the arguments, or None for numpy inputs."""
    for value in values:
        if hasattr(value, "detach") and hasattr(value, "device"):
            return value.device
    return None


def _restore(array: np.ndarray | None, device: Any, squeeze: bool) -> Any:
    if array is None:
        return None
    if squeeze:
        array = array[0]
    if device is None:
        return array
    import torch

    return torch.from_numpy(np.ascontiguousarray(array)).to(device)


def _finish(side: SideInputs, device: Any, squeeze: bool) -> SideInputs:
    return SideInputs(**{name: _restore(value, device, squeeze) for name, value in side.as_dict().items()})


# -- the reference's entry points --------------------------------------------------------------
def _build(
    long_example_ids: np.ndarray,
    global_example_ids: np.ndarray,
    sentence_ids: np.ndarray,
    local_radius: int,
    max_distance: int,
    use_hard_g2l_mask: bool,
    ignore_hard_g2l_mask: np.ndarray | None,
    use_hard_l2g_mask: bool,
    ignore_hard_l2g_mask: np.ndarray | None,
) -> SideInputs:
    """The eight tensors from checked, batched int32 example ids ([B, L], [B, G])."""
    batch_size, long_length = long_example_ids.shape
    global_length = global_example_ids.shape[-1]
    out = allocate_side_inputs(batch_size, long_length, global_length, local_radius, with_ids=max_distance > 0)
    l2l_window(
        long_example_ids, local_radius, max_distance, out_mask=out.l2l_att_mask, out_ids=out.l2l_relative_att_ids
    )
    same_segment(global_example_ids, global_example_ids, out=out.g2g_att_mask)
    same_segment(long_example_ids, global_example_ids, out=out.l2g_att_mask)
    same_segment(global_example_ids, long_example_ids, out=out.g2l_att_mask)
    if use_hard_g2l_mask:
        restrict_to_owner(out.g2l_att_mask, sentence_ids, ignore_hard_g2l_mask, global_major=True)
    if use_hard_l2g_mask:
        restrict_to_owner(out.l2g_att_mask, sentence_ids, ignore_hard_l2g_mask)
    if max_distance > 0:
        out.g2g_relative_att_ids[...] = full_relative_ids(global_length, max_distance)
        labels = dict(belongs=belongs_id(max_distance), does_not_belong=does_not_belong_id(max_distance))
        owner_labels(sentence_ids, global_length, out=out.l2g_relative_att_ids, **labels)
        owner_labels(sentence_ids, global_length, global_major=True, out=out.g2l_relative_att_ids, **labels)
    return out


def _prepare(
    long_ids: Any,
    global_ids: Any,
    sentence_ids: Any,
    ignore_g2l: Any,
    ignore_l2g: Any,
    names: tuple[str, str],
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None, bool]:
    """Convert, check shapes, and add a batch dim when the inputs have none."""
    long_name, global_name = names
    long_ids = _as_int32(long_ids, long_name)
    global_ids = _as_int32(global_ids, global_name)
    sentence_ids = _as_int32(sentence_ids, "sentence_ids")
    if long_ids.ndim not in (1, 2):
        raise SideInputError(
            f"{long_name} must be [batch, long_length] or [long_length], got shape {list(long_ids.shape)}"
        )
    _check_shape(sentence_ids, "sentence_ids", long_ids.shape, long_name)
    if global_ids.ndim != long_ids.ndim or global_ids.shape[:-1] != long_ids.shape[:-1]:
        raise SideInputError(
            f"{global_name} has shape {list(global_ids.shape)}, which does not share the batch of "
            f"{long_name} {list(long_ids.shape)}"
        )
    if ignore_g2l is not None:
        ignore_g2l = _as_int32(ignore_g2l, "ignore_hard_g2l_mask")
        _check_shape(ignore_g2l, "ignore_hard_g2l_mask", global_ids.shape, global_name)
        _check_zero_one(ignore_g2l, "ignore_hard_g2l_mask")
    if ignore_l2g is not None:
        ignore_l2g = _as_int32(ignore_l2g, "ignore_hard_l2g_mask")
        _check_shape(ignore_l2g, "ignore_hard_l2g_mask", long_ids.shape, long_name)
        _check_zero_one(ignore_l2g, "ignore_hard_l2g_mask")
    squeeze = long_ids.ndim == 1
    if squeeze:
        long_ids, global_ids, sentence_ids = long_ids[None], global_ids[None], sentence_ids[None]
        ignore_g2l = None if ignore_g2l is None else ignore_g2l[None]
        ignore_l2g = None if ignore_l2g is None else ignore_l2g[None]
    return long_ids, global_ids, sentence_ids, ignore_g2l, ignore_l2g, squeeze


def _entry(
    kind: str,
    long_values: Any,
    global_values: Any,
    sentence_ids: Any,
    local_radius: Any,
    max_distance: Any,
    hard: tuple,
) -> SideInputs:
    """The body of both entry points: `kind` says whether the values are breakpoints or example ids."""
    local_radius = _check_int(local_radius, "local_radius", 1)
    max_distance = _check_int(max_distance, "relative_pos_max_distance", 0)
    use_g2l, ignore_g2l, use_l2g, ignore_l2g = hard
    device = _torch_device(long_values, global_values, sentence_ids)
    names = (f"long_{kind}", f"global_{kind}")
    long_ids, global_ids, owners, ignore_g2l, ignore_l2g, squeeze = _prepare(
        long_values, global_values, sentence_ids, ignore_g2l, ignore_l2g, names
    )
    if kind == "breakpoints":
        _check_zero_one(long_ids, names[0])
        _check_zero_one(global_ids, names[1])
        long_ids, global_ids = example_ids_from_breakpoints(long_ids), example_ids_from_breakpoints(global_ids)
    else:
        for array, name in zip((long_ids, global_ids), names):
            if array.size and array.min() < 0:
                raise SideInputError(f"{name} must be non-negative, found {int(array.min())}")
    side = _build(long_ids, global_ids, owners, local_radius, max_distance, use_g2l, ignore_g2l, use_l2g, ignore_l2g)
    return _finish(side, device, squeeze)


def side_inputs_from_example_ids(
    long_example_ids: Any,
    global_example_ids: Any,
    sentence_ids: Any,
    local_radius: int,
    relative_pos_max_distance: int,
    use_hard_g2l_mask: bool = False,
    ignore_hard_g2l_mask: Any = None,
    use_hard_l2g_mask: bool = False,
    ignore_hard_l2g_mask: Any = None,
) -> SideInputs:
    """The eight side inputs from example ids (etcmodel's ``..._from_example_ids``).

    Every packed example, and the padding, needs its own non-negative id; tokens attend only
    within their id (a 0/1 input mask is a valid special case). `sentence_ids[..., l]` is the
    global position that owns long token l. ``ignore_hard_*`` (0/1, [.., G] and [.., L]) exempt
    global / long tokens from the hard mask; they matter only when that hard mask is on.
    """
    hard = (use_hard_g2l_mask, ignore_hard_g2l_mask, use_hard_l2g_mask, ignore_hard_l2g_mask)
    return _entry(
        "example_ids", long_example_ids, global_example_ids, sentence_ids, local_radius, relative_pos_max_distance, hard
    )


def side_inputs(
    long_breakpoints: Any,
    global_breakpoints: Any,
    sentence_ids: Any,
    local_radius: int,
    relative_pos_max_distance: int,
    use_hard_g2l_mask: bool = False,
    ignore_hard_g2l_mask: Any = None,
    use_hard_l2g_mask: bool = False,
    ignore_hard_l2g_mask: Any = None,
) -> SideInputs:
    """The eight side inputs from breakpoints, as etcmodel's `make_global_local_transformer_side_inputs`.

    Breakpoints are 0/1 with a 1 on the last token of each packed document ([B, L] long,
    [B, G] global); tokens after the last 1 are padding. `sentence_ids` [B, L] names the global
    position that owns each long token (any value for padding). Shapes in, shapes out:
    l2l [B, L, 2r+1], g2g [B, G, G], l2g [B, L, G], g2l [B, G, L], all int32.
    """
    hard = (use_hard_g2l_mask, ignore_hard_g2l_mask, use_hard_l2g_mask, ignore_hard_l2g_mask)
    return _entry(
        "breakpoints", long_breakpoints, global_breakpoints, sentence_ids, local_radius, relative_pos_max_distance, hard
    )


def fixed_block_layout(input_mask: np.ndarray, num_tokens_per_block: int) -> tuple[np.ndarray, np.ndarray]:
    """One global per block of N long tokens: (sentence_ids [.., L], global_input_mask [.., G]).

    G = ceil(L / N); long token l belongs to global l // N (padding included); a global is
    real (1) when its block holds at least one real token.
    """
    input_mask = np.asarray(input_mask, dtype=np.int32)
    long_length = input_mask.shape[-1]
    global_length = -(-long_length // num_tokens_per_block)
    padded = np.zeros((*input_mask.shape[:-1], global_length * num_tokens_per_block), dtype=np.int32)
    padded[..., :long_length] = input_mask
    blocks = padded.reshape(*input_mask.shape[:-1], global_length, num_tokens_per_block)
    global_input_mask = np.minimum(blocks.max(axis=-1, initial=0), 1).astype(np.int32)
    owner = np.arange(long_length, dtype=np.int32) // np.int32(num_tokens_per_block)
    return np.broadcast_to(owner, input_mask.shape).copy(), global_input_mask


class FixedBlockSideInputs(NamedTuple):
    """What etcmodel's `make_fixed_block_side_inputs` returns, in its order (unpacks as a pair)."""

    side_inputs: SideInputs
    global_token_ids: Any  # [B, G] int32: global_token_id for real blocks, 0 for padding


def fixed_block_side_inputs(
    input_mask: Any,
    num_tokens_per_block: int,
    local_radius: int,
    relative_pos_max_distance: int,
    use_hard_g2l_mask: bool = False,
    use_hard_l2g_mask: bool = False,
    global_token_id: int = 1,
) -> FixedBlockSideInputs:
    """Side inputs for the structure-free "fixed blocks" layout, from a BERT input mask.

    One global token per `num_tokens_per_block` long tokens; the input mask itself is the
    example id (1 real, 0 padding), so real tokens attend to real ones and padding to padding.
    Returns ``(side_inputs, global_token_ids)`` like the reference.
    """
    blocks = _check_int(num_tokens_per_block, "num_tokens_per_block", 1)
    local_radius = _check_int(local_radius, "local_radius", 1)
    max_distance = _check_int(relative_pos_max_distance, "relative_pos_max_distance", 0)
    token_id = _check_int(global_token_id, "global_token_id", 0)
    device = _torch_device(input_mask)
    mask = _as_int32(input_mask, "input_mask")
    if mask.ndim not in (1, 2):
        raise SideInputError(f"input_mask must be [batch, long_length] or [long_length], got shape {list(mask.shape)}")
    _check_zero_one(mask, "input_mask")
    squeeze = mask.ndim == 1
    if squeeze:
        mask = mask[None]
    owners, global_mask = fixed_block_layout(mask, blocks)
    side = _build(
        mask, global_mask, owners, local_radius, max_distance, use_hard_g2l_mask, None, use_hard_l2g_mask, None
    )
    global_token_ids = (global_mask * np.int32(token_id)).astype(np.int32)
    return FixedBlockSideInputs(_finish(side, device, squeeze), _restore(global_token_ids, device, squeeze))
