"""The HTML reader as it was first written: one Python object per element, text built run by run.

Kept as the test reference for the vectorized reader (`graphattn.ingest._walk`): both must give
the same graph for any markup. Slow (a dataclass and a dict per element); not used by the package.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import lxml.etree as etree
import numpy as np

from graphattn.errors import IngestError
from graphattn.graph import CONTAINS, DocGraph, Edge, Node
from graphattn.ingest import _style as style
from graphattn.ingest.html import _parse_tree, _select

_HTML_WHITESPACE = re.compile(r"[ \t\n\r\f]+")
_NCNAME = re.compile(r"^[A-Za-z_][\w.-]*$")
_SPACE, _TAB, _NEWLINE = 1, 2, 3
_SEPARATORS = {_SPACE: " ", _TAB: "\t", _NEWLINE: "\n"}


def reference_graph(markup: str, selector: str | None = None, max_elements: int = 10**7) -> DocGraph:
    root = _parse_tree(markup, None)
    selected = _select(root, selector, None) if selector else None
    walk = _Walk(max_elements=max_elements, source=None)
    walk.run(root)
    title = root.findtext(".//title")
    return _build_graph(
        walk,
        doc_id=None,
        source=None,
        selected=selected,
        attrs={
            "source": None,
            "encoding": "utf-8",
            "encoding_source": "str",
            "title": " ".join(title.split()) if title else None,
        },
    )


@dataclass(slots=True)
class _Element:
    """One rendered element while walking; becomes a node if it holds visible text."""

    el: etree._Element
    tag: str
    xpath: str
    depth: int
    parent: int  # index of the parent record, -1 for the root
    display: str
    is_bold: bool
    font_px: float
    preformatted: bool
    first_chunk: int
    end_chunk: int = -1
    child_elements: int = 0
    child_tag_counts: dict[str, int] = field(default_factory=dict)


class _TextBuilder:
    """Appends visible text with browser whitespace rules; records each chunk's span."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.length = 0
        self.pending = 0  # strongest separator owed before the next chunk
        self.chunk_starts: list[int] = []
        self.chunk_ends: list[int] = []

    def separate(self, strength: int) -> None:
        self.pending = max(self.pending, strength)

    def line_break(self) -> None:
        """`<br>`: a line break even between two other breaks."""
        if self.length:
            self._emit("\n")
        self.pending = 0

    def add(self, text: str | None, preformatted: bool) -> bool:
        """Add a text run; True if it produced a visible chunk."""
        if not text:
            return False
        trailing = False
        if not preformatted:
            text = _HTML_WHITESPACE.sub(" ", text)
            if text.startswith(" "):
                self.separate(_SPACE)
                text = text[1:]
            trailing = text.endswith(" ")
            text = text.rstrip(" ")
            if not text:
                if trailing:
                    self.separate(_SPACE)
                return False
        if self.length and self.pending:
            self._emit(_SEPARATORS[self.pending])
        self.chunk_starts.append(self.length)
        self._emit(text)
        self.chunk_ends.append(self.length)
        self.pending = _SPACE if trailing else 0
        return True

    def _emit(self, piece: str) -> None:
        self.parts.append(piece)
        self.length += len(piece)

    def text(self) -> str:
        return "".join(self.parts)


class _Walk:
    """One pass over the tree (start/end events, no recursion) building text and records."""

    def __init__(self, max_elements: int, source: str | None) -> None:
        self.max_elements = max_elements
        self.source = source
        self.text = _TextBuilder()
        self.records: list[_Element] = []
        self.chunk_owner: list[int] = []  # record index that contains each text chunk

    def run(self, root: etree._Element) -> None:
        stack: list[int | None] = []  # record index, None for a skipped (hidden) element
        walker = etree.iterwalk(root, events=("start", "end"))
        for event, el in walker:
            if event == "start":
                record = self._enter(el, stack[-1] if stack else -1)
                stack.append(record)
                if record is None:
                    walker.skip_subtree()
                else:
                    self._add_text(_drop_leading_newline(el.text, self.records[record].tag), record)
            else:
                record = stack.pop()
                if record is not None:
                    self._leave(record)
                parent = stack[-1] if stack else None
                if parent is not None:
                    self._add_text(el.tail, parent)

    def _enter(self, el: etree._Element, parent: int | None) -> int | None:
        tag = el.tag if isinstance(el.tag, str) else None
        if tag is None or parent is None:
            return None  # comments/PIs the parser kept, or inside a hidden subtree
        tag = tag.lower()
        parent_record = self.records[parent] if parent >= 0 else None
        if parent_record is not None:
            parent_record.child_tag_counts[tag] = parent_record.child_tag_counts.get(tag, 0) + 1
        raw_style = el.get("style")
        declared = style.inline_style(raw_style) if raw_style else {}
        if style.is_hidden(tag, el, declared):
            return None
        if len(self.records) >= self.max_elements:
            raise IngestError(f"more than max_elements={self.max_elements} rendered elements", file=self.source)
        if parent_record is not None:
            parent_record.child_elements += 1
        display = style.display_of(tag, declared)
        record = _Element(
            el=el,
            tag=tag,
            xpath=_xpath_step(parent_record, tag),
            depth=0 if parent_record is None else parent_record.depth + 1,
            parent=parent,
            display=display,
            is_bold=style.is_bold_style(tag, declared, parent_record is not None and parent_record.is_bold),
            font_px=style.computed_font_px(
                tag, declared, el.get("size"), style.DEFAULT_FONT_PX if parent_record is None else parent_record.font_px
            ),
            preformatted=tag in style.PREFORMATTED_TAGS
            or declared.get("white-space", "").startswith("pre")
            or (parent_record is not None and parent_record.preformatted and "white-space" not in declared),
            first_chunk=len(self.text.chunk_starts),
        )
        self.records.append(record)
        if tag == "br":
            self.text.line_break()
        elif display == "table-cell":
            self.text.separate(_TAB)
        elif display in style.BLOCK_DISPLAYS:
            self.text.separate(_NEWLINE)
        return len(self.records) - 1

    def _leave(self, index: int) -> None:
        record = self.records[index]
        record.end_chunk = len(self.text.chunk_starts)
        if record.display in style.BLOCK_DISPLAYS and record.display != "table-cell":
            self.text.separate(_NEWLINE)

    def _add_text(self, text: str | None, owner: int) -> None:
        if self.text.add(text, self.records[owner].preformatted):
            self.chunk_owner.append(owner)


