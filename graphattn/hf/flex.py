"""FlexAttention for a graphattn structure: a BlockMask built from the structure's tiles (once per
batch and layer rule, shared by every layer of that type), a mask_mod reading the compact form,
and a score_mod adding the learned bias of each pair's relative label.

`BlockMask.from_kv_blocks` takes, per query tile, the key tiles that are partly allowed (their
elements go through mask_mod) and those fully allowed (mask_mod skipped): `Structure.tiles` gives
both in O(tiles^2 + N + E), where `create_block_mask` evaluates mask_mod on all N x N pairs.
Tree structures need only their per-token arrays in mask_mod; graph structures (ETC rules with
labels) store the labels of the allowed tiles only, [tiles kept, B, T, T] int16 (-1 = masked).
"""

from __future__ import annotations

import torch
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from graphattn.hf.structure import NO_LIMIT, LayerRule, Structure

TILE = 128
_compiled = None


def _kv_lists(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, nq, nk] bool -> counts [B, 1, nq] and key-tile indices [B, 1, nq, nk] (kept ones first)."""
    n_keys = blocks.shape[-1]
    slot = blocks.cumsum(-1, dtype=torch.int32) - 1  # a kept tile's place in its row's list
    slot = torch.where(blocks, slot, n_keys)  # the rest go to a spare column, dropped below
    order = torch.zeros(*blocks.shape[:-1], n_keys + 1, dtype=torch.int32, device=blocks.device)
    tile = torch.arange(n_keys, dtype=torch.int32, device=blocks.device).expand_as(slot)
    order.scatter_(-1, slot.long(), tile)
    counts = blocks.sum(-1, dtype=torch.int32)
    return counts[:, None].contiguous(), order[..., :n_keys][:, None].contiguous()


def _tree_mask_mod(structure: Structure, rule: LayerRule):
    enter, exit_, pos, causal = structure.enter, structure.exit, structure.positions, structure.causal

    def mask_mod(b, h, q, k):
        eq, ek = enter[b, q], enter[b, k]
        ok = (ek <= eq) & (eq < exit_[b, k]) & (eq >= 0) & (ek >= 0)
        if causal:
            ok = ok & (k <= q)
        if rule.lo > -NO_LIMIT:
            ok = ok & (pos[b, k] - pos[b, q] >= rule.lo)
        if rule.hi < NO_LIMIT:
            ok = ok & (pos[b, k] - pos[b, q] <= rule.hi)
        return ok

    return mask_mod


def label_store(structure: Structure, rule: LayerRule, tile: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Slot of each (query tile, key tile) [nq, nk] (0: none) and the labels of the kept tiles,
    [1 + kept, B, tile, tile] int16, -1 where masked (slot 0 is all -1)."""
    batch, length = structure.shape
    n_tiles = -(-length // tile)
    lists = structure.key_tiles(rule, tile)
    slot = torch.zeros(n_tiles, n_tiles, dtype=torch.int32, device=structure.device)
    blocks = [torch.full((1, batch, tile, tile), -1, dtype=torch.int16, device=structure.device)]
    kept = 1
    for t, keys in enumerate(lists):  # per query tile
        if keys.numel() == 0:
            continue
        rows = slice(t * tile, min(length, (t + 1) * tile))
        mask, labels = structure.pairs(rows, keys, rule)
        labels = torch.where(mask, labels, -1).to(torch.int16)
        key_tiles = torch.unique(keys // tile)
        padded = torch.full((batch, tile, key_tiles.numel() * tile), -1, dtype=torch.int16, device=keys.device)
        where = (torch.searchsorted(key_tiles, keys // tile) * tile + keys % tile)[None, None, :]
        padded[:, : rows.stop - rows.start].scatter_(2, where.expand(batch, rows.stop - rows.start, -1), labels)
        blocks.append(padded.view(batch, tile, -1, tile).permute(2, 0, 1, 3))
        slot[t, key_tiles] = torch.arange(kept, kept + key_tiles.numel(), device=keys.device, dtype=torch.int32)
        kept += key_tiles.numel()
    return slot, torch.cat(blocks)


def build_block_mask(structure: Structure, rule: LayerRule, tile: int = TILE):
    """The BlockMask (and, for graph structures, the label store) of one layer rule."""
    batch, length = structure.shape
    any_, full = structure.tiles(rule, tile)
    partial = any_ & ~full
    store = None
    if structure.kind == "tree":
        mask_mod = _tree_mask_mod(structure, rule)
    else:
        slot, labels = label_store(structure, rule, tile)
        store = (slot, labels)

        def mask_mod(b, h, q, k):
            return labels[slot[q // tile, k // tile], b, q % tile, k % tile] >= 0

    counts, indices = _kv_lists(partial)
    full_counts, full_indices = _kv_lists(full)
    block_mask = BlockMask.from_kv_blocks(
        counts,
        indices,
        full_counts,
        full_indices,
        BLOCK_SIZE=tile,
        mask_mod=mask_mod,
        seq_lengths=(length, length),
    )
    return block_mask, store


def flex_forward(query, key, value, layer, table, scale: float) -> torch.Tensor:
    """FlexAttention over the structure; [B, H, N, d_v]."""
    global _compiled
    structure, rule = layer.structure, layer.rule
    tile = TILE
    block_mask, store = structure.cached(("flex", rule, tile), lambda: build_block_mask(structure, rule, tile))
    score_mod = None
    if table is not None and store is not None:
        slot, labels = store

        def score_mod(score, b, h, q, k):
            label = labels[slot[q // tile, k // tile], b, q % tile, k % tile].clamp(min=0).int()
            return score + table[h, label].to(score.dtype)

    run = flex_attention
    if query.is_cuda:
        if _compiled is None:
            _compiled = torch.compile(flex_attention, dynamic=False)
        run = _compiled
    return run(
        query,
        key,
        value,
        score_mod=score_mod,
        block_mask=block_mask,
        scale=scale,
        enable_gqa=key.shape[1] != query.shape[1],
    )
