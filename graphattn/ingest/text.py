"""Plain text -> DocGraph (paragraphs and sentences) and candidate-mention linking, with spaCy.

Conventions (the dataset schemas depend on them):

* ``doc`` (type ``document``) spans the whole text; ``p0, p1, ...`` (type ``paragraph``) are the
  blocks between blank lines; ``p0.s0, p0.s1, ...`` (type ``sentence``) their sentences.
  ``contains`` edges go document -> paragraph -> sentence. Every span is trimmed of surrounding
  whitespace, so no two nodes of one type overlap and no span starts or ends with a space.
* Sentences come from the pipeline's ``doc.sents``: by default ``spacy.blank("en")`` plus the
  rule-based ``sentencizer`` (no model download); a user's loaded pipeline (with a parser or
  senter) is used as given. Paragraphs longer than ``nlp.max_length`` are fed in whitespace-cut
  pieces, each piece boundary also ending a sentence.
* Mentions: `link_mentions` finds every case-insensitive, token-aligned occurrence of each
  candidate string (spaCy ``PhraseMatcher`` on ``LOWER``) inside given regions and adds a
  ``mention`` node per occurrence with a ``mention_of`` edge to its candidate node. Both the text
  and the candidates are lower-cased *before* tokenizing, so that case-sensitive tokenizer
  exceptions ("Dr." vs "dr.") cannot make a candidate miss. Overlapping matches keep the longest
  (then the earliest), as spaCy's ``filter_spans`` does: each token then links to one candidate,
  as in ETC's WikiHop (``l2g_linked_ids`` holds one candidate per token).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping, Sequence

from spacy.language import Language
from spacy.matcher import PhraseMatcher
from spacy.tokens import Span
from spacy.util import filter_spans

from graphattn.errors import IngestError
from graphattn.graph import DocGraph

MENTION_OF = "mention_of"
_BLANK_LINES = re.compile(r"\n[ \t\r\f\v]*\n")


@functools.lru_cache(maxsize=1)
def default_nlp() -> Language:
    """``spacy.blank("en")`` + ``sentencizer``: rule-based, nothing downloaded. Cached."""
    import spacy

    nlp = spacy.blank("en")
    nlp.add_pipe("sentencizer")
    return nlp


def text_to_graph(
    text: str,
    *,
    nlp: Language | None = None,
    candidates: Sequence[str] | None = None,
    doc_id: str | None = None,
    source: str | None = None,
) -> DocGraph:
    """Split `text` into paragraphs (blank lines) and sentences; optionally link candidates.

    With `candidates`, each string becomes a ``candidate`` node ``c0, c1, ...`` (attr ``text``,
    no span: the string need not occur in the text) and every mention in the text is linked to it.
    """
    if not isinstance(text, str):
        raise IngestError(f"text must be a str, got {type(text).__name__}", file=source)
    if not text.strip():
        raise IngestError("empty document: the text has no visible characters", file=source)
    graph = DocGraph(text, doc_id=doc_id, source=source)
    graph.add_node("doc", "document", _trim(text, 0, len(text)))
    paragraphs = [span for span in paragraph_spans(text) if span[1] > span[0]]
    for index, span in enumerate(paragraphs):
        graph.add_child("doc", f"p{index}", "paragraph", span, index=index)
    add_sentences(graph, [f"p{i}" for i in range(len(paragraphs))], nlp=nlp)
    if candidates is not None:
        candidate_ids = []
        for index, candidate in enumerate(candidates):
            if not isinstance(candidate, str) or not candidate.strip():
                raise IngestError(f"candidate {index} must be a non-empty string, got {candidate!r}", file=source)
            graph.add_node(f"c{index}", "candidate", None, text=candidate, index=index)
            candidate_ids.append(f"c{index}")
        link_mentions(
            graph,
            {cid: graph.nodes[cid].attrs["text"] for cid in candidate_ids},
            within=[f"p{i}" for i in range(len(paragraphs))],
            nlp=nlp,
        )
    return graph


def paragraph_spans(text: str, start: int = 0, end: int | None = None) -> list[tuple[int, int]]:
    """Spans of the blocks of ``text[start:end]`` separated by blank lines, trimmed."""
    end = len(text) if end is None else end
    spans, cursor = [], start
    for match in _BLANK_LINES.finditer(text, start, end):
        spans.append(_trim(text, cursor, match.start()))
        cursor = match.end()
    spans.append(_trim(text, cursor, end))
    return [s for s in spans if s[1] > s[0]]


def add_sentences(
    graph: DocGraph, parents: Sequence[str], *, nlp: Language | None = None, type: str = "sentence"
) -> list[str]:
    """Add a sentence node (``<parent>.s<j>``, attr ``index``) per sentence of each parent's span."""
    nlp = nlp or default_nlp()
    added = []
    for parent in parents:
        start, end = graph.node(parent).span or (0, 0)
        for index, (s_start, s_end) in enumerate(sentence_spans(graph.text, start, end, nlp)):
            node = graph.add_child(parent, f"{parent}.s{index}", type, (s_start, s_end), index=index)
            added.append(node.id)
    return added


