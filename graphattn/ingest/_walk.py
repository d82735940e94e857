"""HTML tree -> visible text and element columns, with one light pass in Python and numpy after.

`walk` follows lxml's start/end events once (iterative, no recursion) and only records, per
element, what the tree holds: tag, parent, depth, its text and tail, and the event order; an
element with a ``style`` or ``hidden`` attribute (or an ``input``, ``dialog``, ``font``) has its
inline style read there, and a hidden one has its subtree skipped. No Python object is made per
element. Everything a browser would compute from that is done in `_Columns` with numpy:

* inherited style (display, bold, font size, preformatted) level by level down the tree, from
  per-tag defaults (`_style`), with the few styled elements patched per element;
* the visible text: whitespace runs collapsed in one regex pass over all non-preformatted runs,
  then the separators owed between visible chunks (space, tab, newline, ``<br>``) as one
  segmented maximum over the event stream, and the text assembled by one gather of code points;
* each element's range of text chunks, and sibling subscripts for the xpaths.

`to_graph` then makes the DocGraph of `graphattn.ingest.html` in one bulk add.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import lxml.etree as etree
import numpy as np

from graphattn.errors import IngestError
from graphattn.graph import CONTAINS, DocGraph
from graphattn.graph_columns import Deferred
from graphattn.ingest import _style as style

_HTML_SPACE_POINTS = np.array([ord(c) for c in " \t\n\r\f"], dtype=np.uint32)  # HTML's whitespace, nothing else
_NCNAME = re.compile(r"^[A-Za-z_][\w.-]*$")
_SPACE, _TAB, _NEWLINE = 1, 2, 3
_SEPARATOR_CODES = np.array([0, ord(" "), ord("\t"), ord("\n")], dtype=np.uint32)
_ATTRIBUTE_TAGS = frozenset({"input", "dialog", "font"})  # tags whose attributes the style rules read
_COMMENT = "#comment"  # stands for a comment or PI the parser kept: not an element, but its tail is text


@dataclass
class Walk:
    """What the walk records, one entry per element seen (hidden ones too), in document order."""

    tags: list[str] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)  # index of the parent element, -1 for the root
    depths: list[int] = field(default_factory=list)
    texts: list[str | None] = field(default_factory=list)
    tails: list[str | None] = field(default_factory=list)
    events: list[int] = field(default_factory=list)  # i: element i starts, ~i: it ends
    hidden: list[int] = field(default_factory=list)  # not rendered (with their subtree), or a comment
    styled: dict[int, tuple[dict, str | None]] = field(default_factory=dict)  # i -> (inline style, size attr)
    selected: list[int] | None = None


def walk(root: etree._Element, *, max_elements: int, source: str | None, selected: set | None = None) -> Walk:
    """Record the tree in one pass; see the module docstring for what is computed after."""
    out = Walk(selected=[] if selected is not None else None)
    tags, parents, depths, texts, tails, events = out.tags, out.parents, out.depths, out.texts, out.tails, out.events
    hidden, styled, chosen = out.hidden, out.styled, out.selected
    invisible = style.INVISIBLE_TAGS
    attribute_tags = _ATTRIBUTE_TAGS
    stack: list[int] = []
    walker = etree.iterwalk(root, events=("start", "end"))
    for event, el in walker:
        if event == "end":
            events.append(~stack.pop())
            continue
        index = len(tags)
        tag = el.tag
        events.append(index)
        parents.append(stack[-1] if stack else -1)
        depths.append(len(stack))
        stack.append(index)
        tails.append(el.tail)
        if not isinstance(tag, str):  # a comment or PI the parser kept
            tags.append(_COMMENT)
            texts.append(None)
            hidden.append(index)
            walker.skip_subtree()
            continue
        tags.append(tag)  # libxml2's HTML parser gives tag names in lower case
        texts.append(el.text)
        raw_style = el.get("style")
        if raw_style is not None or tag in attribute_tags or el.get("hidden") is not None:
            declared = style.inline_style(raw_style)
            if style.is_hidden(tag, el, declared):
                hidden.append(index)
                walker.skip_subtree()
                continue
            styled[index] = (declared, el.get("size"))
        elif tag in invisible:
            hidden.append(index)
            walker.skip_subtree()
            continue
        if chosen is not None and el in selected:
            chosen.append(index)
        if index - len(hidden) >= max_elements:
            raise IngestError(f"more than max_elements={max_elements} rendered elements", file=source)
    return out


class _Columns:
    """The rendered page computed from a `Walk`: element properties, visible text, chunks."""

    def __init__(self, walk: Walk):
        self.walk = walk
        n = self.n = len(walk.tags)
        self.parents = np.asarray(walk.parents, dtype=np.int64)
        self.depths = np.asarray(walk.depths, dtype=np.int64)
        self.rendered = np.ones(n, dtype=bool)
        self.rendered[np.asarray(walk.hidden, dtype=np.int64)] = False
        self.tag_names = sorted(set(walk.tags))
        code_of = {tag: i for i, tag in enumerate(self.tag_names)}
        self.tag_codes = np.fromiter(map(code_of.__getitem__, walk.tags), dtype=np.int64, count=n)
        self._inherit_style()
        self._text()

    # -- style, level by level ---------------------------------------------------------------
    def _tag_table(self, fn, dtype) -> np.ndarray:
        return np.array([fn(tag) for tag in self.tag_names], dtype=dtype)

    def _inherit_style(self) -> None:
        codes, parents = self.tag_codes, self.parents
        self.displays = self._tag_table(lambda t: style.display_of(t, {}), object)[codes]
        bold_tag = self._tag_table(lambda t: t in style.BOLD_TAGS, bool)[codes]
        scale = self._tag_table(lambda t: style.TAG_FONT_SCALE.get(t, 1.0), np.float64)[codes]
        monospace = self._tag_table(lambda t: t in style.MONOSPACE_TAGS, bool)[codes]
        pre_tag = self._tag_table(lambda t: t in style.PREFORMATTED_TAGS, bool)[codes]
        self.bold = np.zeros(self.n, dtype=bool)
        self.font_px = np.full(self.n, style.DEFAULT_FONT_PX, dtype=np.float64)
        self.preformatted = np.zeros(self.n, dtype=bool)
        styled = self.walk.styled
        styled_rows = np.array(sorted(styled), dtype=np.int64)
        styled_depths = self.depths[styled_rows]
        rows = np.flatnonzero(self.rendered)
        rows = rows[np.argsort(self.depths[rows], kind="stable")]
        levels = np.searchsorted(self.depths[rows], np.arange(int(self.depths.max(initial=0)) + 2))
        for level in range(levels.size - 1):
            at = rows[levels[level] : levels[level + 1]]
            parent = parents[at]
            has = parent >= 0
            parent_px = np.where(has, self.font_px[np.maximum(parent, 0)], style.DEFAULT_FONT_PX)
            parent_bold = has & self.bold[np.maximum(parent, 0)]
            parent_pre = has & self.preformatted[np.maximum(parent, 0)]
            mono = monospace[at] & (parent_px == style.DEFAULT_FONT_PX)
            self.font_px[at] = np.where(mono, style.MONOSPACE_FONT_PX, parent_px) * scale[at]
            self.bold[at] = parent_bold | bold_tag[at]
            self.preformatted[at] = pre_tag[at] | parent_pre
            for i in styled_rows[styled_depths == level].tolist():  # the few with an inline style or attributes
                declared, size = styled[i]
                tag, p = self.walk.tags[i], int(parents[i])
                px = float(self.font_px[p]) if p >= 0 else style.DEFAULT_FONT_PX
                self.displays[i] = style.display_of(tag, declared)
                self.bold[i] = style.is_bold_style(tag, declared, p >= 0 and bool(self.bold[p]))
                self.font_px[i] = style.computed_font_px(tag, declared, size, px)
                self.preformatted[i] = (
                    bool(pre_tag[i])
                    or declared.get("white-space", "").startswith("pre")
                    or (p >= 0 and bool(self.preformatted[p]) and "white-space" not in declared)
                )

    # -- the visible text ----------------------------------------------------------------------
    def _text(self) -> None:
        """Text chunks and separators exactly as a sequential builder would emit them.

        The event stream has two items per event: a separator item (an element start owes a
        tab or newline, ``<br>`` breaks the line, a block's end owes a newline) and a text item
        (the element's text after its start, its tail after its end). Visible chunks and
        ``<br>`` are boundaries; the separator before a chunk is the strongest one owed since
        the previous boundary (a leading space, a whitespace-only run, the previous chunk's
        trailing space count as spaces), written only once some text exists.
        """
        walk, n = self.walk, self.n
        events = np.asarray(walk.events, dtype=np.int64)
        starts = events >= 0
        element = np.where(starts, events, ~events)
        rendered = self.rendered[element]
        is_block = _flag(self.displays, style.BLOCK_DISPLAYS)
        is_cell = self.displays == "table-cell"
        is_br = self.tag_codes == self.code("br")
        self.is_block = is_block
        open_strength = np.where(is_cell, _TAB, np.where(is_block, _NEWLINE, 0))
        close_strength = np.where(is_block & ~is_cell, _NEWLINE, 0)
        strength = np.where(starts, open_strength[element], close_strength[element]) * rendered
        br = starts & is_br[element] & rendered

        # Text items: an element's text after its start (rendered only), a tail after its end.
        texts = np.asarray(walk.texts + [None], dtype=object)
        tails = np.asarray(walk.tails + [None], dtype=object)
        has_parent = self.parents[element] >= 0
        item_text = np.where(
            starts, np.where(rendered, texts[element], None), np.where(has_parent, tails[element], None)
        )
        owner = np.where(starts, element, self.parents[element])
        drop = np.flatnonzero(
            starts & rendered & np.isin(self.tag_codes[element], self._codes("pre", "listing", "textarea"))
        )
        for k in drop:  # HTML drops the newline right after <pre>, <listing>, <textarea>; libxml2 keeps it
            if item_text[k] and item_text[k][0] == "\n":
                item_text[k] = item_text[k][1:]
        present = item_text.astype(bool)  # None and "" are no text
        pre = present & self.preformatted[np.maximum(owner, 0)]
        self._collapse(item_text, present, pre)

        # Boundaries, windows and the separator each visible chunk gets.
        m = events.size
        visible = present & (pre | (self._core_len > 0))
        contrib = np.zeros(2 * m, dtype=np.int64)  # item 2j: separator of event j; item 2j+1: its text
        contrib[0::2] = strength
        lead_space = present & ~pre & (self._lead | (self._core_len <= 0))  # incl. whitespace-only runs
        contrib[1::2] = np.where(lead_space, _SPACE, 0)
        boundary = np.zeros(2 * m, dtype=bool)
        boundary[0::2] = br
        boundary[1::2] = visible
        positions = np.flatnonzero(boundary)
        window = np.cumsum(boundary) - boundary  # boundaries strictly before each item
        owed = np.zeros(positions.size + 1, dtype=np.int64)
        np.maximum.at(owed, window, contrib)
        chunk_item = boundary[positions] & (positions % 2 == 1)
        trail = np.zeros(2 * m, dtype=bool)
        trail[1::2] = visible & ~pre & self._trail
        after_trail = np.concatenate([[False], trail[positions]])[: positions.size]  # previous boundary left a space
        owed[: positions.size] = np.maximum(owed[: positions.size], np.where(after_trail, _SPACE, 0))
        chunks_before = np.cumsum(chunk_item) - chunk_item
        written = chunks_before > 0  # text exists: separators and <br> newlines are written
        sep = np.where(chunk_item, np.where(written, owed[: positions.size], 0), np.where(written, _NEWLINE, 0))
        event_of = positions // 2
        core_start = np.where(chunk_item, self._core_start[event_of], 0)
        core_len = np.where(chunk_item, np.where(pre[event_of], self._length[event_of], self._core_len[event_of]), 0)

        # The text: one gather over [all runs' code points, separator code points].
        sep_len = (sep > 0).astype(np.int64)
        piece = sep_len + core_len
        offset = np.cumsum(piece) - piece
        chunk_start = (offset + sep_len)[chunk_item]
        self.chunk_starts, self.chunk_ends = chunk_start, chunk_start + core_len[chunk_item]
        self.chunk_owner = owner[event_of[chunk_item]]
        total = int(piece.sum())
        source_index = np.empty(total, dtype=np.int64)
        sep_at = offset[sep_len > 0]
        source_index[sep_at] = self._points.size + sep[sep_len > 0]
        chunk_core_start = core_start[chunk_item]
        body, which = _expand(chunk_core_start, core_len[chunk_item])
        source_index[self.chunk_starts[which] + body - chunk_core_start[which]] = body
        points = np.concatenate([self._points, _SEPARATOR_CODES])
        self.text = points[source_index].astype("<u4").tobytes().decode("utf-32-le")

        # Each element's range of chunks: those emitted between its start and its end.
        chunk_count = np.cumsum(visible) - visible  # chunks before each event's text item
        self.first_chunk = np.zeros(n, dtype=np.int64)
        self.end_chunk = np.zeros(n, dtype=np.int64)
        self.first_chunk[element[starts]] = chunk_count[starts]
        self.end_chunk[element[~starts]] = chunk_count[~starts]

    def _codes(self, *tags: str) -> list[int]:
        return [self.tag_names.index(t) for t in tags if t in self.tag_names]

    def code(self, tag: str) -> int:
        """The code of `tag`, -1 when the page has no such tag."""
        return self.tag_names.index(tag) if tag in self.tag_names else -1

    def _collapse(self, item_text: np.ndarray, present: np.ndarray, pre: np.ndarray) -> None:
        """All text items as one code-point array, whitespace runs of the non-preformatted ones
        collapsed to one space (with numpy, not per run); per item its start, length, leading
        and trailing space, and the length of its core (without them)."""
        pieces = np.where(present, item_text, "")
        points = np.frombuffer("\x00".join(pieces.tolist()).encode("utf-32-le"), dtype="<u4")  # texts hold no NUL
        space = np.isin(points, _HTML_SPACE_POINTS)
        if pre.any():  # preformatted items keep their whitespace
            item_of = np.cumsum(points == 0)
            space &= ~pre[item_of]
        run = space.copy()
        run[1:] &= space[:-1]  # a whitespace character right after another one goes
        points = np.where(space, np.uint32(32), points)[~run]
        self._points = points
        bounds = np.flatnonzero(points == 0)
        start = np.concatenate([[0], bounds + 1])
        length = np.concatenate([bounds, [points.size]]) - start
        last = np.maximum(start + length - 1, 0)
        nonempty = length > 0
        padded = points if points.size else np.zeros(1, dtype="<u4")
        self._lead = nonempty & ~pre & (padded[np.minimum(start, padded.size - 1)] == 32)
        self._trail = nonempty & ~pre & (padded[np.minimum(last, padded.size - 1)] == 32)
        self._length = length
        self._core_start = start + self._lead
        whitespace_only = ~pre & (length == 1) & self._lead
        self._core_len = np.where(pre, length, length - self._lead - (self._trail & (length > 1)))
        self._core_len[whitespace_only] = 0


def _subscripts(parents: np.ndarray, tag_codes: np.ndarray, not_element: int) -> np.ndarray:
    """1-based position among same-tag element siblings (hidden ones counted, comments not)."""
    n = parents.size
    key = np.where(tag_codes != not_element, (parents + 1) * (int(tag_codes.max(initial=0)) + 2) + tag_codes, -1)
    order = np.lexsort((np.arange(n), key))
    sorted_key = key[order]
    group_start = (
        np.flatnonzero(np.concatenate([[True], sorted_key[1:] != sorted_key[:-1]])) if n else np.zeros(0, np.int64)
    )
    rank = np.arange(n) - np.repeat(group_start, np.diff(np.append(group_start, n)))
    out = np.empty(n, dtype=np.int64)
    out[order] = rank + 1
    return out


def _expand(starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every position of the ranges [start, start + length), in order, and its range index."""
    total = int(lengths.sum())
    which = np.repeat(np.arange(lengths.size), lengths)
    first = np.cumsum(lengths) - lengths
    return np.arange(total, dtype=np.int64) - np.repeat(first - starts, lengths), which


def _flag(values: np.ndarray, members: frozenset) -> np.ndarray:
    """bool per value: it is one of `members` (decided once per distinct value)."""
    decided = {v: v in members for v in set(values.tolist())}
    return np.fromiter(map(decided.__getitem__, values.tolist()), dtype=bool, count=values.size)


def _xpath_column(
    tags: list, parents: np.ndarray, tag_codes: np.ndarray, not_element: int, kept: np.ndarray, n_texts: int
) -> np.ndarray:
    """``/html/body/div[2]/p[1]``: html and body plain, every other step subscripted."""
    subscripts = _subscripts(parents, tag_codes, not_element)
    paths: list[str] = []
    steps: dict[tuple[str, int], str] = {}
    for tag, parent, subscript in zip(tags, parents.tolist(), subscripts.tolist()):
        if parent < 0:
            paths.append("/" + tag)
        elif tag == "body" and tags[parent] == "html":
            paths.append(paths[parent] + "/body")
        else:
            step = steps.get((tag, subscript))
            if step is None:
                name = tag if _NCNAME.match(tag) else f"*[name()='{tag}']"
                step = steps[(tag, subscript)] = f"/{name}[{subscript}]"
            paths.append(paths[parent] + step)
    return _pad(np.asarray(paths, dtype=object)[kept], n_texts)


def _features(page: _Columns, rows: np.ndarray) -> dict[str, np.ndarray]:
    """VDOM features of elements `rows` and, as ``parent_*``, of their parents (the document
    root, a block at the default size, stands in for the parent of <html>)."""
    n = page.n
    parents = page.parents
    real_children = page.rendered & (parents >= 0)
    children = np.bincount(parents[real_children], minlength=n) if n else np.zeros(0, np.int64)
    distinct_px, px_index = np.unique(page.font_px, return_inverse=True)
    own = {
        "is_block": page.is_block,
        "is_inline": _flag(page.displays, style.INLINE_DISPLAYS),
        "is_heading": np.isin(page.tag_codes, page._codes(*sorted(style.HEADING_TAGS))),
        "is_leaf": children == 0,
        "is_bold": page.bold,
        "font_size": np.asarray([round(x, 2) for x in distinct_px.tolist()], dtype=np.float64)[px_index.reshape(n)],
        "font_size_bucket": np.asarray(style.font_size_bucket(page.font_px), dtype=np.int64).reshape(n),
    }
    root = {
        "is_block": True,
        "is_inline": False,
        "is_heading": False,
        "is_leaf": False,
        "is_bold": False,
        "font_size": style.DEFAULT_FONT_PX,
        "font_size_bucket": style.font_size_bucket(style.DEFAULT_FONT_PX),
    }
    out = {}
    parent = parents[rows]
    has_parent = parent >= 0
    for key, values in own.items():
        out[key] = values[rows]
    for key, values in own.items():
        parent_values = np.full(rows.size, root[key], dtype=values.dtype)
        parent_values[has_parent] = values[parent[has_parent]]
        out[f"parent_{key}"] = parent_values
    return out


def to_graph(walk: Walk, *, doc_id: str | None, source: str | None, doc_attrs: dict) -> DocGraph:
    """The graph: ``doc``, then element nodes ``e0..`` (those holding text), then text nodes ``t0..``.

    Added in bulk without DocGraph's per-item checks: every span comes from the text builder,
    every id is made here once and every edge joins rows made here (tests build the same graph
    through the checked path).
    """
    page = _Columns(walk)
    text = page.text
    graph = DocGraph(text, doc_id=doc_id, source=source)
    graph.add_node("doc", "document", (0, len(text)), **doc_attrs)
    total = max(len(text), 1)
    starts, ends, owner = page.chunk_starts, page.chunk_ends, page.chunk_owner
    first, end = page.first_chunk, page.end_chunk
    kept = np.flatnonzero(page.rendered & (end > first))  # elements that render text (their ancestors do too)
    n_elements, n_texts = kept.size, starts.size
    node_of = np.full(page.n + 1, -1, dtype=np.int64)  # element index -> element node number
    node_of[kept] = np.arange(n_elements)
    element_span = (
        np.stack([starts[first[kept]], ends[end[kept] - 1]], axis=1) if n_elements else np.zeros((0, 2), np.int64)
    )
    spans = np.concatenate([element_span, np.stack([starts, ends], axis=1)]).reshape(-1, 2)

    element_ids = [f"e{i}" for i in range(n_elements)]
    ids = element_ids + [f"t{i}" for i in range(n_texts)]
    rows_of = np.concatenate([kept, owner])  # the element each node takes its features from
    is_element = np.arange(n_elements + n_texts) < n_elements
    parent_node = node_of[page.parents[kept]]
    element_id_array = np.asarray(element_ids + [None], dtype=object)
    tags = np.asarray(walk.tags, dtype=object)
    attrs: dict = {
        "tag": tags[rows_of],
        "xpath": (
            Deferred(_xpath_column, walk.tags, page.parents, page.tag_codes, page.code(_COMMENT), kept, n_texts),
            is_element,
        ),
        "depth": (_pad(page.depths[kept], n_texts), is_element),
        "parent": (_pad(element_id_array[parent_node], n_texts), is_element),
        "display": (_pad(page.displays[kept], n_texts), is_element),
        "element": (
            np.concatenate([np.full(n_elements, None, dtype=object), element_id_array[node_of[owner]]]),
            ~is_element,
        ),
        **_features(page, rows_of),
        "reading_position": spans[:, 0] / total,
        "text_share": (spans[:, 1] - spans[:, 0]) / total,
    }
    if walk.selected is not None:
        chosen = np.zeros(page.n, dtype=bool)
        chosen[np.asarray(walk.selected, dtype=np.int64)] = True
        attrs["selected"] = (_pad(chosen[kept], n_texts), is_element)
    codes = np.repeat(np.array([0, 1]), [n_elements, n_texts])
    first_row = graph.add_nodes(ids, (("element", "text"), codes), spans, attrs, validate=False)
    element_rows = first_row + np.arange(n_elements)
    graph.add_edges(np.where(parent_node >= 0, first_row + parent_node, 0), CONTAINS, element_rows)
    graph.add_edges(first_row + node_of[owner], CONTAINS, first_row + n_elements + np.arange(n_texts))
    return graph


def _pad(values: np.ndarray, count: int) -> np.ndarray:
    """Element values followed by `count` placeholders for the text rows (marked absent)."""
    filler = np.full(count, None, dtype=object) if values.dtype == object else np.zeros(count, dtype=values.dtype)
    return np.concatenate([values, filler])
