"""OpenKP: web pages with their keyphrases, from the dataset's records or added to any page graph.

OpenKP records (MS MARCO OpenKP, JSON lines) hold ``url``; ``text``, the page's clean-body words
separated by single spaces (punctuation removed); ``VDOM``, a JSON string (or list) with one
object per text element: ``text``, ``start_idx`` / ``end_idx`` (its word range) and ``feature``,
20 numbers: the element's x, width, y, height, is_block, is_inline, is_heading, is_leaf, font
size and is_bold, then the same ten of its parent; and ``KeyPhrases``, 1-3 keyphrases as word
lists (a JSON string or a list).

`openkp_graph(record)` builds what ``schemas/openkp-dom.yaml`` compiles, in the HTML reader's
conventions (`graphattn.ingest.html`): ``doc`` (document; attrs url, title None), one ``t<i>``
(text) per VDOM element, child of ``doc``, spanning its words, with the VDOM features under the
HTML reader's attr names (``is_block`` ... ``is_bold``, ``font_size``, ``font_size_bucket``, the
``parent_*`` ones, and ``x``, ``y``, ``width``, ``height``, ``reading_position``, ``text_share``),
and the keyphrase nodes below.

Keyphrase nodes: ``k<i>.<j>`` of type ``keyphrase`` is the j-th occurrence of keyphrase i (attrs
``phrase``, the words lowercased and joined by spaces, and ``index`` = i), found by matching the
lowercased words. `add_keyphrases(graph, phrases)` adds them to any graph, such as a page read by
`read_html`, matching whole words (letters, digits, inner hyphens and apostrophes) of its text.
A keyphrase found nowhere in the text is a `LabelWarning`; the page compiles without it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from graphattn.errors import warn_label
from graphattn.graph import DocGraph
from graphattn.ingest import _style as style
from graphattn.ingest.records import Record

KEYPHRASE = "keyphrase"
VDOM_FEATURES = ("x", "width", "y", "height", "is_block", "is_inline", "is_heading", "is_leaf", "font_size", "is_bold")
_FLAGS = ("is_block", "is_inline", "is_heading", "is_leaf", "is_bold")
_WORD = re.compile(r"\w+(?:['\u2019-]\w+)*")


def phrase_key(words: Sequence[str]) -> str:
    """How keyphrases compare (OpenKP's evaluation): words lowercased, joined by single spaces."""
    return " ".join(w.lower() for w in words)


def find_phrase(words: np.ndarray, phrase: Sequence[str]) -> np.ndarray:
    """Start indices where the lowercased word array `words` holds `phrase` (lowercased) in a row."""
    n = len(phrase)
    if n == 0 or n > words.size:
        return np.zeros(0, np.int64)
    hits = np.ones(words.size - n + 1, bool)
    for t, word in enumerate(phrase):
        hits &= words[t : words.size - n + 1 + t] == word.lower()
    return np.flatnonzero(hits)


def _add_occurrences(
    graph: DocGraph, phrases: list[list[str]], words: np.ndarray, starts: np.ndarray, ends: np.ndarray, warn
) -> None:
    """One keyphrase node per occurrence of each phrase (word arrays: lowercased words, their char spans)."""
    for i, phrase in enumerate(phrases):
        if not phrase:
            continue
        found = find_phrase(words, phrase)
        if found.size == 0:
            warn(f"keyphrase {' '.join(phrase)!r} is not in the text", i)
        for j, first in enumerate(found.tolist()):
            span = (int(starts[first]), int(ends[first + len(phrase) - 1]))
            graph.add_node(f"k{i}.{j}", KEYPHRASE, span, phrase=phrase_key(phrase), index=i)


def add_keyphrases(graph: DocGraph, phrases: Sequence[str | Sequence[str]], *, source: str | None = None) -> DocGraph:
    """Add a keyphrase node per occurrence of each phrase (a string or a word list) in the graph's text."""
    matches = list(_WORD.finditer(graph.text))
    words = np.array([m.group().lower() for m in matches], dtype=object)
    starts = np.array([m.start() for m in matches], np.int64)
    ends = np.array([m.end() for m in matches], np.int64)
    split = [_WORD.findall(p) if isinstance(p, str) else list(p) for p in phrases]

    def warn(message: str, i: int) -> None:
        warn_label(message, "keyphrases", file=source or graph.source, path=("keyphrases", i))

    _add_occurrences(graph, split, words, starts, ends, warn)
    return graph


def _json_field(record: Record, key: str, expect: type) -> Any:
    """A field that OpenKP stores either as JSON text or as the value itself."""
    value = record.get(key, expect=(str, expect))
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise record.error(
                f"{key} is a string that is not valid JSON ({err.msg}, column {err.colno})", key
            ) from None
        if not isinstance(value, expect):
            raise record.error(f"{key} must hold a JSON {expect.__name__}", key)
    return value


def openkp_graph(record: Record | Any) -> DocGraph:
    """One OpenKP record -> DocGraph (see the module docstring)."""
    record = record if isinstance(record, Record) else Record(record)
    text = record.get("text", expect=str)
    if not text.strip():
        raise record.error("text is empty", "text")
    words = text.split(" ")
    lengths = np.fromiter((len(w) for w in words), np.int64, len(words))
    starts = np.cumsum(lengths + 1) - (lengths + 1)
    ends = starts + lengths
    vdom = _json_field(record, "VDOM", list)
    phrases = _json_field(record, "KeyPhrases", list) if "KeyPhrases" in record.data else []

    graph = DocGraph(text, doc_id=_doc_id(record), source=record.file)
    graph.add_node("doc", "document", (0, len(text)), url=record.get("url", expect=str, default=None), title=None)
    total = max(len(text), 1)
    for i, element in enumerate(vdom):
        if not isinstance(element, dict):
            raise record.error(f"VDOM element {i} is not an object", "VDOM", i)
        first, stop = element.get("start_idx"), element.get("end_idx")
        if not (isinstance(first, int) and isinstance(stop, int) and 0 <= first < stop <= len(words)):
            raise record.error(
                f"word range [{first}, {stop}) is empty or outside the text's {len(words)} words", "VDOM", i
            )
        feature = element.get("feature")
        if not (
            isinstance(feature, list)
            and len(feature) == 2 * len(VDOM_FEATURES)
            and all(isinstance(v, (int, float)) for v in feature)
        ):
            raise record.error(f"feature must be a list of {2 * len(VDOM_FEATURES)} numbers", "VDOM", i, "feature")
        span = (int(starts[first]), int(ends[stop - 1]))
        graph.add_child(
            "doc",
            f"t{i}",
            "text",
            span,
            **_vdom_attrs(feature),
            reading_position=span[0] / total,
            text_share=(span[1] - span[0]) / total,
        )
    lowered = np.array([w.lower() for w in words], dtype=object)
    for i, phrase in enumerate(phrases):
        if not (isinstance(phrase, list) and all(isinstance(w, str) for w in phrase)):
            raise record.error("a keyphrase must be a list of words", "KeyPhrases", i)
    _add_occurrences(
        graph,
        [[w for w in p if w] for p in phrases],
        lowered,
        starts,
        ends,
        lambda message, i: record.warn("keyphrases", message, "KeyPhrases", i),
    )
    return graph


def _vdom_attrs(feature: list) -> dict[str, Any]:
    own = dict(zip(VDOM_FEATURES, feature[: len(VDOM_FEATURES)]))
    parent = dict(zip(VDOM_FEATURES, feature[len(VDOM_FEATURES) :]))
    out: dict[str, Any] = {}
    for prefix, values in (("", own), ("parent_", parent)):
        for key, value in values.items():
            out[prefix + key] = bool(value) if key in _FLAGS else float(value)
        out[prefix + "font_size_bucket"] = int(style.font_size_bucket(values["font_size"]))
    return out


def _doc_id(record: Record) -> str | None:
    url = record.get("url", expect=str, default=None)
    return url if url is not None else (str(record.data["id"]) if "id" in record.data else None)


__all__ = ["KEYPHRASE", "add_keyphrases", "find_phrase", "openkp_graph", "phrase_key"]