def sentence_spans(text: str, start: int, end: int, nlp: Language | None = None) -> list[tuple[int, int]]:
    """Trimmed, non-empty sentence spans of ``text[start:end]`` (absolute offsets)."""
    nlp = nlp or default_nlp()
    spans = []
    for piece_start, piece_end in _pieces(text, start, end, nlp.max_length):
        doc = nlp(text[piece_start:piece_end])
        for sent in doc.sents:
            span = _trim(text, piece_start + sent.start_char, piece_start + sent.end_char)
            if span[1] > span[0]:
                spans.append(span)
    return spans


def link_mentions(
    graph: DocGraph,
    candidates: Mapping[str, str],
    *,
    within: Iterable[str],
    nlp: Language | None = None,
    prefix: str = "m",
) -> list[str]:
    """Add ``mention`` nodes for every occurrence of each candidate string inside `within` nodes.

    `candidates` maps a candidate node id to its string. Mention ids are ``<prefix>0, ...`` in
    text order; each mention has attrs ``candidate`` and ``text`` and one ``mention_of`` edge.
    """
    nlp = nlp or default_nlp()
    matcher = PhraseMatcher(nlp.vocab, attr="LOWER")
    for candidate_id, string in candidates.items():
        pattern = nlp.make_doc(_lower_same_length(string.strip()))
        if len(pattern):
            matcher.add(candidate_id, [pattern])
    found: set[tuple[int, int, str]] = set()  # a set: overlapping regions find a mention once
    for region in within:
        start, end = graph.node(region).span or (0, 0)
        for piece_start, piece_end in _pieces(graph.text, start, end, nlp.max_length):
            doc = nlp.make_doc(_lower_same_length(graph.text[piece_start:piece_end]))
            for span in _longest_first(matcher(doc), doc):
                found.add((piece_start + span.start_char, piece_start + span.end_char, span.label_))
    ids = []
    for index, (m_start, m_end, candidate_id) in enumerate(sorted(found)):
        node = graph.add_node(
            f"{prefix}{index}", "mention", (m_start, m_end), candidate=candidate_id, text=graph.text[m_start:m_end]
        )
        graph.add_edge(node.id, MENTION_OF, candidate_id)
        ids.append(node.id)
    return ids


def _longest_first(matches, doc) -> list[Span]:
    """Matches as labelled spans, overlaps resolved longest-first (spaCy's filter_spans)."""
    return filter_spans([Span(doc, start, end, label=match_id) for match_id, start, end in matches])


def _lower_same_length(text: str) -> str:
    """Lower-case without changing offsets (``"İ".lower()`` is two characters: keep the first)."""
    lowered = text.lower()
    if len(lowered) == len(text):
        return lowered
    return "".join(c.lower()[0] for c in text)


def _pieces(text: str, start: int, end: int, max_length: int) -> list[tuple[int, int]]:
    """Cut [start, end) at whitespace into pieces of at most `max_length` characters."""
    pieces = []
    while end - start > max_length:
        cut = text.rfind(" ", start + 1, start + max_length)
        cut = start + max_length if cut <= start else cut
        pieces.append((start, cut))
        start = cut
    pieces.append((start, end))
    return pieces


def _trim(text: str, start: int, end: int) -> tuple[int, int]:
    """Shrink [start, end) past leading and trailing whitespace."""
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end
