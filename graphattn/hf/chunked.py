"""graphattn's CPU compute path (`backend="chunked"`): exact attention over what a structure allows.

Two routes, chosen per batch and layer rule from the structure alone:

- **documents**: a tree without branches (packed documents) whose documents each lie in one run of
  tokens with consecutive positions. The layer rule inside a run of L tokens is then a range of
  index offsets, so each document is plain SDPA on views of the row: no mask when the rule is
  causal or bidirectional over the document (PyTorch's fused CPU kernel, which keeps only the
  log-sum-exp for the backward pass: no recompute, O(L) memory), a [L, L] band mask when a window
  is narrower than the document. Queries, keys and values are split into per-document views (one
  autograd node each way, no index_select copies); equal documents of up to `GROUP_LIMIT` tokens
  are concatenated and run as one batch (one call instead of hundreds for short SFT samples); padding
  runs output zeros.
- **tiles** (everything else: prefix trees, schema graphs with relative labels, a window band over
  a document too long for its [L, L] mask): per block of `CHUNK` query rows, the key tiles of
  `KEY_TILE` tokens the structure allows, gathered, and SDPA with the block's boolean mask (with
  relative labels, an einsum plus the bias gathered per pair). Blocks are recomputed in the
  backward pass (activation checkpointing) only when what the backward pass would keep (gathered
  keys and values, masks, and with labels the scores) exceeds `KEEP_BYTES` per layer: small
  batches skip the recompute, a 32K-token row keeps O(N + block x allowed keys) memory.

Both are deterministic on CPU (tests/hf rerun a backward and compare bits).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from graphattn.hf.structure import GraphattnMaskError, LayerMask, LayerRule, Structure

CHUNK = 512  # query rows per step of the tile route (fewer Python steps; measured best of 128/256/512)
KEY_TILE = 128  # the key tiles it skips or keeps
BAND_LIMIT = 4096  # longest document given a dense [L, L] band mask (16 MiB) on the document route
GROUP_LIMIT = 256  # equal documents up to this length run as one SDPA batch (per-call costs dominate below)
KEEP_BYTES = 256 << 20  # the tile route keeps its blocks for the backward pass below this, per layer


def chunked_attention(query, key, value, layer: LayerMask, table, scale: float) -> torch.Tensor:
    """Exact attention of `query` [B, H, N, d] over `key` / `value` [B, H_kv, N, d] under the
    layer's structure and rule (optionally a relative-bias `table` [H, labels]); [B, H, N, d_v]."""
    structure, rule = layer.structure, layer.rule
    if query.shape[1] % key.shape[1]:
        raise GraphattnMaskError(f"{query.shape[1]} query heads do not group over {key.shape[1]} key/value heads")
    plan = _document_plan(structure, rule) if table is None else None
    if plan is not None:
        return _attend_documents(query, key, value, plan, scale)
    return _attend_tiles(query, key, value, structure, rule, table, scale)


# -- the document route -----------------------------------------------------------------------------
class _Runs:
    """A batch's runs of tokens, numbered in row-major order: `row_sizes` (each row's run lengths);
    `singles` (run, kind) run alone; `groups` (kind, runs) of equal short documents run as one
    batch; `padding` runs (zeros out). kind: "full", "causal" or a (lo, hi) band of index offsets."""

    def __init__(self, row_sizes: list, singles: list, groups: list, padding: list):
        self.row_sizes, self.singles, self.groups, self.padding = row_sizes, singles, groups, padding
        self.sizes = [size for sizes in row_sizes for size in sizes]


def _document_plan(structure: Structure, rule: LayerRule) -> _Runs | None:
    """The document route's plan, or None where it does not apply. Built once per batch and rule
    (a few host reads), shared by every layer of the rule."""
    if structure.kind != "tree" or structure.has_branches():
        return None
    lo, hi = rule.lo, min(rule.hi, 0) if structure.causal else rule.hi
    if not lo <= 0 <= hi:  # a rule hiding a token from itself: rows may see nothing, the tile route's case
        return None
    return structure.cached(("documents", lo, hi), lambda: _runs(structure, lo, hi))


def _runs(structure: Structure, lo: int, hi: int) -> _Runs | None:
    enter, positions = structure.enter, structure.positions
    length = enter.shape[1]
    change = torch.ones_like(enter, dtype=torch.bool)
    change[:, 1:] = enter[:, 1:] != enter[:, :-1]
    real = enter >= 0
    steps = positions[:, 1:] - positions[:, :-1]
    if not bool(((steps == 1) | change[:, 1:] | ~real[:, 1:]).all()):
        return None  # positions that are not consecutive inside a document: offsets are not index offsets
    rows, starts = change.nonzero(as_tuple=True)  # row-major: runs in order
    last = torch.ones_like(rows, dtype=torch.bool)
    last[:-1] = rows[1:] != rows[:-1]
    ends = torch.where(last, length, starts.roll(-1))
    ids = enter[rows, starts]
    documents, doc_rows = ids[ids >= 0], rows[ids >= 0]
    if not bool(((documents[1:] > documents[:-1]) | (doc_rows[1:] != doc_rows[:-1])).all()):
        return None  # a document in two runs of its row
    sizes = (ends - starts).tolist()
    singles, padding, alike = [], [], {}
    for run, (size, doc) in enumerate(zip(sizes, ids.tolist())):
        if doc < 0:
            padding.append(run)
            continue
        band_lo, band_hi = max(lo, -(size - 1)), min(hi, size - 1)
        if band_lo == -(size - 1) and band_hi == size - 1:
            kind = "full"
        elif band_lo == -(size - 1) and band_hi == 0:
            kind = "causal"
        elif size <= BAND_LIMIT:
            kind = (band_lo, band_hi)
        else:
            return None
        alike.setdefault((size, kind), []).append(run)
    groups = []
    for (size, kind), runs in alike.items():
        if len(runs) == 1 or size > GROUP_LIMIT:
            singles.extend((run, kind) for run in runs)
        else:
            groups.append((kind, runs))
    per_row = torch.bincount(rows, minlength=enter.shape[0]).tolist()
    row_sizes, at = [], 0
    for count in per_row:
        row_sizes.append(sizes[at : at + count])
        at += count
    return _Runs(row_sizes, singles, groups, padding)


