"""Batching: pad compiled instances to common lengths and stack them into torch tensors.

Padding follows the reference: the padded tail is one more document, so padding tokens attend
padding tokens (l2l within the radius, g2g, l2g, g2l) and nothing real attends padding; relative
ids of padding are the plain distance pattern (l2l, g2g) and does_not_belong (l2g, g2l).
`long_input_mask` / `global_input_mask` tell the model which rows are real. Task targets are
padded with TARGET_IGNORE along their per-global axis and stacked otherwise (`_targets`).

Instances compiled compact also give the batch's `CompactBatch` (`EtcBatch.compact`), which the
kernels read directly; `dense_side=False` then skips the eight dense tensors altogether.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from graphattn.compact import CompactBatch, CompactSideInputs, allocate_side_inputs, l2l_window
from graphattn.contract import TARGET_IGNORE, EtcBatch, EtcInstance, SideInputs
from graphattn.errors import BatchError
from graphattn.labels import does_not_belong_id, full_relative_ids


def _target(lengths: list[int], pad_to: int | None, what: str) -> int:
    longest = max(lengths)
    if pad_to is None:
        return longest
    if pad_to < longest:
        raise BatchError(f"pad_to_{what}={pad_to} is shorter than the longest instance ({longest} {what} tokens)")
    return int(pad_to)


def _geometry(instances: Sequence[EtcInstance]) -> tuple[int, int]:
    radii, vocabs = set(), set()
    for inst in instances:
        side = inst.side
        radii.add((side.local_radius, inst.label_vocab.max_distance))
        vocabs.add(tuple(inst.label_vocab.names))
    if len(radii) > 1:
        raise BatchError(
            f"instances disagree on (local_radius, relative_pos_max_distance): {sorted(radii)}; "
            "compile them with one schema"
        )
    if len(vocabs) > 1:
        raise BatchError("instances carry different label vocabularies; compile them with one schema")
    return radii.pop()


def _pad_dense(out: SideInputs, b: int, side: SideInputs, L: int, G: int, radius: int, k: int, dnb: int) -> None:
    """Write one instance's eight tensors into row b of the batch, padding per the reference."""
    n_long, n_global = side.long_length, side.global_length
    pad_doc = np.concatenate([np.zeros(n_long, np.int32), np.ones(L - n_long, np.int32)])
    l2l_window(pad_doc, radius, k, out_mask=out.l2l_att_mask[b], out_ids=out.l2l_relative_att_ids[b])
    out.l2l_att_mask[b, :n_long] = side.l2l_att_mask
    out.g2g_att_mask[b] = 0
    out.g2g_att_mask[b, :n_global, :n_global] = side.g2g_att_mask
    out.g2g_att_mask[b, n_global:, n_global:] = 1
    out.g2g_relative_att_ids[b] = full_relative_ids(G, k)
    out.g2g_relative_att_ids[b, :n_global, :n_global] = side.g2g_relative_att_ids
    for name, rows, cols in (("l2g", n_long, n_global), ("g2l", n_global, n_long)):
        mask_out, ids_out = getattr(out, f"{name}_att_mask"), getattr(out, f"{name}_relative_att_ids")
        mask_out[b] = 0
        mask_out[b, :rows, :cols] = getattr(side, f"{name}_att_mask")
        mask_out[b, rows:, cols:] = 1
        ids_out[b] = dnb
        ids_out[b, :rows, :cols] = getattr(side, f"{name}_relative_att_ids")


def _stack(rows: list[np.ndarray], length: int, fill=0) -> torch.Tensor:
    first = rows[0]
    out = np.full((len(rows), length, *first.shape[1:]), fill, dtype=first.dtype)
    for b, row in enumerate(rows):
        out[b, : row.shape[0]] = row
    return torch.from_numpy(out)


def _targets(instances: list[EtcInstance], G: int) -> dict[str, torch.Tensor]:
    """Each target as one int64 tensor: per-global arrays padded to G with TARGET_IGNORE, the rest stacked."""
    out: dict[str, torch.Tensor] = {}
    first = instances[0]
    for name, axis in first.target_axes.items():
        if any(name not in inst.targets or inst.target_axes.get(name) != axis for inst in instances):
            raise BatchError(f"target {name!r} is missing from some instances; compile them with one schema")
        values = [np.asarray(inst.targets[name]) for inst in instances]
        if axis == "global":
            out[name] = _stack(values, G, TARGET_IGNORE).long()
        elif len({v.shape for v in values}) > 1:
            shapes = sorted({v.shape for v in values})
            raise BatchError(f"target {name!r} has shapes {shapes} across the batch; compile with one schema")
        else:
            out[name] = torch.from_numpy(np.stack(values)).long()
    return out


def _dense_side(instances: list[EtcInstance], L: int, G: int, radius: int, k: int) -> SideInputs:
    dnb = does_not_belong_id(k)
    out = allocate_side_inputs(len(instances), L, G, radius)
    for b, inst in enumerate(instances):
        if isinstance(inst.side, CompactSideInputs):
            inst.side.padded(L, G).write_dense(out.map(lambda a: a[b]))
        else:
            _pad_dense(out, b, inst.side, L, G, radius, k, dnb)
    return out.to_torch()


def collate(
    instances: Sequence[EtcInstance],
    pad_to_long: int | None = None,
    pad_to_global: int | None = None,
    *,
    dense_side: bool = True,
) -> EtcBatch:
    """Pad instances to the longest (or the given) lengths and stack them into an EtcBatch.

    When every instance is compact the batch also carries their `CompactBatch`; `dense_side=False`
    (compact instances only) leaves `side` None, so that memory stays O(B (L + G) + E)."""
    instances = list(instances)
    if not instances:
        raise BatchError("collate needs at least one instance")
    radius, k = _geometry(instances)
    L = _target([i.long_length for i in instances], pad_to_long, "long")
    G = _target([i.global_length for i in instances], pad_to_global, "global")
    all_compact = all(isinstance(inst.side, CompactSideInputs) for inst in instances)
    if not dense_side and not all_compact:
        raise BatchError(
            "dense_side=False needs instances compiled with compact=True (the others carry only dense side inputs)"
        )
    compact = CompactBatch.from_instances([inst.side for inst in instances], L, G).to_torch() if all_compact else None
    features: dict[str, torch.Tensor] = {}
    for name in instances[0].features:
        if any(name not in inst.features for inst in instances):
            raise BatchError(f"feature {name!r} is missing from some instances; compile them with one schema")
        length = G if name.startswith("global:") else L
        features[name] = _stack([inst.features[name] for inst in instances], length)
    ones = lambda n: np.ones(n, np.int32)  # noqa: E731
    return EtcBatch(
        long_token_ids=_stack([i.long_token_ids for i in instances], L),
        long_type_ids=_stack([i.long_type_ids for i in instances], L),
        global_token_ids=_stack([i.global_token_ids for i in instances], G),
        global_type_ids=_stack([i.global_type_ids for i in instances], G),
        long_input_mask=_stack([ones(i.long_length) for i in instances], L),
        global_input_mask=_stack([ones(i.global_length) for i in instances], G),
        side=_dense_side(instances, L, G, radius, k) if dense_side else None,
        vocab_size=len(instances[0].label_vocab),
        features=features,
        compact=compact,
        targets=_targets(instances, G),
    )
