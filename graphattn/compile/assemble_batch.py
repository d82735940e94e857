"""Assembly of many instances at once: the per-token lookups of a whole batch in one pass.

`assemble` looks up, per document, which node covers each long position (owners at every
level, type ids, l2l run starts, hard-l2g rows): a few dozen numpy calls on arrays of a
thousand tokens, so a document costs its calls, not its tokens. Here the documents of all the
instances of a batch are laid end to end, as one ragged array (values + offsets): long
positions `[long_start[d], long_start[d] + long_length[d])` belong to document d, its nodes are
rows `[node_start[d], ...)` of the concatenated node arrays. Ranges of different documents
never overlap, so "the innermost node covering a position" over the concatenation is each
document's own answer; the lookups run once per batch and are cut per instance at the end.

Per document (and per instance) stay the parts that can fail on bad input, each failing on its
own (`begin_instance`: no text fits; `finish_instance`: links, features, targets), so a document
that fails gets its exception in its place and the others compile. The result is identical to
`assemble` of each instance alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from graphattn.compile.assemble import (
    BLOCK,
    NODE,
    PER_TOKEN,
    SPECIAL,
    TokenLookups,
    _Doc,
    _hard_l2g_rows,
    _owners,
    begin_instance,
    doc_nodes_of,
    finish_instance,
    global_flags,
    node_positions,
    schema_types,
    token_lookups,
    type_table,
)
from graphattn.compile.layout import DocLayout
from graphattn.compile.ranges import (
    coverage,
    expand_ranges,
    innermost,
    ragged_offsets,
    ragged_rows,
    searchsorted_left,
    take_or,
)
from graphattn.compile.targets import DocNodes
from graphattn.compile.tokens import TokenTable
from graphattn.compile.truncate import Selection, _nearest_of_type
from graphattn.contract import EtcInstance
from graphattn.schema import Schema

Item = tuple[list[DocLayout], list[Selection]]
"""One instance to assemble: its documents' layouts and the tokens chosen from each."""


def assemble_many(
    items: Sequence[Item], schema: Schema, table: TokenTable, *, compact: bool = False
) -> list[EtcInstance | Exception]:
    """`assemble` of each item, the per-token lookups done once for all of them.

    An item that fails gets its exception in its place (any exception, as `assemble` raises it)."""
    out: list[EtcInstance | Exception | None] = [None] * len(items)
    begun: list[tuple[int, list[_Doc], object]] = []
    try:
        pairs = [(lay, sel) for layouts, selections in items for lay, sel in zip(layouts, selections)]
        made = iter(long_parts(pairs, schema))
        long = [[next(made) for _ in layouts] for layouts, _ in items]
        global_parts([doc for docs in long for doc in docs], schema)
    except Exception:  # noqa: BLE001 - as for the lookups below: each document alone
        long = [None] * len(items)
    for i, (layouts, selections) in enumerate(items):
        try:
            docs, report = begin_instance(layouts, selections, schema, long[i], globals_made=long[i] is not None)
        except Exception as err:  # noqa: BLE001 - per instance
            out[i] = err
            continue
        begun.append((i, docs, report))
    try:
        lookups = batch_lookups([docs for _, docs, _ in begun], schema, table)
    except Exception:  # noqa: BLE001 - a batch the vectorized path cannot take: each instance alone
        lookups = [None] * len(begun)
    for (i, docs, report), lookup in zip(begun, lookups):
        try:
            lookup = lookup if lookup is not None else token_lookups(docs, schema, table)
            out[i] = finish_instance(docs, report, lookup, items[i][1], schema, table, compact)  # type: ignore[arg-type]
        except Exception as err:  # noqa: BLE001 - per instance
            out[i] = err
    return out  # type: ignore[return-value]


