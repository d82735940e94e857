"""Longformer inputs from compiled instances: the long position each global token copies.

A schema declares Longformer's global positions the way it declares any global (see
schemas/longformer.yaml): a `global: per_token` type yields one global per wordpiece, owned by
exactly that long token (`instance.long_owners[type]`), and a `global_prefix` token copies the
`long_prefix` token of the same name in its document. `LongformerEncoder` needs those positions;
everything else it reads from the ordinary EtcBatch.

HF-style inputs (a [B, L] 0/1 global attention mask) convert with `global_positions_from_mask`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from graphattn.compile.batching import collate
from graphattn.contract import EtcBatch, EtcInstance
from graphattn.errors import BatchError, CompileError
from graphattn.schema import Schema, load_schema

__all__ = ["global_copy_positions", "collate_global_positions", "collate_longformer", "global_positions_from_mask"]


def _document_starts(instance: EtcInstance) -> np.ndarray:
    """First long position of each packed document."""
    docs = instance.long_doc_index
    starts = np.full(len(instance.doc_ids), -1, dtype=np.int64)
    first = np.flatnonzero(np.r_[True, docs[1:] != docs[:-1]])
    starts[docs[first]] = first
    return starts


def _prefix_positions(instance: EtcInstance, schema: Schema, positions: np.ndarray) -> None:
    """The k-th global_prefix token of a document copies the long_prefix token of its name."""
    specials = np.flatnonzero(np.asarray(instance.global_node_types, dtype=object) == "special")
    if specials.size == 0:
        return
    global_docs = (
        instance.global_doc_index
        if instance.global_doc_index is not None
        else np.zeros(instance.global_length, np.int32)
    )
    starts = _document_starts(instance)
    for g in specials:  # a few per document
        name = instance.global_node_ids[g].strip("<>")
        if name not in schema.long_prefix:
            raise CompileError(
                f"global prefix token {name!r} (global {g}) has no long copy: "
                "Longformer globals are long positions, and "
                f"long_prefix is {list(schema.long_prefix)}; add {name!r} to long_prefix",
                **schema.where("global_prefix"),
            )
        positions[g] = starts[global_docs[g]] + schema.long_prefix.index(name)


def global_copy_positions(instance: EtcInstance, schema: Schema | str | Any) -> np.ndarray:
    """[G] int64: the long position that global token g of `instance` copies.

    Raises CompileError for a global that copies nothing (a `global: node` type, fixed blocks,
    a prefix token missing from long_prefix), naming it and its type."""
    schema = load_schema(schema)
    positions = np.full(instance.global_length, -1, dtype=np.int64)
    for level in schema.global_types:
        node_type = schema.node_types.get(level)
        if node_type is None or node_type.global_mode != "per_token" or level not in instance.long_owners:
            continue
        owners = np.asarray(instance.long_owners[level])
        copied = np.flatnonzero(owners >= 0)
        positions[owners[copied]] = copied
    _prefix_positions(instance, schema, positions)
    missing = np.flatnonzero(positions < 0)
    if missing.size:
        g = int(missing[0])
        kind = instance.global_node_types[g]
        hint = (
            f"declare type {kind!r} with `global: per_token` (and `long: true`)"
            if kind in schema.node_types
            else "fixed blocks have no long copy"
        )
        raise CompileError(
            f"global {g} ({instance.global_node_ids[g]!r}, type {kind!r}) is not a copy of a long position, "
            "which Longformer "
            f"global attention needs: {hint}; {missing.size} global(s) affected",
            file=schema.source,
            node=instance.global_node_ids[g],
        )
    return positions


def collate_global_positions(
    instances: Sequence[EtcInstance], schema: Schema | str | Any, pad_to_global: int | None = None
) -> torch.Tensor:
    """[B, G] int64 positions of every instance's globals, -1 in the padded slots (G as collate's)."""
    schema = load_schema(schema)
    rows = [global_copy_positions(inst, schema) for inst in instances]
    width = max((r.shape[0] for r in rows), default=0)
    if pad_to_global is not None:
        if pad_to_global < width:
            raise BatchError(
                f"pad_to_global={pad_to_global} is shorter than the longest instance ({width} global tokens)"
            )
        width = pad_to_global
    out = np.full((len(rows), width), -1, dtype=np.int64)
    for b, row in enumerate(rows):
        out[b, : row.shape[0]] = row
    return torch.from_numpy(out)


def collate_longformer(
    instances: Sequence[EtcInstance],
    schema: Schema | str | Any,
    pad_to_long: int | None = None,
    pad_to_global: int | None = None,
) -> tuple[EtcBatch, torch.Tensor]:
    """`collate` plus the [B, G] global positions that LongformerEncoder takes with the batch."""
    batch = collate(instances, pad_to_long, pad_to_global)
    return batch, collate_global_positions(instances, schema, batch.global_token_ids.shape[1])


def global_positions_from_mask(global_mask: torch.Tensor) -> torch.Tensor:
    """HF's [B, L] global attention mask (nonzero = global) -> [B, G] positions in ascending order,
    -1 padded, G the largest count in the batch."""
    is_global = global_mask != 0
    counts = is_global.sum(dim=1)
    width = int(counts.max()) if counts.numel() else 0
    order = torch.sort((~is_global).to(torch.int8), dim=1, stable=True).indices[:, :width]
    filled = torch.arange(width, device=global_mask.device)[None, :] < counts[:, None]
    return torch.where(filled, order, -1)
