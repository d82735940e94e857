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
keep their whitespace (less the newline right after the start tag). Not rendered, so left out:
``head``, ``script``, ``style``, ``template``, ``noscript``, ``iframe``, comments, processing
instructions, the ``hidden`` attribute and inline ``display:none`` / ``visibility:hidden``. Each
node's span covers its first to its last visible character (never a separator).

VDOM features without rendering: display, font size and weight come from tag defaults plus the
inline ``style`` (see `_style`). Geometry (x, y, width, height) needs a layout engine; in its
place each node gets ``reading_position`` (start / text length) and ``text_share`` (span length /
text length), both in [0, 1].

Safety: lxml's *HTML* parser only (never the XML parser), so DTDs, internal entity declarations
and external entities are inert text, never expanded or fetched (no billion laughs, no file
reads); ``no_network``; ``huge_tree`` off, so libxml2 keeps its depth (256) and text-run (10 MB)
limits — hitting one raises `IngestError` naming line and column (the parser would silently drop
the rest of the page). The tree walk is iterative. Input above ``max_bytes`` is refused before
it is parsed; a page with more than ``max_elements`` rendered elements right after its tree is
recorded (`_tree.walk`: about the memory of the parsed tree again), before anything is built.

Encodings (`graphattn.ingest.encoding`): as browsers decode, by the WHATWG Encoding Standard's
labels only: a byte-order mark, else the ``encoding`` argument, else ``<meta charset>`` /
``http-equiv`` in the first 4 KB, else UTF-8 if the bytes are valid UTF-8 and windows-1252 if not.
A ``<meta>`` label the Standard does not know (``utf-7``, ``base64``) is ignored. Bytes that do not
decode raise `IngestError` with the byte offset and line (``errors="strict"``, the default);
``errors="replace"`` puts U+FFFD in their place instead.
"""

from __future__ import annotations

import os
from pathlib import Path

import lxml.etree as etree

from graphattn.errors import IngestError
from graphattn.graph import DocGraph
from graphattn.ingest._tree import walk
from graphattn.ingest._walk import to_graph
from graphattn.ingest.encoding import decode_html

MAX_BYTES = 64 * 1024 * 1024
MAX_ELEMENTS = 500_000


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
        raise IngestError(
            f"document has {len(data)} {'bytes' if isinstance(data, bytes) else 'characters'}, "
            f"over max_bytes={max_bytes}",
            file=source,
        )
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
    columns = walk(root, max_elements=max_elements, source=source, selected=selected)
    title = root.findtext(".//title")
    return to_graph(
        columns,
        doc_id=doc_id,
        source=source,
        doc_attrs={
            "source": source,
            "encoding": used_encoding,
            "encoding_source": how,
            "title": " ".join(title.split()) if title else None,
        },
    )


def _parse_tree(markup: str, source: str | None) -> etree._Element:
    # lxml.etree's HTML parser, not lxml.html's: the same libxml2 parser without a Python
    # element-class lookup per element (a third of the walk's time on large pages).
    parser = etree.HTMLParser(
        encoding="utf-8",
        no_network=True,
        huge_tree=False,
        remove_comments=True,
        remove_pis=True,
        remove_blank_text=False,
        compact=True,
        default_doctype=False,
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
            limit = (
                " (libxml2's limits: nesting 256 elements deep, one text run 10 MB)"
                if "limit" in message or "depth" in message
                else ""
            )
            raise IngestError(
                f"the HTML parser stopped at column {entry.column}: {entry.message.strip()}{limit}; "
                "refusing a page whose remainder would be silently dropped",
                file=source,
                line=entry.line,
            )
    return root


def _select(root: etree._Element, selector: str, source: str | None) -> set:
    """The elements a CSS selector matches (cssselect's HTML translation, evaluated by lxml)."""
    from cssselect import HTMLTranslator, SelectorError

    try:
        xpath = HTMLTranslator().css_to_xpath(selector)
    except SelectorError as err:
        raise IngestError(f"invalid CSS selector {selector!r}: {err}", file=source) from None
    try:
        return set(root.xpath(xpath))
    except etree.XPathError as err:
        raise IngestError(
            f"CSS selector {selector!r} does not translate into valid XPath: {err}", file=source
        ) from None
