"""Pass 3: assemble one instance from documents and the tokens chosen from each.

Per document: the long sequence (prefix, kept tokens, a [SEP] after each `sep_after` node), the
global sequence (prefix, then `global_order` groups in document order, then fixed blocks), and
per long token the owning global at each level, its type id, segment and hard-l2g row flag.
Documents are concatenated; everything per token is numpy (nodes become ranges over long
positions, and per-token values are "innermost covering range" lookups). The result is the compact form;
`to_dense` of it gives the eight tensors.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import compress

import numpy as np

from graphattn.compact import CompactSideInputs
from graphattn.compile.features import doc_features
from graphattn.compile.layout import DocLayout, document_error, schema_ref
from graphattn.compile.ranges import count_in_ranges, coverage, expand_ranges, innermost, searchsorted_left, take_or
from graphattn.compile.targets import DocNodes, lower_targets
from graphattn.compile.tokens import TokenTable
from graphattn.compile.truncate import Selection, _nearest_of_type, whole_sizes
from graphattn.contract import EtcInstance, TruncationReport
from graphattn.errors import CompileError
from graphattn.schema import Schema

SPECIAL, NODE, PER_TOKEN, BLOCK = 0, 1, 2, 3


@dataclass
class _Doc:
    """One document inside the instance, in its own coordinates.

    "Body" positions are the document's long positions after its prefix: kept tokens with the
    inserted [SEP]s. A node's body range covers its kept tokens and the [SEP]s of itself and
    of the nodes inside it, so a [SEP] belongs to the node it closes, not to the last child.
    """

    lay: DocLayout
    kept: np.ndarray  # [n] token indices kept (long text)
    kr: np.ndarray  # [N, 2] node ranges among kept tokens ([0, 0) for a node that holds no tokens)
    br: np.ndarray  # [N, 2] node ranges over body positions ([0, 0) for one that keeps none)
    kept_pos: np.ndarray  # [n] body position of each kept token
    body_token: np.ndarray  # [body] token index, -1 for an inserted [SEP]
    alive: np.ndarray  # [N] bool
    n_prefix: int
    g_kind: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # [Gd]
    g_node: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # node index, -1
    g_token: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # per_token: token index
    node_gpos: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # [N] first global, -1
    node_gcount: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # [N]
    _covering: np.ndarray | None = None  # `covering()`: given by whoever made `kr`, else made when first asked

    @property
    def body_length(self) -> int:
        return int(self.body_token.shape[0])

    @property
    def long_length(self) -> int:
        return self.n_prefix + self.body_length

    @property
    def inserted(self) -> np.ndarray:
        return self.body_token < 0

    def with_prefix(self, values: np.ndarray, prefix_value) -> np.ndarray:
        """Per body position -> per long position of the document."""
        out = np.empty((self.long_length, *values.shape[1:]), dtype=values.dtype)
        out[: self.n_prefix] = prefix_value
        out[self.n_prefix :] = values
        return out

    def innermost_of(self, nodes: np.ndarray) -> np.ndarray:
        """Per body position: index into `nodes` of the innermost one covering it, -1 if none."""
        return innermost(self.body_length, self.br[nodes, 0], self.br[nodes, 1], self.lay.rank[nodes])

    def covering(self) -> np.ndarray:
        """The nodes that keep tokens, ascending: only they cover body positions (past a cut,
        a page's nodes mostly keep none, so per-position lookups choose among these)."""
        if self._covering is None:
            self._covering = np.flatnonzero(self.kr[:, 1] > self.kr[:, 0])
        return self._covering


def _long_part(lay: DocLayout, sel: Selection, schema: Schema) -> _Doc:
    """The document's long body: kept tokens with a [SEP] after each `sep_after` node.

    Only the nodes whose range holds tokens (`DocLayout.token_rows`) can keep any; past a cut,
    a page's nodes mostly hold none, and their ranges stay [0, 0)."""
    kept = np.flatnonzero(lay.is_long & sel.keep)
    n = kept.shape[0]
    rows = lay.token_rows()
    kr_rows = searchsorted_left(kept, np.take(lay.ranges, rows, axis=0))
    has_kept = kr_rows[:, 1] > kr_rows[:, 0]
    rank = np.take(lay.rank, rows)
    seps = np.flatnonzero(np.take(lay.type_flag("sep_after"), rows) & has_kept)  # indexes `rows`
    order = np.lexsort((-rank[seps], kr_rows[seps, 1] - 1))  # inner node's [SEP] first where several end together
    seps = seps[order]
    last = kr_rows[seps, 1] - 1  # the kept token each [SEP] follows, ascending
    body_token = np.insert(kept, last + 1, -1)
    kept_pos = np.arange(n) + np.searchsorted(last, np.arange(n), side="left")
    # A node's body range ends after the [SEP]s that follow its last token and belong to it or
    # to nodes inside it (rank >= its rank): count them with one sorted key per [SEP].
    scale = int(rank.max(initial=0)) + 1
    sep_keys = last * scale + (scale - 1 - rank[seps])
    holding = np.flatnonzero(has_kept)  # indexes `rows`
    node_last, holding_rank = kr_rows[holding, 1] - 1, rank[holding]
    own_seps = np.searchsorted(
        sep_keys, node_last * scale + (scale - 1 - holding_rank), side="right"
    ) - np.searchsorted(sep_keys, node_last * scale, side="left")
    covering = rows[holding]  # the nodes that keep tokens
    kr = np.zeros((lay.n_nodes, 2), dtype=np.int64)
    kr[rows] = kr_rows
    br = np.zeros((lay.n_nodes, 2), dtype=np.int64)
    br[covering, 0] = kept_pos[kr_rows[holding, 0]]
    br[covering, 1] = kept_pos[node_last] + 1 + own_seps
    alive = ~lay.in_long
    alive[covering] = True
    return _Doc(lay, kept, kr, br, kept_pos, body_token, alive, len(schema.long_prefix), _covering=covering)


def _global_part(doc: _Doc, schema: Schema) -> None:
    """The document's global sequence: prefix, then each global_order group in document order
    (per_token nodes expand to one global per wordpiece of their text), fixed blocks in theirs."""
    lay = doc.lay
    n_prefix = len(schema.global_prefix)
    # A prefix global's `g_token` is its index in global_prefix: a cut may keep only its first few.
    kinds, nodes, tokens = [np.full(n_prefix, SPECIAL)], [np.full(n_prefix, -1)], [np.arange(n_prefix)]
    candidates = lay.selected & doc.alive
    blocks_name = schema.fixed_blocks.name if schema.fixed_blocks else None
    for group in schema.global_order:
        members = np.flatnonzero(candidates & lay.of_types(group))
        members = members[np.argsort(lay.rank[members], kind="stable")]
        per_token = lay.of_types(
            [t for t in group if t in schema.node_types and schema.node_types[t].global_mode == "per_token"]
        )[members]
        counts = np.where(per_token, lay.ranges[members, 1] - lay.ranges[members, 0], 1)
        positions, which = expand_ranges(np.zeros_like(counts), counts)
        kinds.append(np.where(per_token[which], PER_TOKEN, NODE))
        nodes.append(members[which])
        tokens.append(np.where(per_token[which], lay.ranges[members[which], 0] + positions, -1))
        if blocks_name in group:
            n_blocks = -(-doc.long_length // schema.fixed_blocks.tokens_per_block)
            kinds.append(np.full(n_blocks, BLOCK))
            nodes.append(np.full(n_blocks, -1))
            tokens.append(np.arange(n_blocks))  # block number
    doc.g_kind, doc.g_node, doc.g_token = (np.concatenate(a).astype(np.int64) for a in (kinds, nodes, tokens))


def _index_globals(doc: _Doc) -> None:
    """Per node: its first global position and how many globals it has (after any cut)."""
    n = doc.lay.n_nodes
    doc.node_gpos = np.full(n, -1, dtype=np.int64)
    doc.node_gcount = np.zeros(n, dtype=np.int64)
    has = np.flatnonzero(doc.g_node >= 0)
    np.add.at(doc.node_gcount, doc.g_node[has], 1)
    doc.node_gpos[doc.g_node[has][::-1]] = has[::-1]  # first position of each node


def _cut_globals(docs: list[_Doc], schema: Schema, report: TruncationReport) -> None:
    """Drop globals past max_global_length, last in global order first."""
    excess = sum(d.g_kind.shape[0] for d in docs) - schema.max_global_length
    if excess <= 0:
        return
    report.messages.append(f"cut the last {excess} global token(s) to fit max_global_length {schema.max_global_length}")
    for doc in reversed(docs):
        take = min(excess, doc.g_kind.shape[0])
        if take == 0:
            continue
        cut = slice(doc.g_kind.shape[0] - take, None)
        lost = doc.g_node[cut]
        keep = slice(0, doc.g_kind.shape[0] - take)
        doc.g_kind, doc.g_node, doc.g_token = doc.g_kind[keep], doc.g_node[keep], doc.g_token[keep]
        whole = np.setdiff1d(lost[lost >= 0], doc.g_node[doc.g_node >= 0])  # sorted, unique
        report.dropped_nodes.extend(_node_labels(doc, whole, len(docs)))
        excess -= take
        if excess <= 0:
            break


def _node_labels(doc: _Doc, nodes: np.ndarray, n_docs: int) -> Iterable[str]:
    """How the truncation report names nodes (ascending rows): the node id, prefixed with the doc
    id when the instance packs several documents (a page past its cut drops thousands at once)."""
    node_ids = doc.lay.node_ids
    lo, hi = (int(nodes[0]), int(nodes[-1]) + 1) if nodes.size else (0, 0)
    if nodes.size * 4 < hi - lo:
        ids: Iterable[str] = map(node_ids.__getitem__, nodes.tolist())
    else:  # most rows of a stretch (a page's tail): filtering the list by a byte mask is 3x faster
        keep = np.zeros(hi - lo, dtype=np.uint8)
        keep[nodes - lo] = 1
        ids = compress(node_ids[lo:hi], keep.tobytes())
    if n_docs > 1 and doc.lay.graph.doc_id is not None:
        return (f"{doc.lay.graph.doc_id}/{node_id}" for node_id in ids)
    return ids


def _owners(doc: _Doc, schema: Schema, level: str, goffset: int) -> np.ndarray:
    """Global position (instance coordinates) owning each long position of `doc` at `level`."""
    lay = doc.lay
    if schema.fixed_blocks is not None and level == schema.fixed_blocks.name:
        first_block = int(np.argmax(doc.g_kind == BLOCK)) if (doc.g_kind == BLOCK).any() else -1
        n_blocks = int(np.count_nonzero(doc.g_kind == BLOCK))
        block = np.arange(doc.long_length) // schema.fixed_blocks.tokens_per_block
        return np.where((first_block >= 0) & (block < n_blocks), goffset + first_block + block, -1)
    rows = doc.covering()
    nodes = rows[lay.of_types([level])[rows] & (doc.node_gpos[rows] >= 0)]
    inner = doc.innermost_of(nodes)
    node = take_or(nodes, inner, -1)
    first = take_or(doc.node_gpos, node, -1)
    if schema.node_types[level].global_mode == "per_token":  # each wordpiece owned by its own copy
        offset = doc.body_token - take_or(lay.ranges[:, 0], node, 0)
        valid = (node >= 0) & ~doc.inserted & (offset < take_or(doc.node_gcount, node, 0))
        owner = np.where(valid, goffset + first + offset, -1)
    else:
        owner = np.where(node >= 0, goffset + first, -1)
    return doc.with_prefix(owner, -1)


def _covered_by(doc: _Doc, nodes_mask: np.ndarray) -> np.ndarray:
    rows = doc.covering()
    nodes = rows[nodes_mask[rows]]
    return coverage(doc.body_length, doc.br[nodes, 0], doc.br[nodes, 1])


def _long_type_ids(doc: _Doc, schema: Schema) -> np.ndarray:
    lay = doc.lay
    table = _per_type(lay, schema, lambda t: -1 if t.type_id is None else t.type_id)
    rows = doc.covering()
    nodes = rows[table[lay.node_type[rows]] >= 0]
    if nodes.size == 0:
        return np.zeros(doc.long_length, dtype=np.int32)
    inner = doc.innermost_of(nodes)
    ids = take_or(table[lay.node_type[nodes]], inner, 0)
    return doc.with_prefix(ids.astype(np.int32), 0)


def _segment_boundaries(doc: _Doc) -> tuple[np.ndarray, np.ndarray]:
    """bool [Ld]: a new l2l run starts here; and per body position its innermost segment node."""
    lay = doc.lay
    boundary = np.zeros(doc.long_length, dtype=bool)
    boundary[:1] = True  # a document starts a run (an empty one has no positions at all)
    rows = doc.covering()  # the nodes that cover body positions (all of them alive)
    any_segment = rows[lay.type_flag("segment")[rows]]
    for t, _name in enumerate(lay.type_names):
        nodes = any_segment[lay.node_type[any_segment] == t]
        if nodes.size == 0:
            continue
        inner = doc.innermost_of(nodes)
        key = doc.with_prefix(take_or(nodes, inner, -1), -1)
        boundary[1:] |= key[1:] != key[:-1]
    inner = doc.innermost_of(any_segment)
    return boundary, take_or(any_segment, inner, -1)


def _global_segments(doc: _Doc, inner_segment: np.ndarray, node_offset: int) -> np.ndarray:
    """Segment of each global: its nearest segment ancestor-or-self, else the segment its text is in."""
    lay = doc.lay
    is_segment = lay.type_flag("segment")
    nodes = doc.g_node
    seg = np.full(nodes.shape[0], -1, dtype=np.int64)
    real = nodes >= 0
    own = take_or(is_segment, nodes, False)
    seg[own] = nodes[own]
    rest = np.flatnonzero(real & ~own)
    if rest.size:
        seg[rest] = _nearest_of_type(lay.parent, nodes[rest], is_segment)
        by_span = rest[(seg[rest] < 0) & (doc.br[nodes[rest], 1] > doc.br[nodes[rest], 0])]
        if by_span.size and inner_segment.size:
            seg[by_span] = inner_segment[doc.br[nodes[by_span], 0]]
    return np.where(seg >= 0, seg + node_offset, -1)


def _per_type(lay: DocLayout, schema: Schema, fn) -> np.ndarray:
    """A value per type index (a trailing 0 for padding lookups)."""
    return np.array([fn(schema.node_types[t]) for t in lay.type_names] + [0])


def _hard_l2g_rows(schema: Schema) -> bool:
    """Whether hard l2g is on for long query rows: masks.hard_l2g, or the fixed-block override
    (the schema loader allows that override only where blocks are the sole global level)."""
    blocks = schema.fixed_blocks
    return schema.masks.hard_l2g if blocks is None or blocks.hard_l2g is None else blocks.hard_l2g


def schema_types(lay: DocLayout, schema: Schema) -> np.ndarray:
    """[N] each node's type as an index into `schema.node_types` (the layout's own index is into
    the graph's `type_names`); made once per layout and schema."""
    cached = lay._schema_types
    if cached is None or cached[0] is not schema:
        index = {name: i for i, name in enumerate(schema.node_types)}
        types = np.array([index[t] for t in lay.type_names], dtype=np.int64)[lay.node_type]
        types.flags.writeable = False  # shared by every caller
        cached = lay._schema_types = (schema, types)
    return cached[1]


def type_table(schema: Schema, fn, dtype=None) -> np.ndarray:
    """A value per schema node type (in `schema.node_types` order), indexed by `schema_types`."""
    return np.array([fn(t) for t in schema.node_types.values()], dtype=dtype)


def global_flags(kind: np.ndarray, node_type: np.ndarray, schema: Schema) -> dict[str, np.ndarray]:
    """Per global: g2g blockable, its g2l row under the hard mask, and global type id, from its
    kind and its node's type (index into `schema.node_types`; any value for the compiler's own).

    Hard masks are per query row (etcmodel): a global whose type ignores hard g2l, and the
    global_prefix tokens ([CLS]), attend to every long token of their document.
    """
    is_node = (kind == NODE) | (kind == PER_TOKEN)
    masks, blocks = schema.masks, schema.fixed_blocks

    def by_type(fn, special, block):
        values = np.where(is_node, type_table(schema, fn)[node_type], special)
        return np.where(kind == BLOCK, block, values)

    block_hard_g2l = masks.hard_g2l if blocks is None or blocks.hard_g2l is None else blocks.hard_g2l
    return {
        "blockable": by_type(
            lambda t: schema.segments.blocks(t.name, t.name), False, schema.segments.block_g2g is True
        ).astype(bool),
        "hard_g2l": by_type(lambda t: masks.hard_g2l and not t.ignore_hard_g2l, False, block_hard_g2l).astype(bool),
        "type_ids": by_type(lambda t: t.global_type_id, 0, blocks.type_id if blocks else 0).astype(np.int32),
    }


def _global_flags(doc: _Doc, schema: Schema) -> dict[str, np.ndarray]:
    lay, kind = doc.lay, doc.g_kind
    types = schema_types(lay, schema)
    node_type = types[np.maximum(doc.g_node, 0)] if lay.n_nodes else np.zeros(kind.shape[0], np.int64)
    return global_flags(kind, node_type, schema)


def _global_token_ids(doc: _Doc, schema: Schema, table: TokenTable) -> np.ndarray:
    lay, kind = doc.lay, doc.g_kind
    ids = np.zeros(kind.shape[0], dtype=np.int32)
    special = kind == SPECIAL
    ids[special] = table.global_prefix[doc.g_token[special]]
    per_type = np.array([table.node_global.get(t, 0) for t in lay.type_names] + [0], dtype=np.int32)
    node = kind == NODE
    ids[node] = per_type[lay.node_type[doc.g_node[node]]]
    tok = kind == PER_TOKEN
    ids[tok] = lay.token_ids[doc.g_token[tok]]
    if table.block is not None:
        ids[kind == BLOCK] = table.block
    return ids


def _names(doc: _Doc, schema: Schema) -> tuple[list[str], list[str]]:
    """Node id and type name of each global (``<cls>``, ``<block:3>`` for the compiler's own)."""
    lay, kind = doc.lay, doc.g_kind
    ids = np.empty(kind.shape[0], dtype=object)
    types = np.empty(kind.shape[0], dtype=object)
    real = doc.g_node >= 0
    ids[real] = [lay.node_ids[i] for i in doc.g_node[real].tolist()]  # a few globals of possibly many nodes
    types[real] = np.asarray(lay.type_names, dtype=object)[lay.node_type[doc.g_node[real]]]
    special = np.flatnonzero(kind == SPECIAL)
    ids[special] = [f"<{schema.global_prefix[i]}>" for i in doc.g_token[special]]
    types[special] = "special"
    blocks = np.flatnonzero(kind == BLOCK)
    if blocks.size:
        ids[blocks] = [f"<{schema.fixed_blocks.name}:{b}>" for b in doc.g_token[blocks]]
        types[blocks] = schema.fixed_blocks.name
    return ids.tolist(), types.tolist()


def _edge_pairs(doc: _Doc, schema: Schema, vocab, goffset: int, loffset: int) -> tuple[list, list]:
    """(long, global, label) pairs from l2g/g2l links and (src, dst, label) from g2g links."""
    lay = doc.lay
    long_links, g2g_links = [], []
    kept_pos = loffset + doc.n_prefix + doc.kept_pos  # long position of kept token k
    for name, rel in schema.relations.items():
        if rel.link is None:
            continue
        src, dst = lay.edges[name]
        if src.size == 0:
            continue
        long_side, global_side = (dst, src) if rel.link == "g2l" else (src, dst)
        sides = [global_side] if rel.link != "g2g" else [src, dst]
        for side in sides if not rel.hierarchy else []:  # hierarchy labels skip global-less levels
            no_global = ~lay.type_flag("is_global")[side]
            if no_global.any():
                e = int(np.argmax(no_global))
                bad = lay.node_ids[side[e]]
                raise CompileError(
                    f"edge {lay.node_ids[src[e]]!r} -[{name}]-> {lay.node_ids[dst[e]]!r}: "
                    f"a {rel.link} link needs a global at "
                    f"{bad!r}, but its type {lay.type_names[lay.node_type[side[e]]]!r} "
                    f"has global: none in {schema_ref(schema)}",
                    file=lay.graph.source,
                    node=bad,
                )
        if rel.link == "g2g":
            ok = (doc.node_gpos[src] >= 0) & (doc.node_gpos[dst] >= 0)
            a, b = src[ok], dst[ok]
            fwd = vocab.id(rel.label)
            rev = vocab.id(rel.reverse_label or rel.label)
            ga, ea = expand_ranges(doc.node_gpos[a], doc.node_gpos[a] + doc.node_gcount[a])
            gb, eb = expand_ranges(doc.node_gpos[b[ea]], doc.node_gpos[b[ea]] + doc.node_gcount[b[ea]])
            src_g, dst_g = goffset + ga[eb], goffset + gb
            g2g_links.append((src_g, dst_g, np.full(src_g.shape, fwd)))
            g2g_links.append((dst_g, src_g, np.full(src_g.shape, rev)))
            continue
        label = vocab.id(rel.label) if rel.label else vocab.belongs
        ok = (doc.kr[long_side, 1] > doc.kr[long_side, 0]) & (doc.node_gpos[global_side] >= 0)
        ls, gs = long_side[ok], global_side[ok]
        k, e = expand_ranges(doc.kr[ls, 0], doc.kr[ls, 1])
        g, pair = expand_ranges(doc.node_gpos[gs[e]], doc.node_gpos[gs[e]] + doc.node_gcount[gs[e]])
        long_links.append((kept_pos[k[pair]], goffset + g, np.full(g.shape, label)))
    return long_links, g2g_links


def _unique_last(a: np.ndarray, b: np.ndarray, label: np.ndarray, width: int):
    """Keep one label per (a, b) pair: the last one given (later relations override earlier)."""
    if a.size == 0:
        return a.astype(np.int32), b.astype(np.int32), label.astype(np.int32)
    key = a.astype(np.int64) * width + b
    if np.all(key[1:] > key[:-1]):  # one relation's links come in order: all distinct, nothing to sort
        return a.astype(np.int32), b.astype(np.int32), label.astype(np.int32)
    _, first_from_end = np.unique(key[::-1], return_index=True)
    keep = np.sort(a.size - 1 - first_from_end)
    return a[keep].astype(np.int32), b[keep].astype(np.int32), label[keep].astype(np.int32)


DENSE_LIMIT_BYTES = 4 << 30
"""Most bytes the eight dense side-input tensors of one instance may take (int32 masks and ids:
8 * (L * (2r + 1) + G * G + 2 * L * G)); past it compile_instance(compact=False) refuses before allocating.
The compact form (O(L + G + edges)) has no such limit. 4 GiB is L = 131072 with G = 2048."""


def _check_dense_size(L: int, G: int, schema: Schema) -> None:
    parts = {"local_radius": L * (2 * schema.local_radius + 1), "max_global_length": G * G + 2 * L * G}
    nbytes = 8 * sum(parts.values())
    if nbytes > DENSE_LIMIT_BYTES:
        key = max(parts, key=parts.get)
        raise CompileError(
            f"the eight dense side-input tensors of this instance (L={L}, G={G}, "
            f"local_radius={schema.local_radius}) would take {nbytes / 2**30:.1f} GiB, over "
            f"graphattn.compile.assemble.DENSE_LIMIT_BYTES ({DENSE_LIMIT_BYTES / 2**30:.0f} GiB): "
            f"compile with compact=True (memory O(L + G + edges)), or lower {key} / max_long_length",
            **schema.where(key),
        )


def _doc_nodes(doc: _Doc, schema: Schema, loffset: int) -> DocNodes:
    """What target lowering needs from one document: globals' nodes, nodes' kept long positions."""
    lay = doc.lay
    past = lay.long_past_cut if lay.long_past_cut is not None else np.zeros(lay.n_nodes, dtype=bool)
    rows = lay.token_rows()
    kr, ranges = np.take(doc.kr, rows, axis=0), np.take(lay.ranges, rows, axis=0)
    positions = node_positions(
        lay.n_nodes, rows, kr, ranges, doc.kept, doc.kept_pos, lay.is_long, past, loffset + doc.n_prefix
    )
    return doc_nodes_of(doc, schema, *positions)


def node_positions(n: int, rows, kr, ranges, kept, kept_pos, is_long, past, base) -> tuple:
    """Per node (`n` of them): the first and last long position of its kept tokens (-1: none),
    whether all its long tokens are kept, whether it holds long text (`past`: past the cut too),
    whether its first long token is kept. Only `rows`, the nodes whose range holds tokens, have
    anything to say (a page's nodes past a cut hold none): `kr` [len(rows), 2] are their ranges
    among `kept` / `kept_pos`, `ranges` their token ranges into `is_long`; `base` (one offset, or
    one per row) moves body positions to instance ones."""
    kept_from, kept_to = kr[:, 0], kr[:, 1]
    starts, ends = ranges[:, 0], ranges[:, 1]
    has_kept = kept_to > kept_from
    first, last = np.full(n, -1, dtype=np.int64), np.full(n, -1, dtype=np.int64)
    first[rows] = np.where(has_kept, base + take_or(kept_pos, np.where(has_kept, kept_from, -1), 0), -1)
    last[rows] = np.where(has_kept, base + take_or(kept_pos, np.where(has_kept, kept_to - 1, -1), 0), -1)
    total = count_in_ranges(is_long, starts, ends)
    has_text = past.copy()
    has_text[rows] |= total > 0
    long_tokens = np.flatnonzero(is_long)
    first_long = take_or(long_tokens, np.where(total > 0, searchsorted_left(long_tokens, starts), -1), -1)
    complete, holds_first = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
    complete[rows] = (total > 0) & (kept_to - kept_from == total)
    holds_first[rows] = has_kept & (take_or(kept, np.where(has_kept, kept_from, -1), -2) == first_long)
    return first, last, complete, has_text, holds_first


def doc_nodes_of(doc: _Doc, schema: Schema, first, last, complete, has_text, holds_first) -> DocNodes:
    """`DocNodes` of a document from its per-node arrays (see `DocNodes` for each)."""
    lay = doc.lay
    n_globals = doc.g_kind.shape[0]
    prefix = {name: i for i, name in enumerate(schema.global_prefix) if i < n_globals and doc.g_kind[i] == SPECIAL}
    return DocNodes(
        graph=lay.graph,
        node_ids=lay.node_ids,
        node_is=lay.of_types,
        rank=lay.rank,
        selected=lay.selected,
        global_nodes=doc.g_node,
        prefix=prefix,
        first=first,
        last=last,
        complete=complete,
        has_text=has_text,
        holds_first=holds_first,
    )


@dataclass
class TokenLookups:
    """What an instance holds per long position and per global, all its documents together."""

    long: dict[str, np.ndarray]  # [L] ids, types, spans, doc, boundary, hard_l2g
    owners: dict[str, np.ndarray]  # level -> int64 [L]: owning global (instance coordinates), -1
    globals: dict[str, np.ndarray]  # [G] ids, types, doc, segment, blockable, hard_g2l
    targets: list[DocNodes] | None = None  # per document, what target lowering needs (made later if None)


def begin_instance(
    layouts: list[DocLayout],
    selections: list[Selection],
    schema: Schema,
    docs: list[_Doc] | None = None,
    globals_made: bool = False,
) -> tuple[list[_Doc], TruncationReport]:
    """The documents' long and global sequences (globals cut to fit), and the report so far.
    `docs`: their long parts made already (`_long_part` of each, as `assemble_batch` makes them),
    with their global sequences too if `globals_made` (`_global_part`)."""
    report = TruncationReport()
    for sel in selections:
        report.messages.extend(sel.messages)
    before = [whole_sizes(lay, schema) for lay in layouts]
    report.long_tokens_before = sum(b[0] for b in before)
    report.globals_before = sum(b[1] for b in before)

    if docs is None:
        docs = [_long_part(lay, sel, schema) for lay, sel in zip(layouts, selections)]
    if all(doc.body_length == 0 for doc in docs):
        raise document_error(
            layouts[0].graph,
            f"no text fits: max_long_length {schema.max_long_length} leaves no room for a single token of the document "
            f"after its prefix and separators ({schema_ref(schema)})",
        )
    for doc in docs:
        if not globals_made:
            _global_part(doc, schema)
        dropped = np.flatnonzero(doc.lay.in_long & ~doc.alive)
        report.dropped_nodes.extend(_node_labels(doc, dropped, len(docs)))
    _cut_globals(docs, schema, report)
    for doc in docs:
        _index_globals(doc)
    return docs, report


def token_lookups(docs: list[_Doc], schema: Schema, table: TokenTable) -> TokenLookups:
    """Per long position of one instance: token ids, type ids, spans, document, l2l run starts,
    hard-l2g rows and owners at every level; per global: token and type ids, document, segment,
    mask flags (`assemble_batch.batch_lookups` does this for many instances at once)."""
    long_parts: dict[str, list] = {k: [] for k in ("ids", "types", "spans", "doc", "boundary", "hard_l2g")}
    global_parts: dict[str, list] = {k: [] for k in ("ids", "types", "doc", "segment", "blockable", "hard_g2l")}
    hard_l2g = _hard_l2g_rows(schema)
    owners: dict[str, list] = {level: [] for level in schema.global_types}
    goffset = node_offset = 0
    for d, doc in enumerate(docs):
        lay = doc.lay
        body_ids = take_or(lay.token_ids, doc.body_token, table.sep if table.sep is not None else 0)
        long_parts["ids"].append(doc.with_prefix(body_ids.astype(np.int32), table.long_prefix))
        long_parts["types"].append(_long_type_ids(doc, schema))
        long_parts["spans"].append(doc.with_prefix(take_or(lay.offsets, doc.body_token, -1), -1))
        long_parts["doc"].append(np.full(doc.long_length, d, dtype=np.int32))
        boundary, inner_segment = _segment_boundaries(doc)
        long_parts["boundary"].append(boundary)
        # A long query row is under hard l2g unless a node covering it ignores it ([CLS] never is).
        restricted = hard_l2g & ~_covered_by(doc, lay.type_flag("ignore_hard_l2g"))
        long_parts["hard_l2g"].append(doc.with_prefix(restricted, False))
        for level in owners:
            owners[level].append(_owners(doc, schema, level, goffset))

        flags = _global_flags(doc, schema)
        global_parts["ids"].append(_global_token_ids(doc, schema, table))
        global_parts["types"].append(flags["type_ids"])
        global_parts["doc"].append(np.full(doc.g_kind.shape[0], d, dtype=np.int32))
        global_parts["segment"].append(_global_segments(doc, inner_segment, node_offset))
        for key in ("blockable", "hard_g2l"):
            global_parts[key].append(flags[key])
        goffset += doc.g_kind.shape[0]
        node_offset += lay.n_nodes
    return TokenLookups(
        {k: np.concatenate(v) for k, v in long_parts.items()},
        {level: np.concatenate(v) for level, v in owners.items()},
        {k: np.concatenate(v) for k, v in global_parts.items()},
    )


def assemble(
    layouts: list[DocLayout], selections: list[Selection], schema: Schema, table: TokenTable, *, compact: bool = False
) -> EtcInstance:
    """Lower documents (with the tokens chosen from each) into one EtcInstance."""
    docs, report = begin_instance(layouts, selections, schema)
    return finish_instance(docs, report, token_lookups(docs, schema, table), selections, schema, table, compact)


def finish_instance(
    docs: list[_Doc],
    report: TruncationReport,
    lookups: TokenLookups,
    selections: list[Selection],
    schema: Schema,
    table: TokenTable,
    compact: bool,
) -> EtcInstance:
    """The instance from its documents and their per-token lookups: globals, links, features, targets."""
    vocab = schema.label_vocab()
    layouts = [doc.lay for doc in docs]
    levels = schema.global_types
    features: dict[str, list] = {}
    long_links, g2g_links, node_ids, node_types, target_docs = [], [], [], [], []
    loffset = goffset = 0
    for doc in docs:
        names, types = _names(doc, schema)
        node_ids.extend(names)
        node_types.extend(types)
        ll, gg = _edge_pairs(doc, schema, vocab, goffset, loffset)
        long_links.extend(ll)
        g2g_links.extend(gg)
        for key, value in doc_features(doc, schema).items():
            features.setdefault(key, []).append(value)
        if schema.targets and lookups.targets is None:
            target_docs.append(_doc_nodes(doc, schema, loffset))
        loffset += doc.long_length
        goffset += doc.g_kind.shape[0]

    cat = lookups.long
    gcat = lookups.globals
    L, G = cat["ids"].shape[0], gcat["ids"].shape[0]
    if L > schema.max_long_length:
        report.messages.append(
            f"long length {L} still exceeds max_long_length {schema.max_long_length} (nothing left to drop)"
        )
    report.long_tokens_after, report.globals_after = L, G
    empty3 = (np.zeros(0, np.int64),) * 3
    la, lb, lc = (np.concatenate(x) for x in zip(*long_links)) if long_links else empty3
    ga, gb, gc = (np.concatenate(x) for x in zip(*g2g_links)) if g2g_links else empty3
    side = CompactSideInputs(
        local_radius=schema.local_radius,
        max_distance=schema.relative_pos_max_distance,
        levels=levels,
        owners=np.stack([lookups.owners[lv] for lv in levels]).astype(np.int32)
        if levels
        else np.zeros((0, L), np.int32),
        long_doc=cat["doc"],
        long_segment=(np.cumsum(cat["boundary"]) - 1).astype(np.int32),
        global_doc=gcat["doc"],
        global_segment=gcat["segment"].astype(np.int32),
        global_blockable=gcat["blockable"],
        long_hard_l2g=cat["hard_l2g"],
        global_hard_g2l=gcat["hard_g2l"],
        cross_segment_label=vocab.id(schema.segments.cross_segment_label)
        if schema.segments.cross_segment_label
        else -1,
    )
    if not compact:
        _check_dense_size(L, G, schema)
    target_docs = lookups.targets if lookups.targets is not None else target_docs
    targets = lower_targets(schema.targets, target_docs, windowed=any(sel.window is not None for sel in selections))
    report.dropped_targets.extend(targets.dropped)
    report.messages.extend(targets.messages)
    side.link_long, side.link_global, side.link_label = _unique_last(la, lb, lc, max(G, 1))
    side.g2g_src, side.g2g_dst, side.g2g_label = _unique_last(ga, gb, gc, max(G, 1))
    return EtcInstance(
        long_token_ids=cat["ids"].astype(np.int32),
        long_type_ids=cat["types"].astype(np.int32),
        global_token_ids=gcat["ids"].astype(np.int32),
        global_type_ids=gcat["types"].astype(np.int32),
        side=side if compact else side.to_dense(),
        label_vocab=vocab,
        global_node_ids=node_ids,
        global_node_types=node_types,
        long_char_spans=cat["spans"].astype(np.int32),
        long_doc_index=cat["doc"],
        long_owners={level: side.owners[i] for i, level in enumerate(levels)},
        doc_ids=[lay.graph.doc_id for lay in layouts],
        texts=[lay.text for lay in layouts],  # U+FFFD for a lone surrogate, as the tokens saw it
        truncation=report,
        features={k: np.concatenate(v) for k, v in features.items()},
        global_doc_index=gcat["doc"],
        targets=targets.arrays,
        target_axes=targets.axes,
    )
