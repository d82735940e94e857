"""A brute-force compiler written straight from the definitions (docs/DESIGN.md §3 and the
schema descriptions), one token and one pair at a time, for the property tests to compare the
vectorized compiler against. Slow on purpose: no shared code with graphattn.compile.

Definitions used (no truncation):
- long text: tokens whose first character lies in a span of a `long` node type (all tokens if
  no type is long); per document: long_prefix, the long tokens in text order, and a [SEP] right
  after the last token of each `sep_after` node (inner node's first).
- a position is "in" node X if it is a real token whose first char lies in X's span, or the
  [SEP] of X or of a node whose span lies inside X's span (for equal spans, of a deeper node).
- owner of a position at level T: the innermost (smallest span, then deepest) global node of
  type T it is in; per_token globals own exactly their own wordpiece.
- global order: global_prefix, then per group the nodes in (start, -end, depth) order, span-less
  ones after in insertion order; per_token nodes expand to one global per wordpiece.
- hard masks are per query row (etcmodel's ignore_hard_*_mask): hard l2g closes long query i
  to every global but its owners and links unless i is a prefix token or lies in a node whose
  type ignores hard l2g; hard g2l closes global query g to every long token but those it owns or
  is linked to unless g is a prefix global or its type ignores hard g2l. Columns are never exempt.
"""

from __future__ import annotations

import numpy as np

from graphattn.schema import Schema


def _contains(outer, inner) -> bool:
    return outer[0] <= inner[0] and inner[1] <= outer[1]


class RefDoc:
    def __init__(self, graph, schema: Schema, tokenizer, doc_index: int):
        self.graph, self.schema, self.d = graph, schema, doc_index
        enc = tokenizer.encode(graph.text)
        self.ids, self.offsets = list(enc.ids), [tuple(o) for o in enc.offsets]
        self.nodes = list(graph.nodes.values())
        self.parent = {}
        for e in graph.edges:
            if schema.relations[e.relation].hierarchy:
                self.parent[e.dst] = e.src
        self.span = {n.id: n.span for n in self.nodes}
        self.type = {n.id: schema.node_types[n.type] for n in self.nodes}

    def depth(self, node_id: str) -> int:
        d = 0
        while node_id in self.parent:
            node_id, d = self.parent[node_id], d + 1
        return d

    def in_node(self, node_id: str, pos) -> bool:
        span = self.span[node_id]
        if span is None:
            return False
        kind, value = pos
        if kind == "tok":
            return span[0] <= self.offsets[value][0] < span[1]
        if kind == "sep":  # X's [SEP] is in X and in what contains X (equal spans: the shallower)
            inner = self.span[value]
            return node_id == value or (
                _contains(span, inner) and not (span == inner and self.depth(node_id) > self.depth(value))
            )
        return False

    def long_positions(self, special_ids, sep_id):
        long_types = [n for n, t in self.schema.node_types.items() if t.long]
        out = [("prefix", special_ids[name]) for name in self.schema.long_prefix]
        tokens = [
            t
            for t in range(len(self.ids))
            if not long_types or any(self.in_node(n.id, ("tok", t)) for n in self.nodes if n.type in long_types)
        ]
        seps = [n for n in self.nodes if self.type[n.id].sep_after and n.span is not None]
        for t in tokens:
            out.append(("tok", t))
            closing = [n for n in seps if [u for u in tokens if self.in_node(n.id, ("tok", u))][-1:] == [t]]
            closing.sort(key=lambda n: (-n.span[0], n.span[1], -self.depth(n.id)))
            out.extend(("sep", n.id) for n in closing)
        return out

    def globals_(self, special_ids, table_global):
        out = [("special", name) for name in self.schema.global_prefix]
        for group in self.schema.global_order:
            members = [n for n in self.nodes if n.type in group and self.type[n.id].selects(n.attrs)]
            spanned = sorted(
                [n for n in members if n.span is not None], key=lambda n: (n.span[0], -n.span[1], self.depth(n.id))
            )
            spanless = [n for n in members if n.span is None]
            for n in spanned + spanless:
                if self.type[n.id].global_mode == "per_token":
                    for t in range(len(self.ids)):
                        if self.in_node(n.id, ("tok", t)):
                            out.append(("per_token", n.id, t))
                else:
                    out.append(("node", n.id))
        return out

    def segment_of_global(self, entry):
        if entry[0] == "special":
            return None
        node_id = entry[1]
        while True:
            if self.type[node_id].segment:
                return (self.d, node_id)
            if node_id not in self.parent:
                return None
            node_id = self.parent[node_id]


