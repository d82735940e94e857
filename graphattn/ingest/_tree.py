"""HTML tree -> `Walk`: what the tree holds per element, recorded without Python code per element.

lxml's C-level iteration lists every node once (``root.iter()``, document order), and one `map`
per property reads tags, parents, texts and tails; libxml2's XPath finds the few elements with a
``style`` or ``hidden`` attribute, and only those (and ``input``, ``dialog``, ``font``) have
their inline style read in Python. Hidden elements are recorded but what they hold is cut out
with numpy, as are depths and the start/end event order, which `graphattn.ingest._walk` turns
into the visible text. (A per-event loop over ``iterwalk`` cost as much again.)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import compress
from operator import attrgetter, methodcaller

import lxml.etree as etree
import numpy as np

from graphattn.errors import IngestError
from graphattn.graph.forest import forest_depths
from graphattn.ingest import _style as style

COMMENT = "#comment"  # stands for a comment or PI the parser kept: not an element, but its tail is text
_ATTRIBUTE_TAGS = frozenset({"input", "dialog", "font"})  # tags whose attributes the style rules read


@dataclass
class Walk:
    """What the walk records, one entry per element seen (hidden ones too), in document order."""

    tag_names: list[str] = field(default_factory=list)  # sorted; comments and PIs are "#comment"
    tag_codes: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # index into tag_names
    parents: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # parent's index, -1 for the root
    depths: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    texts: list[str | None] = field(default_factory=list)
    tails: list[str | None] = field(default_factory=list)
    events: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # i: element i starts, ~i: it ends
    hidden: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # not rendered (with their subtree)
    styled: dict[int, tuple[dict, str | None]] = field(default_factory=dict)  # i -> (inline style, size attr)
    selected: np.ndarray | None = None


_TAG, _TEXT, _TAIL, _PARENT = attrgetter("tag"), attrgetter("text"), attrgetter("tail"), methodcaller("getparent")
# Attribute nodes found by libxml2's XPath: far cheaper than asking every element for them.
_STYLE_ATTRIBUTES = etree.XPath("descendant-or-self::*/@style")
_HIDDEN_ATTRIBUTES = etree.XPath("descendant-or-self::*/@hidden")


def walk(root: etree._Element, *, max_elements: int, source: str | None, selected: set | None = None) -> Walk:
    """Record the tree with lxml's C-level iteration and one `map` per property (no Python code
    per element); what a hidden element hides is then cut out with numpy. See the module docstring."""
    nodes = list(root.iter())  # document order, comments and PIs included (their tails are text)
    n = len(nodes)
    position = _Positions(nodes)
    parents = position.of(map(_PARENT, nodes), n)
    tags = list(map(_TAG, nodes))
    kinds = {tag: i for i, tag in enumerate(set(tags))}
    codes = np.fromiter(map(kinds.__getitem__, tags), dtype=np.int64, count=n)
    names = [tag if isinstance(tag, str) else COMMENT for tag in kinds]  # a comment or PI the parser kept
    tag_names = sorted(set(names))
    codes = np.array([tag_names.index(name) for name in names], dtype=np.int64).reshape(-1)[codes]
    hidden_tag = np.array([name == COMMENT or name in style.INVISIBLE_TAGS for name in tag_names])
    attribute_tag = np.array([name in _ATTRIBUTE_TAGS for name in tag_names])
    hidden = hidden_tag[codes]
    owners = [attribute.getparent() for attribute in _STYLE_ATTRIBUTES(root) + _HIDDEN_ATTRIBUTES(root)]
    candidates = np.union1d(position.of(owners, len(owners)), np.flatnonzero(attribute_tag[codes]))
    styled = {}
    for i in candidates.tolist():  # the few elements whose attributes the style rules read
        el, tag = nodes[i], tags[i]
        declared = style.inline_style(el.get("style"))
        if style.is_hidden(tag, el, declared):
            hidden[i] = True
        else:
            styled[i] = (declared, el.get("size"))

    seen = ~_below(hidden, parents)  # hidden elements are recorded, what they hold is not
    rows = np.flatnonzero(seen)
    renumber = np.cumsum(seen) - 1
    hidden = hidden[rows]
    if np.count_nonzero(~hidden) > max_elements:
        raise IngestError(f"more than max_elements={max_elements} rendered elements", file=source)
    kept_parents = parents[rows]
    kept_parents = np.where(kept_parents >= 0, renumber[np.maximum(kept_parents, 0)], -1)
    depths, _ = forest_depths(kept_parents)  # a tree: no node is on a cycle
    everything = rows.size == n
    keep = None if everything else seen.tolist()
    texts = list(map(_TEXT, nodes) if everything else compress(map(_TEXT, nodes), keep))
    tails = list(map(_TAIL, nodes) if everything else compress(map(_TAIL, nodes), keep))
    codes = codes[rows]
    if COMMENT in tag_names:
        for i in np.flatnonzero(codes == tag_names.index(COMMENT)).tolist():
            texts[i] = None  # a comment's content is not text
    chosen = None
    if selected is not None:
        picked = np.unique(position.of(selected, len(selected)))
        picked = picked[picked >= 0]
        picked = picked[seen[picked]]
        chosen = renumber[picked]
        chosen = chosen[~hidden[chosen]]
    return Walk(
        tag_names=tag_names,
        tag_codes=codes,
        parents=kept_parents,
        depths=depths,
        texts=texts,
        tails=tails,
        events=_events(kept_parents, depths),
        hidden=np.flatnonzero(hidden),
        styled={int(renumber[i]): value for i, value in styled.items() if seen[i]},
        selected=chosen,
    )


class _Positions:
    """Document positions of lxml elements, found by object identity: lxml keeps one proxy per
    node while it lives, and `nodes` keeps them all alive (a dict of 30k elements costs more)."""

    def __init__(self, nodes: list):
        self.ids = np.fromiter(map(id, nodes), dtype=np.uint64, count=len(nodes))
        self.order = np.argsort(self.ids)
        self.sorted_ids = self.ids[self.order]

    def of(self, elements, count: int) -> np.ndarray:
        """Position of each element, -1 for None or one not in `nodes`."""
        wanted = np.fromiter(map(id, elements), dtype=np.uint64, count=count)
        at = np.minimum(np.searchsorted(self.sorted_ids, wanted), max(self.ids.size - 1, 0))
        found = self.sorted_ids[at] == wanted if self.ids.size else np.zeros(count, dtype=bool)
        return np.where(found, self.order[at] if self.ids.size else 0, -1)


def _below(marked: np.ndarray, parents: np.ndarray) -> np.ndarray:
    """bool per element: some proper ancestor is marked (pointer doubling, parents before children)."""
    has = parents >= 0
    below = np.zeros(parents.size, dtype=bool)
    below[has] = marked[parents[has]]
    ancestor = np.where(has, parents, -1)
    while True:
        has = ancestor >= 0
        if not has.any():
            return below
        up = np.where(has, ancestor, 0)
        below |= has & below[up]
        ancestor = np.where(has, ancestor[up], -1)


def _events(parents: np.ndarray, depths: np.ndarray) -> np.ndarray:
    """The start/end event stream of a tree given in document order: element i ends right
    after its subtree, i.e. before element ``i + size`` starts; of the ends there, deepest first."""
    n = parents.size
    size = np.ones(n, dtype=np.int64)
    order = np.argsort(depths, kind="stable")
    bounds = np.searchsorted(depths[order], np.arange(int(depths.max(initial=-1)) + 2))
    for level in range(bounds.size - 2, 0, -1):  # the deepest level first: children before parents
        at = order[bounds[level] : bounds[level + 1]]
        np.add.at(size, parents[at], size[at])
    position = np.concatenate([np.arange(n), np.arange(n) + size])  # sort keys: a start at (i, 1, 0),
    phase = np.concatenate([np.ones(n, np.int64), np.zeros(n, np.int64)])  # the end of i at (i + size, 0, -depth)
    deepest = np.concatenate([np.zeros(n, np.int64), -depths])
    stream = np.concatenate([np.arange(n), ~np.arange(n)])
    return stream[np.lexsort((deepest, phase, position))]