def long_parts(pairs: list[tuple[DocLayout, Selection]], schema: Schema) -> list[_Doc]:
    """`assemble._long_part` of each (layout, selection), over the documents laid end to end:
    their tokens (offset per document), kept tokens and the nodes that hold tokens as one array
    each (`DocLayout.token_rows`: the other nodes' ranges stay [0, 0), as in `_long_part`)."""
    if not pairs:
        return []
    lays = [lay for lay, _ in pairs]
    token_start, _ = ragged_offsets([lay.n_tokens for lay in lays])
    n_nodes = [lay.n_nodes for lay in lays]
    node_start, total_nodes = ragged_offsets(n_nodes)
    kept = np.flatnonzero(np.concatenate([lay.is_long & sel.keep for lay, sel in pairs]))  # batch token index
    kept_start = np.searchsorted(kept, token_start)
    n_kept = np.diff(np.append(kept_start, kept.shape[0]))
    token_rows = [lay.token_rows() for lay in lays]
    row_doc = ragged_rows([r.shape[0] for r in token_rows])
    rows = np.concatenate(token_rows) + node_start[row_doc]  # batch node rows
    # Node ranges among the document's kept tokens, and the [SEP]s: after the last kept token of
    # each `sep_after` node, the inner node's first where several end together.
    kr_rows = searchsorted_left(kept, _take_rows([lay.ranges for lay in lays], token_rows) + token_start[row_doc, None])
    kr_rows -= kept_start[row_doc, None]
    has_kept = kr_rows[:, 1] > kr_rows[:, 0]
    rank = _take_rows([lay.rank for lay in lays], token_rows) + node_start[row_doc]
    sep_after = _take_rows([lay.type_flag("sep_after") for lay in lays], token_rows)
    seps = np.flatnonzero(sep_after & has_kept)  # indexes `rows`
    last = kr_rows[seps, 1] - 1 + kept_start[row_doc[seps]]  # batch index of the kept token each [SEP] follows
    order = np.lexsort((-rank[seps], last))
    seps, last = seps[order], last[order]
    seps_before = np.searchsorted(row_doc[seps], np.arange(len(lays)))  # [SEP]s of the documents before
    body_start = kept_start + seps_before
    body = np.insert(kept, last + 1, -1)
    body_doc = ragged_rows(n_kept + np.diff(np.append(seps_before, seps.shape[0])))
    body_token = np.where(body >= 0, body - token_start[body_doc], -1)
    kept_doc = ragged_rows(n_kept)
    kept_pos = np.arange(kept.shape[0]) + np.searchsorted(last, np.arange(kept.shape[0]), side="left")
    # A node's body range ends after the [SEP]s that follow its last kept token and belong to it
    # or to nodes inside it (rank >= its rank): one sorted key per [SEP], as in `_long_part`.
    scale = int(rank.max(initial=0)) + 1
    sep_keys = last * scale + (scale - 1 - rank[seps])
    holding = np.flatnonzero(has_kept)  # indexes `rows`
    holding_doc = row_doc[holding]
    node_last = kr_rows[holding, 1] - 1 + kept_start[holding_doc]
    own_seps = np.searchsorted(
        sep_keys, node_last * scale + (scale - 1 - rank[holding]), side="right"
    ) - np.searchsorted(sep_keys, node_last * scale, side="left")
    covering = rows[holding]  # the nodes that keep tokens (batch rows, ascending)
    kr = np.zeros((total_nodes, 2), dtype=np.int64)
    kr[rows] = kr_rows
    br = np.zeros((total_nodes, 2), dtype=np.int64)
    br[covering, 0] = kept_pos[kr_rows[holding, 0] + kept_start[holding_doc]] - body_start[holding_doc]
    br[covering, 1] = kept_pos[node_last] + 1 + own_seps - body_start[holding_doc]
    alive = ~np.concatenate([lay.in_long for lay in lays])
    alive[covering] = True
    covering_start = np.searchsorted(holding_doc, np.arange(len(lays) + 1))
    kept -= token_start[kept_doc]
    kept_pos -= body_start[kept_doc]
    n_prefix = len(schema.long_prefix)
    docs = []
    for d, lay in enumerate(lays):
        k0, k1, n0, n1 = kept_start[d], kept_start[d] + n_kept[d], node_start[d], node_start[d] + n_nodes[d]
        b0 = body_start[d]
        b1 = b0 + n_kept[d] + (seps_before[d + 1] if d + 1 < len(lays) else seps.shape[0]) - seps_before[d]
        covers = covering[covering_start[d] : covering_start[d + 1]] - n0
        docs.append(
            _Doc(
                lay,
                kept[k0:k1],
                kr[n0:n1],
                br[n0:n1],
                kept_pos[k0:k1],
                body_token[b0:b1],
                alive[n0:n1],
                n_prefix,
                _covering=covers,
            )
        )
    return docs