def reference(graphs, schema: Schema, tokenizer) -> dict:
    """Everything an instance holds, from the definitions. Returns plain numpy arrays."""
    k, r = schema.relative_pos_max_distance, schema.local_radius
    vocab = schema.label_vocab()
    dnb, belongs = 2 * k + 1, 2 * k + 2
    special_ids = {
        name: (v if isinstance(v, int) else tokenizer.token_to_id(v)) for name, v in schema.special_tokens.items()
    }
    docs = [RefDoc(g, schema, tokenizer, d) for d, g in enumerate(graphs)]

    longs, globs = [], []  # (doc, entry)
    for doc in docs:
        longs += [(doc, p) for p in doc.long_positions(special_ids, special_ids.get("sep"))]
        globs += [(doc, e) for e in doc.globals_(special_ids, special_ids.get("global"))]
    L, G = len(longs), len(globs)

    def long_id(doc, p):
        return {"prefix": lambda: p[1], "tok": lambda: doc.ids[p[1]], "sep": lambda: special_ids["sep"]}[p[0]]()

    def global_id(doc, e):
        if e[0] == "special":
            return special_ids[e[1]]
        if e[0] == "per_token":
            return doc.ids[e[2]]
        token = doc.type[e[1]].global_token
        token = special_ids["global"] if token is None else token
        return token if isinstance(token, int) else tokenizer.token_to_id(token)

    def owns(gi, li) -> bool:
        (gdoc, e), (ldoc, p) = globs[gi], longs[li]
        if gdoc is not ldoc or e[0] == "special":
            return False
        if e[0] == "per_token":
            return p == ("tok", e[2])
        level = gdoc.graph.nodes[e[1]].type
        holders = [
            n for n in gdoc.nodes if n.type == level and gdoc.type[n.id].selects(n.attrs) and gdoc.in_node(n.id, p)
        ]
        if not holders:
            return False
        inner = min(holders, key=lambda n: (n.span[1] - n.span[0], -gdoc.depth(n.id)))
        return inner.id == e[1]

    def link_label(gi, li):
        (gdoc, e), (ldoc, p) = globs[gi], longs[li]
        label = None
        if gdoc is not ldoc or e[0] == "special" or p[0] != "tok":
            return None
        for edge in gdoc.graph.edges:
            rel = schema.relations[edge.relation]
            if rel.link not in ("l2g", "g2l"):
                continue
            long_side, global_side = (edge.dst, edge.src) if rel.link == "g2l" else (edge.src, edge.dst)
            if global_side == e[1] and gdoc.in_node(long_side, p):
                label = vocab.id(rel.label) if rel.label else belongs
        return label

    def exempt_long(li, flag) -> bool:
        doc, p = longs[li]
        return p[0] == "prefix" or any(getattr(doc.type[n.id], flag) and doc.in_node(n.id, p) for n in doc.nodes)

    def hard_global(gi) -> bool:
        doc, e = globs[gi]
        if e[0] == "special":
            return False
        return schema.masks.hard_g2l and not doc.type[e[1]].ignore_hard_g2l

    # segments: a new run wherever the innermost segment node of some segment type changes
    def seg_key(li):
        doc, p = longs[li]
        key = [doc.d]
        for name, t in schema.node_types.items():
            if t.segment:
                holders = [n for n in doc.nodes if n.type == name and doc.in_node(n.id, p)]
                key.append(min(holders, key=lambda n: n.span[1] - n.span[0]).id if holders else None)
        return tuple(key)

    keys = [seg_key(i) for i in range(L)]
    l2l_mask = np.zeros((L, 2 * r + 1), np.int32)
    for i in range(L):
        for c in range(2 * r + 1):
            j = i + c - r
            if 0 <= j < L and all(keys[m] == keys[m + 1] for m in range(min(i, j), max(i, j))):
                l2l_mask[i, c] = 1

    def dist(q, key):
        d = key - q
        return min(d, k) if d > 0 else (k + min(-d, k) if d < 0 else 0)

    g2g_mask = np.zeros((G, G), np.int32)
    g2g_ids = np.zeros((G, G), np.int32)
    segs = [doc.segment_of_global(e) for doc, e in globs]
    cross_label = vocab.id(schema.segments.cross_segment_label) if schema.segments.cross_segment_label else None
    for g in range(G):
        for h in range(G):
            same_doc = globs[g][0] is globs[h][0]
            cross = same_doc and segs[g] != segs[h]
            types = [None if e[0] == "special" else doc.graph.nodes[e[1]].type for doc, e in (globs[g], globs[h])]
            blocked = cross and None not in types and schema.segments.blocks(*types)
            g2g_mask[g, h] = int(same_doc and not blocked)
            g2g_ids[g, h] = cross_label if (cross and cross_label is not None) else dist(g, h)
    for doc in docs:
        for edge in doc.graph.edges:
            rel = schema.relations[edge.relation]
            if rel.link != "g2g":
                continue
            src = [i for i, (d, e) in enumerate(globs) if d is doc and e[0] != "special" and e[1] == edge.src]
            dst = [i for i, (d, e) in enumerate(globs) if d is doc and e[0] != "special" and e[1] == edge.dst]
            for a in src:
                for b in dst:
                    g2g_ids[a, b] = vocab.id(rel.label)
                    g2g_ids[b, a] = vocab.id(rel.reverse_label or rel.label)

    l2g_mask = np.zeros((L, G), np.int32)
    l2g_ids = np.full((L, G), dnb, np.int32)
    g2l_mask = np.zeros((G, L), np.int32)
    for i in range(L):
        for g in range(G):
            same_doc = longs[i][0] is globs[g][0]
            owned, link = owns(g, i), link_label(g, i)
            l2g_ids[i, g] = link if link is not None else (belongs if owned else dnb)
            free_l2g = not schema.masks.hard_l2g or exempt_long(i, "ignore_hard_l2g")
            free_g2l = not hard_global(g)
            l2g_mask[i, g] = int(same_doc and (free_l2g or owned or link is not None))
            g2l_mask[g, i] = int(same_doc and (free_g2l or owned or link is not None))

    pattern = [dist(0, c - r) for c in range(2 * r + 1)]
    return {
        "long_token_ids": np.array([long_id(d, p) for d, p in longs], np.int32),
        "global_token_ids": np.array([global_id(d, e) for d, e in globs], np.int32),
        "long_doc_index": np.array([d.d for d, _ in longs], np.int32),
        "l2l_att_mask": l2l_mask,
        "l2l_relative_att_ids": np.array([pattern] * L, np.int32).reshape(L, 2 * r + 1),
        "g2g_att_mask": g2g_mask,
        "g2g_relative_att_ids": g2g_ids,
        "l2g_att_mask": l2g_mask,
        "l2g_relative_att_ids": l2g_ids,
        "g2l_att_mask": g2l_mask,
        "g2l_relative_att_ids": l2g_ids.T.copy(),
    }
