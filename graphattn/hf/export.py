"""A packed structure in the formats other stacks read, named as they name them.

- varlen (`flash_kwargs`, `seq_idx`): `cu_seq_lens_q` / `cu_seq_lens_k` (int32 offsets), `max_length_q` /
  `max_length_k` (Python ints) and `seq_idx` (int32 [B, N]), as transformers'
  `DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_seq_idx=True)` gives them and as
  FlashAttention's varlen kernels, PyTorch's `varlen_attn` and Mamba / convolution layers read them.
  The offsets index the batch flattened row by row (`input_ids.reshape(-1)`, B * N tokens): every
  document is one sequence and every padding token one more (its position id is 0, where
  transformers and TRL's padding-free collator cut sequences too), so each document computes what
  it computes alone and the offsets cover the whole buffer. For one row without padding this is
  exactly the collator's output; with padding, TRL's `DataCollatorForLanguageModeling(padding_free=True)`'s.
- THD with padded documents (`padded_documents=True`, TransformerEngine's / Megatron's convention
  for context parallelism): `cu_seq_lens_q` / `_k` hold the real lengths' cumulative sums and
  `cu_seq_lens_padded` where each document starts in the flattened buffer (the padding after a
  document, a row's tail included, belongs to its padded extent). These `cu_seq_lens_q` are not
  buffer offsets: give such a batch to a THD consumer, not to transformers' flash path.
- MagiAttention (`magi_ranges`): per row, `(q_ranges, k_ranges, mask_types)` slices.

A prefix tree has no varlen form (a branch sees a prefix it shares with its siblings) and is
refused; so is the schema route's structure. Nothing here imports `Structure`: it is read through
its `kind`, `enter`, `exit` and `causal` fields.
"""

from __future__ import annotations

import numpy as np
import torch

MAX_RANGE_PAIRS = 1 << 24  # (segment, descendant segment) pairs a tree's Magi ranges may enumerate


def _tree_fields(structure, what: str) -> tuple[torch.Tensor, torch.Tensor]:
    if getattr(structure, "kind", None) != "tree":
        raise ValueError(f"{what}: the schema route's structure has no such form (use it as attention_mask)")
    return structure.enter, structure.exit


def _documents_only(structure, what: str) -> torch.Tensor:
    """The flat enter numbers [B * N] of a structure of packed documents; a tree is refused."""
    enter, exit_ = _tree_fields(structure, what)
    real = enter >= 0
    if bool((real & (exit_ - enter != 1)).any()):
        raise ValueError(
            f"{what}: a prefix tree cannot be flattened to cu_seq_lens (its branches share a prefix); "
            "use the structure as attention_mask, its BlockMask, or to_magi_ranges()"
        )
    return enter


def _boundaries(enter: torch.Tensor, with_padding: bool) -> torch.Tensor:
    """[B * N] bool: a new sequence starts here (a row's start, a new document and, where
    `with_padding`, every padding token)."""
    width = enter.shape[1]
    flat = enter.reshape(-1)
    real = flat >= 0
    prev = torch.cat([flat.new_full((1,), -2), flat[:-1]])
    new = flat != prev
    new |= (torch.arange(flat.numel(), device=flat.device) % width) == 0
    if with_padding:
        new |= ~real
    else:
        new &= real
    return new


def flash_kwargs(structure, padded_documents: bool = False) -> dict:
    """`cu_seq_lens_q`, `cu_seq_lens_k` (int32), `max_length_q`, `max_length_k` (ints); with
    `padded_documents` also `cu_seq_lens_padded` (int32), TransformerEngine's THD convention."""
    what = "cu_seq_lens"
    enter = _documents_only(structure, what)
    total = enter.numel()
    if not padded_documents:
        starts = _boundaries(enter, True).nonzero().flatten()
        cu = torch.cat([starts, starts.new_tensor([total])]).to(torch.int32)
        longest = int((cu[1:] - cu[:-1]).max())
        return {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu.clone(), "max_length_q": longest, "max_length_k": longest}
    starts = _boundaries(enter, False).nonzero().flatten()
    if starts.numel() == 0:
        raise ValueError(f"{what}: the structure holds no document")
    if int(starts[0]) != 0:
        raise ValueError(f"{what}: padding before the first document has no padded extent to belong to")
    lengths = torch.bincount(torch.cumsum(_boundaries(enter, False).long(), 0)[enter.reshape(-1) >= 0] - 1)
    cu = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)]).to(torch.int32)
    padded = torch.cat([starts, starts.new_tensor([total])]).to(torch.int32)
    longest = int((padded[1:] - padded[:-1]).max())
    return {
        "cu_seq_lens_q": cu,
        "cu_seq_lens_k": cu.clone(),
        "max_length_q": longest,
        "max_length_k": longest,
        "cu_seq_lens_padded": padded,
    }


