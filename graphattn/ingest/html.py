"""HTML -> DocGraph: the visible text of a page, its element tree and OpenKP's VDOM features.

Conventions (the dataset schemas depend on them):

* Node ``doc`` of type ``document`` spans the whole text. Attrs: ``source``, ``encoding`` (the
  Python codec that decoded the bytes), ``encoding_source`` (``bom`` | ``argument`` | ``meta`` |
  ``utf-8-default`` | ``fallback``, see `graphattn.ingest.encoding`; ``str`` for text given as str),
  ``title``.
* One ``element`` node per rendered element that holds visible text, ids ``e0, e1, ...`` in
  document order. Attrs: ``tag``; ``xpath`` with sibling subscripts (``/html/body/div[2]/p[1]``:
  ``html`` and ``body`` plain, every other step subscripted, resolvable with lxml's ``xpath()``);
  ``depth`` (``html`` is 0); ``parent`` (the parent element's node id, None for ``html``);
  ``display``; and the VDOM features of the element and of its parent element: ``is_block``,
  ``is_inline``, ``is_heading``, ``is_leaf``, ``is_bold``, ``font_size`` (px),
  ``font_size_bucket`` (ETC's 24 OpenKP buckets), ``parent_is_block``, ... ``parent_font_size_bucket``;
  and ``reading_position`` / ``text_share`` (see below). With a ``selector``: ``selected``.
* One ``text`` node per visible text run (a DOM text node: an element's text or a tail), ids
  ``t0, t1, ...``. Text nodes never overlap, so they are the VDOM elements of OpenKP (one global
  token each). They carry the features of their containing element and, as ``parent_*``, of that
  element's parent — exactly OpenKP's (node, parent) pairs — plus ``element`` (containing node id).
* ``contains`` edges: ``doc`` -> ``e0`` (html), element -> child element, element -> text node.

Text: what a browser shows (its ``innerText``, without layout). Runs of HTML whitespace collapse
to one space; spaces at line starts and ends are dropped; block elements start and end a line
(``\\n``), ``<br>`` breaks a line, table cells are separated by ``\\t``; ``<pre>``/``<textarea>``
keep their whitespace (less the newline right after the start tag). Not rendered, so left out: ``head``, ``script``, ``style``, ``template``,
``noscript``, ``iframe``, comments, processing instructions, the ``hidden`` attribute and inline
``display:none`` / ``visibility:hidden``. Each node's span covers its first to its last visible
character (never a separator).

VDOM features without rendering: display, font size and weight come from tag defaults plus the
inline ``style`` (see `_style`). Geometry (x, y, width, height) needs a layout engine; in its
place each node gets ``reading_position`` (start / text length) and ``text_share`` (span length /
text length), both in [0, 1].

Safety: lxml's *HTML* parser only (never the XML parser), so DTDs, internal entity declarations
and external entities are inert text, never expanded or fetched (no billion laughs, no file
reads); ``no_network``; ``huge_tree`` off, so libxml2 keeps its depth (256) and text-run (10 MB)
limits — hitting one raises `IngestError` naming line and column (the parser would silently drop
the rest of the page). The tree walk is iterative. Input above ``max_bytes`` or with more than
``max_elements`` elements is refused before it costs memory.

Encodings (`graphattn.ingest.encoding`): as browsers decode, by the WHATWG Encoding Standard's
labels only: a byte-order mark, else the ``encoding`` argument, else ``<meta charset>`` /
``http-equiv`` in the first 4 KB, else UTF-8 if the bytes are valid UTF-8 and windows-1252 if not.
A ``<meta>`` label the Standard does not know (``utf-7``, ``base64``) is ignored. Bytes that do not
decode raise `IngestError` with the byte offset and line (``errors="strict"``, the default);
``errors="replace"`` puts U+FFFD in their place instead.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import lxml.etree as etree
import numpy as np

from graphattn.errors import IngestError
from graphattn.graph import CONTAINS, DocGraph, Edge, Node
from graphattn.ingest import _style as style
from graphattn.ingest.encoding import decode_html

MAX_BYTES = 64 * 1024 * 1024
MAX_ELEMENTS = 500_000

_HTML_WHITESPACE = re.compile(r"[ \t\n\r\f]+")
_NCNAME = re.compile(r"^[A-Za-z_][\w.-]*$")
_SPACE, _TAB, _NEWLINE = 1, 2, 3
_SEPARATORS = {_SPACE: " ", _TAB: "\t", _NEWLINE: "\n"}


# -- public API ------------------------------------------------------------------------------
def read_html(path: str | os.PathLike, *, encoding: str | None = None, errors: str = "strict", **options) -> DocGraph:
    """Read an HTML file into a DocGraph; the file size is checked first.

    `encoding`: a WHATWG label (``"utf-8"``, ``"windows-1252"``, ``"latin1"``, ``"shift_jis"``...)
    to read the bytes in, as a server's Content-Type would say it: it overrides ``<meta charset>``
    but not a byte-order mark; None (the default) sniffs as browsers do (module docstring).
    `errors`: ``"strict"`` (default) refuses bytes invalid in that encoding with an `IngestError`
    naming byte offset and line; ``"replace"`` reads them as U+FFFD. Other options as `parse_html`.
    """
    options.update(encoding=encoding, errors=errors)
    path = Path(path)
    max_bytes = options.get("max_bytes", MAX_BYTES)
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise IngestError(f"file has {size} bytes, over max_bytes={max_bytes}", file=str(path))
        data = path.read_bytes()
    except OSError as err:
        raise IngestError(f"cannot read HTML file: {err.strerror}", file=str(path)) from None
    options.setdefault("doc_id", path.stem)
    return parse_html(data, source=str(path), **options)


def parse_html(
    data: str | bytes,
    *,
    source: str | None = None,
    doc_id: str | None = None,
    encoding: str | None = None,
    errors: str = "strict",
    selector: str | None = None,
    max_bytes: int = MAX_BYTES,
    max_elements: int = MAX_ELEMENTS,
) -> DocGraph:
    """Parse an HTML document (str, or bytes in any declared or sniffed encoding) into a DocGraph.

    `selector` (CSS) marks matching element nodes with attr ``selected=True`` (others False), so a
    schema can make exactly those elements global tokens with ``where: {selected: true}``.
    `encoding` and `errors` apply to bytes, as in `read_html`.
    """
    if errors not in ("strict", "replace"):
        raise IngestError(f"errors must be 'strict' or 'replace', got {errors!r}", file=source)
    if len(data) > max_bytes:
        raise IngestError(f"document has {len(data)} {'bytes' if isinstance(data, bytes) else 'characters'}, over max_bytes={max_bytes}", file=source)
    if isinstance(data, bytes):
        markup, used_encoding, how = decode_html(data, encoding=encoding, errors=errors, source=source)
    elif isinstance(data, str):
        markup, used_encoding, how = data, "utf-8", "str"
    else:
        raise IngestError(f"HTML must be str or bytes, got {type(data).__name__}", file=source)
    if not markup.strip():
        raise IngestError("empty document: no markup or text at all", file=source)
    root = _parse_tree(markup, source)
    selected = _select(root, selector, source) if selector else None
    walk = _Walk(max_elements=max_elements, source=source)
    walk.run(root)
    title = root.findtext(".//title")
    return _build_graph(walk, doc_id=doc_id, source=source, selected=selected, attrs={
        "source": source, "encoding": used_encoding, "encoding_source": how,
        "title": " ".join(title.split()) if title else None,
    })


def _parse_tree(markup: str, source: str | None) -> etree._Element:
    # lxml.etree's HTML parser, not lxml.html's: the same libxml2 parser without a Python
    # element-class lookup per element (a third of the walk's time on large pages).
    parser = etree.HTMLParser(
        encoding="utf-8", no_network=True, huge_tree=False, remove_comments=True, remove_pis=True,
        remove_blank_text=False, compact=True, default_doctype=False,
    )
    try:
        encoded = markup.replace("\x00", "\ufffd").encode("utf-8")
    except UnicodeEncodeError as err:
        raise IngestError(f"text has an unpaired surrogate at character {err.start}", file=source) from None
    try:
        root = etree.fromstring(encoded, parser=parser)
    except etree.XMLSyntaxError as err:
        raise IngestError(f"cannot parse HTML: {err}", file=source, line=getattr(err, "lineno", None)) from None
    if root is None:
        raise IngestError("cannot parse HTML: the parser found no elements", file=source)
    for entry in parser.error_log:
        if entry.level_name == "FATAL":
            message = entry.message.lower()
            limit = " (libxml2's limits: nesting 256 elements deep, one text run 10 MB)" if "limit" in message or "depth" in message else ""
            raise IngestError(
                f"the HTML parser stopped at column {entry.column}: {entry.message.strip()}{limit}; "
                "refusing a page whose remainder would be silently dropped",
                file=source, line=entry.line,
            )
    return root


def _select(root: etree._Element, selector: str, source: str | None) -> set:
    try:
        return set(root.xpath(style.css_to_xpath(selector)))
    except etree.XPathError as err:
        raise IngestError(f"CSS selector {selector!r} does not translate into valid XPath: {err}", file=source) from None


# -- the walk --------------------------------------------------------------------------------
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
            font_px=style.computed_font_px(tag, declared, el.get("size"),
                                           style.DEFAULT_FONT_PX if parent_record is None else parent_record.font_px),
            preformatted=tag in style.PREFORMATTED_TAGS or declared.get("white-space", "").startswith("pre")
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
    root = {"is_block": True, "is_inline": False, "is_heading": False, "is_leaf": False, "is_bold": False,
            "font_size": style.DEFAULT_FONT_PX, "font_size_bucket": style.font_size_bucket(style.DEFAULT_FONT_PX)}
    return [{**mine, **{f"parent_{k}": v for k, v in (own[r.parent] if r.parent >= 0 else root).items()}}
            for r, mine in zip(records, own)]


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
        node_attrs = {"tag": record.tag, "xpath": record.xpath, "depth": record.depth, "parent": node_ids.get(record.parent),
                      "display": record.display, **features[index], "reading_position": start / total,
                      "text_share": (end - start) / total}
        if selected is not None:
            node_attrs["selected"] = record.el in selected
        nodes.append(Node(node_id, "element", (start, end), node_attrs))
        edges.append(Edge(node_ids.get(record.parent, "doc"), CONTAINS, node_id))
    for chunk, owner in enumerate(walk.chunk_owner):
        start, end = starts[chunk], ends[chunk]
        node_id = f"t{chunk}"
        nodes.append(Node(node_id, "text", (start, end), {
            "element": node_ids[owner], "tag": walk.records[owner].tag, **features[owner],
            "reading_position": start / total, "text_share": (end - start) / total}))
        edges.append(Edge(node_ids[owner], CONTAINS, node_id))
    graph.extend(nodes, edges, validate=False)
    return graph