def _drop_leading_newline(text: str | None, tag: str) -> str | None:
    """HTML drops one newline right after ``<pre>``, ``<listing>`` and ``<textarea>``; libxml2 keeps it."""
    if text and tag in ("pre", "listing", "textarea") and text.startswith("\n"):
        return text[1:]
    return text


def _xpath_step(parent: _Element | None, tag: str) -> str:
    if parent is None:
        return "/" + tag
    if tag == "body" and parent.tag == "html":
        return parent.xpath + "/body"
    name = tag if _NCNAME.match(tag) else f"*[name()='{tag}']"
    return f"{parent.xpath}/{name}[{parent.child_tag_counts[tag]}]"


# -- the graph -------------------------------------------------------------------------------
def _record_features(records: list[_Element]) -> list[dict]:
    """Per record: its VDOM features and its parent's as ``parent_*`` (one dict each, copied per node)."""
    buckets = style.font_size_bucket(np.array([r.font_px for r in records] or [style.DEFAULT_FONT_PX]))
    own = [
        {
            "is_block": r.display in style.BLOCK_DISPLAYS,
            "is_inline": r.display in style.INLINE_DISPLAYS,
            "is_heading": r.tag in style.HEADING_TAGS,
            "is_leaf": r.child_elements == 0,
            "is_bold": r.is_bold,
            "font_size": round(r.font_px, 2),
            "font_size_bucket": int(bucket),
        }
        for r, bucket in zip(records, buckets)
    ]
    # The document root stands in for the parent of <html>: a block at the default size.
    root = {
        "is_block": True,
        "is_inline": False,
        "is_heading": False,
        "is_leaf": False,
        "is_bold": False,
        "font_size": style.DEFAULT_FONT_PX,
        "font_size_bucket": style.font_size_bucket(style.DEFAULT_FONT_PX),
    }
    return [
        {**mine, **{f"parent_{k}": v for k, v in (own[r.parent] if r.parent >= 0 else root).items()}}
        for r, mine in zip(records, own)
    ]


def _build_graph(walk: _Walk, *, doc_id, source, selected, attrs) -> DocGraph:
    """Nodes and edges added in bulk without DocGraph's per-item checks: every span comes from
    the text builder, every id is made here once and every edge joins nodes made here, so the
    checks (half the time on large pages) would only re-prove what holds by construction."""
    text = walk.text.text()
    graph = DocGraph(text, doc_id=doc_id, source=source)
    graph.add_node("doc", "document", (0, len(text)), **attrs)
    nodes: list[Node] = []
    edges: list[Edge] = []
    total = max(len(text), 1)
    starts, ends = walk.text.chunk_starts, walk.text.chunk_ends
    features = _record_features(walk.records)
    node_ids: dict[int, str] = {}
    for index, record in enumerate(walk.records):
        if record.end_chunk <= record.first_chunk:
            continue  # renders no text: not a node (its subtree has none either)
        start, end = starts[record.first_chunk], ends[record.end_chunk - 1]
        node_id = node_ids[index] = f"e{len(node_ids)}"
        node_attrs = {
            "tag": record.tag,
            "xpath": record.xpath,
            "depth": record.depth,
            "parent": node_ids.get(record.parent),
            "display": record.display,
            **features[index],
            "reading_position": start / total,
            "text_share": (end - start) / total,
        }
        if selected is not None:
            node_attrs["selected"] = record.el in selected
        nodes.append(Node(node_id, "element", (start, end), node_attrs))
        edges.append(Edge(node_ids.get(record.parent, "doc"), CONTAINS, node_id))
    for chunk, owner in enumerate(walk.chunk_owner):
        start, end = starts[chunk], ends[chunk]
        node_id = f"t{chunk}"
        nodes.append(
            Node(
                node_id,
                "text",
                (start, end),
                {
                    "element": node_ids[owner],
                    "tag": walk.records[owner].tag,
                    **features[owner],
                    "reading_position": start / total,
                    "text_share": (end - start) / total,
                },
            )
        )
        edges.append(Edge(node_ids[owner], CONTAINS, node_id))
    graph.extend(nodes, edges, validate=False)
    return graph
