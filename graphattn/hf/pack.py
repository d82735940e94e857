"""Packed documents and prefix trees as model inputs: token ids, position ids, labels and the
structure (`attention_mask`) from one compact form, the segments' preorder intervals.

A packed document is a root segment without children; a prefix tree is segments whose parents
come first. Everything is built from per-segment arrays and `repeat_interleave`, never per token
in Python.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from graphattn.hf import export
from graphattn.hf.inputs import (
    IGNORE,
    MAX_TOKENS,
    ROW_MASKS,
    check_documents,
    check_packing,
    check_rows,
    check_segments,
    check_str,
)
from graphattn.hf.structure import Structure


def _preorder(parents: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Preorder number and subtree end of each segment of a forest whose parents come first."""
    count = len(parents)
    size = np.ones(count, np.int64)
    for s in range(count - 1, -1, -1):  # per segment, not per token: children before parents
        if parents[s] >= 0:
            size[parents[s]] += size[s]
    enter = np.zeros(count, np.int64)
    next_free = np.zeros(count, np.int64)  # where a segment's next child starts
    roots = 0
    for s in range(count):
        p = parents[s]
        if p < 0:
            enter[s] = roots
            roots += size[s]
        else:
            enter[s] = next_free[p]
        next_free[s] = enter[s] + 1
        if p >= 0:
            next_free[p] += size[s]
    return enter, enter + size