def _band(size: int, lo: int, hi: int, device) -> torch.Tensor:
    offset = torch.arange(size, device=device)[None, :] - torch.arange(size, device=device)[:, None]
    return (offset >= lo) & (offset <= hi)


def _sdpa(q, k, v, kind, scale: float) -> torch.Tensor:
    """[G, H, L, d] queries against their own document's keys under `kind` (4-D: PyTorch's fused
    CPU kernel takes only [batch, heads, L, d]; a 3-D input falls back to the unfused math)."""
    mask = _band(q.shape[2], *kind, q.device) if isinstance(kind, tuple) else None
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=kind == "causal", scale=scale, enable_gqa=q.shape[1] != k.shape[1]
    )


def _attend_documents(query, key, value, plan: _Runs, scale: float) -> torch.Tensor:
    """Each document through SDPA on its own [1, H, L, d] views of q / k / v (one split per row and
    tensor, one autograd node each), equal short documents concatenated and run as one batch;
    [B, H, N, d_v], a view of a [B, N, H, d_v] tensor (the layout the output projection reads, so
    the caller's transpose costs no copy)."""
    batch, heads, length, _ = query.shape
    views = [
        [piece for row, sizes in zip(t.split(1), plan.row_sizes) for piece in row.split(sizes, dim=2)]
        for t in (query, key, value)
    ]
    outs: list = [None] * len(plan.sizes)
    for run, kind in plan.singles:
        outs[run] = _sdpa(*(pieces[run] for pieces in views), kind, scale)[0].transpose(0, 1)  # [L, H, d_v]
    for kind, runs in plan.groups:
        q, k, v = (torch.cat([pieces[run] for run in runs]) for pieces in views)  # [G, H, L, d]
        for run, out in zip(runs, _sdpa(q, k, v, kind, scale).transpose(1, 2).unbind(0)):
            outs[run] = out
    for run in plan.padding:
        outs[run] = query.new_zeros(plan.sizes[run], heads, value.shape[-1])
    out = torch.cat(outs) if len(outs) > 1 else outs[0]
    return out.view(batch, length, heads, value.shape[-1]).transpose(1, 2)


# -- the tile route ---------------------------------------------------------------------------------
def _attend_tile(query, key, value, table, structure, rule, rows_start, keys, scale):
    """One query block against its gathered keys: [B, H, n, d]."""
    batch, heads, n, dim = query.shape
    groups = key.shape[1]
    k = key.index_select(2, keys)
    v = value.index_select(2, keys)
    if table is None:  # a fused kernel; rows that see nothing (padding) attend a dummy key, zeroed after
        mask, _ = structure.pairs(slice(rows_start, rows_start + n), keys, rule)
        empty = ~mask.any(-1)
        if empty.any():
            mask = mask.clone()
            mask[..., 0] |= empty
        out = F.scaled_dot_product_attention(
            query, k, v, attn_mask=mask[:, None], scale=scale, enable_gqa=groups != heads
        )
        return out.masked_fill(empty[:, None, :, None], 0.0)
    q = query.view(batch, groups, heads // groups, n, dim)
    scores = torch.einsum("bgrnd,bgmd->bgrnm", q, k) * scale
    mask, labels = structure.pairs(slice(rows_start, rows_start + n), keys, rule)
    bias = F.embedding(labels, table.t()).permute(0, 3, 1, 2)  # [B, H, n, m]
    scores = scores + bias.reshape(batch, groups, heads // groups, n, -1).to(scores.dtype)
    allowed = mask[:, None, None]
    scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
    probs = torch.softmax(scores.float(), dim=-1).to(v.dtype) * allowed
    return torch.einsum("bgrnm,bgmd->bgrnd", probs, v).reshape(batch, heads, n, -1)


def _kept_bytes(query, key, value, plans: list, table) -> int:
    """What the tile route's backward pass keeps without recompute: per block its gathered keys and
    values and its mask, and with labels its scores, bias and probabilities (fp32, per head)."""
    batch, heads, _, _ = query.shape
    per_key = batch * key.shape[1] * (key.shape[-1] + value.shape[-1]) * key.element_size()
    per_pair = batch * (1 + (3 * heads * 4 + 8 if table is not None else 0))
    return sum(keys.numel() * (per_key + CHUNK * per_pair) for keys in plans)


def _attend_tiles(query, key, value, structure: Structure, rule: LayerRule, table, scale: float) -> torch.Tensor:
    """Exact attention over the allowed key tiles only, block by block; [B, H, N, d_v]."""
    batch, heads, _, _ = query.shape
    plans = structure.key_tiles(rule, KEY_TILE, CHUNK)
    grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (query, key, value, table))
    recompute = grad and _kept_bytes(query, key, value, plans, table) > KEEP_BYTES
    outs = []
    for index, keys in enumerate(plans):
        start = index * CHUNK
        q = query[:, :, start : start + CHUNK]
        if keys.numel() == 0:
            outs.append(q.new_zeros(batch, heads, q.shape[2], value.shape[-1]))
            continue
        args = (q, key, value, table, structure, rule, start, keys, scale)
        outs.append(checkpoint(_attend_tile, *args, use_reentrant=False) if recompute else _attend_tile(*args))
    return torch.cat(outs, dim=2)
