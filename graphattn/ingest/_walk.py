"""A recorded HTML tree (`graphattn.ingest._tree`) -> visible text and element columns, in numpy.

Everything a browser would compute from what the tree holds is done in `_Columns`:

* inherited style (display, bold, font size, preformatted) level by level down the tree, from
  per-tag defaults (`_style`), with the few styled elements patched per element;
* the visible text: whitespace runs collapsed in one pass over the code points of all text runs
  (preformatted ones kept), then the separators owed between visible chunks (space, tab,
  newline, ``<br>``) as one segmented maximum over the event stream, and the text assembled by
  cutting the chunks out of those code points and putting the separators between;
* each element's range of text chunks, and sibling subscripts for the xpaths.

`to_graph` then makes the DocGraph of `graphattn.ingest.html` in one bulk add.
"""

from __future__ import annotations

import re

import numpy as np

from graphattn.graph import CONTAINS, DocGraph
from graphattn.graph.columns import Deferred
from graphattn.ingest import _style as style
from graphattn.ingest._tree import COMMENT, Walk

_NCNAME = re.compile(r"^[A-Za-z_][\w.-]*$")
_SPACE, _TAB, _NEWLINE = 1, 2, 3
_SEPARATOR_CODES = np.array([0, ord(" "), ord("\t"), ord("\n")], dtype=np.uint32)