def _rows_to_batch(
    rows: list[dict],
    pad_token_id: int,
    causal: bool | None,
    pad_to_multiple_of: int,
    predecessor: bool = False,
    *,
    labels: bool = True,
    extras: Sequence[str] = (),
) -> dict:
    """Stack per-row arrays, padding each to the longest row (padding: segment -1, label -100,
    `extras` columns 0)."""
    width = max(len(r["input_ids"]) for r in rows)
    width = -(-width // pad_to_multiple_of) * pad_to_multiple_of
    if width > MAX_TOKENS:
        raise ValueError(f"a row of {width} tokens is over the limit of {MAX_TOKENS}")
    if len(rows) * width > MAX_TOKENS:
        raise ValueError(f"a batch of {len(rows)} rows x {width} tokens is over the limit of {MAX_TOKENS} tokens")

    def stack(name: str, fill: int) -> torch.Tensor:
        out = np.full((len(rows), width), fill, np.int64)
        for b, r in enumerate(rows):
            out[b, : len(r[name])] = r[name]
        return torch.from_numpy(out)

    positions = stack("position_ids", 0)
    structure = Structure(
        "tree",
        positions,
        causal,
        enter=stack("enter", -1).int(),
        exit=stack("exit", -1).int(),
    )
    batch = {"input_ids": stack("input_ids", pad_token_id), "position_ids": positions, "attention_mask": structure}
    if labels:
        batch["labels"] = stack("labels", IGNORE)
    for name in extras:
        batch[name] = stack(name, 0)
    if predecessor:
        batch["predecessor"] = stack("predecessor", -1)
    return batch


def pack_documents(
    docs: Sequence[Sequence[int]],
    causal: bool | None = None,
    max_length: int | None = None,
    *,
    pad_token_id: int = 0,
    pad_to_multiple_of: int = 1,
    return_labels: bool = False,
    return_flash_kwargs: bool = False,
    return_seq_idx: bool = False,
    pad_documents_to_multiple_of: int = 1,
) -> dict:
    """Token lists packed into rows, no token seeing another document.

    Without `max_length` one row holds every document in the given order; with it, documents fill
    rows in order and a new row starts when the next one does not fit (a longer document is
    refused). Rows are padded to the longest, rounded up to `pad_to_multiple_of` (padding:
    `pad_token_id`, position 0, label -100, attending nothing). Returns `input_ids`, `position_ids`
    (restarting per document) and `attention_mask` (the structure). `causal=None` keeps each layer's
    own rule (bidirectional for an encoder, causal or sliding for a decoder); True / False override
    it as `Structure.causal` says.

    `return_labels=True` adds causal-LM `labels` (the ids, -100 on each document's first token and
    on padding, as transformers' `DataCollatorWithFlattening` makes them); they are not made
    unless asked, so an encoder's MLM head is never handed next-token labels. `return_flash_kwargs`
    / `return_seq_idx` add `cu_seq_lens_q/k`, `max_length_q/k` / `seq_idx` (`graphattn.hf.export`).
    `pad_documents_to_multiple_of=m` pads every document to a multiple of m tokens (THD layout for
    context parallelism) and adds `cu_seq_lens_padded`, TransformerEngine's convention.
    """
    args = check_packing(
        causal=causal,
        max_length=max_length,
        pad_token_id=pad_token_id,
        pad_to_multiple_of=pad_to_multiple_of,
        pad_documents_to_multiple_of=pad_documents_to_multiple_of,
        flags={
            "return_labels": return_labels,
            "return_flash_kwargs": return_flash_kwargs,
            "return_seq_idx": return_seq_idx,
        },
    )
    arrays = check_documents(docs)
    return _pack(arrays, [f"docs[{i}]" for i in range(len(arrays))], args)


def _pack(arrays: list[np.ndarray], names: list[str], args: dict, labels=None, extras=None) -> dict:
    """Checked documents (+ per-document `labels` and `extras` columns) into a batch: rows filled
    greedily in order, each document padded to `pad_documents_to_multiple_of`, then the exports."""
    extras = extras or {}
    lengths = np.array([a.size for a in arrays], np.int64)
    multiple, max_length = args["pad_documents_to_multiple_of"], args["max_length"]
    padded = -(-lengths // multiple) * multiple
    if padded.sum() > MAX_TOKENS:
        raise ValueError(f"{padded.sum()} tokens with padding, over the limit of {MAX_TOKENS}")
    if max_length is not None and (padded > max_length).any():
        i = int(np.argmax(padded > max_length))
        with_padding = f" ({padded[i]} padded to a multiple of {multiple})" if multiple > 1 else ""
        raise ValueError(f"{names[i]}: {lengths[i]} tokens{with_padding} do not fit max_length={max_length}")
    row_of = np.zeros(len(arrays), np.int64)
    if max_length is not None:
        used, row = 0, 0
        for i, n in enumerate(padded):  # per document: greedy in order
            if used + n > max_length:
                row, used = row + 1, 0
            row_of[i], used = row, used + n
    fills = {"input_ids": args["pad_token_id"], "position_ids": 0, "enter": -1, "exit": -1, "labels": IGNORE}
    rows = []
    bounds = np.searchsorted(row_of, np.arange(int(row_of.max()) + 2))  # rows hold consecutive documents
    for row in range(len(bounds) - 1):
        members = np.arange(bounds[row], bounds[row + 1])
        r = _tree_row(
            [-1] * len(members), [arrays[i] for i in members], None if labels is None else [labels[i] for i in members]
        )
        for name, columns in extras.items():
            r[name] = np.concatenate([columns[i] for i in members])
        r.pop("predecessor")  # a tree's; documents are predicted within themselves
        if multiple > 1:
            r = _spread(r, lengths[members], padded[members], fills)
        rows.append(r)
    with_labels = labels is not None or args["return_labels"]
    batch = _rows_to_batch(
        rows, args["pad_token_id"], args["causal"], args["pad_to_multiple_of"], labels=with_labels, extras=list(extras)
    )
    structure, thd = batch["attention_mask"], multiple > 1
    if thd or args["return_flash_kwargs"]:
        kwargs = export.flash_kwargs(structure, thd)
        batch.update(kwargs if args["return_flash_kwargs"] else {"cu_seq_lens_padded": kwargs["cu_seq_lens_padded"]})
    if args["return_seq_idx"]:
        batch["seq_idx"] = export.seq_idx(structure, thd)
    return batch


def _spread(row: dict, lengths: np.ndarray, padded: np.ndarray, fills: dict) -> dict:
    """A row's arrays with each document followed by its padding (to `padded` tokens)."""
    before = np.concatenate([[0], np.cumsum(padded - lengths)[:-1]])
    index = np.arange(lengths.sum()) + np.repeat(before, lengths)
    out = {}
    for name, values in row.items():
        spread = np.full(int(padded.sum()), fills.get(name, 0), np.int64)
        spread[index] = values
        out[name] = spread
    return out


def _tree_row(parents: Sequence[int], tokens: list[np.ndarray], labels: list[np.ndarray] | None = None) -> dict:
    """One row's arrays from its segments (parents first); `labels` per segment where the caller
    brings them (else the ids), -100 on each segment's first token either way."""
    parents = np.asarray(parents, np.int64)
    lengths = np.array([len(t) for t in tokens], np.int64)
    enter, exit_ = _preorder(parents)
    # positions continue from the parent's end: a segment starts at its parent's start + length
    start = np.zeros(len(parents), np.int64)
    for s, p in enumerate(parents):  # per segment
        start[s] = 0 if p < 0 else start[p] + lengths[p]
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    segment = np.repeat(np.arange(len(parents)), lengths)
    within = np.arange(offsets[-1]) - offsets[segment]
    ids = np.concatenate(tokens) if tokens else np.zeros(0, np.int64)
    labels = ids.copy() if labels is None else np.concatenate(labels)
    labels[offsets[:-1][lengths > 0]] = IGNORE
    # the token each token is predicted from: the one before it in its segment, or its parent's last
    parent_last = np.where(parents >= 0, offsets[np.maximum(parents, 0)] + lengths[np.maximum(parents, 0)] - 1, -1)
    predecessor = np.where(within > 0, np.arange(offsets[-1]) - 1, parent_last[segment])
    return {
        "input_ids": ids,
        "position_ids": start[segment] + within,
        "enter": enter[segment],
        "exit": exit_[segment],
        "labels": labels,
        "predecessor": predecessor,
    }


def pack_tree(
    segments: Sequence[tuple[int, Sequence[int]]],
    causal: bool | None = None,
    *,
    pad_token_id: int = 0,
    pad_to_multiple_of: int = 1,
    return_labels: bool = False,
    return_flash_kwargs: bool = False,
    return_seq_idx: bool = False,
) -> dict:
    """A prefix tree in one row: `segments = [(parent_index, tokens), ...]`, parent -1 for a root and
    before its children. Each token sees its ancestors' tokens and its own segment's earlier ones;
    positions continue from the parent's end, so every token computes what it computes in its
    root-to-leaf sequence alone. Returns what `pack_documents` returns plus `predecessor` (the
    index of the token each token is predicted from, -1 for a root's first): use
    `tree_lm_loss`, as a child's first token is predicted from its parent's last. A tree has no
    `cu_seq_lens` / `seq_idx` form: asking for them is refused unless every segment is a root."""
    args = check_packing(
        causal=causal,
        pad_token_id=pad_token_id,
        pad_to_multiple_of=pad_to_multiple_of,
        flags={
            "return_labels": return_labels,
            "return_flash_kwargs": return_flash_kwargs,
            "return_seq_idx": return_seq_idx,
        },
    )
    parents, tokens = check_segments(segments)
    batch = _rows_to_batch(
        [_tree_row(parents, tokens)],
        args["pad_token_id"],
        args["causal"],
        args["pad_to_multiple_of"],
        predecessor=True,
        labels=args["return_labels"],
    )
    if args["return_flash_kwargs"]:
        batch.update(export.flash_kwargs(batch["attention_mask"]))
    if args["return_seq_idx"]:
        batch["seq_idx"] = export.seq_idx(batch["attention_mask"])
    return batch


def tree_lm_loss(logits: torch.Tensor, batch: dict, weight: torch.Tensor | None = None) -> torch.Tensor:
    """Mean next-token loss of a packed tree: token j is predicted from the logits at
    `predecessor[j]`, so every child's first token is trained from its parent's last.
    `weight` [B, N] (e.g. 1 on completion tokens, 0 on the prompt) scales each token's term."""
    predecessor, targets = batch["predecessor"], batch["input_ids"]
    real = predecessor >= 0
    if weight is not None:
        real &= weight != 0
    b, j = real.nonzero(as_tuple=True)
    terms = torch.nn.functional.cross_entropy(logits[b, predecessor[b, j]].float(), targets[b, j], reduction="none")
    if weight is None:
        return terms.mean()
    w = weight[b, j].to(terms.dtype)
    return (terms * w).sum() / w.sum().clamp(min=1e-12)


class PackingCollator:
    """A data collator for transformers.Trainer / TRL: rows of a datasets.Dataset with a token list
    under `input_key` are packed by `pack_documents` into rows of at most `max_length` tokens
    (every row of a batch padded to the longest; `pad_to_multiple_of` to round it).

    It keeps what the rows bring: their `labels` (e.g. TRL's completion-only labels) are packed
    beside the tokens, -100 on each document's first token as transformers'
    `DataCollatorWithFlattening` does; `completion_mask` / `assistant_masks` / `token_type_ids`
    columns are packed too (0 on padding); a row with `seq_lengths` (TRL's packing) is split into its documents.
    Without a `labels` column, causal-LM labels are made only with `return_labels=True` (the
    masks' 0s then become -100); an encoder's batch holds no labels it did not ask for. Other
    columns are not packed. The flags are `pack_documents`'."""

    def __init__(
        self,
        max_length: int | None = None,
        *,
        causal: bool | None = None,
        input_key: str = "input_ids",
        pad_token_id: int = 0,
        pad_to_multiple_of: int = 1,
        return_labels: bool = False,
        return_flash_kwargs: bool = False,
        return_seq_idx: bool = False,
        pad_documents_to_multiple_of: int = 1,
    ):
        self._args = check_packing(
            causal=causal,
            max_length=max_length,
            pad_token_id=pad_token_id,
            pad_to_multiple_of=pad_to_multiple_of,
            pad_documents_to_multiple_of=pad_documents_to_multiple_of,
            flags={
                "return_labels": return_labels,
                "return_flash_kwargs": return_flash_kwargs,
                "return_seq_idx": return_seq_idx,
            },
        )
        self.input_key = check_str(input_key, "input_key")
        self.max_length, self.causal = self._args["max_length"], self._args["causal"]
        self.pad_token_id, self.pad_to_multiple_of = self._args["pad_token_id"], self._args["pad_to_multiple_of"]

    def __call__(self, rows: Sequence[dict]) -> dict:
        docs, names, labels, masks = check_rows(rows, self.input_key)
        folded = [m for name, m in masks.items() if name in ROW_MASKS]
        if labels is None and self._args["return_labels"] and folded:
            keep = [np.logical_and.reduce([m[i] != 0 for m in folded]) for i in range(len(docs))]
            labels = [np.where(k, d, IGNORE) for k, d in zip(keep, docs)]
        return _pack(docs, names, self._args, labels, masks)