def _take_rows(arrays: list[np.ndarray], rows: list[np.ndarray]) -> np.ndarray:
    """Those `rows` of each document's per-node array, the documents end to end."""
    return np.concatenate([np.take(array, r, axis=0) for array, r in zip(arrays, rows)])


def global_parts(docs: list[_Doc], schema: Schema) -> None:
    """`assemble._global_part` of each document, over all of them at once: each piece of each
    document's global sequence (prefix, each global_order group's members, fixed blocks) is made
    for the whole batch, then one stable sort by (document, piece) puts them in each one's order."""
    if not docs:
        return
    lays = [doc.lay for doc in docs]
    n_nodes = [lay.n_nodes for lay in lays]
    node_start, _ = ragged_offsets(n_nodes)
    node_type = np.concatenate([schema_types(lay, schema) for lay in lays])
    rank = np.concatenate([lay.rank for lay in lays]) + np.repeat(node_start, n_nodes)
    node_doc = ragged_rows(n_nodes)
    ranges = np.concatenate([lay.ranges for lay in lays])
    candidates = np.concatenate([lay.selected for lay in lays]) & np.concatenate([doc.alive for doc in docs])
    per_token_type = type_table(schema, lambda t: t.global_mode == "per_token", bool)
    blocks_name = schema.fixed_blocks.name if schema.fixed_blocks else None
    n_prefix = len(schema.global_prefix)
    n_docs = len(docs)
    # pieces: (document, piece number, kind, node (document row), token)
    pieces = [
        (
            np.repeat(np.arange(n_docs), n_prefix),
            np.zeros(n_docs * n_prefix, np.int64),
            np.full(n_docs * n_prefix, SPECIAL),
            np.full(n_docs * n_prefix, -1),
            np.tile(np.arange(n_prefix), n_docs),
        )
    ]
    for g, group in enumerate(schema.global_order):
        in_group = np.array([name in group for name in schema.node_types], dtype=bool)
        members = np.flatnonzero(candidates & in_group[node_type])
        members = members[np.argsort(rank[members], kind="stable")]  # by document, then document order
        per_token = per_token_type[node_type[members]]
        counts = np.where(per_token, ranges[members, 1] - ranges[members, 0], 1)
        positions, which = expand_ranges(np.zeros_like(counts), counts)
        node = members[which]
        pieces.append(
            (
                node_doc[node],
                np.full(node.shape[0], 2 * g + 1),
                np.where(per_token[which], PER_TOKEN, NODE),
                node - node_start[node_doc[node]],
                np.where(per_token[which], ranges[node, 0] + positions, -1),
            )
        )
        if blocks_name in group:
            n_blocks = -(-np.array([doc.long_length for doc in docs]) // schema.fixed_blocks.tokens_per_block)
            block_doc = ragged_rows(n_blocks)
            block = np.arange(block_doc.shape[0]) - ragged_offsets(n_blocks)[0][block_doc]
            pieces.append(
                (
                    block_doc,
                    np.full(block.shape[0], 2 * g + 2),
                    np.full(block.shape[0], BLOCK),
                    np.full(block.shape[0], -1),
                    block,
                )
            )
    doc, piece, kind, node, token = (np.concatenate(column).astype(np.int64) for column in zip(*pieces))
    order = np.argsort(doc * (2 * len(schema.global_order) + 2) + piece, kind="stable")
    kind, node, token = kind[order], node[order], token[order]
    start = np.searchsorted(doc[order], np.arange(n_docs + 1))
    for d, one in enumerate(docs):
        part = slice(start[d], start[d + 1])
        one.g_kind, one.g_node, one.g_token = kind[part], node[part], token[part]


@dataclass
class _Batch:
    """The documents of many instances end to end: per long position and per node, batch-wide."""

    docs: list[_Doc]
    long_start: np.ndarray  # [D] first long position of each document
    long_length: np.ndarray  # [D]
    node_start: np.ndarray  # [D] first row of each document's nodes
    doc_of: np.ndarray  # [Ltot] document of each long position
    token: np.ndarray  # [Ltot] the document's token index at each position, -1 for a prefix or inserted [SEP]
    prefix: np.ndarray  # [Ltot] bool: a long_prefix position
    node_type: np.ndarray  # [Ntot] index into the schema's node types
    alive: np.ndarray  # [Ntot] bool
    rank: np.ndarray  # [Ntot] document order, offset per document (unique across the batch)
    body: np.ndarray  # [Ntot, 2] the node's body range, in batch long positions
    range_start: np.ndarray  # [Ntot] the node's first token (document coordinates)
    gpos: np.ndarray  # [Ntot] the node's first global in its instance, -1 for none
    gcount: np.ndarray  # [Ntot] how many globals it has
    parent: np.ndarray  # [Ntot] hierarchy parent (batch row), -1 for roots
    g_doc: np.ndarray  # [Gtot] document of each global
    g_kind: np.ndarray  # [Gtot] SPECIAL, NODE, PER_TOKEN or BLOCK
    g_node: np.ndarray  # [Gtot] the global's node (batch row), -1 for the compiler's own
    g_token: np.ndarray  # [Gtot] see `_Doc.g_token` (document coordinates)
    covering: np.ndarray  # rows whose body range is not empty, ascending (all alive): only they cover positions

    @property
    def length(self) -> int:
        return int(self.doc_of.shape[0])

    def innermost_of(self, nodes: np.ndarray) -> np.ndarray:
        """Per batch long position: index into `nodes` of the innermost one covering it, -1 if none."""
        return innermost(self.length, self.body[nodes, 0], self.body[nodes, 1], self.rank[nodes])


def _concat_batch(docs: list[_Doc], goffsets: list[int], schema: Schema) -> _Batch:
    n_prefix = docs[0].n_prefix
    long_length = np.array([doc.long_length for doc in docs], dtype=np.int64)
    body_length = long_length - n_prefix
    n_nodes = np.array([doc.lay.n_nodes for doc in docs], dtype=np.int64)
    long_start, total = ragged_offsets(long_length)
    node_start, _ = ragged_offsets(n_nodes)
    doc_of = ragged_rows(long_length)
    # Body positions: after each document's prefix; the prefix positions are the others.
    body_start, body_total = ragged_offsets(body_length)
    body_pos = np.arange(body_total) + np.repeat(long_start + n_prefix - body_start, body_length)
    token = np.full(total, -1, dtype=np.int64)
    token[body_pos] = np.concatenate([doc.body_token for doc in docs])
    prefix = np.ones(total, dtype=bool)
    prefix[body_pos] = False
    node_type = np.concatenate([schema_types(doc.lay, schema) for doc in docs])
    gpos = np.concatenate([np.where(doc.node_gpos >= 0, doc.node_gpos + g, -1) for doc, g in zip(docs, goffsets)])
    g_doc = ragged_rows([doc.g_kind.shape[0] for doc in docs])
    g_node = np.concatenate([doc.g_node for doc in docs])
    node_base = np.repeat(node_start, n_nodes)  # each node's document's first row
    parent = np.concatenate([doc.lay.parent for doc in docs]) + node_base
    return _Batch(
        docs=docs,
        long_start=long_start,
        long_length=long_length,
        node_start=node_start,
        doc_of=doc_of,
        token=token,
        prefix=prefix,
        node_type=node_type,
        alive=np.concatenate([doc.alive for doc in docs]),
        rank=np.concatenate([doc.lay.rank for doc in docs]) + node_base,
        body=np.concatenate([doc.br for doc in docs]) + np.repeat(long_start + n_prefix, n_nodes)[:, None],
        range_start=np.concatenate([doc.lay.ranges[:, 0] for doc in docs]),
        gpos=gpos,
        gcount=np.concatenate([doc.node_gcount for doc in docs]),
        parent=np.where(parent >= node_base, parent, -1),
        g_doc=g_doc,
        g_kind=np.concatenate([doc.g_kind for doc in docs]),
        g_node=np.where(g_node >= 0, g_node + node_start[g_doc], -1),
        g_token=np.concatenate([doc.g_token for doc in docs]),
        covering=np.concatenate([doc.covering() + start for doc, start in zip(docs, node_start.tolist())]),
    )


def batch_lookups(instances: list[list[_Doc]], schema: Schema, table: TokenTable) -> list[TokenLookups]:
    """`token_lookups` of each instance (its documents), computed over all of them at once."""
    if not instances:
        return []
    docs = [doc for inst in instances for doc in inst]
    goffsets = [g for inst in instances for g in ragged_offsets([d.g_kind.shape[0] for d in inst])[0].tolist()]
    batch = _concat_batch(docs, goffsets, schema)
    boundary, inner_segment = _segment_boundaries(batch, schema)
    doc_in_instance = np.concatenate([np.arange(len(inst)) for inst in instances]).astype(np.int32)
    long = {
        "ids": _long_token_ids(batch, table),
        "types": _long_type_ids(batch, schema),
        "spans": _long_spans(batch),
        "doc": doc_in_instance[batch.doc_of],
        "boundary": boundary,
        "hard_l2g": _hard_l2g(batch, schema),
    }
    owners = {level: _level_owners(batch, schema, level, goffsets) for level in schema.global_types}
    first_of_instance = np.repeat(ragged_offsets([len(inst) for inst in instances])[0], [len(i) for i in instances])
    globals_ = _global_arrays(batch, schema, table, inner_segment, batch.node_start[first_of_instance])
    globals_["doc"] = doc_in_instance[batch.g_doc]
    globals_ = {k: globals_[k] for k in ("ids", "types", "doc", "segment", "blockable", "hard_g2l")}

    first_long = batch.long_start[first_of_instance]
    targets = _target_nodes(batch, schema, batch.long_start - first_long) if schema.targets else None
    g_start, _ = ragged_offsets([doc.g_kind.shape[0] for doc in docs])
    g_stop = g_start + [doc.g_kind.shape[0] for doc in docs]
    out, first_doc = [], 0
    for inst in instances:
        d0, d1 = first_doc, first_doc + len(inst)
        start, stop = int(batch.long_start[d0]), int(batch.long_start[d1 - 1] + batch.long_length[d1 - 1])
        g0, g1 = int(g_start[d0]), int(g_stop[d1 - 1])
        out.append(
            TokenLookups(
                {k: v[start:stop] for k, v in long.items()},
                {level: v[start:stop] for level, v in owners.items()},
                {k: v[g0:g1] for k, v in globals_.items()},
                targets[d0:d1] if targets is not None else None,
            )
        )
        first_doc = d1
    return out


def _target_nodes(batch: _Batch, schema: Schema, long_offset: np.ndarray) -> list[DocNodes]:
    """`assemble._doc_nodes` of every document (`long_offset`: where each starts in its instance),
    over the nodes whose range holds tokens (`DocLayout.token_rows`), the documents end to end."""
    docs = batch.docs
    token_rows = [doc.lay.token_rows() for doc in docs]
    row_doc = ragged_rows([rows.shape[0] for rows in token_rows])
    kept_start, _ = ragged_offsets([doc.kept.shape[0] for doc in docs])
    token_start, _ = ragged_offsets([doc.lay.n_tokens for doc in docs])
    past = [doc.lay.long_past_cut for doc in docs]
    positions = node_positions(
        int(batch.node_start[-1]) + docs[-1].lay.n_nodes,
        np.concatenate(token_rows) + batch.node_start[row_doc],
        _take_rows([doc.kr for doc in docs], token_rows) + kept_start[row_doc, None],  # batch kept index
        _take_rows([doc.lay.ranges for doc in docs], token_rows) + token_start[row_doc, None],  # batch token index
        np.concatenate([doc.kept + token_start[d] for d, doc in enumerate(docs)]),
        np.concatenate([doc.kept_pos for doc in docs]),
        np.concatenate([doc.lay.is_long for doc in docs]),
        np.concatenate([p if p is not None else np.zeros(doc.lay.n_nodes, bool) for p, doc in zip(past, docs)]),
        (long_offset + docs[0].n_prefix)[row_doc],
    )
    out = []
    for d, doc in enumerate(docs):
        rows = slice(int(batch.node_start[d]), int(batch.node_start[d]) + doc.lay.n_nodes)
        out.append(doc_nodes_of(doc, schema, *(array[rows] for array in positions)))
    return out


def _global_arrays(
    batch: _Batch, schema: Schema, table: TokenTable, inner_segment: np.ndarray, instance_node_start: np.ndarray
) -> dict[str, np.ndarray]:
    """Per global of the batch: token id, type id, segment (instance node index), g2g blockable,
    its g2l row under the hard mask (see `assemble._global_flags`)."""
    kind, node = batch.g_kind, batch.g_node
    node_type = take_or(batch.node_type, node, 0)
    out = global_flags(kind, node_type, schema)
    out["types"] = out.pop("type_ids")
    ids = np.zeros(kind.shape[0], dtype=np.int32)
    special = kind == SPECIAL
    ids[special] = table.global_prefix[batch.g_token[special]]
    node_global = np.array([table.node_global.get(t, 0) for t in schema.node_types], dtype=np.int32)
    of_node = kind == NODE
    ids[of_node] = node_global[node_type[of_node]]
    tok = np.flatnonzero(kind == PER_TOKEN)
    token_ids, token_start = _concat_tokens(batch, lambda lay: lay.token_ids)
    ids[tok] = token_ids[batch.g_token[tok] + token_start[batch.g_doc[tok]]]
    if table.block is not None:
        ids[kind == BLOCK] = table.block
    out["ids"] = ids

    # Segment: the nearest segment ancestor-or-self, else the segment its text is in.
    is_segment = type_table(schema, lambda t: bool(t.segment), bool)[batch.node_type]
    seg = np.full(node.shape[0], -1, dtype=np.int64)
    own = take_or(is_segment, node, False)
    seg[own] = node[own]
    rest = np.flatnonzero((node >= 0) & ~own)
    if rest.size:
        seg[rest] = _nearest_of_type(batch.parent, node[rest], is_segment)
        body = batch.body[node[rest]]
        by_span = rest[(seg[rest] < 0) & (body[:, 1] > body[:, 0])]
        seg[by_span] = inner_segment[batch.body[node[by_span], 0]]
    out["segment"] = np.where(seg >= 0, seg - instance_node_start[batch.g_doc], -1)
    return out


def _long_token_ids(batch: _Batch, table: TokenTable) -> np.ndarray:
    ids = np.full(batch.length, table.sep if table.sep is not None else 0, dtype=np.int32)
    ids[batch.prefix] = np.tile(table.long_prefix, len(batch.docs))
    real = np.flatnonzero(batch.token >= 0)
    token_ids, token_start = _concat_tokens(batch, lambda lay: lay.token_ids)
    ids[real] = token_ids[batch.token[real] + token_start[batch.doc_of[real]]]
    return ids


def _long_spans(batch: _Batch) -> np.ndarray:
    spans = np.full((batch.length, 2), -1, dtype=np.int32)
    real = np.flatnonzero(batch.token >= 0)
    offsets, token_start = _concat_tokens(batch, lambda lay: lay.offsets)
    # each (start, end) pair moved as one int64: a 1-D take instead of a row gather
    pairs = np.ascontiguousarray(offsets).view(np.int64).reshape(-1)
    spans.view(np.int64).reshape(-1)[real] = pairs[batch.token[real] + token_start[batch.doc_of[real]]]
    return spans


def _concat_tokens(batch: _Batch, column) -> tuple[np.ndarray, np.ndarray]:
    parts = [column(doc.lay) for doc in batch.docs]
    return np.concatenate(parts), ragged_offsets([p.shape[0] for p in parts])[0]


def _long_type_ids(batch: _Batch, schema: Schema) -> np.ndarray:
    type_ids = type_table(schema, lambda t: -1 if t.type_id is None else t.type_id, np.int64)
    rows = batch.covering
    nodes = rows[type_ids[batch.node_type[rows]] >= 0]
    return take_or(type_ids[batch.node_type[nodes]], batch.innermost_of(nodes), 0).astype(np.int32)


def _hard_l2g(batch: _Batch, schema: Schema) -> np.ndarray:
    ignores = type_table(schema, lambda t: bool(t.ignore_hard_l2g), bool)
    rows = batch.covering
    nodes = rows[ignores[batch.node_type[rows]]]
    restricted = _hard_l2g_rows(schema) & ~coverage(batch.length, batch.body[nodes, 0], batch.body[nodes, 1])
    restricted[batch.prefix] = False
    return restricted


def _segment_boundaries(batch: _Batch, schema: Schema) -> tuple[np.ndarray, np.ndarray]:
    """bool [Ltot]: a new l2l run starts here (at every document's start, and where the innermost
    segment node of any one type changes); and per position its innermost segment node, as the
    batch row (-1: none)."""
    is_segment = type_table(schema, lambda t: bool(t.segment), bool)
    boundary = np.zeros(batch.length, dtype=bool)
    segments = batch.covering[is_segment[batch.node_type[batch.covering]]]
    for t in np.flatnonzero(is_segment).tolist():
        nodes = segments[batch.node_type[segments] == t]
        if nodes.size == 0:
            continue
        key = take_or(nodes, batch.innermost_of(nodes), -1)
        boundary[1:] |= key[1:] != key[:-1]
    boundary[batch.long_start[batch.long_start < batch.length]] = True
    return boundary, take_or(segments, batch.innermost_of(segments), -1)


def _level_owners(batch: _Batch, schema: Schema, level: str, goffsets: list[int]) -> np.ndarray:
    """int64 [Ltot]: the global (instance coordinates) owning each position at `level`, -1 for none."""
    if schema.fixed_blocks is not None and level == schema.fixed_blocks.name:  # arithmetic per document
        return np.concatenate([_owners(doc, schema, level, g) for doc, g in zip(batch.docs, goffsets)])
    level_type = list(schema.node_types).index(level)
    rows = batch.covering
    nodes = rows[(batch.node_type[rows] == level_type) & (batch.gpos[rows] >= 0)]
    node = take_or(nodes, batch.innermost_of(nodes), -1)
    first = take_or(batch.gpos, node, -1)
    if schema.node_types[level].global_mode == "per_token":  # each wordpiece owned by its own copy
        offset = batch.token - take_or(batch.range_start, node, 0)
        valid = (node >= 0) & (batch.token >= 0) & (offset < take_or(batch.gcount, node, 0))
        return np.where(valid, first + offset, -1)
    return np.where(node >= 0, first, -1)


__all__ = ["Item", "assemble_many", "batch_lookups", "global_parts", "long_parts"]
