"""Random but structurally realistic batched side inputs, for tests and benchmarks.

The compiler makes side inputs from real documents; kernels need many odd batches quickly and
without a tokenizer. This builds them the way etcmodel does (one global token per sentence,
sentences of random length, packed documents that never see each other, padding as one more
document, optional hard masks, mention links with their own label, rows with nothing to attend
to), vectorized over tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from graphattn.contract import SideInputs
from graphattn.labels import belongs_id, does_not_belong_id, first_schema_label_id


@dataclass
class SyntheticLayout:
    """What `synthetic_side_inputs` built, for tests that want to check against it."""

    long_owner: torch.Tensor  # [B, L] global position owning each long token (-1 for padding)
    long_doc: torch.Tensor  # [B, L] packed-document id (-1 for padding)
    global_doc: torch.Tensor  # [B, G]
    vocab_size: int


def relative_position_ids(offsets: torch.Tensor, max_distance: int) -> torch.Tensor:
    """etcmodel ids: 0 same, 1..k key to the right (clipped), k+1..2k key to the left (clipped)."""
    right = offsets.clamp(0, max_distance)
    left = (-offsets).clamp(0, max_distance)
    return torch.where(offsets >= 0, right, max_distance + left).to(torch.int32)


def _owners(batch: int, long_length: int, global_length: int, padding: int, gen: torch.Generator) -> torch.Tensor:
    """Contiguous runs of long tokens per global token (random lengths), -1 on padding."""
    real = long_length - padding
    owners = torch.full((batch, long_length), -1, dtype=torch.long)
    if global_length == 0 or real <= 0:
        return owners
    for b in range(batch):  # per instance, not per token
        cuts = torch.randperm(max(real - 1, 1), generator=gen)[: min(global_length, real) - 1] + 1
        starts = torch.zeros(real, dtype=torch.long)
        starts[cuts.sort().values] = 1
        owners[b, :real] = torch.cumsum(starts, 0)
    return owners


def synthetic_side_inputs(
    batch: int,
    long_length: int,
    global_length: int,
    radius: int,
    max_distance: int = 12,
    *,
    num_docs: int = 1,
    long_padding: int = 0,
    global_padding: int = 0,
    hard_g2l: bool = False,
    hard_l2g: bool = False,
    mention_links: int = 0,
    empty_long_rows: int = 0,
    empty_global_rows: int = 0,
    seed: int = 0,
) -> tuple[SideInputs, SyntheticLayout]:
    """Batched int32 side inputs [B, ...] plus the layout they were built from."""
    gen = torch.Generator().manual_seed(seed)
    does_not_belong, belongs = does_not_belong_id(max_distance), belongs_id(max_distance)
    mention = first_schema_label_id(max_distance)
    vocab_size = mention + 1
    real_globals = global_length - global_padding

    owners = _owners(batch, long_length, real_globals, long_padding, gen)
    docs_per_global = torch.div(
        torch.arange(max(real_globals, 0)) * num_docs, max(real_globals, 1), rounding_mode="floor"
    )
    global_doc = torch.full((batch, global_length), -1, dtype=torch.long)
    global_doc[:, :real_globals] = docs_per_global
    if real_globals > 0:
        long_doc = torch.where(owners >= 0, global_doc.gather(1, owners.clamp(min=0)), torch.full_like(owners, -1))
    else:  # no global tokens: every real long token is in document 0
        long_doc = torch.where(torch.arange(long_length) < long_length - long_padding, 0, -1).expand(batch, -1).clone()

    # l2l: window i-r..i+r, same document (padding is a document too), inside the sequence.
    offsets = torch.arange(-radius, radius + 1)
    keys = torch.arange(long_length)[:, None] + offsets[None, :]
    inside = (keys >= 0) & (keys < long_length)
    key_doc = long_doc.gather(1, keys.clamp(0, long_length - 1).reshape(1, -1).expand(batch, -1)).reshape(
        batch, long_length, -1
    )
    l2l_mask = inside & (key_doc == long_doc[:, :, None])
    l2l_ids = relative_position_ids(offsets, max_distance)[None, None].expand(batch, long_length, -1)

    positions = torch.arange(global_length)
    g2g_mask = global_doc[:, :, None] == global_doc[:, None, :]
    g2g_ids = relative_position_ids(positions[None, :] - positions[:, None], max_distance)[None].expand(batch, -1, -1)

    owned = owners[:, :, None] == positions[None, None, :]  # [B, L, G]
    same_doc = long_doc[:, :, None] == global_doc[:, None, :]
    l2g_mask = owned if hard_l2g else same_doc
    g2l_mask = (owned if hard_g2l else same_doc).transpose(1, 2)
    l2g_ids = torch.where(owned, belongs, does_not_belong).to(torch.int32)
    g2l_ids = l2g_ids.transpose(1, 2)

    if mention_links and real_globals > 0 and long_length - long_padding > 0:
        rows = torch.randint(0, long_length - long_padding, (batch, mention_links), generator=gen)
        cols = torch.randint(0, real_globals, (batch, mention_links), generator=gen)
        b = torch.arange(batch)[:, None].expand_as(rows)
        link = long_doc[b, rows] == global_doc[b, cols]
        l2g_ids = l2g_ids.clone()
        g2l_ids = g2l_ids.clone()
        l2g_ids[b[link], rows[link], cols[link]] = mention
        g2l_ids[b[link], cols[link], rows[link]] = mention
        l2g_mask = l2g_mask.clone()
        g2l_mask = g2l_mask.clone()
        l2g_mask[b[link], rows[link], cols[link]] = True
        g2l_mask[b[link], cols[link], rows[link]] = True

    if empty_long_rows:
        rows = torch.randperm(long_length, generator=gen)[:empty_long_rows]
        l2l_mask = l2l_mask.clone()
        l2g_mask = l2g_mask.clone()
        l2l_mask[:, rows] = False
        l2g_mask[:, rows] = False
    if empty_global_rows and global_length:
        rows = torch.randperm(global_length, generator=gen)[:empty_global_rows]
        g2g_mask = g2g_mask.clone()
        g2l_mask = g2l_mask.clone()
        g2g_mask[:, rows] = False
        g2l_mask[:, rows] = False

    as_int = lambda t: t.to(torch.int32).contiguous()  # noqa: E731
    side = SideInputs(
        l2l_att_mask=as_int(l2l_mask),
        g2g_att_mask=as_int(g2g_mask),
        l2g_att_mask=as_int(l2g_mask),
        g2l_att_mask=as_int(g2l_mask),
        l2l_relative_att_ids=as_int(l2l_ids),
        g2g_relative_att_ids=as_int(g2g_ids),
        l2g_relative_att_ids=as_int(l2g_ids),
        g2l_relative_att_ids=as_int(g2l_ids),
    )
    return side, SyntheticLayout(owners, long_doc, global_doc, vocab_size)
