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

from graphattn.hf.structure import Structure

IGNORE = -100
MAX_TOKENS = 1 << 24  # one row of a batch; a bigger request is a mistake, refused before allocation


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


def _check_tokens(tokens, where: str) -> np.ndarray:
    array = np.asarray(tokens)
    if array.ndim != 1 or not (array.size == 0 or np.issubdtype(array.dtype, np.integer)):
        raise ValueError(f"{where}: expected a list of integer token ids, got shape {array.shape} dtype {array.dtype}")
    return array.astype(np.int64)


def _rows_to_batch(
    rows: list[dict], pad_token_id: int, causal: bool | None, pad_to_multiple_of: int, predecessor: bool = False
) -> dict:
    """Stack per-row arrays, padding each to the longest row (padding: segment -1, label -100)."""
    width = max(len(r["input_ids"]) for r in rows)
    width = -(-width // pad_to_multiple_of) * pad_to_multiple_of
    if width > MAX_TOKENS:
        raise ValueError(f"a row of {width} tokens is over the limit of {MAX_TOKENS}")

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
    batch["labels"] = stack("labels", IGNORE)
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
) -> dict:
    """Token lists packed into rows, no token seeing another document.

    Without `max_length` one row holds every document in the given order; with it, documents fill
    rows in order and a new row starts when the next one does not fit (a longer document is
    refused). Rows are padded to the longest (padding: `pad_token_id`, position 0, label -100,
    attending nothing). Returns `input_ids`, `position_ids` (restarting per document), `labels`
    (the ids, with -100 on each document's first token, so a causal LM's shifted loss never
    predicts across a boundary) and `attention_mask` (the structure). `causal=None` keeps each layer's
    own rule (bidirectional for an encoder, causal or sliding for a decoder); True / False override
    it as `Structure.causal` says.
    """
    if not docs:
        raise ValueError("pack_documents: no documents")
    arrays = [_check_tokens(d, f"docs[{i}]") for i, d in enumerate(docs)]
    lengths = np.array([len(a) for a in arrays], np.int64)
    if (lengths == 0).any():
        raise ValueError(f"docs[{int(np.argmax(lengths == 0))}]: empty document")
    if max_length is not None:
        if max_length < 1 or max_length > MAX_TOKENS:
            raise ValueError(f"max_length: expected 1..{MAX_TOKENS}, got {max_length}")
        if (lengths > max_length).any():
            i = int(np.argmax(lengths > max_length))
            raise ValueError(f"docs[{i}]: {lengths[i]} tokens do not fit max_length={max_length}")
    row_of = np.zeros(len(arrays), np.int64)
    if max_length is not None:
        used, row = 0, 0
        for i, n in enumerate(lengths):  # per document: greedy in order
            if used + n > max_length:
                row, used = row + 1, 0
            row_of[i], used = row, used + n
    rows = []
    for row in range(int(row_of.max()) + 1):
        members = np.flatnonzero(row_of == row)
        rows.append(_tree_row([-1] * len(members), [arrays[i] for i in members]))
    return _rows_to_batch(rows, pad_token_id, causal, pad_to_multiple_of)


def _tree_row(parents: Sequence[int], tokens: list[np.ndarray]) -> dict:
    """One row's arrays from its segments (parents first)."""
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
    labels = ids.copy()
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
) -> dict:
    """A prefix tree in one row: `segments = [(parent_index, tokens), ...]`, parent -1 for a root and
    before its children. Each token sees its ancestors' tokens and its own segment's earlier ones;
    positions continue from the parent's end, so every token computes what it computes in its
    root-to-leaf sequence alone. Returns what `pack_documents` returns plus `predecessor` (the
    index of the token each token is predicted from, -1 for a root's first): use
    `tree_lm_loss`, as a child's first token is predicted from its parent's last."""
    if not segments:
        raise ValueError("pack_tree: no segments")
    parents, tokens = [], []
    for i, item in enumerate(segments):
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            raise ValueError(f"segments[{i}]: expected (parent_index, tokens)")
        parent = int(item[0])
        if not -1 <= parent < i:
            raise ValueError(f"segments[{i}]: parent {parent} must be -1 or an earlier segment (0..{i - 1})")
        array = _check_tokens(item[1], f"segments[{i}]")
        if array.size == 0:
            raise ValueError(f"segments[{i}]: empty segment")
        parents.append(parent)
        tokens.append(array)
    return _rows_to_batch([_tree_row(parents, tokens)], pad_token_id, causal, pad_to_multiple_of, predecessor=True)


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
    (every row of a batch padded to the longest; `pad_to_multiple_of` to round it)."""

    def __init__(
        self,
        max_length: int | None = None,
        *,
        causal: bool | None = None,
        input_key: str = "input_ids",
        pad_token_id: int = 0,
        pad_to_multiple_of: int = 1,
    ):
        self.max_length, self.causal, self.input_key = max_length, causal, input_key
        self.pad_token_id, self.pad_to_multiple_of = pad_token_id, pad_to_multiple_of

    def __call__(self, rows: Sequence[dict]) -> dict:
        docs = []
        for i, row in enumerate(rows):
            if self.input_key not in row:
                raise ValueError(f"row {i}: no {self.input_key!r} column (columns: {sorted(row)})")
            docs.append(row[self.input_key])
        return pack_documents(
            docs,
            self.causal,
            self.max_length,
            pad_token_id=self.pad_token_id,
            pad_to_multiple_of=self.pad_to_multiple_of,
        )