class _Columns:
    """The rendered page computed from a `Walk`: element properties, visible text, chunks."""

    def __init__(self, walk: Walk):
        self.walk = walk
        n = self.n = walk.tag_codes.size
        self.parents = np.asarray(walk.parents, dtype=np.int64)
        self.depths = np.asarray(walk.depths, dtype=np.int64)
        self.rendered = np.ones(n, dtype=bool)
        self.rendered[np.asarray(walk.hidden, dtype=np.int64)] = False
        self.tag_names, self.tag_codes = walk.tag_names, walk.tag_codes
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
                tag, p = self.tag_names[codes[i]], int(parents[i])
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
        is_block = self.display_is(style.BLOCK_DISPLAYS)
        is_cell = self.display_is({"table-cell"})
        is_br = self.tag_codes == self.code("br")
        self.is_block = is_block
        open_strength = np.where(is_cell, _TAB, np.where(is_block, _NEWLINE, 0))
        close_strength = np.where(is_block & ~is_cell, _NEWLINE, 0)
        strength = np.where(starts, open_strength[element], close_strength[element]) * rendered
        br = starts & is_br[element] & rendered

        # Text items: an element's text after its start (rendered only), a tail after its end.
        texts = np.fromiter(walk.texts, dtype=object, count=n)
        tails = np.fromiter(walk.tails, dtype=object, count=n)
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
        present, pre = self._collapse(item_text, self.preformatted[np.maximum(owner, 0)])

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

        # The text: the chunks' cores cut out of all runs' code points, separators put between.
        sep_len = (sep > 0).astype(np.int64)
        piece = sep_len + core_len
        offset = np.cumsum(piece) - piece
        chunk_start = (offset + sep_len)[chunk_item]
        self.chunk_starts, self.chunk_ends = chunk_start, chunk_start + core_len[chunk_item]
        self.chunk_owner = owner[event_of[chunk_item]]
        text = np.empty(int(piece.sum()), dtype="<u4")
        is_separator = np.zeros(text.size, dtype=bool)
        is_separator[offset[sep_len > 0]] = True
        text[is_separator] = _SEPARATOR_CODES[sep[sep_len > 0]]
        text[~is_separator] = self._points[_inside(core_start[chunk_item], core_len[chunk_item], self._points.size)]
        self.text = text.tobytes().decode("utf-32-le")

        # Each element's range of chunks: those emitted between its start and its end.
        chunk_count = np.cumsum(visible) - visible  # chunks before each event's text item
        self.first_chunk = np.zeros(n, dtype=np.int64)
        self.end_chunk = np.zeros(n, dtype=np.int64)
        self.first_chunk[element[starts]] = chunk_count[starts]
        self.end_chunk[element[~starts]] = chunk_count[~starts]

    def display_is(self, displays: frozenset | set) -> np.ndarray:
        """bool per element: its display is one of `displays` (decided per tag, then per styled element)."""
        flags = self._tag_table(lambda t: style.display_of(t, {}) in displays, bool)[self.tag_codes]
        for i in self.walk.styled:
            flags[i] = self.displays[i] in displays
        return flags

    def _codes(self, *tags: str) -> list[int]:
        return [self.tag_names.index(t) for t in tags if t in self.tag_names]

    def code(self, tag: str) -> int:
        """The code of `tag`, -1 when the page has no such tag."""
        return self.tag_names.index(tag) if tag in self.tag_names else -1

    def _collapse(self, item_text: np.ndarray, preformatted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """All text items as one code-point array, whitespace runs of the non-preformatted ones
        collapsed to one space (with numpy, not per run); per item its start, length, leading
        and trailing space, and the length of its core (without them). Returns which items
        hold text at all (None and "" do not) and which of those are preformatted."""
        present = item_text.astype(bool)  # None and "" are no text
        pre = present & preformatted
        runs = item_text[present].tolist()
        points = np.frombuffer("\x00".join(runs).encode("utf-32-le"), dtype="<u4")  # texts hold no NUL
        # HTML's whitespace, nothing else: space, and \t \n \f \r (9, 10, 12, 13)
        space = (points == 32) | (((points - np.uint32(9)) < 5) & (points != 11))
        if pre.any():  # preformatted runs keep their whitespace
            run_length = np.fromiter(map(len, runs), dtype=np.int64, count=len(runs))
            space &= ~np.repeat(pre[present], run_length + 1)[: points.size]  # each run and the NUL after it
        run = space.copy()
        run[1:] &= space[:-1]  # a whitespace character right after another one goes
        points = np.where(space, np.uint32(32), points)[~run]
        self._points = points
        bounds = np.flatnonzero(points == 0)
        start = np.zeros(item_text.size, dtype=np.int64)  # items without text: empty, anywhere
        length = np.zeros(item_text.size, dtype=np.int64)
        start[present] = np.concatenate([[0], bounds + 1])[: len(runs)]
        length[present] = (np.concatenate([bounds, [points.size]]) - start[present])[: len(runs)]
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
        return present, pre


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


def _inside(starts: np.ndarray, lengths: np.ndarray, size: int) -> np.ndarray:
    """bool [size]: inside one of the ranges [start, start + length), which are disjoint, ordered
    and not empty."""
    edges = np.zeros(size + 1, dtype=np.int8)
    edges[starts] = 1
    edges[starts + lengths] -= 1
    return np.cumsum(edges[:size], dtype=np.int8).astype(bool)


def _xpath_column(
    tags: np.ndarray, parents: np.ndarray, tag_codes: np.ndarray, not_element: int, kept: np.ndarray, n_texts: int
) -> np.ndarray:
    """``/html/body/div[2]/p[1]``: html and body plain, every other step subscripted."""
    subscripts = _subscripts(parents, tag_codes, not_element)
    paths: list[str] = []
    steps: dict[tuple[str, int], str] = {}
    tags = tags.tolist()
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
        "is_inline": page.display_is(style.INLINE_DISPLAYS),
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

    element_ids = _node_ids("e", n_elements)
    ids = element_ids + _node_ids("t", n_texts)
    rows_of = np.concatenate([kept, owner])  # the element each node takes its features from
    is_element = np.arange(n_elements + n_texts) < n_elements
    parent_node = node_of[page.parents[kept]]
    element_id_array = np.asarray(element_ids + [None], dtype=object)
    tags = np.asarray(walk.tag_names, dtype=object)[walk.tag_codes]
    attrs: dict = {
        "tag": tags[rows_of],
        "xpath": (
            Deferred(_xpath_column, tags, page.parents, page.tag_codes, page.code(COMMENT), kept, n_texts),
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


_SHARED_IDS = 1 << 16  # the first ids of each kind are made once and shared by every page (str is immutable)
_made_ids: dict[str, list[str]] = {}


def _node_ids(prefix: str, count: int) -> list[str]:
    """``[prefix0, prefix1, ...]``: a slice of ids made once, not 30k f-strings per page."""
    made = _made_ids.get(prefix)
    if made is None:
        made = _made_ids[prefix] = [f"{prefix}{i}" for i in range(_SHARED_IDS)]
    if count <= len(made):
        return made[:count]
    return made + [f"{prefix}{i}" for i in range(len(made), count)]


def _pad(values: np.ndarray, count: int) -> np.ndarray:
    """Element values followed by `count` placeholders for the text rows (marked absent)."""
    filler = np.full(count, None, dtype=object) if values.dtype == object else np.zeros(count, dtype=values.dtype)
    return np.concatenate([values, filler])