def seq_idx(structure, padded_documents: bool = False) -> torch.Tensor:
    """int32 [B, N]: the sequence of `flash_kwargs` (same `padded_documents`) each token lies in."""
    enter = _documents_only(structure, "seq_idx")
    new = _boundaries(enter, not padded_documents)
    if padded_documents and not bool(new[0]):
        raise ValueError("seq_idx: padding before the first document has no padded extent to belong to")
    return (torch.cumsum(new.long(), 0) - 1).to(torch.int32).view(enter.shape)


def _pieces(enter: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Starts and ends of the runs of equal enter numbers among a row's real tokens."""
    real = enter >= 0
    prev = np.concatenate([[-2], enter[:-1]])
    nxt = np.concatenate([enter[1:], [-2]])
    return np.flatnonzero(real & (enter != prev)), np.flatnonzero(real & (enter != nxt)) + 1


def magi_ranges(structure, row: int | None = None, causal: bool | None = None) -> tuple:
    """`(q_ranges, k_ranges, mask_types)` of one row: int32 [n, 2] half-open [start, end) slices of
    the row and "full" / "causal" per slice (causal bottom-right aligned; here every causal slice
    is square). Each segment gives one slice for itself and one per run of its descendants in the
    layout (one when the tree is laid out in preorder): O(segments), never per token. Every allowed
    (query, key) pair is in exactly one slice; padding is in none. The model's own sliding window
    is not part of the slices."""
    enter_all, exit_all = _tree_fields(structure, "to_magi_ranges")
    rows = enter_all.shape[0]
    if row is None:
        if rows != 1:
            raise ValueError(f"to_magi_ranges: the structure has {rows} rows; pass row=0..{rows - 1}")
        row = 0
    if isinstance(row, bool) or not isinstance(row, (int, np.integer)) or not 0 <= row < rows:
        raise ValueError(f"to_magi_ranges: row must be an integer in 0..{rows - 1}, got {row!r}")
    if causal is None:
        causal = structure.causal
    if causal is None:
        raise ValueError(
            "to_magi_ranges: the structure leaves causality to each layer (causal=None); "
            "pass causal=True or causal=False for the slices"
        )
    if not isinstance(causal, bool):
        raise ValueError(f"to_magi_ranges: causal must be None, True or False, got {causal!r}")
    enter = enter_all[row].cpu().numpy().astype(np.int64)
    exit_ = exit_all[row].cpu().numpy().astype(np.int64)
    a, b = _pieces(enter)
    e, x = enter[a], exit_[a]
    # descendants: the pieces whose enter number lies in [e, x); contiguous once sorted by enter
    order = np.argsort(e, kind="stable")
    lo, hi = np.searchsorted(e[order], e, "left"), np.searchsorted(e[order], x, "left")
    counts = hi - lo
    if counts.sum() > MAX_RANGE_PAIRS:
        raise ValueError(f"to_magi_ranges: {counts.sum()} segment pairs, over the limit of {MAX_RANGE_PAIRS}")
    key = np.repeat(np.arange(len(a)), counts)
    within = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    query = order[np.repeat(lo, counts) + within]
    keep = a[query] > a[key] if causal else query != key  # causal: a key is seen only from later tokens
    key, query = key[keep], query[keep]
    by = np.lexsort((a[query], key))  # per key piece, its viewers in layout order
    key, query = key[by], query[by]
    run = np.ones(len(key), bool)
    run[1:] = (key[1:] != key[:-1]) | (a[query[1:]] != b[query[:-1]])
    first = np.flatnonzero(run)
    last = np.concatenate([first[1:], [len(key)]])[: len(first)] - 1
    q = np.concatenate([np.stack([a, b], 1), np.stack([a[query[first]], b[query[last]]], 1)])
    k = np.concatenate([np.stack([a, b], 1), np.stack([a[key[first]], b[key[first]]], 1)])
    kinds = np.concatenate([np.full(len(a), causal), np.zeros(len(first), bool)])
    order = np.lexsort((k[:, 0], q[:, 0]))
    return (
        torch.from_numpy(q[order].astype(np.int32)),
        torch.from_numpy(k[order].astype(np.int32)),
        ["causal" if c else "full" for c in kinds[order]],
    )
