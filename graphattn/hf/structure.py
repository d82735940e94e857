"""The structure a Hugging Face model takes as its `attention_mask`: O(N + E), never N x N.

Two kinds, one interface (`pairs` for a block of queries x keys, `tiles` for which tiles of the
N x N pattern may hold an allowed pair):

- "tree" (packed documents and prefix trees). Every token belongs to a segment; segments form a
  forest numbered in preorder, so segment s's subtree is the interval [enter, exit) of preorder
  numbers. Key k is visible from query q iff k's segment is an ancestor of (or is) q's segment:
  ``enter[k] <= enter[q] < exit[k]``, and with `causal=True` also k <= q. A packed document is a root
  segment with no children. Padding has enter = -1: it sees nothing and nothing sees it.
- "graph" (the schema route). The flat sequence is the ETC instance's globals then its long
  tokens; the rules and relative labels are the ETC ones of `graphattn.compact.CompactBatch`, read
  through `graphattn.kernels.structure` (the same code that feeds our own kernels).

A model layer adds its own rule (causal, sliding window) as an allowed range of position offsets
``lo <= position[k] - position[q] <= hi`` (`LayerRule`), so windows count positions along a
root-to-leaf path, as the path run alone would.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from graphattn.compact import CompactBatch
from graphattn.kernels.structure import dense_g2g, dense_g2l, dense_l2g, distance_ids, tile_max, tile_min

_BIG = torch.iinfo(torch.int32).max
NO_LIMIT = 1 << 40
RECURRENT_CHECKED = ("hybrid", "checked")  # graphattn.hf.hybrid let this structure through a model's recurrent layers


class GraphattnMaskError(ValueError):
    """A model, input or setting graphattn cannot honour (raised instead of ignoring a mask)."""


@dataclass(frozen=True)
class LayerRule:
    """The offsets one layer type allows: lo <= position[key] - position[query] <= hi."""

    lo: int = -NO_LIMIT
    hi: int = NO_LIMIT

    @property
    def causal(self) -> bool:
        return self.hi <= 0


@dataclass
class Structure:
    """A batch's attention structure in compact form, passed to a model as `attention_mask`.

    `positions` [B, N] are the position ids the structure was built with (a model must be given
    the same, as `position_ids`). `causal`: None (the default) keeps each layer's own rule, the
    structure only separating documents / branches; True makes every layer causal (keys after the
    query masked; a bidirectional window keeps its past half); False states that the layers attend
    both ways, and a causal layer refuses it (graphattn never widens a model's rule). Tree kind:
    `enter`, `exit` [B, N] int32. Graph kind: `compact` (a torch `CompactBatch`), `global_length`
    (flat rows [0, G) are globals), `num_labels`.
    """

    kind: str
    positions: torch.Tensor
    causal: bool | None = None
    enter: torch.Tensor | None = None
    exit: torch.Tensor | None = None
    compact: CompactBatch | None = None
    global_length: int = 0
    num_labels: int = 0
    _plans: dict = field(default_factory=dict, repr=False, compare=False)

    ndim = 2  # transformers' mask preprocessing treats us as a [B, N] padding mask: it calls .to()

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.positions.shape)

    @property
    def device(self) -> torch.device:
        return self.positions.device

    @property
    def has_labels(self) -> bool:
        return self.kind == "graph"

    def size(self, dim: int | None = None):
        return self.shape if dim is None else self.shape[dim]

    def to(self, *args, **kwargs) -> Structure:
        """Move to a device (dtype and other arguments are ignored: the structure is integers)."""
        device = kwargs.get("device")
        for arg in args:
            if isinstance(arg, (str, torch.device)):
                device = arg
        if device is None or torch.device(device) == self.device:
            return self
        move = lambda t: None if t is None else t.to(device)  # noqa: E731
        return Structure(
            self.kind,
            move(self.positions),
            self.causal,
            move(self.enter),
            move(self.exit),
            None if self.compact is None else self.compact.map(move),
            self.global_length,
            self.num_labels,
        )

    # -- what trainers ask of an attention_mask (no dense mask is pretended) ----------------------
    def real_tokens(self) -> torch.Tensor:
        """[B, N] bool: the tokens that are not padding (what a [B, N] padding mask would say)."""
        if self.kind != "tree":
            raise ValueError("real_tokens: the schema route's structure does not record its padding")
        return self.enter >= 0

    def sum(self, *args, **kwargs) -> torch.Tensor:
        """The number of real tokens (Trainer / TRL count tokens as `attention_mask.sum()`); with a
        `dim`, per row or per column, as a [B, N] padding mask would answer."""
        return self.real_tokens().sum(*args, **kwargs)

    # transformers hands a model's recurrent layers (linear attention, Mamba, convolutions) the 2-D
    # attention_mask as a padding mask (masking_utils.create_recurrent_attention_mask asks `mask == 1` and
    # slices it): the real tokens answer where those layers may take the structure (graphattn.hf.hybrid).
    def __eq__(self, other):
        return self is other if isinstance(other, Structure) else self.padding_view() == other

    def __ne__(self, other):
        return self is not other if isinstance(other, Structure) else self.padding_view() != other

    def __getitem__(self, index) -> torch.Tensor:
        return self.padding_view()[index]

    def padding_view(self) -> torch.Tensor:
        """The structure asked as a [B, N] padding mask (`mask == 1`, `mask[:, -n:]`): its real tokens,
        where every row is one sequence or graphattn.hf.hybrid let it through this model. Otherwise a
        layer is about to read several documents or a tree as one sequence without graphattn's check
        (a model with no attention layer, e.g. Mamba2, or one that builds this mask first): refused."""
        if self.row_kind() == "sequences" or self._plans.get(RECURRENT_CHECKED):
            return self.real_tokens()
        raise GraphattnMaskError(
            "attention_mask: a layer reads this structure as a padding mask, i.e. its rows as single sequences, "
            "without graphattn's check (a recurrent layer of a model with no attention layer or one that builds "
            "this mask first); its rows hold several documents or a tree: pack one document per row"
        )

    def row_kind(self) -> str:
        """'sequences' (every row one sequence: a document or a chain of segments, then padding),
        'documents' (rows of packed documents), 'gaps' (padding inside a row), 'tree' (anything else: a
        branch) or 'graph'. Computed once per batch."""
        if self.kind != "tree":
            return "graph"

        def build() -> str:
            enter, exit_ = self.enter, self.exit
            real = enter >= 0
            if bool((real[:, 1:] & ~real[:, :-1]).any()):
                return "gaps"
            pair = real[:, 1:]
            prev_e, prev_x, next_e, next_x = enter[:, :-1], exit_[:, :-1], enter[:, 1:], exit_[:, 1:]
            same = next_e == prev_e
            only_child = (next_e == prev_e + 1) & (next_x == prev_x)  # the chain goes on
            if not bool((pair & ~(same | only_child)).any()):
                return "sequences"
            return "documents" if not bool((real & (exit_ - enter != 1)).any()) else "tree"

        return self.cached(("hybrid", "kind"), build)

    def has_branches(self) -> bool:
        """Whether a tree structure has a segment with children (one host read per batch, cached)."""
        if self.kind != "tree":
            return False
        return self.cached(("branches",), lambda: bool(((self.exit - self.enter) > 1).any()))

    # -- the ecosystem's formats (graphattn.hf.export) --------------------------------------------
    def to_flash_kwargs(self, padded_documents: bool = False) -> dict:
        """`cu_seq_lens_q/k`, `max_length_q/k` (+ `cu_seq_lens_padded`): see `graphattn.hf.export`."""
        from graphattn.hf.export import flash_kwargs

        return flash_kwargs(self, padded_documents)

    def to_seq_idx(self, padded_documents: bool = False) -> torch.Tensor:
        """int32 [B, N]: the sequence each token lies in, as Mamba / convolution layers read it."""
        from graphattn.hf.export import seq_idx

        return seq_idx(self, padded_documents)

    def to_magi_ranges(self, row: int | None = None, causal: bool | None = None) -> tuple:
        """`(q_ranges, k_ranges, mask_types)` of one row, MagiAttention's slices."""
        from graphattn.hf.export import magi_ranges

        return magi_ranges(self, row, causal)

    # -- element rule ---------------------------------------------------------------------------
    def pairs(self, rows: slice, keys: torch.Tensor, rule: LayerRule) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Mask [B, n, m] (bool) and relative labels ([B, n, m] long, graph kind; else None) of
        query rows `rows` against key indices `keys` [m]."""
        query = torch.arange(rows.start, rows.stop, device=keys.device)
        if self.kind == "tree":
            eq, ek, xk = self.enter[:, rows, None], self.enter[:, None, keys], self.exit[:, None, keys]
            mask = (ek <= eq) & (eq < xk) & (eq >= 0) & (ek >= 0)
            labels = None
        else:
            mask, labels = self._graph_pairs(rows, keys)
        if self.causal:
            mask &= (keys[None, :] <= query[:, None])[None]
        offset = self.positions[:, None, keys] - self.positions[:, rows, None]
        if rule.lo > -NO_LIMIT:
            mask &= offset >= rule.lo
        if rule.hi < NO_LIMIT:
            mask &= offset <= rule.hi
        return mask, labels

    def _graph_pairs(self, rows: slice, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The ETC rules on flat indices: [0, G) globals, [G, G + L) long tokens."""
        c, g = self.compact, self.global_length
        batch, n = self.shape[0], rows.stop - rows.start
        mask = torch.zeros(batch, n, keys.numel(), dtype=torch.bool, device=keys.device)
        labels = torch.zeros(batch, n, keys.numel(), dtype=torch.long, device=keys.device)
        key_global = keys < g
        kg, kl = keys[key_global], keys[~key_global] - g
        global_rows = slice(rows.start, min(rows.stop, g))
        long_rows = slice(max(rows.start, g) - g, rows.stop - g)
        pieces = []
        if global_rows.stop > global_rows.start:
            out = slice(0, global_rows.stop - global_rows.start)
            if kg.numel():
                m, i = dense_g2g(c, global_rows)
                pieces.append((out, key_global, m[:, :, kg], i[:, :, kg]))
            if kl.numel():
                lo, hi = int(kl.min()), int(kl.max()) + 1
                m, i = dense_g2l(c, global_rows, slice(lo, hi))
                pieces.append((out, ~key_global, m[:, :, kl - lo], i[:, :, kl - lo]))
        if long_rows.stop > long_rows.start:
            out = slice(max(rows.start, g) - rows.start, n)
            if kg.numel():
                m, i = dense_l2g(c, long_rows, slice(0, g))
                pieces.append((out, key_global, m[:, :, kg], i[:, :, kg]))
            if kl.numel():
                m, i = self._l2l(long_rows, kl)
                pieces.append((out, ~key_global, m, i))
        for out, columns, m, i in pieces:
            block_mask, block_labels = mask[:, out], labels[:, out]
            block_mask[:, :, columns] = m.bool()
            block_labels[:, :, columns] = i.long()
        return mask, labels

    def _l2l(self, rows: slice, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        c = self.compact
        query = torch.arange(rows.start, rows.stop, device=keys.device)
        delta = keys[None, :] - query[:, None]
        same = c.long_segment[:, rows, None] == c.long_segment[:, None, keys]
        mask = same & (delta.abs() <= c.local_radius)[None]
        return mask, distance_ids(delta, c.max_distance).expand(c.batch_size, -1, -1)

    # -- tiles ----------------------------------------------------------------------------------
    def tiles(self, rule: LayerRule, tile: int) -> tuple[torch.Tensor, torch.Tensor]:
        """`any` and `full` [B, n_tiles, n_tiles] bool: the tile may hold an allowed pair; every
        pair of the tile is allowed. O(tiles^2 + N + E); `any` is conservative, `full` exact."""
        n = self.shape[1]
        device = self.device
        start = torch.arange(0, n, tile, device=device)
        stop = (start + tile).clamp(max=n) - 1
        whole = (stop - start + 1) == tile
        pos_lo, pos_hi = tile_min(self.positions.int(), tile), tile_max(self.positions.int(), tile)
        if self.kind == "tree":
            real = self.enter >= 0
            e_lo = tile_min(torch.where(real, self.enter, _BIG), tile)
            e_hi = tile_max(torch.where(real, self.enter, -_BIG), tile)
            x_lo = tile_min(torch.where(real, self.exit, _BIG), tile)
            x_hi = tile_max(torch.where(real, self.exit, -_BIG), tile)
            any_ = (e_lo[:, None, :] <= e_hi[:, :, None]) & (e_lo[:, :, None] < x_hi[:, None, :])
            no_pad = tile_min(real.int(), tile).bool() & whole[None]
            full = (e_hi[:, None, :] <= e_lo[:, :, None]) & (e_hi[:, :, None] < x_lo[:, None, :])
            full &= no_pad[:, :, None] & no_pad[:, None, :]
        else:
            any_ = self._graph_any(tile, start, stop)
            full = torch.zeros_like(any_)
        if self.causal:
            any_ &= (start[None, :] <= stop[:, None])[None]
            full &= (stop[None, :] <= start[:, None])[None]
        if rule.lo > -NO_LIMIT:
            any_ &= (pos_hi[:, None, :] - pos_lo[:, :, None]) >= rule.lo
            full &= (pos_lo[:, None, :] - pos_hi[:, :, None]) >= rule.lo
        if rule.hi < NO_LIMIT:
            any_ &= (pos_lo[:, None, :] - pos_hi[:, :, None]) <= rule.hi
            full &= (pos_hi[:, None, :] - pos_lo[:, :, None]) <= rule.hi
        return any_, full & any_

    def _graph_any(self, tile: int, start: torch.Tensor, stop: torch.Tensor) -> torch.Tensor:
        """Per query, a superset interval of its allowed keys among globals and one among long
        tokens (kernels.structure.allowed_key_range for l2g / g2l, documents for g2g, the band
        for l2l); a tile may hold a pair where a query tile's intervals meet the key tile."""
        from graphattn.kernels.structure import allowed_key_range

        c, g = self.compact, self.global_length
        batch, length = c.batch_size, c.long_length
        device = self.device
        glob = torch.arange(g, device=device, dtype=torch.int32).expand(batch, g)
        docs = int(c.global_doc.max()) + 1 if g else 1
        first = torch.full((batch, docs), _BIG, dtype=torch.int32, device=device)
        last = torch.full((batch, docs), -_BIG, dtype=torch.int32, device=device)
        first.scatter_reduce_(1, c.global_doc.long(), glob, "amin")
        last.scatter_reduce_(1, c.global_doc.long(), glob, "amax")
        g2g = (first.gather(1, c.global_doc.long()), last.gather(1, c.global_doc.long()) + 1)
        g2l = allowed_key_range(c, "g2l") if length and g else None
        l2g = allowed_key_range(c, "l2g") if length and g else None
        token = torch.arange(length, device=device, dtype=torch.int32).expand(batch, length)
        band = ((token - c.local_radius).clamp(min=0) + g, (token + c.local_radius + 1).clamp(max=length) + g)
        empty = lambda n: (torch.full((batch, n), _BIG, device=device), torch.full((batch, n), -_BIG, device=device))  # noqa: E731
        shift = lambda r: (r[0] + g, torch.where(r[1] > -_BIG, r[1] + g, r[1]))  # noqa: E731
        to_globals = (
            torch.cat([g2g[0], (l2g or empty(length))[0]], 1),
            torch.cat([g2g[1], (l2g or empty(length))[1]], 1),
        )
        long_side = shift(g2l) if g2l is not None else empty(g)
        to_long = (torch.cat([long_side[0], band[0]], 1), torch.cat([long_side[1], band[1]], 1))
        any_ = torch.zeros(batch, start.numel(), start.numel(), dtype=torch.bool, device=device)
        for lo_hi in (to_globals, to_long):
            lo, hi = tile_min(lo_hi[0].int(), tile), tile_max(lo_hi[1].int(), tile)  # [B, tiles]
            any_ |= (start[None, None, :] < hi[:, :, None]) & (stop[None, None, :] >= lo[:, :, None])
        return any_

    # -- per-layer plans, built once per batch ------------------------------------------------------
    def key_tiles(self, rule: LayerRule, tile: int, rows: int | None = None) -> list[torch.Tensor]:
        """Per block of `rows` query rows (default `tile`; a multiple of it), the key indices of the
        key tiles of `tile` tokens that may hold a pair for any row of the batch."""
        rows = rows or tile
        if rows % tile:
            raise ValueError(f"rows ({rows}) must be a multiple of tile ({tile})")
        key = ("keys", rule, tile, rows)
        if key not in self._plans:
            any_, _ = self.tiles(rule, tile)
            union = any_.any(0)  # [tiles, tiles]
            group = rows // tile
            pad = -union.shape[0] % group
            union = torch.nn.functional.pad(union, (0, 0, 0, pad)).view(-1, group, union.shape[1]).any(1)
            n = self.shape[1]
            counts = union.sum(1).tolist()
            tile_ids = union.nonzero()[:, 1]
            offsets = torch.arange(tile, device=self.device)
            lists = []
            for ids in tile_ids.split(counts):
                index = (ids[:, None] * tile + offsets).flatten()
                lists.append(index[index < n])
            self._plans[key] = lists
        return self._plans[key]

    def cached(self, key, build):
        """A per-batch object (a BlockMask, a label store) built on first use and shared by layers."""
        if key not in self._plans:
            self._plans[key] = build()
        return self._plans[key]


class LayerMask:
    """What one layer type receives as `attention_mask`: the structure and the layer's rule."""

    ndim = 2

    def __init__(self, structure: Structure, rule: LayerRule):
        self.structure, self.rule = structure, rule

    @property
    def shape(self):
        return self.structure.shape

    def __repr__(self) -> str:
        return f"LayerMask({self.structure.kind}, shape={self.shape}, rule={self.rule})"
